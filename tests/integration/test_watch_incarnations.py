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

import pytest

from ctxcc.v1 import session_pb2
from ctxcc.v1 import session_service_pb2 as spb
from server.app import Daemon
from tests.conftest import Stubs
from tests.helpers import user


async def _append(api: Stubs, sid: str, text: str) -> Any:
    return await api.sessions.AppendEvents(
        spb.AppendEventsRequest(session_id=sid, events=[user(text)])
    )


async def _next_event(updates: Any) -> tuple[int, str]:
    while True:
        msg = await asyncio.wait_for(updates.__anext__(), 30)
        if msg.HasField("event"):
            return msg.event.seq, msg.event.user_message.parts[0].text


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
    assert await _next_event(updates) == (1, "new 1")  # subscribed to the new log

    release.set()
    assert (await late).last_seq == 3  # the old log's append, answered
    await _append(api, sid, "new 2")
    await _append(api, sid, "new 3")
    try:
        assert await _next_event(updates) == (2, "new 2")
        assert await _next_event(updates) == (3, "new 3")
    finally:
        watch.cancel()
