"""A DeleteSession whose storage thread hands its result back to the event loop only
after the session was made again under its id and watched: what the delete then drops
from memory is the deleted session's alone. It used to end every watch of the id, so the
new session's watch answered SESSION_NOT_FOUND although its session exists (and the new
session's pending count, memos and repeatable views went with the old one's)."""

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


async def _append(api: Stubs, sid: str, text: str) -> None:
    await api.sessions.AppendEvents(spb.AppendEventsRequest(session_id=sid, events=[user(text)]))


async def test_a_delete_landing_late_ends_only_the_deleted_sessions_watches(
    daemon: Daemon, unix_api: Stubs, monkeypatch: pytest.MonkeyPatch
) -> None:
    api, sid = unix_api, "remade"
    create = spb.CreateSessionRequest(session=session_pb2.Session(session_id=sid))
    await api.sessions.CreateSession(create)
    await _append(api, sid, "old 1")
    old_watch = api.sessions.WatchSession(spb.WatchSessionRequest(session_id=sid))
    old_updates = old_watch.__aiter__()
    assert await next_user_event(old_updates) == (1, "old 1")

    store = daemon._store
    assert store is not None
    delete = store.delete_session
    deleted, release = threading.Event(), threading.Event()

    def descheduled_after_deleting(session_id: str) -> Any:
        result = delete(session_id)
        deleted.set()
        release.wait(30)  # handed back to the loop once the session is made again
        return result

    monkeypatch.setattr(store, "delete_session", descheduled_after_deleting)
    gone = asyncio.ensure_future(
        api.sessions.DeleteSession(spb.DeleteSessionRequest(session_id=sid))
    )
    assert await asyncio.to_thread(deleted.wait, 30)
    await api.sessions.CreateSession(create)
    watch = api.sessions.WatchSession(spb.WatchSessionRequest(session_id=sid))
    updates = watch.__aiter__()
    await _append(api, sid, "new 1")
    assert await next_user_event(updates) == (1, "new 1")  # subscribed to the new log

    release.set()
    assert (await gone).deleted_events == 1
    # The old session's watch ends with the delete ...
    with pytest.raises(grpc.aio.AioRpcError) as ended:
        await next_user_event(old_updates)
    assert ended.value.code() == grpc.StatusCode.NOT_FOUND
    assert error_info(ended.value).reason == "SESSION_NOT_FOUND"
    # ... the new one's goes on.
    await _append(api, sid, "new 2")
    try:
        assert await next_user_event(updates) == (2, "new 2")
    finally:
        watch.cancel()
