"""Calls that fail, against a real Prometheus (Debian's, as in test_prometheus.py)
evaluating ctxcc's rules with their durations cut to a second (promtool's unit tests
check the durations): two daemons, one of them on a store with a damaged table file.

Every step of the damaged session's agent answers DATA_LOSS while the daemon stays
SERVING and every other rule stays quiet: CtxccServerErrors must name that daemon. The
other daemon's clients send invalid requests, ask for sessions that do not exist and
create ones that do: the clients' errors, which must page no one.

The same damaged session stepped over CompileStream (as the official clients step):
each step's failure is answered in-band (a StepError, the stream stays open), so no
call's status code ever shows it; `ctxcc_errors_total` counts it by its reason."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2

from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import compile_service_pb2_grpc, session_pb2, session_service_pb2_grpc
from ctxcc.v1 import session_service_pb2 as spb
from tests.contract.test_rocks import damaged_table
from tests.e2e.proc import DaemonProcess
from tests.e2e.prom import Prometheus, rules_firing_at_once, until
from tests.helpers import ROUTE, user

ALERT = "CtxccServerErrors"
DAMAGED, CLUMSY = "agent-0", "agent-1"


def damaged_store(data: Path, log: Path) -> None:
    """A session of 200 events whose table file has a damaged data block."""
    d = DaemonProcess(data, log_path=log).start()
    try:
        d.wait_ready()
        with grpc.insecure_channel(d.target) as ch:
            sessions: Any = session_service_pb2_grpc.SessionServiceStub(ch)
            sessions.CreateSession(
                spb.CreateSessionRequest(session=session_pb2.Session(session_id="s"))
            )
            for k in range(200):
                text = f"message {k} " + "lorem ipsum " * 120
                sessions.AppendEvents(spb.AppendEventsRequest(session_id="s", events=[user(text)]))
    finally:
        assert d.terminate() == 0
    d.start()  # the log replayed into a table file at open
    d.wait_ready()
    assert d.terminate() == 0
    damaged_table(data / "db")


def clients_errors(target: str) -> set[str]:
    """Requests a daemon rightly refuses; the codes they got."""
    codes = set()
    with grpc.insecure_channel(target) as ch:
        sessions: Any = session_service_pb2_grpc.SessionServiceStub(ch)
        compiles: Any = compile_service_pb2_grpc.CompileServiceStub(ch)
        sessions.CreateSession(
            spb.CreateSessionRequest(session=session_pb2.Session(session_id="taken"))
        )
        calls: list[Callable[[], object]] = [
            lambda: sessions.GetSession(spb.GetSessionRequest(session_id="gone")),
            lambda: sessions.AppendEvents(
                spb.AppendEventsRequest(session_id="gone", events=[user("hi")])
            ),
            lambda: compiles.Compile(cpb.CompileRequest(session_id="gone", route=ROUTE)),
            lambda: compiles.Compile(cpb.CompileRequest(session_id="taken")),
            lambda: sessions.CreateSession(
                spb.CreateSessionRequest(session=session_pb2.Session(session_id="taken"))
            ),
        ]
        for _ in range(20):
            for call in calls:
                with pytest.raises(grpc.RpcError) as err:
                    call()
                codes.add(err.value.code().name)
    return codes


def test_server_errors_fire_for_the_damaged_daemon_and_clients_errors_do_not(
    short_tmp: Path, tmp_path: Path
) -> None:
    damaged_store(short_tmp / "a", tmp_path / "a.log")
    damaged = DaemonProcess(short_tmp / "a", log_path=tmp_path / "a.log").start()
    clumsy = DaemonProcess(short_tmp / "b", log_path=tmp_path / "b.log").start()
    prom: Prometheus | None = None
    try:
        targets = {
            DAMAGED: str(damaged.wait_ready()["metrics"]),
            CLUMSY: str(clumsy.wait_ready()["metrics"]),
        }
        prom = Prometheus(tmp_path, targets, rules_firing_at_once(tmp_path))
        prom.start()
        prom.wait_scrapes(2)

        # The clients' own mistakes, by the hundred: quiet, however many.
        codes = clients_errors(clumsy.target)
        assert {"NOT_FOUND", "INVALID_ARGUMENT", "ALREADY_EXISTS"} <= codes, codes
        assert not codes & {"DATA_LOSS", "INTERNAL", "UNKNOWN"}, codes

        # The damaged session's agent keeps stepping: each compile reads through the
        # damaged block. The daemon serves on, so health alone tells no one.
        with grpc.insecure_channel(damaged.target) as ch:
            compiles: Any = compile_service_pb2_grpc.CompileServiceStub(ch)
            for _ in range(8):
                with pytest.raises(grpc.RpcError) as err:
                    compiles.Compile(cpb.CompileRequest(session_id="s", route=ROUTE))
                assert err.value.code() == grpc.StatusCode.DATA_LOSS
        assert damaged.health() == health_pb2.HealthCheckResponse.SERVING
        assert damaged.metric("ctxcc_rpc_errors_total", code="DATA_LOSS") == 8

        fired = until(f"{ALERT} fires", lambda: prom.alerts(ALERT).get(DAMAGED))
        assert fired["labels"]["severity"] == "warning"
        assert "errors in 10 minutes on its own side" in fired["annotations"]["summary"]
        prom.wait_scrapes(3)
        for state in ("pending", "firing"):
            assert CLUMSY not in prom.alerts(ALERT, state), state
        # No other rule saw the damaged daemon's failing steps.
        others = [
            a["labels"]["alertname"]
            for a in prom.api("alerts")["alerts"]
            if a["labels"]["alertname"] != ALERT
        ]
        assert others == [], others
    finally:
        if prom is not None:
            prom.stop()
        damaged.ensure_stopped()
        clumsy.ensure_stopped()


def test_stream_steps_on_a_damaged_record_are_counted_by_reason_and_fire(
    short_tmp: Path, tmp_path: Path
) -> None:
    damaged_store(short_tmp / "a", tmp_path / "a.log")
    damaged = DaemonProcess(short_tmp / "a", log_path=tmp_path / "a.log").start()
    prom: Prometheus | None = None
    try:
        targets = {DAMAGED: str(damaged.wait_ready()["metrics"])}
        prom = Prometheus(tmp_path, targets, rules_firing_at_once(tmp_path))
        prom.start()
        prom.wait_scrapes(2)

        # One stream, as an agent holds it: eight steps of the damaged session, and two of
        # a session that does not exist (the client's mistake, counted apart).
        steps = [
            cpb.CompileStreamRequest(
                step=cpb.StepRequest(
                    step_id=f"step-{k}",
                    compile=cpb.CompileRequest(session_id="s" if k < 8 else "gone", route=ROUTE),
                )
            )
            for k in range(10)
        ]
        with grpc.insecure_channel(damaged.target) as ch:
            compiles: Any = compile_service_pb2_grpc.CompileServiceStub(ch)
            answers = list(compiles.CompileStream(iter(steps), timeout=120))
        # Every step answered in-band, the stream ended OK by its client.
        assert [a.step_id for a in answers] == [f"step-{k}" for k in range(10)]
        assert [a.error.reason for a in answers] == ["RECORD_CORRUPT"] * 8 + [
            "SESSION_NOT_FOUND"
        ] * 2
        assert all(a.error.code == grpc.StatusCode.DATA_LOSS.value[0] for a in answers[:8])
        assert damaged.health() == health_pb2.HealthCheckResponse.SERVING

        # Counted once per failed step, by reason; no call ended with an error.
        assert damaged.metric("ctxcc_errors_total", reason="RECORD_CORRUPT") == 8
        assert damaged.metric("ctxcc_errors_total", reason="SESSION_NOT_FOUND") == 2
        assert damaged.metric("ctxcc_errors_total") == 10
        assert damaged.metric("ctxcc_rpc_errors_total") == 0
        # RocksDB's words for each, in the log the alert sends the operator to.
        assert (tmp_path / "a.log").read_text().count("RECORD_CORRUPT: RocksDB read") == 8

        until(
            f"{ALERT} pending or firing",
            lambda: any(DAMAGED in prom.alerts(ALERT, state) for state in ("pending", "firing")),
        )
        fired = until(f"{ALERT} fires", lambda: prom.alerts(ALERT).get(DAMAGED))
        assert fired["labels"]["severity"] == "warning"
    finally:
        if prom is not None:
            prom.stop()
        damaged.ensure_stopped()
