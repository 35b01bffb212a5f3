"""Observability against real parts: a replay through a daemon, a real /metrics scrape
checked by promtool, the Grafana dashboard's queries against that scrape, the alert
rules under `promtool test rules`, and `ctxcc inspect` / `ctxcc sessions`."""

from __future__ import annotations

import asyncio
import io
import json
import lzma
import re
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from bench.paths import dev_traces
from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_pb2
from ctxcc.v1 import session_service_pb2 as spb
from server.app import Daemon
from server.domain.errors import Reason
from server.replay import run
from tests.conftest import make_config, stubs_for
from tests.helpers import ROUTE, compile_request, user

REPO = Path(__file__).resolve().parents[2]
PROMTOOL = REPO / ".tools" / "promtool"
DEV = dev_traces()


@pytest.fixture
async def replayed(short_tmp: Path) -> AsyncIterator[tuple[Daemon, str]]:
    trace = short_tmp / "part.jsonl"
    with lzma.open(DEV, "rt") as f:
        trace.write_text("".join(f.readlines()[:80]))
    d = Daemon(make_config(short_tmp / "data"))
    await d.start()
    try:
        await run(trace, f"unix:{d.endpoints.unix}", None, io.StringIO())
        url = f"http://{d.endpoints.metrics}/metrics"
        scrape = urllib.request.urlopen(url, timeout=10).read().decode()  # noqa: ASYNC210
        yield d, scrape
    finally:
        await d.stop()


def _promtool(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL.exists(), "run `make test` (it fetches promtool) or scripts/get_prometheus.sh"
    return subprocess.run(
        [str(PROMTOOL), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=REPO / "deploy" / "prometheus",
    )


def _samples(scrape: str) -> set[str]:
    return {
        line.split("{")[0].split(" ")[0] for line in scrape.splitlines() if line and line[0] != "#"
    }


async def test_real_scrape_passes_promtool_and_has_the_metrics(
    replayed: tuple[Daemon, str],
) -> None:
    _, scrape = replayed
    checked = _promtool("check", "metrics", stdin=scrape)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    names = _samples(scrape)
    for name in (
        "ctxcc_compile_duration_seconds_bucket",
        "ctxcc_view_tokens_sum",
        "ctxcc_budget_utilization_ratio_bucket",
        "ctxcc_compile_decisions_total",
        "ctxcc_estimation_error_ratio_bucket",
        "ctxcc_estimation_error_tokens_bucket",
        "ctxcc_usage_reports_total",
        "ctxcc_events_appended_total",
        "ctxcc_appended_bytes_total",
        "ctxcc_rpc_duration_seconds_count",
        "ctxcc_storage_write_duration_seconds_bucket",
        "ctxcc_sessions",
        "ctxcc_rocksdb_size_bytes",
        "ctxcc_data_dir_free_bytes",
        "ctxcc_data_dir_full",
        "ctxcc_compiles_without_basis_total",
        "ctxcc_watchers",
        "ctxcc_sessions_over_budget",
        "ctxcc_tokenizer_loaded",
        "ctxcc_build_info",
    ):
        assert name in names, name
    # The replay compiled Claude routes: their table is built (others may be, by other
    # tests in this process; tests/e2e/test_tokenizer_loading.py checks a fresh daemon).
    assert 'ctxcc_tokenizer_loaded{tokenizer="claude"} 1.0' in scrape
    assert 'layer="history"' in scrape and 'model_family="anthropic"' in scrape
    assert re.search(
        r'ctxcc_usage_reports_total\{method="baseline_delta",model="claude-sonnet-4",'
        r'model_family="anthropic"\} [1-9]',
        scrape,
    )
    assert "replay-" not in scrape, "a session id leaked into a label"
    sessions = re.search(r"^ctxcc_sessions (\d+)", scrape, re.M)
    assert sessions and int(sessions.group(1)) >= 1


async def test_dashboard_queries_use_only_scraped_metrics(replayed: tuple[Daemon, str]) -> None:
    _, scrape = replayed
    check = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "scripts/gen_dashboard.py", "--check"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert check.returncode == 0, check.stderr
    board = json.loads((REPO / "deploy/grafana/ctxcc-dashboard.json").read_text())
    assert board["templating"]["list"][0] == {
        "name": "datasource",
        "label": "Prometheus",
        "type": "datasource",
        "query": "prometheus",
        "current": {},
        "hide": 0,
    }
    names = _samples(scrape)
    used = set()
    titles = [p["title"] for p in board["panels"]]
    for p in board["panels"]:
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        for t in p["targets"]:
            used |= set(re.findall(r"\bctxcc_[a-z_]+", t["expr"]))
    assert used and used <= names, sorted(used - names)
    for wanted in (
        "pressure by layer",
        "utilisation",
        "Estimation error",
        "Compactions",
        "Compile latency",
        "RPC errors",
    ):
        assert any(wanted in t for t in titles), wanted


def test_alert_rules_check_and_unit_tests_pass() -> None:
    checked = _promtool("check", "rules", "ctxcc-rules.yaml")
    assert checked.returncode == 0 and "8 rules found" in checked.stdout, (
        checked.stdout + checked.stderr
    )
    tested = _promtool("test", "rules", "ctxcc-rules.test.yaml")
    assert tested.returncode == 0, tested.stdout + tested.stderr
    plain = yaml.safe_load((REPO / "deploy/prometheus/ctxcc-rules.yaml").read_text())
    operator = yaml.safe_load((REPO / "deploy/kubernetes/base/prometheusrule.yaml").read_text())
    assert operator["kind"] == "PrometheusRule"
    assert operator["spec"]["groups"] == plain["groups"]
    alerts = {r["alert"] for g in plain["groups"] for r in g["rules"]}
    assert alerts == {
        "CtxccEstimationErrorHigh",
        "CtxccProjectionFallbacks",
        "CtxccCompileSlow",
        "CtxccSessionsOverBudget",
        "CtxccDataDirLowSpace",
        "CtxccDataDirFull",
        "CtxccServerErrors",
        "CtxccTargetDown",
    }


async def test_inspect_and_sessions_after_a_replay(replayed: tuple[Daemon, str]) -> None:
    d, _ = replayed
    target = f"unix:{d.endpoints.unix}"

    def ctxcc(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "server", *args, "--target", target],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    listed = await asyncio.to_thread(ctxcc, "sessions", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert len(rows) >= 2 and all(r["model"] for r in rows)
    sid = max(rows, key=lambda r: r["head_seq"])["session_id"]
    shown = await asyncio.to_thread(ctxcc, "inspect", sid, "--json")
    assert shown.returncode == 0, shown.stderr
    s = json.loads(shown.stdout)
    assert s["session_id"] == sid and s["context_window"] == 200_000
    assert s["estimate_method"] == "baseline_delta" and s["last_reported_input_tokens"] > 0
    assert set(s["layers"]) == {"pinned", "history", "working_set", "tool_schema", "native_state"}
    assert s["biggest_items"]["history"][0]["tokens"] >= s["biggest_items"]["history"][-1]["tokens"]
    text = await asyncio.to_thread(ctxcc, "inspect", sid, "--at-seq", "3")
    assert text.returncode == 0, text.stderr
    assert text.stdout.splitlines()[0].startswith(f"session {sid}  seq 3")
    assert text.stdout.splitlines()[1].startswith("showing ")
    # Seq 3 is the first request's tool result: all of it is the current turn.
    assert text.stdout.splitlines()[2].startswith("[") and "▒" in text.stdout.splitlines()[2]
    # The first request had no report before it (its own came after it: the next one's
    # baseline), which the text says as such.
    first = await asyncio.to_thread(ctxcc, "inspect", sid, "--at-seq", "1")
    assert "(route_model)" in first.stdout, first.stdout
    assert "no usage reported on this route before it" in first.stdout
    latest = await asyncio.to_thread(ctxcc, "inspect", sid)
    assert f"baseline {s['last_reported_input_tokens']} reported before it" in latest.stdout
    # Inspecting changes nothing: no compile is recorded, the estimate basis stays.
    again = json.loads((await asyncio.to_thread(ctxcc, "inspect", sid, "--json")).stdout)
    assert again["estimated_input_tokens"] == s["estimated_input_tokens"]
    missing = await asyncio.to_thread(ctxcc, "inspect", "no-such-session")
    assert missing.returncode == 1 and "NOT_FOUND" in missing.stderr


def _unit_of(expr: str) -> str:
    """The unit a query's numbers are in, read from the metric names it uses."""
    if "histogram_quantile" in expr:
        bucket = re.search(r"\b(ctxcc_\w+)_bucket\b", expr)
        assert bucket, expr
        return {"seconds": "s", "ratio": "percentunit"}[bucket.group(1).rsplit("_", 1)[1]]
    if re.search(r"_sum\b.*\) / .*_count\b", expr):
        return {"tokens": "short"}[re.findall(r"\bctxcc_\w+?_(\w+)_sum\b", expr)[0]]
    if re.search(r"_count\b.*\) / .*_count\b", expr):
        return "percentunit"  # a share of one family's observations in another's
    if "rate(" in expr:
        return "ops"
    sizes = re.findall(r"\bctxcc_\w+_bytes\b", expr)
    if sizes:
        return "percentunit" if len(sizes) == 2 and " / " in expr else "bytes"
    return "short"


def test_every_panel_has_one_unit_on_its_axis() -> None:
    board = json.loads((REPO / "deploy/grafana/ctxcc-dashboard.json").read_text())
    for p in board["panels"]:
        unit = p["fieldConfig"]["defaults"]["unit"]
        assert p["fieldConfig"]["overrides"] == [], p["title"]
        got = {_unit_of(t["expr"]) for t in p["targets"]}
        assert got == {"ops" if unit == "reqps" else unit}, (p["title"], unit, got)


def test_dashboard_layout_and_variables_are_consistent() -> None:
    board = json.loads((REPO / "deploy/grafana/ctxcc-dashboard.json").read_text())
    panels = board["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells: set[tuple[int, int]] = set()
    for p in panels:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        area = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not cells & area, f"{p['title']} overlaps another panel"
        cells |= area
        refs = [t["refId"] for t in p["targets"]]
        assert len(set(refs)) == len(refs), p["title"]
    defined = {v["name"] for v in board["templating"]["list"]} | {"__rate_interval"}
    used = {
        name for p in panels for t in p["targets"] for name in re.findall(r"\$\{?(\w+)", t["expr"])
    }
    assert used == defined - {"datasource"}


def _errors_by_reason(d: Daemon) -> dict[str, float]:
    text = generate_latest(d.telemetry.registry).decode()
    return {
        m.group(1): float(m.group(2))
        for m in re.finditer(r'^ctxcc_errors_total\{reason="(\w+)"\} (\S+)$', text, re.M)
    }


async def test_each_answered_error_is_counted_once_by_its_reason(short_tmp: Path) -> None:
    token = short_tmp / "token"
    token.write_text("t" * 32)
    d = Daemon(make_config(short_tmp / "data", auth_token_file=str(token)))
    await d.start()
    assert d.endpoints.tcp is not None
    tcp, unix = stubs_for(d.endpoints.tcp), stubs_for(f"unix:{d.endpoints.unix}")
    try:
        assert set(_errors_by_reason(d).values()) == {0.0}
        # Refused by the interceptor before any handler runs (no token over TCP).
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await tcp.sessions.GetSession(spb.GetSessionRequest(session_id="gone"))
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        # A handler's own error, through its guard and then the interceptor.
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await unix.sessions.GetSession(spb.GetSessionRequest(session_id="gone"))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        # A method no service has: answered outside the calls the interceptor wraps.
        nothing: Any = unix.channel.unary_unary("/ctxcc.v1.NoService/Nothing")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await nothing(b"")
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
        # Two stream steps answered in-band, then the stream ends OK: counted as steps,
        # never again as a call.
        call: Any = unix.compiles.CompileStream()
        for k in range(2):
            step = cpb.StepRequest(
                step_id=str(k), compile=cpb.CompileRequest(session_id="gone", route=ROUTE)
            )
            await call.write(cpb.CompileStreamRequest(step=step))
            answer = await call.read()
            assert answer.error.reason == "SESSION_NOT_FOUND"
        await call.done_writing()
        assert await call.code() == grpc.StatusCode.OK

        counted = {r: n for r, n in _errors_by_reason(d).items() if n}
        assert counted == {"UNAUTHENTICATED": 1, "SESSION_NOT_FOUND": 3, "METHOD_NOT_FOUND": 1}
        assert set(_errors_by_reason(d)) == {r.value for r in Reason}
    finally:
        await tcp.channel.close()
        await unix.channel.close()
        await d.stop()


def _family_samples(scrape: str, name: str) -> dict[tuple[str, str], float]:
    """(sample name, le) -> value of one family's samples for ROUTE's model, summed over
    the estimate methods."""
    out: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(scrape):
        for s in family.samples:
            if s.name.startswith(name) and s.labels.get("model") == ROUTE.model:
                key = s.name, s.labels.get("le", "")
                out[key] = out.get(key, 0.0) + s.value
    return out


async def _reported_then_scraped(
    data: Path, factors: dict[str, float]
) -> tuple[str, dict[str, float]]:
    """A daemon where each session (by id) compiles one message and reports `factor` times
    its estimate: the /metrics scrape after, and each report's shortfall."""
    d = Daemon(make_config(data))
    await d.start()
    shortfalls = {}
    try:
        api = stubs_for(f"unix:{d.endpoints.unix}")
        for sid, factor in factors.items():
            await api.sessions.CreateSession(
                spb.CreateSessionRequest(session=session_pb2.Session(session_id=sid))
            )
            await api.sessions.AppendEvents(
                spb.AppendEventsRequest(session_id=sid, events=[user("list the files " * 50)])
            )
            view = (await api.compiles.Compile(compile_request(sid))).view
            estimate = view.budget.estimated_input_tokens
            reported = int(estimate * factor)
            await api.compiles.ReportUsage(
                cpb.ReportUsageRequest(
                    compile_id=view.compile_id, route=ROUTE, input_tokens=reported
                )
            )
            shortfalls[sid] = (reported - estimate) / reported
        url = f"http://{d.endpoints.metrics}/metrics"
        scrape = await asyncio.to_thread(
            lambda: urllib.request.urlopen(url, timeout=10).read().decode()
        )
        await api.channel.close()
    finally:
        await d.stop()
    return scrape, shortfalls


async def test_estimates_under_the_reported_count_are_told_apart(short_tmp: Path) -> None:
    """The error histograms hold a miss's size only: an estimate under the provider's
    count (the direction that lets a request past the window) is counted apart, with its
    shortfall, in a real scrape; an over-estimate is not."""
    scrape, shortfalls = await _reported_then_scraped(
        short_tmp / "data", {"under": 4.0, "over": 0.25}
    )
    errors = _family_samples(scrape, "ctxcc_estimation_error_ratio")
    under = _family_samples(scrape, "ctxcc_estimation_under_ratio")
    assert errors["ctxcc_estimation_error_ratio_count", ""] == 2
    assert under["ctxcc_estimation_under_ratio_count", ""] == 1
    assert under["ctxcc_estimation_under_ratio_sum", ""] == pytest.approx(shortfalls["under"])
    assert 0.7 < shortfalls["under"] <= 0.75  # a quarter of the count estimated
    assert under["ctxcc_estimation_under_ratio_bucket", "0.5"] == 0
    assert under["ctxcc_estimation_under_ratio_bucket", "1.0"] == 1
    # An over-estimate of more than twice the count (here about four times) has buckets
    # of its own below +Inf.
    assert errors["ctxcc_estimation_error_ratio_bucket", "1.0"] == 1
    assert errors["ctxcc_estimation_error_ratio_bucket", "2.0"] == 1
    assert errors["ctxcc_estimation_error_ratio_bucket", "5.0"] == 2


async def test_the_under_series_exists_at_zero_from_a_label_sets_first_report(
    short_tmp: Path,
) -> None:
    """Over-estimates only: the dashboard's share under is 0 for the route, not absent,
    and a later first shortfall is a change rate() sees, not a series born with it."""
    scrape, _ = await _reported_then_scraped(short_tmp / "data", {"over": 0.5})
    errors = _family_samples(scrape, "ctxcc_estimation_error_ratio")
    under = _family_samples(scrape, "ctxcc_estimation_under_ratio")
    assert errors["ctxcc_estimation_error_ratio_count", ""] == 1
    assert under.get(("ctxcc_estimation_under_ratio_count", "")) == 0, under
