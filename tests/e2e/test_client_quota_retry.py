"""The Python client waits out the daemon's transient quotas against a real daemon: with
`--max-calls-in-progress 2` and two idle CompileStreams holding it, a unary call and a
stream step are refused (`quota=calls_in_progress`), retried, and succeed once a stream
ends; a lasting quota (`--max-session-bytes`) fails on its first refusal."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest
from ctxcc_client import AsyncClient, Client, CtxccError, user

from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import compile_service_pb2_grpc, session_pb2
from ctxcc.v1 import session_service_pb2 as spb
from tests.e2e.proc import DaemonProcess
from tests.e2e.test_clients import _go_daemon_test, _ts_daemon_test
from tests.helpers import ROUTE, padded_watch

CAP = 2
STREAM = "CompileService/CompileStream"


@pytest.fixture
def daemon(short_tmp: Path) -> Iterator[DaemonProcess]:
    d = DaemonProcess(
        short_tmp / "data",
        "--max-calls-in-progress",
        str(CAP),
        "--max-session-bytes",
        "65536",
        "--ui-listen",
        "none",
    )
    with d.serving():
        yield d


def _refusals(daemon: DaemonProcess) -> float:
    return daemon.metric("ctxcc_errors_total", reason="QUOTA_EXCEEDED")


def test_unary_call_and_stream_step_wait_out_calls_in_progress(daemon: DaemonProcess) -> None:
    with Client(daemon.target, retry_seconds=60) as client:
        client.sessions.CreateSession(
            spb.CreateSessionRequest(session=session_pb2.Session(session_id="s"))
        )
        start = threading.Event()
        with ThreadPoolExecutor(1) as pool:

            def append() -> spb.AppendEventsResponse:
                start.wait()
                resp: spb.AppendEventsResponse = client.sessions.AppendEvents(
                    spb.AppendEventsRequest(session_id="s", events=[user("hello")])
                )
                return resp

            before = _refusals(daemon)
            fut = pool.submit(append)
            _start_when_held(daemon, start, before)
            assert fut.result(timeout=60).last_seq == 1
        assert _refusals(daemon) > before

    async def step() -> cpb.AppendResult | None:
        async with AsyncClient(daemon.target, retry_seconds=60) as actx:
            stream = actx.stream()
            try:
                _, appended = await stream.step(
                    cpb.CompileRequest(session_id="s", route=ROUTE), [user("again")]
                )
                return appended
            finally:
                await stream.close()

    start = threading.Event()
    before = _refusals(daemon)
    with ThreadPoolExecutor(1) as pool:
        fut2 = pool.submit(lambda: (start.wait(), asyncio.run(step()))[1])
        _start_when_held(daemon, start, before)
        appended = fut2.result(timeout=60)
    assert appended is not None and appended.last_seq == 2
    assert _refusals(daemon) > before


def _start_when_held(daemon: DaemonProcess, start: threading.Event, before: float) -> None:
    """Holds the cap with two idle streams, lets the call start, ends one stream once the
    daemon has counted a refusal of it."""
    done = threading.Event()

    def nothing() -> Iterator[cpb.CompileStreamRequest]:
        done.wait()
        yield from ()

    with grpc.insecure_channel(daemon.target) as ch:
        compiles: Any = compile_service_pb2_grpc.CompileServiceStub(ch)
        idle = [compiles.CompileStream(nothing(), timeout=120) for _ in range(CAP)]
        try:
            daemon.wait_in_flight(STREAM, CAP)
            start.set()
            deadline = time.monotonic() + 60
            while _refusals(daemon) <= before:
                assert time.monotonic() < deadline, "the call was never refused"
                time.sleep(0.02)
            idle.pop().cancel()
            daemon.wait_in_flight_at_most(STREAM, CAP - 1)
        finally:
            done.set()
            for call in idle:
                call.cancel()


def test_a_lasting_quota_fails_on_its_first_refusal(daemon: DaemonProcess) -> None:
    with Client(daemon.target, retry_seconds=60) as client:
        client.sessions.CreateSession(
            spb.CreateSessionRequest(session=session_pb2.Session(session_id="big"))
        )
        before = _refusals(daemon)
        with pytest.raises(CtxccError) as err:
            client.sessions.AppendEvents(
                spb.AppendEventsRequest(session_id="big", events=[user("x" * 100_000)])
            )
        assert err.value.reason == "QUOTA_EXCEEDED", err.value
        assert err.value.metadata["quota"] not in {"calls_in_progress", "request_bytes_in_memory"}
        # The daemon may count a refusal just after it answers. Retried, the call would
        # have been refused again and again for retry_seconds before it raised.
        deadline = time.monotonic() + 60
        while _refusals(daemon) < before + 1:
            assert time.monotonic() < deadline, "the refusal was never counted"
            time.sleep(0.02)
        assert _refusals(daemon) == before + 1  # one attempt, not retried


BUDGET = 1 << 20
BIG_TEXT = "x" * 600_000  # two make a request over BUDGET, each event under the 1 MiB cap


def test_a_step_refused_in_band_is_sent_again_on_the_same_stream(short_tmp: Path) -> None:
    """A large step refused in-band (`quota=request_bytes_in_memory`) while a padded watch
    holds 2/3 of the budget is sent again with its request id once the watch ends: it is
    appended once, and the stream that refused it answers it."""
    d = DaemonProcess(
        short_tmp / "data", "--max-request-bytes-in-memory", str(BUDGET), "--ui-listen", "none"
    )
    with d.serving(), Client(d.target, retry_seconds=60) as client:
        for sid in ("watched", "big"):
            client.sessions.CreateSession(
                spb.CreateSessionRequest(session=session_pb2.Session(session_id=sid))
            )
        with grpc.insecure_channel(d.target) as ch:
            watch = padded_watch(ch, "watched", 2 * BUDGET // 3)
            try:
                d.wait_in_flight("SessionService/WatchSession", 1)

                async def steps() -> tuple[cpb.AppendResult | None, int]:
                    async with AsyncClient(d.target, retry_seconds=60) as actx:
                        stream = actx.stream()
                        try:
                            # A small first step opens the stream the large one goes on.
                            await stream.step(
                                cpb.CompileRequest(session_id="big", route=ROUTE), [user("hi")]
                            )
                            before = _refusals(d)
                            release = asyncio.get_running_loop().run_in_executor(
                                None, _release_when_refused, d, watch, before
                            )
                            _, appended = await stream.step(
                                cpb.CompileRequest(session_id="big", route=ROUTE),
                                [user(BIG_TEXT)] * 2,
                            )
                            await release
                            # No CompileStream call has ended: the stream was not reopened.
                            ended = d.metric(
                                "ctxcc_rpc_duration_seconds_count",
                                method="CompileService/CompileStream",
                            )
                            return appended, int(ended)
                        finally:
                            await stream.close()

                appended, ended = asyncio.run(steps())
            finally:
                watch.cancel()
        assert appended is not None and appended.last_seq == 3  # "hi" and the two, once
        assert ended == 0  # refused in-band: the same call answered it


def _release_when_refused(daemon: DaemonProcess, watch: Any, before: float) -> None:
    deadline = time.monotonic() + 60
    while _refusals(daemon) <= before:
        assert time.monotonic() < deadline, "the step was never refused"
        time.sleep(0.02)
    watch.cancel()


def _env(daemon: DaemonProcess) -> dict[str, str]:
    metrics = f"http://{daemon.endpoints['metrics']}/metrics"
    return {"CTXCC_TARGET": daemon.target, "CTXCC_METRICS_URL": metrics}


def test_go_client_waits_out_transient_quotas(daemon: DaemonProcess) -> None:
    """client/go/quota_test.go: the same as the Python client's, against this daemon."""
    _go_daemon_test("TestTransientQuotasAreWaitedOutAgainstADaemon", _env(daemon))


TS_TEST = (
    "against a daemon: a call and a step refused for calls_in_progress succeed once a call"
    " ends; a lasting quota fails at once"
)


def test_typescript_client_waits_out_transient_quotas(daemon: DaemonProcess) -> None:
    """client/typescript/test/quota.test.ts: the same, against this daemon."""
    _ts_daemon_test("quota.test.js", TS_TEST, _env(daemon))
