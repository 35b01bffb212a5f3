"""A compile still running when its session is deleted and created again under the same
id, through a real daemon. A compile that read the old session must not leave its record
in the new one (as the new session's latest compile, naming parts the deletion removed or
that the store's set of stored parts wrongly claims): it answers as a compile of a
deleted session does. And whatever the moment, the new session's own compiles store the
parts they name, so they rebuild byte for byte."""

from __future__ import annotations

import threading
import time
from typing import Any

import grpc
import pytest

from ctxcc.v1 import session_service_pb2 as spb
from server.domain.model import Session as StoredSession
from tests.helpers import error_info, user
from tests.integration import test_repeat_compiles as repeats
from tests.integration.test_repeat_compiles import SID, Session, _append

# The same session and daemon as test_repeat_compiles.py's cases.
session = repeats.session


class _ReleasedThen:
    """The session's lock, running `then` right after the compile's write lets it go."""

    def __init__(self, lock: threading.Lock, then: Any) -> None:
        self._lock, self._then = lock, then

    def acquire(self, blocking: bool = True) -> bool:
        return self._lock.acquire(blocking)

    def release(self) -> None:
        self._lock.release()
        self._then()


@pytest.mark.parametrize("where", ["before_the_write", "within_the_write", "after_the_write"])
async def test_a_compile_across_its_sessions_delete_and_recreate(
    session: Session, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """The deletion and the new session are placed on the compile's own thread after it
    read the old session: before it writes its record; within that write (after the
    store looked up which of its parts are stored, before it takes the session's lock);
    or right after the write let the lock go (the record went to the old session)."""
    store = session.d._store
    assert store is not None
    await session.compile()  # its parts are stored, and known to be
    await _append(session)  # so that the next compile is not a repeat
    put, lock = store.put_compile, store._lock
    armed: list[bool] = []
    recreated: list[int] = []

    def delete_and_recreate() -> None:
        store.delete_session(SID)
        now = time.time_ns()
        store.create_session(StoredSession(SID, now, now, project_id="p"))
        recreated.append(now)

    def writing(record: Any, *args: Any, **kwargs: Any) -> bool:
        if not recreated and record.session_id == SID:
            if where == "before_the_write":
                delete_and_recreate()
            else:
                armed.append(True)
        return put(record, *args, **kwargs)

    def locking(session_id: str) -> Any:
        if not armed or session_id != SID:
            return lock(session_id)
        armed.clear()
        if where == "after_the_write":
            return _ReleasedThen(lock(session_id), delete_and_recreate)
        delete_and_recreate()
        return lock(session_id)

    monkeypatch.setattr(store, "put_compile", writing)
    monkeypatch.setattr(store, "_lock", locking)
    try:
        await session.api.compiles.Compile(session.request())
        refused = None
    except grpc.aio.AioRpcError as err:
        refused = err
    monkeypatch.undo()
    assert recreated, "the session was deleted and created again during the compile"
    if where == "after_the_write":
        assert refused is None, "its record went to the old session, before the deletion"
    else:
        assert refused is not None, "a compile of the old session answered a view"
        assert refused.code() == grpc.StatusCode.NOT_FOUND
        assert error_info(refused).reason == "SESSION_NOT_FOUND"
    # Nothing of the old session's compile in the new session.
    assert store.list_compiles(SID) == []
    assert store.get_last_compile(SID) is None
    assert store.get_session(SID).create_time_ns == recreated[0]
    assert store.get_session(SID).current_route is None
    # The new session's own compile stores the parts it names: its rebuild is exact.
    await session.api.sessions.AppendEvents(
        spb.AppendEventsRequest(session_id=SID, events=[user("start again")])
    )
    fresh = await session.compile()
    assert [r.compile_id for r in store.list_compiles(SID)] == [fresh.compile_id]
