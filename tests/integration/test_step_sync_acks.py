"""A step's append is fsynced beside its compile: nothing that acknowledges it (a
replay, a watch, a unary compile or a repeat of its view) may answer before the log
sync that makes it durable."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

import pytest

from ctxcc.v1 import common_pb2
from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_service_pb2 as spb
from server.app import Daemon
from tests.conftest import Stubs
from tests.helpers import user
from tests.integration.test_step_hop import _HeldSync
from tests.integration.test_step_usage import Steps, _compile, _new_session

T = TypeVar("T")


@contextlib.asynccontextmanager
async def held_second_step(
    daemon: Daemon, api: Stubs, sid: str, steps: Steps
) -> AsyncIterator[tuple[_HeldSync, asyncio.Future[list[cpb.CompileStreamResponse]]]]:
    """Session `sid` made and stepped once (request "a", event e1), then its second step
    (request "b", event e2) started with the daemon's log sync held: the hold and the
    step's pending answer. The sync is let go and the engine's handle put back after."""
    await _new_session(api, sid)
    assert daemon._store is not None
    kv: Any = daemon._store._kv
    held = _HeldSync(kv._db)
    try:
        await steps.step(_compile(sid), [user("one", "e1")], request_id="a")
        kv._db = held
        step = asyncio.ensure_future(steps.step(_compile(sid), [user("two", "e2")], request_id="b"))
        assert await asyncio.to_thread(held.syncing.wait, 10)
        yield held, step
        await step
    finally:
        held.release.set()
        kv._db = held._db
        await steps.close()


async def before_and_after_the_sync(held: _HeldSync, call: Awaitable[T]) -> tuple[bool, T]:
    """Whether `call` was answered within 2 s while the sync was held, and its answer
    once the sync is let go."""
    pending = asyncio.ensure_future(call)
    await asyncio.wait([pending], timeout=2)
    early = pending.done()
    held.release.set()
    return early, await asyncio.wait_for(pending, 10)


async def test_a_retried_step_is_not_answered_as_replayed_before_the_original_is_synced(
    daemon: Daemon, api: Stubs
) -> None:
    """A client whose stream broke mid-step retries the step (same request_id, same
    events) on a new stream while the first step's fsync is still owed: the retry finds
    the first's unsynced idempotency record and must not acknowledge it (replayed) before
    that record is durable."""
    retry_stream = Steps(api)
    try:
        async with held_second_step(daemon, api, "rr", Steps(api)) as (held, _):
            retry = retry_stream.step(_compile("rr"), [user("two", "e2")], request_id="b")
            early, [answer] = await before_and_after_the_sync(held, retry)
            assert answer.append.replayed and answer.append.last_seq == 2, answer
            assert not early, "a replay was acknowledged before the append it replays was synced"
    finally:
        await retry_stream.close()


async def test_a_retried_unary_append_is_not_answered_before_the_step_is_synced(
    daemon: Daemon, api: Stubs
) -> None:
    """The same retry by unary AppendEvents."""
    async with held_second_step(daemon, api, "ru", Steps(api)) as (held, _):
        retry = api.sessions.AppendEvents(
            spb.AppendEventsRequest(session_id="ru", events=[user("two", "e2")], request_id="b")
        )
        early, answer = await before_and_after_the_sync(held, retry)
        assert answer.replayed and answer.last_seq == 2, answer
        assert not early, "a replay was acknowledged before the append it replays was synced"


async def test_a_watch_does_not_send_a_steps_event_before_its_append_is_synced(
    daemon: Daemon, api: Stubs
) -> None:
    """A watch that subscribes while a step's fsync is owed reads its backlog from the
    log, which already holds the step's unsynced events: they must not be sent before
    they are durable (the step itself is not answered yet)."""
    watch = None
    try:
        async with held_second_step(daemon, api, "rw", Steps(api)) as (held, _):
            request = spb.WatchSessionRequest(session_id="rw", after_seq=1)
            watch = api.sessions.WatchSession(request)
            early, update = await before_and_after_the_sync(held, watch.__aiter__().__anext__())
            assert update.event.seq == 2, update
            assert not early, "a watcher got an event before the append that wrote it was synced"
    finally:
        if watch is not None:
            watch.cancel()


@pytest.mark.parametrize("other_route", [False, True], ids=["repeat", "compiled"])
async def test_a_unary_compile_does_not_answer_a_view_of_a_steps_unsynced_events(
    daemon: Daemon, api: Stubs, other_route: bool
) -> None:
    """A Compile of the session while a step's fsync is owed: on the step's route it
    repeats the step's view (kept before the sync), on another it reads the step's events
    from the log; either view must not be answered before they are durable."""
    async with held_second_step(daemon, api, "rc", Steps(api)) as (held, _):
        route = common_pb2.Route(
            connection="default", protocol="openai-chat", endpoint="api", model="gpt-4o"
        )
        request = _compile("rc", route) if other_route else _compile("rc")
        early, answer = await before_and_after_the_sync(held, api.compiles.Compile(request))
        assert answer.view.event_boundary == 2
        assert not early, "a view of events not yet durable was answered"
