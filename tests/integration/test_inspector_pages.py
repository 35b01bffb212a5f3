"""The inspector's pages against a real daemon, over HTTP: what they show of large
sessions, and how they answer odd requests."""

from __future__ import annotations

import asyncio
import html
import re
import socket
import struct
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest

from ctxcc.v1 import checkpoint_pb2 as kpb
from ctxcc.v1 import common_pb2, event_pb2, session_pb2, source_pb2
from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_service_pb2 as spb
from ctxcc.v1 import source_service_pb2 as rpb
from server.app import Daemon
from server.web import present
from tests.conftest import Stubs
from tests.helpers import ROUTE, assistant, compile_request, tool_result, user

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
    hidden = re.search(r'data-hidden="(\d+)">[^<]* more messages', page)
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


async def _metric(daemon: Daemon, name: str) -> float:
    scrape = await asyncio.to_thread(
        lambda: urllib.request.urlopen(f"http://{daemon.endpoints.metrics}/metrics").read()
    )
    found = re.search(rf"^{name} (\S+)$", scrape.decode(), re.M)
    assert found is not None, name
    return float(found.group(1))


def _pumps() -> list[asyncio.Task[Any]]:
    return [t for t in asyncio.all_tasks() if _awaits(t)[0] == "pump"]


def _awaits(task: asyncio.Task[Any]) -> list[str]:
    """The names of the coroutines `task` is suspended in, outermost first."""
    names = []
    coro: Any = task.get_coro()
    while coro is not None:
        code = getattr(coro, "cr_code", None) or getattr(coro, "ag_code", None)
        names.append(code.co_name if code else type(coro).__name__)
        coro = getattr(coro, "cr_await", None) or getattr(coro, "ag_await", None)
    return names


def _draining() -> bool:
    """Whether some task waits for a full send buffer to drain (aiohttp's writer)."""
    return any("_drain_helper" in _awaits(t) for t in asyncio.all_tasks())


async def _stalled_live_stream(daemon: Daemon, api: Stubs, sid: str) -> socket.socket:
    """A live page that stopped reading: its stream's writes wait (the daemon's socket
    buffer is full), and the updates meanwhile fill the queue before the writer."""
    await _session(api, sid)
    await api.sessions.AppendEvents(spb.AppendEventsRequest(session_id=sid, events=[user("hi")]))
    host, port = str(daemon.endpoints.ui).rsplit(":", 1)
    loop = asyncio.get_running_loop()
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    client.setblocking(False)
    await loop.sock_connect(client, (host, int(port)))
    request = f"GET /s/{sid}/live HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n"
    await loop.sock_sendall(client, request.encode())
    assert daemon._web is not None
    server: Any = daemon._web._runner.server

    async def streaming() -> bool:
        return bool(server.connections) and await _metric(daemon, "ctxcc_watchers") == 1

    await _eventually(streaming, "the live stream is subscribed")
    (connection,) = server.connections
    # A slow link: the daemon's send buffer held to the kernel's least (it grows to
    # megabytes on loopback, which tiny SSE messages would take long to fill).
    connection.transport.get_extra_info("socket").setsockopt(
        socket.SOL_SOCKET, socket.SO_SNDBUF, 4096
    )
    while not _draining():  # the writer buffers 64 KB before it waits
        await api.sessions.AppendEvents(
            spb.AppendEventsRequest(session_id=sid, events=[user("x")] * 200)
        )
    for _ in range(20):  # the pump fills its queue (64) while the write waits
        await api.sessions.AppendEvents(
            spb.AppendEventsRequest(session_id=sid, events=[user("y")] * 50)
        )
    assert _draining() and len(_pumps()) == 1
    return client


async def test_a_live_stream_ends_when_its_page_drops_while_a_write_waits(
    daemon: Daemon, unix_api: Stubs, caplog: pytest.LogCaptureFixture
) -> None:
    """The page's connection reset while the stream's write waited on it: aiohttp raised
    ConnectionError("Connection lost"), which the handler did not catch, and its pump,
    cancelled, waited for good to queue the stream's end on a queue nobody read: the
    handler never returned and the watcher stayed subscribed."""
    client = await _stalled_live_stream(daemon, unix_api, "drop")
    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    client.close()  # a reset
    assert daemon._web is not None
    server: Any = daemon._web._runner.server

    async def ended() -> bool:
        return (
            not server.connections and not _pumps() and await _metric(daemon, "ctxcc_watchers") == 0
        )

    await _eventually(ended, "the stream's handler, its pump and its watcher end")
    assert "inspector page failed" not in caplog.text  # a page going away is no incident


async def _eventually(check: Callable[[], Awaitable[bool]], what: str) -> None:
    """Polls `check` until it holds: a bound on a hang (the old code never got there), not
    a measure of speed."""
    for _ in range(1200):
        if await check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"never true: {what}")


async def test_a_live_stream_cancelled_while_a_write_waits_ends_cancelled(
    daemon: Daemon, unix_api: Stubs
) -> None:
    """The daemon stopping cancels a stream's handler (here, while its write waits on a
    stalled page): the handler used to swallow its own cancellation with the pump's, and
    wait on the pump, which waited for good on the full queue."""
    client = await _stalled_live_stream(daemon, unix_api, "stop")
    assert daemon._web is not None
    server: Any = daemon._web._runner.server
    (connection,) = server.connections
    handler: asyncio.Task[None] = connection._task_handler
    handler.cancel()  # as aiohttp does to the handlers left when the daemon stops

    async def ended() -> bool:
        return handler.done() and not _pumps()

    await _eventually(ended, "the handler and its pump end")
    assert handler.cancelled()
    assert await _metric(daemon, "ctxcc_watchers") == 0
    client.close()


def _estimate(page: str) -> int:
    found = re.search(r'data-field="estimated_input_tokens">([\d,]+)<', page)
    assert found is not None
    return int(found.group(1).replace(",", ""))


def _link(page: str, anchor: str) -> str:
    found = re.search(rf'id="{anchor}" href="([^"]+)"', page)
    assert found is not None, anchor
    return html.unescape(found.group(1))


async def test_time_travel_shows_the_recorded_views_of_an_agent_on_a_full_route(
    daemon: Daemon, unix_api: Stubs
) -> None:
    """An agent's route names its connection, protocol and endpoint: ◀ ▶, a typed seq
    (seq and model) and the diff links used to compile a route of the model alone, which
    no compile was recorded for, so they showed a view compiled now (today's memory)
    instead of the one the agent got."""
    api = unix_api
    await _session(api, "routed")
    views = []
    for i in range(4):
        await api.sources.PutMemory(
            rpb.PutMemoryRequest(
                memory=source_pb2.MemoryEntry(
                    memory_id="m1",
                    scope=common_pb2.SCOPE_SESSION,
                    scope_id="routed",
                    text=f"memory version {i} " + "x" * (50 * i),
                )
            )
        )
        await api.sessions.AppendEvents(
            spb.AppendEventsRequest(session_id="routed", events=[user(f"question {i}")])
        )
        views.append((await api.compiles.Compile(compile_request("routed"))).view)
        await api.sessions.AppendEvents(
            spb.AppendEventsRequest(session_id="routed", events=[assistant(f"answer {i}")])
        )
    assert ROUTE.connection and ROUTE.protocol and ROUTE.endpoint

    def recorded(page: str, i: int) -> None:
        v = views[i]
        assert "rebuilt byte for byte" in page and f"<code>{v.compile_id}</code>" in page
        assert _estimate(page) == v.budget.estimated_input_tokens
        assert re.findall(r"memory version (\d+)", page)[:1] == [str(i)]

    for i, v in enumerate(views):
        _, page, _ = await _get(
            daemon, f"/s/routed/step?seq={v.event_boundary}&model={ROUTE.model}"
        )
        recorded(page, i)
    _, page, _ = await _get(daemon, f"/s/routed/step?compile={quote(views[2].compile_id)}")
    recorded(page, 2)
    _, before, _ = await _get(daemon, _link(page, "prev-step"))
    recorded(before, 1)
    _, after, _ = await _get(daemon, _link(page, "next-step"))
    recorded(after, 3)
    _, diff, _ = await _get(daemon, _link(page, "diff-prev"))
    assert _diff_estimates(diff) == [
        views[1].budget.estimated_input_tokens,
        views[2].budget.estimated_input_tokens,
    ]


def _diff_estimates(page: str) -> list[int]:
    shown = re.search(
        r'data-layer="estimate"><td>estimate</td><td class="n">([\d,]+)</td>'
        r'<td class="n">([\d,]+)</td>',
        page,
    )
    assert shown is not None
    return [int(x.replace(",", "")) for x in shown.groups()]


async def test_diffs_compare_the_compiles_of_one_route_when_two_share_a_model(
    daemon: Daemon, unix_api: Stubs
) -> None:
    """Two agents' routes of one model (other connections) compiled at the same seq: the
    diff links named a seq and a model, so their `from` side took the other route's
    compile, the newest at that seq, instead of the previous compile of the row's route."""
    api = unix_api
    await _session(api, "pair")
    other = common_pb2.Route()
    other.CopyFrom(ROUTE)
    other.connection = "backup"

    async def remember(text: str) -> None:
        entry = source_pb2.MemoryEntry(
            memory_id="m1", scope=common_pb2.SCOPE_SESSION, scope_id="pair", text=text
        )
        await api.sources.PutMemory(rpb.PutMemoryRequest(memory=entry))

    await remember("short memory")
    await api.sessions.AppendEvents(
        spb.AppendEventsRequest(session_id="pair", events=[user("question 0")])
    )
    first = (await api.compiles.Compile(compile_request("pair"))).view
    await remember("a much longer memory " + "y" * 400)
    on_backup = compile_request("pair")
    on_backup.route.CopyFrom(other)
    backup = (await api.compiles.Compile(on_backup)).view
    assert backup.event_boundary == first.event_boundary
    assert backup.budget.estimated_input_tokens != first.budget.estimated_input_tokens
    await api.sessions.AppendEvents(
        spb.AppendEventsRequest(
            session_id="pair", events=[assistant("answer 0"), user("question 1")]
        )
    )
    second = (await api.compiles.Compile(compile_request("pair"))).view
    want = [first.budget.estimated_input_tokens, second.budget.estimated_input_tokens]

    _, timeline, _ = await _get(daemon, "/s/pair")
    row = re.search(
        rf'<tr data-compile="{re.escape(second.compile_id)}".*?class="diff-link"', timeline, re.S
    )
    assert row is not None
    link = re.findall(r'href="([^"]+)" class="diff-link"', row.group(0))[-1]
    _, diff, _ = await _get(daemon, html.unescape(link))
    assert _diff_estimates(diff) == want
    shown = re.findall(r'data-compile="([^"]*)">seq', diff)
    assert shown == [first.compile_id, second.compile_id]

    _, step, _ = await _get(daemon, f"/s/pair/step?compile={quote(second.compile_id)}")
    _, diff, _ = await _get(daemon, _link(step, "diff-prev"))
    assert _diff_estimates(diff) == want


def _raw_status(address: str, path: str, host: str) -> int:
    name, port = address.rsplit(":", 1)
    with socket.create_connection((name, int(port)), timeout=30) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        head = s.recv(64)
    return int(head.split(b" ")[1])


async def test_malformed_hosts_and_static_names_are_refused_without_an_incident(
    daemon: Daemon, caplog: pytest.LogCaptureFixture
) -> None:
    """Host headers yarl cannot parse (request.url.host raised) and static file names
    the file system refuses (a NUL, past its name length) were a 500 with a traceback
    in the log."""
    ui = str(daemon.endpoints.ui)
    port = ui.rsplit(":", 1)[1]
    for host in ("::1", "localhost:abc", "127.0.0.1:80:evil", "[::1]evil", "localhost:" + "9" * 20):
        assert await asyncio.to_thread(_raw_status, ui, "/", host) == 400, host
    for host in ("evil.example", f"evil.example:{port}", "[::2]:80"):
        assert await asyncio.to_thread(_raw_status, ui, "/", host) == 421, host
    for host in (f"localhost:{port}", "LOCALHOST", f"[::1]:{port}", "127.0.0.1:"):
        assert await asyncio.to_thread(_raw_status, ui, "/", host) == 200, host
    for path in ("/static/a%00.css", "/static/" + "a" * 300 + ".css", "/static/%2e.css"):
        assert await asyncio.to_thread(_raw_status, ui, path, ui) == 404, path
    assert await asyncio.to_thread(_raw_status, ui, "/static/inspector.css", ui) == 200
    assert "inspector page failed" not in caplog.text
    assert "Traceback" not in caplog.text


async def test_an_empty_event_range_shows_no_events(daemon: Daemon, unix_api: Stubs) -> None:
    """after=5&through=2 showed seq 6 under "Canonical events 6-2": the limit came to 0,
    and the store's read takes one event before it checks its limit."""
    await _session(unix_api, "ranges")
    await unix_api.sessions.AppendEvents(
        spb.AppendEventsRequest(session_id="ranges", events=[user(str(i)) for i in range(10)])
    )
    for query, seqs in [
        ("after=5&through=2", []),
        ("after=5&through=5", []),
        ("after=5&through=6", [6]),
        ("after=1&through=3", [2, 3]),
        ("after=8", [9, 10]),
    ]:
        status, page, _ = await _get(daemon, f"/s/ranges/events?{query}")
        assert status == 200
        assert [int(s) for s in re.findall(r'data-seq="(\d+)"', page)] == seqs, query
        assert 'id="more-events"' not in page, query


async def test_the_sessions_list_filters_before_it_cuts_and_says_what_it_shows(
    daemon: Daemon, unix_api: Stubs
) -> None:
    """The list read the first 500 sessions in id order and filtered those: with 600,
    a filter for the 551st found nothing, and the list never said it was cut."""
    for i in range(600):
        await _session(unix_api, f"s{i:04}")
    await unix_api.sessions.AppendEvents(
        spb.AppendEventsRequest(session_id="s0590", events=[user("hi")])
    )
    await unix_api.compiles.Compile(compile_request("s0590"))

    def listed(page: str) -> list[str]:
        return re.findall(r'<tr data-session="([^"]+)"', page)

    _, page, _ = await _get(daemon, "/")
    assert len(listed(page)) == 500
    cut = re.search(r'id="sessions-cut">([^<]*)<', page)
    assert cut is not None and "first 500 sessions in id order, of 600 sessions" in cut.group(1)
    _, page, _ = await _get(daemon, "/?q=s0550")
    assert listed(page) == ["s0550"] and 'id="sessions-cut"' not in page
    _, page, _ = await _get(daemon, "/?q=S055")
    assert listed(page) == [f"s{i:04}" for i in range(550, 560)]
    _, page, _ = await _get(daemon, f"/?q={ROUTE.model}")  # by the model of its compile
    assert listed(page) == ["s0590"]


async def test_the_list_timeline_and_step_pages_read_no_compile_tables(
    daemon: Daemon, unix_api: Stubs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each compile record's per-message table is as long as its view, stored in chunks:
    the pages joined every record's (a session of 8,000 compiles: ~5 s a page, 9 s the
    step page). What they show of a record needs none of it; only the step's rebuild
    (Compile with rebuild_compile_id) reads its one record's table."""
    api = unix_api
    await _session(api, "long")
    for i in range(3):
        # Past one stored chunk of 256 entries: the records name chunks.
        events = [user(f"ask {i}.{k}") if k % 2 == 0 else assistant("ok") for k in range(300)]
        await api.sessions.AppendEvents(spb.AppendEventsRequest(session_id="long", events=events))
        last = (await api.compiles.Compile(compile_request("long"))).view
    store = daemon._store
    assert store is not None
    read: list[str] = []
    get_part = store.get_compile_part

    def counted(sid: str, digest: str, cls: Any) -> Any:
        read.append(digest)
        return get_part(sid, digest, cls)

    monkeypatch.setattr(store, "get_compile_part", counted)
    for path in ("/", "/s/long", "/s/long?page=1"):
        status, page, _ = await _get(daemon, path)
        assert status == 200 and "long" in page, path
    assert read == []
    from ctxcc.v1 import compile_service_pb2 as cpb

    await api.compiles.Compile(cpb.CompileRequest(rebuild_compile_id=last.compile_id))
    rebuild = len(read)
    assert rebuild > 0
    read.clear()
    status, page, _ = await _get(daemon, "/s/long/step?seq=900")
    assert status == 200 and last.compile_id in page
    assert len(read) == rebuild  # the rebuilt compile's own table, no other


async def test_the_timeline_chart_is_made_off_the_event_loop(
    daemon: Daemon, unix_api: Stubs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chart and rows of every compile (once a page of the timeline) were made on the
    event loop, which also serves gRPC: ~0.8 s of it at 8,000 compiles. They are made on a
    thread."""
    import threading

    from server.web import charts

    api = unix_api
    await _session(api, "tl")
    for i in range(3):
        await api.sessions.AppendEvents(
            spb.AppendEventsRequest(session_id="tl", events=[user(f"{i}")])
        )
        await api.compiles.Compile(compile_request("tl"))
    made_on: list[threading.Thread] = []
    timeline = charts.timeline

    def watched(records: Any, full_window: bool = False) -> Any:
        made_on.append(threading.current_thread())
        return timeline(records, full_window=full_window)

    monkeypatch.setattr(charts, "timeline", watched)
    status, page, _ = await _get(daemon, "/s/tl")
    assert status == 200 and "tl" in page
    assert len(made_on) == 1 and made_on[0] is not threading.main_thread()


async def test_the_timeline_pages_through_a_long_session(
    daemon: Daemon, unix_api: Stubs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`?all=1` drew every compile on one page, ~2 KB each without a bound; the timeline
    now shows a page of compiles (newest first) with links to the older and newer ones,
    and each row keeps its number and its diff against the previous compile of its
    route, also across a page's edge."""
    from server.web import pages

    monkeypatch.setattr(pages, "MAX_TIMELINE", 3)
    api = unix_api
    await _session(api, "paged")
    ids = []
    for i in range(8):
        await api.sessions.AppendEvents(
            spb.AppendEventsRequest(session_id="paged", events=[user(f"{i}")])
        )
        ids.append((await api.compiles.Compile(compile_request("paged"))).view.compile_id)

    def rows(page: str) -> list[tuple[int, str]]:
        found = re.findall(r'<tr data-compile="([^"]+)"[^>]*>\s*<td>(\d+)</td>', page)
        return [(int(n), cid) for cid, n in found]

    seen: list[tuple[int, str]] = []
    path: str | None = "/s/paged"
    while path is not None:
        status, page, _ = await _get(daemon, path)
        assert status == 200
        shown = rows(page)
        assert 0 < len(shown) <= 3
        seen = shown + seen
        for n, cid in shown:
            if n > 1:  # a diff against the compile before it, even on the page before
                assert f"from={quote(ids[n - 2])}&amp;to={quote(cid)}" in page
        older = re.search(r'id="older-compiles" href="([^"]+)"', page)
        path = html.unescape(older.group(1)) if older else None
    assert seen == [(n, cid) for n, cid in enumerate(ids, 1)]
    _, newest, _ = await _get(daemon, "/s/paged")
    assert "newer-compiles" not in newest and "Compiles 6\u20138 of 8" in newest
    _, past, _ = await _get(daemon, "/s/paged?page=99")  # past the end: the oldest page
    assert rows(past) == [(1, ids[0]), (2, ids[1])] and "older-compiles" not in past
    newer = re.search(r'id="newer-compiles" href="([^"]+)"', past)
    assert newer is not None and html.unescape(newer.group(1)) == "/s/paged?page=1"


def _stalled_gets(address: str, path: str, count: int) -> socket.socket:
    """`count` GETs of `path` on one connection (pipelined) whose reader reads nothing:
    more than the kernel's buffers hold (its send buffer is at most 4 MB here)."""
    name, port = address.rsplit(":", 1)
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect((name, int(port)))
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: {address}\r\n\r\n".encode() * count)
    return s


def _read_all(s: socket.socket) -> bytes:
    s.settimeout(120)
    chunks = []
    try:
        while chunk := s.recv(1 << 20):
            chunks.append(chunk)
    except ConnectionResetError:
        pass
    return b"".join(chunks)


async def test_a_page_that_is_not_read_is_given_up(
    daemon: Daemon,
    unix_api: Stubs,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A reader that stopped reading a page held its handler and its few MB for as long as
    its connection stayed open: the page is now written within a time or its connection
    is closed, and the daemon serves the next page."""
    from server.web import server

    monkeypatch.setattr(server, "WRITE_TIMEOUT_S", 1.0)
    api = unix_api
    await _session(api, "stall")
    for _ in range(4):
        await api.sessions.AppendEvents(
            spb.AppendEventsRequest(session_id="stall", events=[user('"' * 150_000)] * 10)
        )
    await api.compiles.Compile(compile_request("stall"))
    ui = str(daemon.endpoints.ui)
    path = "/s/stall/step?format=anthropic_messages"
    status, whole, size = await _get(daemon, path)
    assert status == 200 and size > 3 << 20, size
    count = 4
    s = await asyncio.to_thread(_stalled_gets, ui, path, count)
    with s:
        for _ in range(1200):
            if "was not read within" in caplog.text:
                break
            await asyncio.sleep(0.1)
        assert "was not read within" in caplog.text
        got = await asyncio.to_thread(_read_all, s)
    assert len(got) < count * size  # cut short: the connection was closed
    status, again, _ = await _get(daemon, path)
    assert status == 200 and again == whole


async def test_the_step_and_diff_pages_are_made_off_the_event_loop(
    daemon: Daemon, unix_api: Stubs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The step page's values (the rendered body indented: seconds for a view of 100,000
    messages) and the diff of two views were made on the event loop, which also serves
    gRPC. They are made on a thread."""
    import threading

    from server.web import pages

    api = unix_api
    await _session(api, "off")
    for i in range(2):
        await api.sessions.AppendEvents(
            spb.AppendEventsRequest(session_id="off", events=[user(f"{i}")])
        )
        await api.compiles.Compile(compile_request("off"))
    made_on: dict[str, list[threading.Thread]] = {"body": [], "diff": []}
    from server.service.step_diff import diff_views as diff

    pretty = present.pretty_body

    def pretty_watched(body: str) -> str:
        made_on["body"].append(threading.current_thread())
        return pretty(body)

    def diff_watched(a: Any, b: Any) -> Any:
        made_on["diff"].append(threading.current_thread())
        return diff(a, b)

    monkeypatch.setattr(present, "pretty_body", pretty_watched)
    monkeypatch.setattr(pages, "diff_views", diff_watched)
    status, page, _ = await _get(daemon, "/s/off/step?format=openai_chat")
    assert status == 200 and "&#34;messages&#34;" in page
    status, _, _ = await _get(daemon, "/s/off/diff?a=1&b=2")
    assert status == 200
    assert [len(made_on["body"]), len(made_on["diff"])] == [1, 1]
    assert threading.main_thread() not in made_on["body"] + made_on["diff"]


async def test_tool_call_names_and_ids_are_cut_like_the_rest_of_a_page(
    daemon: Daemon, unix_api: Stubs
) -> None:
    """A tool call's name and id are whatever the model wrote (up to an event's 1 MB):
    the step and diff pages printed them whole, in the call and in its result's header,
    so four calls of 200,000 `<` made pages of 12 MB. They are cut with the call's text."""
    await _session(unix_api, "names")
    size, calls = 200_000, 4
    for i in range(calls):
        name, call_id = "<" * size, f"c{i}" + "<" * size
        await unix_api.sessions.AppendEvents(
            spb.AppendEventsRequest(
                session_id="names",
                events=[assistant("", (call_id, name, "{}")), tool_result(call_id, "ok", name)],
            )
        )
    model = f"model={ROUTE.model}"
    for path in (f"/s/names/step?{model}", f"/s/names/diff?a=1&b={2 * calls}&{model}"):
        status, page, weight = await _get(daemon, path)
        assert status == 200 and weight < PAGE_BOUND, (path, weight)
        assert "more characters left out of this page" in page, path


async def test_a_views_notes_are_cut_like_the_rest_of_a_page(
    daemon: Daemon, unix_api: Stubs
) -> None:
    """A view's notes name what they are about, such as the call id of a result repaired
    or dropped, and there is one per repair: the step page printed every note whole, so
    five results answering no call, each sent twice with an id of 200,000 `<`, made a
    page of 8 MB. The notes are cut to what the page has left after its messages and
    tools, and the page says how many it left out."""
    await _session(unix_api, "notes")
    size, results = 200_000, 5
    for i in range(results):
        call_id = f"r{i}" + "<" * size
        await unix_api.sessions.AppendEvents(
            spb.AppendEventsRequest(
                session_id="notes",
                events=[tool_result(call_id, "ok"), tool_result(call_id, "again")],
            )
        )
    status, page, weight = await _get(daemon, f"/s/notes/step?model={ROUTE.model}")
    assert status == 200 and weight < PAGE_BOUND, weight
    assert re.search(r'<p class="note">[^<]*</p><p class="cut" data-omitted="\d+"', page)
    # A repair and a drop each: cut, they fit the page.
    repairs = re.findall(r'<p class="note">(restored a call|dropped a second result)', page)
    assert len(repairs) == 2 * results and "more notes left out" not in page


async def test_the_timeline_lists_the_newest_checkpoints_and_counts_the_others(
    daemon: Daemon, unix_api: Stubs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The timeline listed every checkpoint of its session, which has no cap on them: a
    session of 20,000 checkpoints made a page of 3.6 MB. It lists the newest ones and
    says how many it left out."""
    from server.web import pages

    monkeypatch.setattr(pages, "MAX_CHECKPOINTS", 3)
    await _session(unix_api, "checkpoints")
    await unix_api.sessions.AppendEvents(
        spb.AppendEventsRequest(session_id="checkpoints", events=[user("hi"), user("more")])
    )
    made = []
    for i in range(5):
        done = await unix_api.compiles.CreateCheckpoint(
            cpb.CreateCheckpointRequest(
                checkpoint=kpb.Checkpoint(
                    session_id="checkpoints",
                    covers_through_seq=1,
                    summary=f"summary {i}",
                    kind=kpb.CHECKPOINT_KIND_MODEL_SUMMARY,
                )
            )
        )
        made.append(done.checkpoint.checkpoint_id)
    status, page, _ = await _get(daemon, "/s/checkpoints")
    assert status == 200
    listed = re.findall(r"<tr><td><code>([^<]+)</code></td>", page)
    assert listed == made[-3:]
    assert "5 checkpoints" in page and 'id="checkpoints-cut"' in page
    assert "The 2 checkpoints before these are not listed" in page


def _post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, str]:
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


@pytest.mark.parametrize(
    ("headers", "body"),
    [
        ({"Content-Type": "multipart/form-data"}, b"x"),  # no boundary
        ({"Content-Type": "multipart/form-data; boundary=zz"}, b"--zz\r\n"),  # cut short
        ({"Content-Type": "application/x-www-form-urlencoded; charset=nope"}, b"token=a"),
        ({"Content-Type": "application/x-www-form-urlencoded; charset=utf-16"}, b"token=a"),
        ({"Content-Type": "multipart/form-data; boundary=zz", "Content-Encoding": "gzip"}, b"x"),
        # Not gzip past its magic: read on after the 400, it put aiohttp's traceback in the log.
        (
            {"Content-Type": "application/x-www-form-urlencoded", "Content-Encoding": "gzip"},
            b"\x1f\x8b" + b"x" * 18,
        ),
    ],
)
async def test_a_sign_in_body_that_cannot_be_read_is_a_bad_request(
    daemon: Daemon, caplog: pytest.LogCaptureFixture, headers: dict[str, str], body: bytes
) -> None:
    """A sign-in form whose body cannot be read (a multipart one without its boundary or
    cut short, an unknown charset, a compression that is none) was a 500, an incident
    with a traceback in the log: it is the sender's fault, a 400."""
    url = f"http://{daemon.endpoints.ui}/login"
    status, page = await asyncio.to_thread(_post, url, body, headers)
    assert status == 400 and "incident" not in page, (status, page)
    assert "The sign-in form could not be read" in page
    await asyncio.sleep(0.5)  # the daemon's handling of the connection after its answer
    assert "inspector page failed" not in caplog.text and "Traceback" not in caplog.text


async def test_an_imported_messages_origin_is_cut_like_the_rest_of_a_page(
    daemon: Daemon, unix_api: Stubs
) -> None:
    """An imported message names the session it came from in any string the client
    sent: the step and diff pages printed it whole on each such message, so ten of
    them from an origin of 200,000 `<` made pages of 8 MB."""
    await _session(unix_api, "imported")
    size, count = 200_000, 10
    event = event_pb2.Event()
    event.imported_message.origin_session_id = "<" * size
    event.imported_message.origin_seq = 1
    event.imported_message.role = event_pb2.MESSAGE_ROLE_USER
    event.imported_message.parts.add(text="hello")
    for _ in range(2):
        await unix_api.sessions.AppendEvents(
            spb.AppendEventsRequest(session_id="imported", events=[event] * (count // 2))
        )
    model = f"model={ROUTE.model}"
    for path in (f"/s/imported/step?{model}", f"/s/imported/diff?a=1&b={count}&{model}"):
        status, page, weight = await _get(daemon, path)
        assert status == 200 and weight < PAGE_BOUND, (path, weight)
        assert "more characters left out of this page" in page, path


async def test_pages_are_made_a_few_at_a_time(
    daemon: Daemon, unix_api: Stubs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Page loads at once wait their turn: at most PAGES_AT_ONCE are made together, on
    threads that hold the GIL the agents' calls need (32 loads at once of a long session's
    step page made 32 together and slowed another session's append and compile from a
    median of 5 ms to 130 ms). Each is still answered."""
    from server.service.inspection import InspectUseCases
    from server.web import pages

    await _session(unix_api, "turns")
    await unix_api.sessions.AppendEvents(
        spb.AppendEventsRequest(session_id="turns", events=[user("hello")])
    )
    await unix_api.compiles.Compile(compile_request("turns"))
    step = InspectUseCases.step
    making, most = 0, 0

    async def step_counted(self: InspectUseCases, *args: Any, **kwargs: Any) -> Any:
        nonlocal making, most
        making += 1
        most = max(most, making)
        try:
            await asyncio.sleep(0.3)  # long enough that the loads below overlap
            return await step(self, *args, **kwargs)
        finally:
            making -= 1

    monkeypatch.setattr(InspectUseCases, "step", step_counted)
    loads = 3 * pages.PAGES_AT_ONCE + 2
    # An asyncio client: threads of the loop's default pool, which this in-process
    # daemon renders its pages on, would wait on pages that wait for them.
    async with aiohttp.ClientSession() as client:

        async def load() -> int:
            async with client.get(f"http://{daemon.endpoints.ui}/s/turns/step") as r:
                await r.read()
                return r.status

        statuses = await asyncio.gather(*(load() for _ in range(loads)))
    assert statuses == [200] * loads
    print(f"{loads} step pages at once: at most {most} made together")
    assert most == pages.PAGES_AT_ONCE


def _raw_head(ui: str, path: str, header: bytes) -> bytes:
    name, port = ui.rsplit(":", 1)
    with socket.create_connection((name, int(port)), timeout=30) as s:
        s.sendall(
            f"GET {path} HTTP/1.1\r\nHost: {ui}\r\nConnection: close\r\n".encode()
            + header
            + b"\r\n\r\n"
        )
        return s.recv(64)


async def test_credentials_that_are_not_utf8_are_refused_without_an_incident(
    short_tmp: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """With a token configured, an Authorization header or sign-in cookie holding bytes
    that are not UTF-8 was a 500 and a traceback in the log (the value, decoded with
    surrogates, could not be encoded to compare): before any sign-in. It is one that
    does not match: to the sign-in page."""
    from tests.conftest import make_config

    token = short_tmp / "token"
    token.write_text("correct-horse-battery-staple\n")
    d = Daemon(make_config(short_tmp / "data", auth_token_file=str(token)))
    await d.start()
    try:
        ui = str(d.endpoints.ui)
        for header in (
            b"Authorization: Bearer \xff\xfe",
            b"Cookie: ctxcc_ui=\xff\xfe",
            b"Authorization: Bearer correct-horse-battery-staple\xff",
        ):
            head = await asyncio.to_thread(_raw_head, ui, "/", header)
            assert head.startswith(b"HTTP/1.1 303 "), (header, head)
        good = b"Authorization: Bearer correct-horse-battery-staple"
        head = await asyncio.to_thread(_raw_head, ui, "/", good)
        assert head.startswith(b"HTTP/1.1 200 "), head
    finally:
        await d.stop()
    assert "inspector page failed" not in caplog.text
    assert "Traceback" not in caplog.text


async def test_pages_whose_readers_went_away_while_they_waited_are_not_made(
    daemon: Daemon,
    unix_api: Stubs,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Loads sent and closed at once wait their turn (PAGES_AT_ONCE) and were then made
    for nobody, one after another: 60 of a long session's step page kept everyone else's
    pages waiting 19 s. A page whose connection is gone when its turn comes is not made."""
    from server.service.inspection import InspectUseCases
    from server.web import pages

    await _session(unix_api, "gone")
    await unix_api.sessions.AppendEvents(
        spb.AppendEventsRequest(session_id="gone", events=[user("hello")])
    )
    await unix_api.compiles.Compile(compile_request("gone"))
    step = InspectUseCases.step
    made = 0

    async def step_slow(self: InspectUseCases, *args: Any, **kwargs: Any) -> Any:
        nonlocal made
        made += 1
        await asyncio.sleep(0.3)
        return await step(self, *args, **kwargs)

    monkeypatch.setattr(InspectUseCases, "step", step_slow)
    ui = str(daemon.endpoints.ui)
    name, port = ui.rsplit(":", 1)
    loop = asyncio.get_running_loop()
    gone = []
    for _ in range(12):
        s = socket.socket()
        s.setblocking(False)
        await loop.sock_connect(s, (name, int(port)))
        await loop.sock_sendall(s, f"GET /s/gone/step HTTP/1.1\r\nHost: {ui}\r\n\r\n".encode())
        gone.append(s)
    await asyncio.sleep(0.1)  # the daemon has read them: the first are being made
    for s in gone:
        s.close()
    status, _, _ = await _get(daemon, "/s/gone/step")
    assert status == 200
    print(f"12 loads closed while they waited: {made - 1} made")
    # Those already being made when they closed, and this test's own.
    assert made <= pages.PAGES_AT_ONCE + 1
    assert "Traceback" not in caplog.text


async def test_a_body_no_page_reads_is_not_read_on(
    daemon: Daemon, caplog: pytest.LogCaptureFixture
) -> None:
    """A GET with a body declared gzip that is not: its page never reads it, and aiohttp
    read it after the answer to keep the connection, and logged the decoding error with
    a traceback, for every such request (any local client could fill the log). The
    connection is closed after the answer instead."""
    ui = str(daemon.endpoints.ui)
    name, port = ui.rsplit(":", 1)
    for path in ("/", "/static/inspector.css", "/nope"):
        with socket.create_connection((name, int(port)), timeout=30) as s:
            s.sendall(
                f"GET {path} HTTP/1.1\r\nHost: {ui}\r\nContent-Encoding: gzip\r\n".encode()
                + b"Content-Length: 20\r\n\r\n\x1f\x8b"
                + b"x" * 18
            )
            answer = b""
            while chunk := await asyncio.to_thread(s.recv, 65536):
                answer += chunk  # to the close
        assert answer.startswith((b"HTTP/1.1 200 ", b"HTTP/1.1 404 ")), (path, answer[:40])
    await asyncio.sleep(0.5)  # the daemon's handling of the connections after the answers
    assert "Traceback" not in caplog.text
