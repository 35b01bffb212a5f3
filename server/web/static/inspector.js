// ctxcc inspector: live refresh only. Pages are complete without this script; it
// re-reads the page the server renders (and escapes) and swaps the <main> element.
"use strict";

(function () {
  const status = document.getElementById("live-status");
  // One refresh at a time: a page whose render takes longer than the period (a long
  // session) piled up requests, each holding the daemon's work, when one started every
  // period whether or not the last had answered.
  let pending = null; // the timer of a refresh asked for by a live update
  let running = false;
  let again = false; // asked for while one ran: made once it is done

  function show(text) {
    if (!status) return;
    status.hidden = false;
    status.textContent = text;
  }

  async function refresh() {
    pending = null;
    if (running) {
      again = true;
      return;
    }
    running = true;
    try {
      const response = await fetch(window.location.href, { credentials: "same-origin" });
      if (!response.ok) return;
      const doc = new DOMParser().parseFromString(await response.text(), "text/html");
      const fresh = doc.getElementById("main");
      const main = document.getElementById("main");
      if (fresh && main) {
        main.replaceChildren(...Array.from(fresh.childNodes).map((n) => document.importNode(n, true)));
        document.body.dataset.refreshed = String(Number(document.body.dataset.refreshed || 0) + 1);
      }
    } catch (err) {
      // The daemon restarting or the network gone: the next period tries again.
    } finally {
      running = false;
      if (again) {
        again = false;
        soon();
      }
    }
  }

  function soon() {
    if (pending === null) pending = window.setTimeout(refresh, 250);
  }

  const live = document.body.dataset.live;
  if (live && window.EventSource) {
    const source = new EventSource(live);
    source.addEventListener("open", () => show("● live"));
    source.addEventListener("error", () => show("○ reconnecting"));
    source.addEventListener("update", soon);
  }
  const every = Number(document.body.dataset.refresh || 0);
  if (every > 0) {
    show("● refreshing every " + every + " s");
    // The next period starts when the last refresh has answered.
    const tick = async () => {
      await refresh();
      window.setTimeout(tick, every * 1000);
    };
    window.setTimeout(tick, every * 1000);
  }
})();
