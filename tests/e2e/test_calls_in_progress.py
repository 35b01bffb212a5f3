"""Calls in their handlers at once are capped (`--max-calls-in-progress`): each costs the
daemon ~25-30 KB however little it sends (5,000 idle CompileStreams: ~140 MB), and
nothing else bounded how many streams a client keeps open. Past the cap a new call
answers RESOURCE_EXHAUSTED/QUOTA_EXCEEDED (`quota=calls_in_progress`) before its handler
runs, health checks still answer, and once a call ends a new one is served."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2

from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import compile_service_pb2_grpc, session_pb2, session_service_pb2_grpc
from ctxcc.v1 import session_service_pb2 as spb
from tests.e2e.proc import DaemonProcess
from tests.helpers import ROUTE, error_info, user

CAP = 20


@pytest.fixture
def daemon(short_tmp: Path) -> Iterator[DaemonProcess]:
    d = DaemonProcess(
        short_tmp / "data", "--max-calls-in-progress", str(CAP), "--ui-listen", "none"
    )
    with d.serving():
        yield d


def _refused_for_calls(err: grpc.RpcError) -> None:
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err
    info = error_info(err)
    assert info.reason == "QUOTA_EXCEEDED"
    assert info.metadata["quota"] == "calls_in_progress"
    assert info.metadata["limit"] == str(CAP)


def test_calls_past_the_cap_are_refused_until_one_ends(daemon: DaemonProcess) -> None:
    with grpc.insecure_channel(daemon.target) as ch:
        sessions: Any = session_service_pb2_grpc.SessionServiceStub(ch)
        compiles: Any = compile_service_pb2_grpc.CompileServiceStub(ch)
        sessions.CreateSession(
            spb.CreateSessionRequest(session=session_pb2.Session(session_id="s"))
        )
        # Streams opened and never sent to: each waits in its handler for a first step.
        done = threading.Event()

        def nothing() -> Iterator[cpb.CompileStreamRequest]:
            done.wait()
            yield from ()

        idle = [compiles.CompileStream(nothing(), timeout=120) for _ in range(CAP)]
        try:
            daemon.wait_in_flight("CompileService/CompileStream", CAP)
            append = spb.AppendEventsRequest(session_id="s", events=[user("hello")])
            with pytest.raises(grpc.RpcError) as unary:
                sessions.AppendEvents(append)
            _refused_for_calls(unary.value)
            step = cpb.CompileStreamRequest(
                step=cpb.StepRequest(
                    step_id="1", compile=cpb.CompileRequest(session_id="s", route=ROUTE)
                )
            )
            with pytest.raises(grpc.RpcError) as stream:
                list(compiles.CompileStream(iter([step]), timeout=60))
            _refused_for_calls(stream.value)
            watch = sessions.WatchSession(spb.WatchSessionRequest(session_id="s"), timeout=60)
            with pytest.raises(grpc.RpcError) as watched:
                next(watch)
            _refused_for_calls(watched.value)
            assert daemon.health() == health_pb2.HealthCheckResponse.SERVING
            idle.pop().cancel()
            daemon.wait_in_flight_at_most("CompileService/CompileStream", CAP - 1)
            # Nothing of a refused call was written.
            assert not sessions.ListEvents(spb.ListEventsRequest(session_id="s")).events
            assert sessions.AppendEvents(append).last_seq == 1
        finally:
            done.set()
            for call in idle:
                call.cancel()
    assert daemon.metric("ctxcc_errors_total", reason="QUOTA_EXCEEDED") == 3
