"""The inspector's pages against a real daemon, over HTTP: what they show of large
sessions, and how they answer odd requests."""

from __future__ import annotations

import asyncio
import re
import urllib.error
import urllib.request

from ctxcc.v1 import session_pb2
from ctxcc.v1 import session_service_pb2 as spb
from server.app import Daemon
from server.web import present
from tests.conftest import Stubs
from tests.helpers import compile_request, user

# What a page may weigh: its text budget and the rendered body's cut, escaped (`<` is
# `&lt;`, `"` is `&#34;`), with room for the markup around them.
PAGE_BOUND = 6 * (present.MAX_PAGE_CHARS + present.MAX_BODY_CHARS)


def _fetch(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=120) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


async def _get(daemon: Daemon, path: str) -> tuple[int, str, int]:
    """(status, page, its size in bytes)."""
    status, body = await asyncio.to_thread(_fetch, f"http://{daemon.endpoints.ui}{path}")
    return status, body.decode(), len(body)


async def _session(api: Stubs, sid: str) -> None:
    await api.sessions.CreateSession(
        spb.CreateSessionRequest(session=session_pb2.Session(session_id=sid))
    )


async def test_pages_of_big_messages_are_bounded_and_say_what_they_left_out(
    daemon: Daemon, unix_api: Stubs
) -> None:
    """40 user messages of 150,000 `<` (6 MB, 24 MB escaped): every page used to print
    every part whole (the step page 24 MB, the events page all 40 events); each is now
    cut to a budget, says how much it left out, and pages on."""
    api = unix_api
    await _session(api, "big")
    size, count = 150_000, 40
    for _ in range(count // 10):
        await api.sessions.AppendEvents(
            spb.AppendEventsRequest(session_id="big", events=[user("<" * size)] * 10)
        )
    view = (await api.compiles.Compile(compile_request("big"))).view
    assert len(view.messages) == count

    status, page, weight = await _get(daemon, "/s/big/step")
    assert status == 200 and weight < PAGE_BOUND, weight
    omitted = size - present.MAX_PART_CHARS
    assert f'data-omitted="{omitted}"' in page
    assert f"{omitted:,} more characters left out of this page" in page
    assert "CompileService.Compile" in page  # where the whole text is
    shown = page.count('<article class="msg')
    hidden = re.search(r'data-hidden="(\d+)"', page)
    assert hidden is not None and 0 < shown < count
    assert shown + int(hidden.group(1)) == count  # the rest are counted, not shown

    status, page, weight = await _get(daemon, "/s/big/diff?a=10&b=40")
    assert status == 200 and weight < PAGE_BOUND, weight
    assert f'data-omitted="{omitted}"' in page

    # The events page reads a few of them (by bytes), cut, with a link to the rest.
    seen: list[int] = []
    after = 0
    while True:
        status, page, weight = await _get(daemon, f"/s/big/events?after={after}")
        assert status == 200 and weight < PAGE_BOUND, weight
        seqs = [int(s) for s in re.findall(r'data-seq="(\d+)"', page)]
        assert seqs and page.count(f'data-omitted="{omitted}"') == len(seqs)
        seen += seqs
        more = re.search(r'id="more-events" href="/s/big/events\?after=(\d+)"', page)
        if more is None:
            break
        assert len(seqs) < count
        after = int(more.group(1))
    assert seen == list(range(1, count + 1))
