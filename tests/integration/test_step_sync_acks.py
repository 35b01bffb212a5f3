"""A step's append is fsynced beside its compile: nothing that acknowledges it (a
replay, a watch, a unary compile or a repeat of its view) may answer before the log
sync that makes it durable."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ctxcc.v1 import common_pb2
from ctxcc.v1 import session_service_pb2 as spb
from server.app import Daemon
from tests.conftest import Stubs
from tests.helpers import user
from tests.integration.test_step_hop import _HeldSync
from tests.integration.test_step_usage import Steps, _compile, _new_session


async def test_a_retried_step_is_not_answered_as_replayed_before_the_original_is_synced(
    daemon: Daemon, api: Stubs
) -> None:
    """A client whose stream broke mid-step retries the step (same request_id, same
    events) on a new stream while the first step's fsync is still owed: the retry finds
    the first's unsynced idempotency record and must not acknowledge it (replayed) before
    that record is durable."""
    await _new_session(api, "rr")
    first_stream, retry_stream = Steps(api), Steps(api)
    assert daemon._store is not None
    kv: Any = daemon._store._kv
    held = _HeldSync(kv._db)
    try:
        await first_stream.step(_compile("rr"), [user("one", "e1")], request_id="a")
        kv._db = held
        first = asyncio.ensure_future(
            first_stream.step(_compile("rr"), [user("two", "e2")], request_id="b")
        )
        assert await asyncio.to_thread(held.syncing.wait, 10)
        retry = asyncio.ensure_future(
            retry_stream.step(_compile("rr"), [user("two", "e2")], request_id="b")
        )
        await asyncio.wait([retry], timeout=2)
        early = retry.done()
        held.release.set()
        [answer] = await retry
        assert answer.append.replayed and answer.append.last_seq == 2, answer
        assert not early, "a replay was acknowledged before the append it replays was synced"
        await first
    finally:
        held.release.set()
        kv._db = held._db
        await first_stream.close()
        await retry_stream.close()


async def test_a_retried_unary_append_is_not_answered_before_the_step_is_synced(
    daemon: Daemon, api: Stubs
) -> None:
    """The same retry by unary AppendEvents (a storage thread, as before the change)."""
    await _new_session(api, "ru")
    steps = Steps(api)
    assert daemon._store is not None
    kv: Any = daemon._store._kv
    held = _HeldSync(kv._db)
    try:
        await steps.step(_compile("ru"), [user("one", "e1")], request_id="a")
        kv._db = held
        step = asyncio.ensure_future(
            steps.step(_compile("ru"), [user("two", "e2")], request_id="b")
        )
        assert await asyncio.to_thread(held.syncing.wait, 10)
        retry = asyncio.ensure_future(
            api.sessions.AppendEvents(
                spb.AppendEventsRequest(session_id="ru", events=[user("two", "e2")], request_id="b")
            )
        )
        await asyncio.wait([retry], timeout=2)
        early = retry.done()
        held.release.set()
        await retry
        assert not early, "a replay was acknowledged before the append it replays was synced"
        await step
    finally:
        held.release.set()
        kv._db = held._db
        await steps.close()


async def test_a_watch_does_not_send_a_steps_event_before_its_append_is_synced(
    daemon: Daemon, api: Stubs
) -> None:
    """A watch that subscribes while a step's fsync is owed reads its backlog from the
    log, which already holds the step's unsynced events: they must not be sent before
    they are durable (the step itself is not answered yet)."""
    await _new_session(api, "rw")
    steps = Steps(api)
    assert daemon._store is not None
    kv: Any = daemon._store._kv
    held = _HeldSync(kv._db)
    watch = None
    try:
        await steps.step(_compile("rw"), [user("one", "e1")], request_id="a")
        kv._db = held
        step = asyncio.ensure_future(
            steps.step(_compile("rw"), [user("two", "e2")], request_id="b")
        )
        assert await asyncio.to_thread(held.syncing.wait, 10)
        watch = api.sessions.WatchSession(spb.WatchSessionRequest(session_id="rw", after_seq=1))
        updates = watch.__aiter__()
        got = asyncio.ensure_future(updates.__anext__())
        await asyncio.wait([got], timeout=2)
        early = got.done()
        held.release.set()
        update = await asyncio.wait_for(got, 10)
        assert update.event.seq == 2, update
        assert not early, "a watcher got an event before the append that wrote it was synced"
        await step
    finally:
        held.release.set()
        kv._db = held._db
        if watch is not None:
            watch.cancel()
        await steps.close()


@pytest.mark.parametrize("other_route", [False, True], ids=["repeat", "compiled"])
async def test_a_unary_compile_does_not_answer_a_view_of_a_steps_unsynced_events(
    daemon: Daemon, api: Stubs, other_route: bool
) -> None:
    """A Compile of the session while a step's fsync is owed: on the step's route it
    repeats the step's view (kept before the sync), on another it reads the step's events
    from the log; either view must not be answered before they are durable."""
    await _new_session(api, "rc")
    steps = Steps(api)
    assert daemon._store is not None
    kv: Any = daemon._store._kv
    held = _HeldSync(kv._db)
    try:
        await steps.step(_compile("rc"), [user("one", "e1")], request_id="a")
        kv._db = held
        step = asyncio.ensure_future(
            steps.step(_compile("rc"), [user("two", "e2")], request_id="b")
        )
        assert await asyncio.to_thread(held.syncing.wait, 10)
        route = common_pb2.Route(
            connection="default", protocol="openai-chat", endpoint="api", model="gpt-4o"
        )
        request = _compile("rc", route) if other_route else _compile("rc")
        compiled = asyncio.ensure_future(api.compiles.Compile(request))
        await asyncio.wait([compiled], timeout=2)
        early = compiled.done()
        held.release.set()
        view = (await compiled).view
        assert view.event_boundary == 2
        assert not early, "a view of events not yet durable was answered"
        await step
    finally:
        held.release.set()
        kv._db = held._db
        await steps.close()
