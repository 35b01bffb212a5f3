"""The route model across a real daemon restart, and one ledger in the view, in a real
/metrics scrape and in `ctxcc inspect`, to the token."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import grpc
from prometheus_client.parser import text_string_to_metric_families

from ctxcc.v1 import (
    common_pb2,
    compile_service_pb2,
    compile_service_pb2_grpc,
    session_pb2,
    session_service_pb2,
    session_service_pb2_grpc,
    view_pb2,
)
from tests.e2e.proc import REPO, DaemonProcess
from tests.helpers import assistant, user

ROUTE = common_pb2.Route(
    connection="agent", protocol="anthropic-messages", endpoint="api", model="claude-sonnet-4"
)
TEXT = "Read the failing test, find the cause in the parser and fix it with a small patch. "


class Api:
    def __init__(self, target: str) -> None:
        self.channel = grpc.insecure_channel(target)
        self.sessions: Any = session_service_pb2_grpc.SessionServiceStub(self.channel)
        self.compiles: Any = compile_service_pb2_grpc.CompileServiceStub(self.channel)

    def new_session(self, sid: str, *texts: str) -> None:
        self.sessions.CreateSession(
            session_service_pb2.CreateSessionRequest(session=session_pb2.Session(session_id=sid))
        )
        self.append(sid, *texts)

    def append(self, sid: str, *texts: str) -> None:
        events = [user(t) if i % 2 == 0 else assistant(t) for i, t in enumerate(texts)]
        self.sessions.AppendEvents(
            session_service_pb2.AppendEventsRequest(session_id=sid, events=events)
        )

    def compile(self, sid: str, dry_run: bool = False) -> view_pb2.CompiledView:
        req = compile_service_pb2.CompileRequest(session_id=sid, route=ROUTE, dry_run=dry_run)
        view: view_pb2.CompiledView = self.compiles.Compile(req).view
        return view

    def report(self, view: view_pb2.CompiledView, tokens: int) -> None:
        self.compiles.ReportUsage(
            compile_service_pb2.ReportUsageRequest(
                compile_id=view.compile_id, route=ROUTE, input_tokens=tokens, output_tokens=100
            )
        )


def _params(view: view_pb2.CompiledView) -> tuple[float, int, int, int, str]:
    m = view.budget.route_model
    return (m.ratio, m.overhead_tokens, m.delta_samples, m.full_samples, m.counter_kind)


def _view_tokens_sums(metrics_address: str) -> dict[str, float]:
    with urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name == "ctxcc_view_tokens":
            for sample in family.samples:
                if sample.name == "ctxcc_view_tokens_sum":
                    sums[sample.labels["layer"]] = sample.value
    return sums


def test_route_model_survives_a_restart_and_the_ledger_agrees_everywhere(
    short_tmp: Path,
) -> None:
    daemon = DaemonProcess(short_tmp / "data").start()
    try:
        daemon.wait_ready()
        api = Api(daemon.target)
        # A session teaches the route: 11,000 hidden tokens, and changes counted 0.8x.
        api.new_session("teach", TEXT * 10)
        view = api.compile("teach")
        reported = view.budget.ledger_tokens + 11_000
        api.report(view, reported)
        for step in range(4):
            api.append("teach", f"step {step} " + TEXT * 30, "done " + TEXT * 5)
            view = api.compile("teach")
            assert view.budget.estimate_method == view_pb2.ESTIMATE_METHOD_BASELINE_DELTA
            reported = view.budget.baseline_tokens + round(
                0.8 * (view.budget.estimated_input_tokens - view.budget.baseline_tokens)
            )
            api.report(view, reported)
        api.new_session("probe", TEXT * 40)
        before = api.compile("probe", dry_run=True)
        assert before.budget.estimate_method == view_pb2.ESTIMATE_METHOD_ROUTE_MODEL
        assert before.budget.route_model.ratio < 0.9
        assert before.budget.route_model.full_samples == 1
        api.channel.close()
    finally:
        assert daemon.terminate() == 0

    restarted = DaemonProcess(short_tmp / "data").start()
    try:
        endpoints = restarted.wait_ready()
        api = Api(restarted.target)
        after = api.compile("probe")
        # Learned parameters, and therefore the estimate, come back from RocksDB.
        assert after.budget.estimate_method == view_pb2.ESTIMATE_METHOD_ROUTE_MODEL
        assert _params(after) == _params(before)
        assert after.budget.estimated_input_tokens == before.budget.estimated_input_tokens
        b = after.budget
        layers = {
            view_pb2.Layer.Name(r.layer).removeprefix("LAYER_").lower(): r.tokens
            for r in after.layers
        }
        assert sum(layers.values()) + b.provider_overhead_tokens == b.estimated_input_tokens
        assert b.provider_overhead_tokens > 10_000
        # The scrape holds exactly this one compile of the restarted daemon.
        sums = _view_tokens_sums(str(endpoints["metrics"]))
        assert sums == {
            **{k: float(v) for k, v in layers.items()},
            "provider_overhead": float(b.provider_overhead_tokens),
            "provider_overhead_negative": 0.0,
        }
        assert sum(sums.values()) == b.estimated_input_tokens
        shown = subprocess.run(
            [sys.executable, "-m", "server", "inspect", "probe", "--json"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env={"CTXCC_TARGET": restarted.target, "PATH": "/usr/bin:/bin"},
        )
        assert shown.returncode == 0, shown.stderr
        s = json.loads(shown.stdout)
        assert s["layers"] == layers
        assert s["provider_overhead"] == b.provider_overhead_tokens
        assert s["estimated_input_tokens"] == b.estimated_input_tokens
        assert s["route_model"]["full_samples"] == 1
        assert s["free_tokens"] == (b.context_window - b.estimated_input_tokens - b.output_reserve)
        api.channel.close()
    finally:
        assert restarted.terminate() == 0


def test_a_negative_provider_overhead_never_lowers_a_metric_sum(short_tmp: Path) -> None:
    """A provider that counts fewer tokens than the layers makes the overhead negative.
    Observed as it was, `ctxcc_view_tokens_sum{layer="provider_overhead"}` fell, which
    Prometheus takes for a counter reset (rate() of it showed +478,548 tokens for an
    average of -8,551). It is observed as two non-negative halves: every `_sum` only
    grows from scrape to scrape, and overhead - negative adds up to the estimates."""
    daemon = DaemonProcess(short_tmp / "data").start()
    try:
        metrics = str(daemon.wait_ready()["metrics"])
        api = Api(daemon.target)
        api.new_session("dense", TEXT * 40)
        first = api.compile("dense")
        before = _view_tokens_sums(metrics)
        # The provider's tokenizer is denser than the local count: 40 % fewer tokens.
        api.report(first, round(first.budget.ledger_tokens * 0.6))
        estimates = first.budget.estimated_input_tokens
        negative = 0
        for step in range(3):
            api.append("dense", f"step {step} " + TEXT * 20, "done")
            view = api.compile("dense")
            b = view.budget
            assert b.provider_overhead_tokens < 0, b
            negative -= b.provider_overhead_tokens
            estimates += b.estimated_input_tokens
            api.report(view, round(b.ledger_tokens * 0.6))
            after = _view_tokens_sums(metrics)
            assert all(after[k] >= before.get(k, 0.0) for k in after), (before, after)
            before = after
        api.channel.close()
    finally:
        assert daemon.terminate() == 0
    assert before["provider_overhead_negative"] == negative
    layers = sum(v for k, v in before.items() if not k.startswith("provider_overhead"))
    overhead = before["provider_overhead"] - before["provider_overhead_negative"]
    assert layers + overhead == estimates
