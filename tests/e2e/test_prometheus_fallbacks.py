"""CtxccProjectionFallbacks on a fleet, against a real Prometheus (Debian's, as in
test_prometheus.py) evaluating ctxcc's rules with their durations cut to a second
(promtool's unit tests check the durations).

Two sidecars: one whose newest checkpoint record is torn on disk, so that every compile
of its agent passes over it (PROJECTION_CORRUPT), and a busy healthy one. Summed over
both, as the rule once did, the fallbacks are under 5% of the compiles and nothing
fired; per daemon, the damaged one is named and the busy one is not."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc

from ctxcc.v1 import (
    checkpoint_pb2,
    compile_service_pb2_grpc,
    session_pb2,
    session_service_pb2_grpc,
    view_pb2,
)
from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_service_pb2 as spb
from storage.kv import Batch
from storage.rocks import open_rocks
from tests.e2e.proc import DaemonProcess
from tests.e2e.prom import Prometheus, rules_firing_at_once, until
from tests.helpers import ROUTE, assistant, user

ALERT = "CtxccProjectionFallbacks"
BROKEN, BUSY = "agent-0", "agent-1"
# Compiles of the busy sidecar per one of the broken one: 1 in 31 of the fleet's
# compiles falls back, about 3%.
BUSY_PER_BROKEN = 30
BROKEN_STEPS = 6
FLEET_RATIO = (
    'sum(rate(ctxcc_projection_fallbacks_total{reason!="route_mismatch"}[10m]))'
    " / sum(rate(ctxcc_compile_decisions_total[10m]))"
)


class Agent:
    def __init__(self, channel: grpc.Channel) -> None:
        self.sessions: Any = session_service_pb2_grpc.SessionServiceStub(channel)
        self.compiles: Any = compile_service_pb2_grpc.CompileServiceStub(channel)

    def create(self, sid: str) -> None:
        self.sessions.CreateSession(
            spb.CreateSessionRequest(session=session_pb2.Session(session_id=sid))
        )

    def step(self, sid: str, text: str) -> view_pb2.CompiledView:
        self.sessions.AppendEvents(
            spb.AppendEventsRequest(session_id=sid, events=[user(text), assistant("done")])
        )
        view: view_pb2.CompiledView = self.compiles.Compile(
            cpb.CompileRequest(session_id=sid, route=ROUTE)
        ).view
        return view

    def summarize(self, sid: str, through: int, summary: str) -> str:
        made = self.compiles.CreateCheckpoint(
            cpb.CreateCheckpointRequest(
                checkpoint=checkpoint_pb2.Checkpoint(
                    session_id=sid, covers_through_seq=through, summary=summary, source_route=ROUTE
                )
            )
        )
        return str(made.checkpoint.checkpoint_id)


def torn_checkpoint_store(data: Path, log: Path) -> None:
    """Session "s" with two summaries, the newer one's record torn (a third of it kept)."""
    d = DaemonProcess(data, log_path=log).start()
    try:
        d.wait_ready()
        with grpc.insecure_channel(d.target) as ch:
            agent = Agent(ch)
            agent.create("s")
            agent.step("s", "one")
            agent.summarize("s", 2, "SUMMARY OF ONE")
            agent.step("s", "two")
            newer = agent.summarize("s", 4, "SUMMARY OF TWO")
    finally:
        assert d.terminate() == 0
    kv = open_rocks(data / "db")
    try:
        for key, raw in list(kv.scan("checkpoints", b"s\x00", b"s\x01")):
            if key.endswith(newer.encode()):
                b = Batch()
                b.put("checkpoints", key, raw[: len(raw) // 3])
                kv.write(b)
    finally:
        kv.close()


def test_one_sidecar_of_a_fleet_falling_back_on_every_compile_is_named(
    short_tmp: Path, tmp_path: Path
) -> None:
    torn_checkpoint_store(short_tmp / "a", tmp_path / "a.log")
    broken = DaemonProcess(short_tmp / "a", log_path=tmp_path / "a.log").start()
    busy = DaemonProcess(short_tmp / "b", log_path=tmp_path / "b.log").start()
    prom: Prometheus | None = None
    try:
        targets = {
            BROKEN: str(broken.wait_ready()["metrics"]),
            BUSY: str(busy.wait_ready()["metrics"]),
        }
        prom = Prometheus(tmp_path, targets, rules_firing_at_once(tmp_path))
        prom.start()
        prom.wait_scrapes(2)
        with grpc.insecure_channel(broken.target) as a, grpc.insecure_channel(busy.target) as b:
            damaged, healthy = Agent(a), Agent(b)
            healthy.create("h")
            for n in range(BROKEN_STEPS):
                view = damaged.step("s", f"step {n}")
                assert list(view.fallback_reasons) == [
                    view_pb2.FALLBACK_REASON_PROJECTION_CORRUPT
                ], view.fallback_reasons
                for k in range(BUSY_PER_BROKEN):
                    assert not healthy.step("h", f"step {n}.{k}").fallback_reasons
        assert broken.metric("ctxcc_projection_fallbacks_total") == BROKEN_STEPS

        fired = until(f"{ALERT} fires", lambda: prom.alerts(ALERT).get(BROKEN))
        assert "compiles on " in fired["annotations"]["summary"]
        prom.wait_scrapes(3)
        at = prom.settled()
        # Summed over the fleet the share is small: the rule as it was saw nothing.
        (fleet,) = prom.query(FLEET_RATIO, at=at)
        assert 0 < fleet.values[0][1] < 0.05, fleet
        for state in ("pending", "firing"):
            assert BUSY not in prom.alerts(ALERT, state), state
    finally:
        if prom is not None:
            prom.stop()
        broken.ensure_stopped()
        busy.ensure_stopped()
