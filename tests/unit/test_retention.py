"""The retention sweep pages through the session list: every idle session is deleted
within one pass however many pages it takes, busy ones never, and the next pass starts
from the first session again."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry

from server.adapters.metrics import PrometheusTelemetry
from server.adapters.system import RandomIds
from server.domain.model import AppendBatch, ContentPart, NewEvent, Session, UserMessage
from server.service.blocking import Blocking
from server.service.limits import ServiceLimits
from server.service.retention import RetentionSweep
from server.service.sessions import SessionUseCases
from server.service.watch import WatchHub
from storage import KVEventStore, MemoryKV

S = 1_000_000_000


class Clock:
    def __init__(self) -> None:
        self.ns = 100 * S

    def now_ns(self) -> int:
        return self.ns


def expired(registry: CollectorRegistry) -> float:
    return registry.get_sample_value("ctxcc_sessions_expired_total") or 0.0


def test_a_pass_over_several_pages_deletes_every_idle_session_and_only_those() -> None:
    async def run() -> None:
        store = KVEventStore(MemoryKV())
        blocking = Blocking(1, 1)
        clock = Clock()
        telemetry = PrometheusTelemetry("test")
        sessions = SessionUseCases(
            store, blocking, WatchHub(8), clock, RandomIds(), ServiceLimits(), telemetry
        )
        # Seven sessions, ids in list order; the busy ones wrote at 95 s, the idle at 10 s.
        busy = {"s1", "s4", "s6"}
        for i in range(7):
            sid = f"s{i}"
            store.create_session(Session(sid, 10 * S, 10 * S))
            at = 95 * S if sid in busy else 10 * S
            event = NewEvent(f"e{i}", UserMessage((ContentPart(text="hi"),)))
            store.append(AppendBatch(sid, (event,), now_ns=at))
        # No clock step: the monotonic clock moves with the wall clock.
        sweep = RetentionSweep(
            sessions, clock, 60 * S, telemetry, page=3, monotonic_ns=clock.now_ns
        )
        pages = []
        while not (swept := await sweep.sweep_page()).wrapped:
            pages.append(swept)
        pages.append(swept)
        assert [(p.examined, p.deleted) for p in pages] == [(3, 2), (3, 2), (1, 0)]
        left = [s.session_id for s in store.list_sessions("", 10)]
        assert left == ["s1", "s4", "s6"]
        assert expired(telemetry.registry) == 4
        # The next pass starts at the first session again: once the busy ones are idle
        # too (the clock moved past their writes by the retention), they go.
        clock.ns = 200 * S
        swept = await sweep.sweep_page()
        assert (swept.examined, swept.deleted, swept.wrapped) == (3, 3, False)
        assert store.list_sessions("", 10) == []
        blocking.shutdown()

    asyncio.run(run())


def test_a_wall_clock_step_forward_is_not_idle_time() -> None:
    """Idleness is measured on the wall clock (the sessions' stored times); one that steps
    forward (an NTP correction) made every session look idle at once, and the sweep
    deleted them all. The step is not counted: they go once the retention has passed on
    the monotonic clock."""

    async def run() -> None:
        store = KVEventStore(MemoryKV())
        blocking = Blocking(1, 1)
        clock = Clock()
        mono = [0]
        telemetry = PrometheusTelemetry("test")
        sessions = SessionUseCases(
            store, blocking, WatchHub(8), clock, RandomIds(), ServiceLimits(), telemetry
        )
        for i in range(3):
            sid = f"s{i}"
            store.create_session(Session(sid, 10 * S, 10 * S))
            event = NewEvent(f"e{i}", UserMessage((ContentPart(text="hi"),)))
            store.append(AppendBatch(sid, (event,), now_ns=10 * S))
        sweep = RetentionSweep(
            sessions, clock, 60 * S, telemetry, page=10, monotonic_ns=lambda: mono[0]
        )
        clock.ns = 20 * S
        assert (await sweep.sweep_page()).deleted == 0
        # A second later the wall clock reads a day later.
        mono[0] += 1 * S
        clock.ns += 1 * S + 86_400 * S
        assert (await sweep.sweep_page()).deleted == 0
        assert len(store.list_sessions("", 10)) == 3
        # Still within the retention of real time: kept.
        mono[0] += 30 * S
        clock.ns += 30 * S
        assert (await sweep.sweep_page()).deleted == 0
        # Past it (21 s + 60 s of real time after their last write at 10 s): deleted.
        mono[0] += 31 * S
        clock.ns += 31 * S
        assert (await sweep.sweep_page()).deleted == 3
        assert expired(telemetry.registry) == 3
        blocking.shutdown()

    asyncio.run(run())
