"""Healthy session patterns under a real Prometheus (Debian's server, as in
test_prometheus.py) scraping a daemon run as an operator runs it: sessions that go over
budget and then compact or are deleted, an agent that switches model after writing a
summary, and agents that leave their watches (cancelled, deadline passed, process
killed). Every alert expression is evaluated through the HTTP API and must stay quiet;
the rules these patterns used to fire are evaluated too, so the test keeps its teeth.
The dashboard's RPC-error query must show the codes those clients got, never UNKNOWN
(a handler that failed unguarded)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from ctxcc.v1 import (
    checkpoint_pb2,
    common_pb2,
    compile_service_pb2,
    compile_service_pb2_grpc,
    session_pb2,
    session_service_pb2,
    session_service_pb2_grpc,
    view_pb2,
)
from tests.e2e.proc import REPO, DaemonProcess
from tests.e2e.prom import RULES, Prometheus, _free_port, rules_firing_at_once
from tests.helpers import assistant, user

OLD = common_pb2.Route(
    connection="agent", protocol="anthropic-messages", endpoint="api", model="claude-sonnet-4"
)
NEW = common_pb2.Route(
    connection="agent", protocol="anthropic-messages", endpoint="api", model="claude-haiku-4-5"
)
# A small window, so that a few steps of plain text put a session over its budget.
SMALL = compile_service_pb2.ModelLimits(context_window=20_000, max_output_tokens=1_000)
# The window of a model an agent moves to when its view no longer fits.
LARGE = compile_service_pb2.ModelLimits(context_window=200_000, max_output_tokens=8_000)
TEXT = "Read the failing test, find the cause in the parser and fix it with a small patch. "
OVER = view_pb2.DECISION_OVER_BUDGET_SEND_ANYWAY
# The rules as they stood before: the over-budget one stayed true for its whole window
# after a session had compacted or been deleted; the fallback one counted the summary a
# switched agent rightly passes over (and divided by a series born at the first compile).
OLD_OVER_BUDGET = (
    'sum(rate(ctxcc_compile_decisions_total{decision="over_budget_send_anyway"}[10m])) > 0'
)
OLD_FALLBACKS = (
    "sum(rate(ctxcc_projection_fallbacks_total[10m]))"
    " / sum(rate(ctxcc_compile_duration_seconds_count[10m])) > 0.05"
)


class Agent:
    def __init__(self, target: str) -> None:
        self.target = target
        self.channel = grpc.insecure_channel(target)
        self.sessions: Any = session_service_pb2_grpc.SessionServiceStub(self.channel)
        self.compiles: Any = compile_service_pb2_grpc.CompileServiceStub(self.channel)

    def create(self, sid: str) -> None:
        self.sessions.CreateSession(
            session_service_pb2.CreateSessionRequest(session=session_pb2.Session(session_id=sid))
        )

    def step(self, sid: str, text: str, route: common_pb2.Route = OLD) -> view_pb2.CompiledView:
        self.sessions.AppendEvents(
            session_service_pb2.AppendEventsRequest(
                session_id=sid, events=[user(text), assistant("done")]
            )
        )
        return self.compile(sid, route)

    def compile(
        self,
        sid: str,
        route: common_pb2.Route = OLD,
        limits: compile_service_pb2.ModelLimits = SMALL,
    ) -> view_pb2.CompiledView:
        req = compile_service_pb2.CompileRequest(session_id=sid, route=route, limits=limits)
        view: view_pb2.CompiledView = self.compiles.Compile(req).view
        return view

    def summarize(self, sid: str, through: int) -> None:
        """A model-written summary on OLD (not portable), covering 1..through."""
        self.compiles.CreateCheckpoint(
            compile_service_pb2.CreateCheckpointRequest(
                checkpoint=checkpoint_pb2.Checkpoint(
                    session_id=sid,
                    covers_through_seq=through,
                    summary="The parser drops escaped quotes; the fix is in lexer.py.",
                    source_route=OLD,
                )
            )
        )

    def over_budget(self, sid: str) -> int:
        """Steps until the session's view is over budget; returns its head seq."""
        for n in range(1, 10):
            view = self.step(sid, f"result {n} " + TEXT * 120)
            if view.decision == OVER:
                return view.event_boundary
        raise AssertionError(f"{sid} never went over budget")


@pytest.fixture
def scraped(short_tmp: Path, tmp_path: Path) -> Iterator[tuple[Agent, Prometheus]]:
    daemon = DaemonProcess(short_tmp / "data", log_path=tmp_path / "daemon.log").start()
    prom: Prometheus | None = None
    try:
        prom = Prometheus(tmp_path, {"agent-0": str(daemon.wait_ready()["metrics"])})
        prom.start()
        prom.wait_scrapes(2)
        agent = Agent(daemon.target)
        yield agent, prom
        agent.channel.close()
    finally:
        if prom is not None:
            prom.stop()
        assert daemon.terminate() == 0


def _gauge(prom: Prometheus, at: float) -> float:
    (got,) = prom.query("ctxcc_sessions_over_budget", at=at)
    return got.values[0][1]


def test_sessions_over_budget_then_compacted_or_deleted_and_a_model_switch_stay_quiet(
    scraped: tuple[Agent, Prometheus],
) -> None:
    agent, prom = scraped
    # Two sessions go over budget for a few steps; a third is an agent that wrote a
    # summary and then moved to another model.
    agent.create("compacts")
    agent.create("deleted")
    agent.create("switches")
    head = agent.over_budget("compacts")
    assert agent.compile("compacts").decision == OVER  # the agent retries once
    agent.over_budget("deleted")
    agent.step("switches", TEXT * 10)
    agent.summarize("switches", 2)
    prom.wait_scrapes(2)
    assert _gauge(prom, prom.settled()) == 2
    # The agent does what the view asked: a summary of the log, and the next step is
    # within budget. The other session is deleted.
    agent.summarize("compacts", head)
    assert agent.step("compacts", "next " + TEXT).decision != OVER
    agent.sessions.DeleteSession(session_service_pb2.DeleteSessionRequest(session_id="deleted"))
    switched = [agent.step("switches", f"step {k} " + TEXT, NEW) for k in range(12)]
    # Every compile on the new route passes over the summary written for the old one.
    assert all(
        list(v.fallback_reasons) == [view_pb2.FALLBACK_REASON_ROUTE_MISMATCH] for v in switched
    )
    assert all(v.decision != OVER for v in switched)
    prom.wait_scrapes(3)
    at = prom.settled()
    assert _gauge(prom, at) == 0
    rules = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    assert len(rules) == 8
    for rule in rules:
        if rule["alert"] == "CtxccDataDirLowSpace":
            continue  # the host's disk, not these sessions (test_prometheus.py covers it)
        got = prom.query(rule["expr"], at=at)
        assert got == [], (rule["alert"], [(s.labels, s.values) for s in got])
    # The old rules: the over-budget one would stay true for 10 minutes after both
    # sessions were done with it (and fire then); the fallback one is already true.
    assert prom.query(OLD_OVER_BUDGET, at=at), "no over-budget compile was seen"
    assert prom.query(OLD_FALLBACKS, at=at), "no route-mismatch fallback was seen"


# An agent process that opens watches and is killed with them open (its TCP connection
# closes under the daemon's streams).
KILLED_WATCHER = """
import sys
import grpc
from ctxcc.v1 import session_service_pb2 as spb, session_service_pb2_grpc as sg

channel = grpc.insecure_channel(sys.argv[1])
stub = sg.SessionServiceStub(channel)
calls = [stub.WatchSession(spb.WatchSessionRequest(session_id="watched")) for _ in range(2)]
stub.GetSession(spb.GetSessionRequest(session_id="watched"))
print("watching", flush=True)
sys.stdin.read()
"""


def test_agents_leaving_their_watches_are_no_daemon_failure(
    scraped: tuple[Agent, Prometheus],
) -> None:
    agent, prom = scraped
    agent.create("watched")
    agent.step("watched", TEXT)
    # One agent cancels its watch; another's watch reaches its deadline.
    cancelled = agent.sessions.WatchSession(
        session_service_pb2.WatchSessionRequest(session_id="watched")
    )
    # Its deadline outlasts the killed agent's start and two scrapes, while all four
    # watches are counted (at 1 s it ran out first in ~2 runs of 5, loaded or not).
    timed = agent.sessions.WatchSession(
        session_service_pb2.WatchSessionRequest(session_id="watched"), timeout=10.0
    )
    killed = subprocess.Popen(
        [sys.executable, "-c", KILLED_WATCHER, agent.target],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert killed.stdout is not None and killed.stdout.readline() == "watching\n"
        prom.wait_scrapes(2)
        (open_watches,) = prom.query("ctxcc_watchers", at=prom.settled())
        assert open_watches.values[0][1] == 4
        cancelled.cancel()
        with pytest.raises(grpc.RpcError) as deadline:
            list(timed)
        assert deadline.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    finally:
        killed.kill()
        killed.wait()
    agent.step("watched", "next " + TEXT)  # the daemon goes on serving
    prom.wait_scrapes(3)
    at = prom.settled()
    (left,) = prom.query("ctxcc_watchers", at=at)
    assert left.values[0][1] == 0
    # The dashboard's panel, as Grafana sends it, over the whole run.
    by_code = prom.query(
        'sum by (method, code) (increase(ctxcc_rpc_errors_total{job="ctxcc"}[10m])) > 0', at=at
    )
    seen = {(s.labels["method"], s.labels["code"]): round(s.values[0][1]) for s in by_code}
    watch = "SessionService/WatchSession"
    assert (watch, "UNKNOWN") not in seen, seen
    assert seen.get((watch, "CANCELLED"), 0) >= 3, seen  # the cancel and the killed agent's
    assert seen.get((watch, "DEADLINE_EXCEEDED"), 0) >= 1, seen
    rules = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    for rule in rules:
        if rule["alert"] != "CtxccDataDirLowSpace":
            assert prom.query(rule["expr"], at=at) == [], rule["alert"]


def test_over_budget_gauge_through_a_larger_window_a_checkpoint_and_restarts(
    short_tmp: Path, tmp_path: Path
) -> None:
    """Each edge case of ctxcc_sessions_over_budget, read from the daemon's /metrics and
    from Prometheus, with CtxccSessionsOverBudget's duration cut to a second so its state
    shows: a session that moves to a model with a larger window leaves at once; one that
    writes a checkpoint stays until its next compile (the gauge counts compiles) and
    leaves then; a deleted one is not brought back by a restart; and after a restart,
    SIGTERM or SIGKILL, the sessions whose latest compile was over budget count again
    before any of them compiles (they used to read 0 until each did, and the alert's
    duration started again)."""
    metrics = f"127.0.0.1:{_free_port()}"  # the same target across restarts
    daemon = DaemonProcess(
        short_tmp / "data", "--metrics-listen", metrics, log_path=tmp_path / "daemon.log"
    ).start()
    prom = Prometheus(tmp_path, {"agent-0": metrics}, rules_firing_at_once(tmp_path))
    agent: Agent | None = None
    try:
        daemon.wait_ready()
        prom.start()
        prom.wait_scrapes(2)
        agent = Agent(daemon.target)
        for sid in ("larger", "summarised", "deleted", "stuck-1", "stuck-2"):
            agent.create(sid)
            agent.over_budget(sid)
        assert daemon.metric("ctxcc_sessions_over_budget") == 5
        firing = _until_firing(prom, lambda got: got == 5)
        assert firing["labels"]["severity"] == "info"

        # A model with a larger window: its first compile there is within budget.
        assert agent.compile("larger", NEW, LARGE).decision != OVER
        assert daemon.metric("ctxcc_sessions_over_budget") == 4
        # A summary through the head: the latest compile is still the one over budget.
        head = agent.compile("summarised").event_boundary
        agent.summarize("summarised", head)
        assert daemon.metric("ctxcc_sessions_over_budget") == 4
        assert agent.compile("summarised").decision != OVER
        assert daemon.metric("ctxcc_sessions_over_budget") == 3
        agent.sessions.DeleteSession(session_service_pb2.DeleteSessionRequest(session_id="deleted"))
        assert daemon.metric("ctxcc_sessions_over_budget") == 2
        _until_firing(prom, lambda got: got == 2)

        # Restarts: nothing compiles until the gauge has been read.
        for how in ("SIGTERM", "SIGKILL"):
            agent.channel.close()
            if how == "SIGTERM":
                assert daemon.terminate() == 0
            else:
                daemon.kill()
            daemon.start()
            daemon.wait_ready()
            assert daemon.metric("ctxcc_sessions_over_budget") == 2, how
            _until_firing(prom, lambda got: got == 2, after_restart=True)
            agent = Agent(daemon.target)

        # The stuck sessions compact; the alert resolves.
        for sid in ("stuck-1", "stuck-2"):
            agent.summarize(sid, agent.compile(sid).event_boundary)
            assert agent.compile(sid).decision != OVER
        assert daemon.metric("ctxcc_sessions_over_budget") == 0
        _until(prom, "the alert resolves", lambda: not _over_budget_alerts(prom))
    finally:
        if agent is not None:
            agent.channel.close()
        prom.stop()
        daemon.terminate()
        daemon.ensure_stopped()


def _over_budget_alerts(prom: Prometheus) -> list[dict[str, Any]]:
    return [
        a
        for a in prom.api("alerts")["alerts"]
        if a["labels"]["alertname"] == "CtxccSessionsOverBudget"
    ]


def _until(prom: Prometheus, what: str, check: Callable[[], Any], timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while not (got := check()):
        assert time.monotonic() < deadline, f"{what}: not after {timeout} s\n{prom.log()}"
        time.sleep(0.2)
    return got


def _until_firing(
    prom: Prometheus, value: Callable[[float], bool], *, after_restart: bool = False
) -> dict[str, Any]:
    """The CtxccSessionsOverBudget alert firing with a value `value` accepts. After a
    restart, first a scrape of the new process (the failed ones mark the series stale)."""
    if after_restart:
        prom.wait_scrapes(2)

    def firing() -> dict[str, Any] | None:
        for alert in _over_budget_alerts(prom):
            if alert["state"] == "firing" and value(float(alert["value"])):
                return alert
        return None

    found: dict[str, Any] = _until(prom, "CtxccSessionsOverBudget fires", firing)
    return found
