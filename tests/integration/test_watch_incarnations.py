"""A session deleted and made again under its id is a new log: its watchers must never be
handed an update of the old one. An append to the old session whose result reaches the
event loop only after the delete, the re-creation and a new watch (its storage thread was
descheduled after the write) used to be published by session id alone: the new session's
watcher got the old log's seq 3 as its next event, and then skipped the new log's own seq 2
and 3 as already sent. Found by scripts/stress_durability.py (a watch of a session deleted
and made again without waiting for its appends: "seq 1225 after 0")."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import grpc
import pytest

from ctxcc.v1 import session_pb2
from ctxcc.v1 import session_service_pb2 as spb
from server.app import Daemon
from tests.conftest import Stubs
from tests.helpers import error_info, next_user_event, user


async def _append(api: Stubs, sid: str, text: str) -> Any:
    return await api.sessions.AppendEvents(
        spb.AppendEventsRequest(session_id=sid, events=[user(text)])
    )


async def test_an_old_sessions_append_landing_late_never_reaches_the_new_sessions_watch(
    daemon: Daemon, api: Stubs, monkeypatch: pytest.MonkeyPatch
) -> None:
    sid = "remade"
    create = spb.CreateSessionRequest(session=session_pb2.Session(session_id=sid))
    await api.sessions.CreateSession(create)
    await _append(api, sid, "old 1")
    await _append(api, sid, "old 2")
    store = daemon._store
    assert store is not None
    append = store.append
    wrote, release = threading.Event(), threading.Event()

    def descheduled_after_writing_old_3(batch: Any) -> Any:
        written = append(batch)
        if batch.events[0].payload.parts[0].text == "old 3":
            wrote.set()
            release.wait(30)  # handed back to the loop only once the session is made again
        return written

    monkeypatch.setattr(store, "append", descheduled_after_writing_old_3)
    late = asyncio.ensure_future(_append(api, sid, "old 3"))
    assert await asyncio.to_thread(wrote.wait, 30)

    await api.sessions.DeleteSession(spb.DeleteSessionRequest(session_id=sid))
    await api.sessions.CreateSession(create)
    watch = api.sessions.WatchSession(spb.WatchSessionRequest(session_id=sid))
    updates = watch.__aiter__()
    await _append(api, sid, "new 1")
    assert await next_user_event(updates) == (1, "new 1")  # subscribed to the new log

    release.set()
    assert (await late).last_seq == 3  # the old log's append, answered
    await _append(api, sid, "new 2")
    await _append(api, sid, "new 3")
    try:
        assert await next_user_event(updates) == (2, "new 2")
        assert await next_user_event(updates) == (3, "new 3")
    finally:
        watch.cancel()


# A watch catches up in pages of this many events (ServiceLimits.max_page_size).
PAGE = 1_000


async def _append_many(api: Stubs, sid: str, prefix: str, count: int) -> None:
    for start in range(1, count + 1, PAGE):
        texts = [f"{prefix} {i}" for i in range(start, min(count, start + PAGE - 1) + 1)]
        await api.sessions.AppendEvents(
            spb.AppendEventsRequest(session_id=sid, events=[user(t) for t in texts])
        )


@pytest.mark.parametrize("held_after", [0, PAGE], ids=["first_page", "second_page"])
async def test_a_catch_up_page_read_after_the_session_is_made_again_ends_the_watch(
    daemon: Daemon, api: Stubs, monkeypatch: pytest.MonkeyPatch, held_after: int
) -> None:
    """A watch reads its backlog from the log in pages, by session id. The session deleted
    and made again (with a log as long) before a page's read used to hand the watcher of
    the old session that page of the new log, at the seqs it expected next of the old one,
    before its watch ended with SESSION_NOT_FOUND. The page read here is held in its
    storage thread (before it reads) until the session is made again and written to."""
    sid = "paged"
    create = spb.CreateSessionRequest(session=session_pb2.Session(session_id=sid))
    await api.sessions.CreateSession(create)
    await _append_many(api, sid, "old", held_after + 2)
    store = daemon._store
    assert store is not None
    read_page = store.read_event_page
    reading, release = threading.Event(), threading.Event()

    def held_page(session_id: str, after_seq: int, limit: int, *args: Any) -> Any:
        if (session_id, after_seq, limit) == (sid, held_after, PAGE) and not reading.is_set():
            reading.set()
            assert release.wait(30)
        return read_page(session_id, after_seq, limit, *args)

    monkeypatch.setattr(store, "read_event_page", held_page)
    watch = api.sessions.WatchSession(spb.WatchSessionRequest(session_id=sid), timeout=60)
    got: list[tuple[int, str]] = []

    async def collect() -> grpc.RpcError | None:
        try:
            async for msg in watch:
                if msg.HasField("event"):
                    got.append((msg.event.seq, msg.event.user_message.parts[0].text))
        except grpc.RpcError as err:
            return err
        return None

    collected = asyncio.ensure_future(collect())
    try:
        assert await asyncio.to_thread(reading.wait, 30)
        await api.sessions.DeleteSession(spb.DeleteSessionRequest(session_id=sid))
        await api.sessions.CreateSession(create)
        await _append_many(api, sid, "new", held_after + 2)
    finally:
        release.set()
    err = await collected
    assert got == [(i, f"old {i}") for i in range(1, held_after + 1)]
    assert err is not None
    assert err.code() == grpc.StatusCode.NOT_FOUND
    assert error_info(err).reason == "SESSION_NOT_FOUND"


async def test_a_watch_tells_the_create_time_of_the_session_it_follows_in_its_header(
    api: Stubs,
) -> None:
    """Sent once subscribed, before any update (here none ever comes): a client that got
    nothing else from the watch can still tell, when it reopens it, whether the session
    under the id is the one it watched."""
    made = await api.sessions.CreateSession(
        spb.CreateSessionRequest(session=session_pb2.Session(session_id="quiet"))
    )
    # The deadline only keeps a daemon that sends no header from hanging the test.
    watch = api.sessions.WatchSession(spb.WatchSessionRequest(session_id="quiet"), timeout=30)
    try:
        header = dict(await watch.initial_metadata())
        assert header["ctxcc-session-create-time-ns"] == str(
            made.session.create_time.ToNanoseconds()
        )
    finally:
        watch.cancel()


async def test_a_live_gap_read_after_the_session_is_made_again_ends_the_watch(
    daemon: Daemon, api: Stubs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once live, a watch that is handed an event past the next seq (an earlier append
    published later) reads the gap from the log by session id. The session deleted and
    made again before that read must end the watch, never hand it the new log's event at
    the seq the old one left open. The publish of the old log's seq 2 is held back here so
    that its seq 3 opens the gap, and the gap's read is held until the new log has a seq 2."""
    sid = "gapped"
    create = spb.CreateSessionRequest(session=session_pb2.Session(session_id=sid))
    await api.sessions.CreateSession(create)
    await _append(api, sid, "old 1")
    hub, store = daemon.hub, daemon._store
    assert store is not None
    publish, read_page = hub.publish, store.read_event_page
    created = (await api.sessions.GetSession(spb.GetSessionRequest(session_id=sid))).session

    def without_seq_2(session_id: str, updates: list[Any], head_seq: int, inc: int = 0) -> None:
        kept = [u for u in updates if not (session_id == sid and getattr(u, "seq", 0) == 2)]
        publish(session_id, kept, head_seq, inc)

    reading, release = threading.Event(), threading.Event()

    def held_gap(session_id: str, after_seq: int, limit: int, *args: Any) -> Any:
        if (session_id, after_seq, limit) == (sid, 1, 1) and not reading.is_set():
            reading.set()
            assert release.wait(30)
        return read_page(session_id, after_seq, limit, *args)

    monkeypatch.setattr(hub, "publish", without_seq_2)
    monkeypatch.setattr(store, "read_event_page", held_gap)
    watch = api.sessions.WatchSession(spb.WatchSessionRequest(session_id=sid), timeout=60)
    updates = watch.__aiter__()
    assert await next_user_event(updates) == (1, "old 1")  # caught up: the watch is live
    got: list[tuple[int, str]] = []

    async def collect() -> grpc.RpcError | None:
        try:
            while True:
                got.append(await next_user_event(updates))
        except grpc.RpcError as err:
            return err

    collected = asyncio.ensure_future(collect())
    try:
        await _append(api, sid, "old 2")  # not published: the log holds it
        await _append(api, sid, "old 3")  # published: seq 3 after 1, a gap to read
        assert await asyncio.to_thread(reading.wait, 30)
        await api.sessions.DeleteSession(spb.DeleteSessionRequest(session_id=sid))
        await api.sessions.CreateSession(create)
        again = (await api.sessions.GetSession(spb.GetSessionRequest(session_id=sid))).session
        assert again.create_time != created.create_time
        await _append(api, sid, "new 1")
        await _append(api, sid, "new 2")
    finally:
        release.set()
    err = await collected
    assert not [g for g in got if g[1].startswith("new")], got
    assert err is not None
    assert err.code() == grpc.StatusCode.NOT_FOUND
    assert error_info(err).reason == "SESSION_NOT_FOUND"
