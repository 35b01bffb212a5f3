"""The bytes WatchSession calls hold in flight are bounded together,
`--max-watch-bytes-in-memory`: a watcher that stops reading keeps its backlog page and the
message gRPC is sending it for as long as its call lives (180 such watchers of 1 MB events
took the daemon from 131 MB to 1,155 MB, past a 768 MiB pod's limit). Past the budget a
watch waits before reading its next page; watchers stalled while others wait are ended
with RESOURCE_EXHAUSTED/QUOTA_EXCEEDED (`quota=watch_bytes_in_memory`) after what they
were already sent, so a reader gets every event in order, and a client that stalled and
reads again resumes after its last event: none skipped, none twice."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import grpc
from ctxcc_client import AsyncClient

from ctxcc.v1 import session_pb2, session_service_pb2_grpc
from ctxcc.v1 import session_service_pb2 as spb
from tests.e2e.proc import FAST_RECONNECT, DaemonProcess
from tests.helpers import error_info, user

BUDGET = 16 << 20
EVENTS = 24
# Events of ~900 KB (under the 1 MiB cap): a stalled watcher holds a few MB of them.
TEXT = "x" * 900_000
STALLED = 12
SEQS = list(range(1, EVENTS + 1))


def _seqs_until(watch: Any, n: int) -> tuple[list[int], grpc.RpcError | None]:
    """The event seqs a raw watch delivers, up to `n`, and the error that ended it, if any."""
    seqs: list[int] = []
    try:
        for msg in watch:
            if msg.HasField("event"):
                seqs.append(msg.event.seq)
                if len(seqs) == n:
                    break
    except grpc.RpcError as err:
        return seqs, err
    return seqs, None


async def _read(watch: Any, n: int) -> list[int]:
    seqs: list[int] = []
    async for msg in watch:
        if msg.HasField("event"):
            seqs.append(msg.event.seq)
            if len(seqs) == n:
                break
    return seqs


def test_stalled_watchers_hold_at_most_the_budget_and_readers_get_every_event(
    short_tmp: Path,
) -> None:
    daemon = DaemonProcess(
        short_tmp / "data", "--max-watch-bytes-in-memory", str(BUDGET), "--ui-listen", "none"
    )
    with daemon.serving(), grpc.insecure_channel(daemon.target) as ch:
        stub: Any = session_service_pb2_grpc.SessionServiceStub(ch)
        _session(stub, "w", [f"{i} {TEXT}" for i in range(EVENTS)], 8)
        # Watchers that never read, each on a connection of its own.
        channels = [grpc.insecure_channel(daemon.target) for _ in range(STALLED)]
        stalled = [
            session_service_pb2_grpc.SessionServiceStub(c).WatchSession(
                spb.WatchSessionRequest(session_id="w"), timeout=600
            )
            for c in channels
        ]
        try:
            deadline = time.monotonic() + 60
            while daemon.metric("ctxcc_watchers") < STALLED or not daemon.metric(
                "ctxcc_watch_bytes_in_memory"
            ):
                assert time.monotonic() < deadline, "the stalled watchers never held anything"
                time.sleep(0.05)
            # Without a budget, twelve watchers held ~5 MB each; now all of them together
            # hold no more than it (the rest wait before reading a page).
            held = []
            for _ in range(10):
                held.append(daemon.metric("ctxcc_watch_bytes_in_memory"))
                time.sleep(0.1)
            assert all(0 < h <= BUDGET for h in held), held

            async def readers() -> tuple[list[int], list[int]]:
                async with (
                    AsyncClient(daemon.target, options=FAST_RECONNECT, retry_seconds=120) as a,
                    AsyncClient(daemon.target, options=FAST_RECONNECT, retry_seconds=120) as b,
                ):
                    # A client that reads two events, then stops reading for a while.
                    paused = a.watch("w")
                    first = await _read(paused, 2)
                    # A reader waits for room until the stalled watchers are ended.
                    whole = await _read(b.watch("w"), EVENTS)
                    # The paused client reads again: what it was sent, then (when it was
                    # ended meanwhile) the watch reopens after its last event.
                    rest = await _read(paused, EVENTS - 2)
                    await paused.aclose()
                    return whole, first + rest

            whole, resumed = asyncio.run(readers())
            assert whole == SEQS
            assert resumed == SEQS
            ended = 0
            for watch in stalled:
                seqs, err = _seqs_until(watch, EVENTS)
                assert seqs == SEQS[: len(seqs)]  # in order, none skipped or twice
                if err is not None:
                    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err
                    info = error_info(err)
                    assert info.reason == "QUOTA_EXCEEDED"
                    assert info.metadata["quota"] == "watch_bytes_in_memory"
                    ended += 1
                else:
                    assert seqs == SEQS
                    watch.cancel()
            assert ended >= 1
            assert daemon.metric("ctxcc_errors_total", reason="QUOTA_EXCEEDED") >= ended
            deadline = time.monotonic() + 60
            while daemon.metric("ctxcc_watch_bytes_in_memory"):
                assert time.monotonic() < deadline, "bytes still held after every watch ended"
                time.sleep(0.05)
        finally:
            for watch in stalled:
                watch.cancel()
            for c in channels:
                c.close()


def test_watches_of_small_events_share_the_budget_under_a_large_max_event_bytes(
    short_tmp: Path,
) -> None:
    """A page sets aside room for its messages as large as its largest event, not
    --max-event-bytes: under a 32 MiB cap a watch of events of a few bytes held 99 MiB of
    the 64 MiB budget (3 MiB of page, 96 MiB for an event it did not have), so the
    watches read their backlogs one at a time and the gauge stood past the budget."""
    daemon = DaemonProcess(
        short_tmp / "data", "--max-event-bytes", str(32 << 20), "--ui-listen", "none"
    )
    events, watchers = 4_000, 4
    with daemon.serving(), grpc.insecure_channel(daemon.target) as ch:
        stub: Any = session_service_pb2_grpc.SessionServiceStub(ch)
        _session(stub, "s", [f"event {i}" for i in range(events)], 500)
        held: list[float] = []
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                held.append(daemon.metric("ctxcc_watch_bytes_in_memory"))
                time.sleep(0.02)

        async def watch_all() -> list[list[int]]:
            async with AsyncClient(daemon.target) as client:
                return await asyncio.gather(
                    *(_read(client.watch("s"), events) for _ in range(watchers))
                )

        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            got = asyncio.run(watch_all())
        finally:
            done.set()
            sampler.join()
        assert all(seqs == list(range(1, events + 1)) for seqs in got)
        assert max(held) <= 64 << 20, max(held)


def _session(stub: Any, sid: str, texts: list[str], batch: int) -> None:
    """A new session `sid` holding a user message of each of `texts`, appended `batch`
    at a time."""
    stub.CreateSession(spb.CreateSessionRequest(session=session_pb2.Session(session_id=sid)))
    for i in range(0, len(texts), batch):
        events = [user(t) for t in texts[i : i + batch]]
        stub.AppendEvents(spb.AppendEventsRequest(session_id=sid, events=events))
