"""The Python client's `watch` reopens after a daemon restart from the last event it
delivered. When the session was deleted and made again under its id while the watch was
away, the reopened watch must not go on into the new log as if it continued the old one
(the new log's seqs restart at 1: its events past the old position would be delivered
as the old session's next ones); it ends NOT_FOUND (SESSION_NOT_FOUND), as an open watch
of a deleted session does. Found by scripts/stress_durability.py."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
import pytest
from ctxcc_client import AsyncClient, CtxccError

from ctxcc.v1 import session_service_pb2 as spb
from tests.e2e.proc import FAST_RECONNECT, DaemonProcess
from tests.helpers import user


async def _next_event_texts(watch: object, n: int) -> list[tuple[int, str]]:
    got: list[tuple[int, str]] = []
    it = watch.__aiter__()  # type: ignore[attr-defined]
    while len(got) < n:
        msg = await it.__anext__()
        if msg.HasField("event"):
            got.append((msg.event.seq, msg.event.user_message.parts[0].text))
    return got


def _two_daemons(short_tmp: Path) -> tuple[DaemonProcess, DaemonProcess]:
    """A daemon serving, and another (not started) for the same data directory on another
    socket, which the watch does not know: the session is deleted and made again there
    while the watch keeps retrying."""
    data = short_tmp / "data"
    daemon = DaemonProcess(data).start()
    daemon.wait_ready()
    other = DaemonProcess(
        data, "--socket", str(short_tmp / "other.sock"), log_path=short_tmp / "other.log"
    )
    return daemon, other


def test_watch_does_not_follow_a_session_made_again_while_it_was_away(short_tmp: Path) -> None:
    daemon, other = _two_daemons(short_tmp)
    target = daemon.target

    async def run() -> None:
        async with AsyncClient(target, options=FAST_RECONNECT, retry_seconds=120) as c:
            await c.create_session("w")
            await c.append("w", [user(f"old {i}") for i in range(1, 4)])
            watch = c.watch("w")
            assert await _next_event_texts(watch, 3) == [(1, "old 1"), (2, "old 2"), (3, "old 3")]
            pending = asyncio.ensure_future(_next_event_texts(watch, 1))
            await asyncio.sleep(0.2)  # the watch is waiting for its 4th event
            daemon.kill()
            await _made_again_meanwhile(daemon, other, "w", 5)
            await _ends_session_not_found(pending)

    try:
        asyncio.run(run())
    finally:
        other.ensure_stopped()
        assert daemon.terminate() == 0


async def _made_again_meanwhile(
    daemon: DaemonProcess, other: DaemonProcess, sid: str, events: int
) -> None:
    """While `daemon` is down: `other`, on the same data directory, deletes the session,
    makes it again and writes `events` events to it; then `daemon` starts again."""
    other.start()
    await asyncio.to_thread(other.wait_ready)
    async with AsyncClient(other.target) as o:
        await o.sessions.DeleteSession(spb.DeleteSessionRequest(session_id=sid))
        await o.create_session(sid)
        await o.append(sid, [user(f"new {i}") for i in range(1, events + 1)])
    assert await asyncio.to_thread(other.terminate) == 0
    daemon.start()
    await asyncio.to_thread(daemon.wait_ready)


async def _ends_session_not_found(pending: asyncio.Future[list[tuple[int, str]]]) -> None:
    with pytest.raises(CtxccError) as caught:
        got = await asyncio.wait_for(pending, 120)
        raise AssertionError(f"the watch went on into the new session's log: {got}")
    assert caught.value.code == grpc.StatusCode.NOT_FOUND
    assert caught.value.reason == "SESSION_NOT_FOUND"


def _wait_watched(daemon: DaemonProcess, timeout: float = 60) -> None:
    """Polls the watchers gauge until the watch is subscribed: the daemon counts it once
    it has handed over the header naming the session's create time."""
    deadline = time.monotonic() + timeout
    while daemon.metric("ctxcc_watchers") < 1:
        assert time.monotonic() < deadline, f"the watch was not subscribed in {timeout}s"
        time.sleep(0.05)


def test_watch_that_delivered_nothing_does_not_follow_a_session_made_again(
    short_tmp: Path,
) -> None:
    """A watch that delivered no event has none to ask for again when it reopens: the
    create time in the daemon's header is what tells it that the session under the id is
    another one now. Before, it went on into the new log from after_seq 0."""
    daemon, other = _two_daemons(short_tmp)
    target = daemon.target

    async def run() -> None:
        async with AsyncClient(target, options=FAST_RECONNECT, retry_seconds=120) as c:
            await c.create_session("q")
            pending = asyncio.ensure_future(_next_event_texts(c.watch("q"), 1))
            await asyncio.to_thread(_wait_watched, daemon)
            # Stopped cleanly: the watch ends SHUTTING_DOWN after its header, and reopens.
            assert await asyncio.to_thread(daemon.terminate) == 0
            await _made_again_meanwhile(daemon, other, "q", 3)
            await _ends_session_not_found(pending)

    try:
        asyncio.run(run())
    finally:
        other.ensure_stopped()
        assert daemon.terminate() == 0


def test_watch_reopened_on_the_same_log_misses_and_repeats_nothing(short_tmp: Path) -> None:
    """The other side of the check above: a restart that keeps the session (the events
    the watch delivered are still there) goes on after the last of them, with the event
    asked for again to check it not delivered twice."""
    data = short_tmp / "data"
    daemon = DaemonProcess(data).start()
    daemon.wait_ready()
    target = daemon.target

    async def run() -> None:
        async with AsyncClient(target, options=FAST_RECONNECT, retry_seconds=120) as c:
            await c.create_session("w")
            await c.append("w", [user(f"a {i}") for i in range(1, 4)])
            watch = c.watch("w")
            assert [s for s, _ in await _next_event_texts(watch, 3)] == [1, 2, 3]
            pending = asyncio.ensure_future(_next_event_texts(watch, 4))
            await asyncio.sleep(0.2)
            daemon.kill()
            daemon.start()
            await asyncio.to_thread(daemon.wait_ready)
            await c.append("w", [user(f"b {i}") for i in range(4, 8)])
            got = await asyncio.wait_for(pending, 120)
            assert got == [(4, "b 4"), (5, "b 5"), (6, "b 6"), (7, "b 7")]

    try:
        asyncio.run(run())
    finally:
        assert daemon.terminate() == 0
