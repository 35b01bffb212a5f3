"""The CPU budget of a compile (`--compile-cpu-budget-ms`), against the daemon as a process.

Budgets are made small through the flag so that the direction that matters does not
depend on timing: counting a 1 MiB message takes ~15 ms of CPU on any machine this runs
on, far over a 1 ms budget; 16 MB of messages take ~300 ms, three times a 100 ms budget.
"""

from __future__ import annotations

import shutil
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2
from prometheus_client.parser import text_string_to_metric_families

from ctxcc.v1 import common_pb2, event_pb2, session_pb2
from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import compile_service_pb2_grpc as cgrpc
from ctxcc.v1 import session_service_pb2 as spb
from ctxcc.v1 import session_service_pb2_grpc as sgrpc
from storage import KVEventStore, open_rocks
from tests.e2e.proc import DaemonProcess
from tests.e2e.test_hostile_corpus import error_info

ROUTE = common_pb2.Route(model="gpt-4o")
LINE = "error in src/pkg/module_{}/handler.py line 17: value out of range, retrying now\n"


def _prose(i: int, size: int = 1_000_000) -> str:
    line = LINE.format(i)
    return (line * (size // len(line) + 1))[:size]


@pytest.fixture
def base() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="ctxcc-budget-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


class Api:
    def __init__(self, target: str) -> None:
        self.channel = grpc.insecure_channel(
            target, options=[("grpc.max_receive_message_length", 64 << 20)]
        )
        self.sessions: Any = sgrpc.SessionServiceStub(self.channel)
        self.compiles: Any = cgrpc.CompileServiceStub(self.channel)

    def session(self, sid: str, *texts: str) -> None:
        self.sessions.CreateSession(
            spb.CreateSessionRequest(session=session_pb2.Session(session_id=sid))
        )
        for text in texts:
            ev = event_pb2.Event()
            ev.user_message.parts.add(text=text)
            self.sessions.AppendEvents(spb.AppendEventsRequest(session_id=sid, events=[ev]))

    def compile(self, sid: str) -> cpb.CompileResponse:
        resp: cpb.CompileResponse = self.compiles.Compile(
            cpb.CompileRequest(session_id=sid, route=ROUTE), timeout=120
        )
        return resp


def _compiles_recorded(data: Path, sid: str) -> int:
    kv = open_rocks(data / "db")
    try:
        return len(KVEventStore(kv).list_compiles(sid))
    finally:
        kv.close()


def test_a_compile_over_its_budget_is_refused_and_records_nothing(base: Path) -> None:
    daemon = DaemonProcess(base / "data", "--compile-cpu-budget-ms", "1").start()
    try:
        daemon.wait_ready()
        api = Api(daemon.target)
        api.session("big", _prose(0))
        with pytest.raises(grpc.RpcError) as caught:
            api.compile("big")
        err: Any = caught.value
        info = error_info(caught.value)
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert info.reason == "QUOTA_EXCEEDED"
        assert dict(info.metadata) == {"quota": "compile_cpu_budget_ms", "limit": "1"}
        assert "CreateCheckpoint" in err.details() and "retry" in err.details()
        # A step on a stream answers the same, in-band, and the stream stays usable.
        ev = event_pb2.Event()
        ev.assistant_message.parts.add(text="still there?")
        steps = [
            cpb.CompileStreamRequest(
                step=cpb.StepRequest(
                    step_id=f"s{i}",
                    events=[ev] if i == 1 else [],
                    compile=cpb.CompileRequest(session_id="big", route=ROUTE),
                )
            )
            for i in (1, 2)
        ]
        replies = list(api.compiles.CompileStream(iter(steps), timeout=120))
        assert [(r.step_id, r.error.reason) for r in replies] == [
            ("s1", "QUOTA_EXCEEDED"),
            ("s2", "QUOTA_EXCEEDED"),
        ]
        assert replies[0].append.last_seq == 2  # the step's events were appended first
        # The daemon is unaffected: health, appends and reads of another session.
        api.session("other", "hello")
        listed = api.sessions.ListEvents(spb.ListEventsRequest(session_id="other"))
        assert [e.seq for e in listed.events] == [1]
        assert daemon.health() == health_pb2.HealthCheckResponse.SERVING
        api.channel.close()
    finally:
        assert daemon.terminate() == 0
    assert _compiles_recorded(base / "data", "big") == 0
    # The session is not damaged: with the default budget it compiles and records.
    daemon = DaemonProcess(base / "data").start()
    try:
        daemon.wait_ready()
        api = Api(daemon.target)
        view = api.compile("big").view
        assert view.event_boundary == 2 and len(view.messages[0].parts[0].text) == 1_000_000
        api.channel.close()
    finally:
        assert daemon.terminate() == 0
    assert _compiles_recorded(base / "data", "big") == 1


def test_retries_continue_where_the_budget_stopped_the_last_attempt(base: Path) -> None:
    """16 distinct 1 MB messages take ~300 ms of CPU to count, over a 100 ms budget:
    the first compile is stopped, and the counts each attempt finished are kept, so the
    retries get through instead of starting over for ever."""
    daemon = DaemonProcess(base / "data", "--compile-cpu-budget-ms", "100").start()
    try:
        daemon.wait_ready()
        api = Api(daemon.target)
        api.session("long", *(_prose(i) for i in range(16)))
        outcomes: list[str] = []
        for _ in range(30):
            try:
                view = api.compile("long").view
            except grpc.RpcError as err:
                outcomes.append(error_info(err).reason)
                continue
            outcomes.append("OK")
            break
        print(f"attempts: {outcomes}")
        assert outcomes[0] == "QUOTA_EXCEEDED" and outcomes[-1] == "OK"
        assert set(outcomes[:-1]) == {"QUOTA_EXCEEDED"}
        assert view.event_boundary == 16
        api.channel.close()
    finally:
        assert daemon.terminate() == 0


def _abandoned(daemon: DaemonProcess) -> float:
    metrics = daemon.endpoints["metrics"]
    with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    for family in text_string_to_metric_families(text):
        if family.name == "ctxcc_compiles_abandoned":
            return sum(s.value for s in family.samples if s.name.endswith("_total"))
    raise AssertionError("ctxcc_compiles_abandoned_total is not exported")


def test_a_compile_whose_caller_went_away_stops_and_records_nothing(base: Path) -> None:
    """A client deadline far below the CPU 24 distinct 1 MB messages take to count (~450 ms
    on the machines this runs on, more under load): the call ends DEADLINE_EXCEEDED at
    once, and the daemon stops the compile's work too instead of finishing it unread."""
    daemon = DaemonProcess(base / "data").start()
    try:
        daemon.wait_ready()
        api = Api(daemon.target)
        api.session("gone", *(_prose(i) for i in range(24)))
        assert _abandoned(daemon) == 0
        with pytest.raises(grpc.RpcError) as caught:
            api.compiles.Compile(cpb.CompileRequest(session_id="gone", route=ROUTE), timeout=0.02)
        assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        # The worker stops at its next check: counted once, whichever check saw it.
        for _ in range(600):
            if _abandoned(daemon) >= 1:
                break
            time.sleep(0.05)
        assert _abandoned(daemon) == 1
        api.channel.close()
    finally:
        assert daemon.terminate() == 0
    assert _compiles_recorded(base / "data", "gone") == 0
