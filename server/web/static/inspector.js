// ctxcc inspector: live refresh only. Pages are complete without this script; it
// re-reads the page the server renders (and escapes) and swaps the <main> element.
"use strict";

(function () {
  const status = document.getElementById("live-status");
  let pending = null;

  function show(text) {
    if (!status) return;
    status.hidden = false;
    status.textContent = text;
  }

  async function refresh() {
    pending = null;
    const response = await fetch(window.location.href, { credentials: "same-origin" });
    if (!response.ok) return;
    const doc = new DOMParser().parseFromString(await response.text(), "text/html");
    const fresh = doc.getElementById("main");
    const main = document.getElementById("main");
    if (fresh && main) {
      main.replaceChildren(...Array.from(fresh.childNodes).map((n) => document.importNode(n, true)));
      document.body.dataset.refreshed = String(Number(document.body.dataset.refreshed || 0) + 1);
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
    window.setInterval(refresh, every * 1000);
  }
})();
