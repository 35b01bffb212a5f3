"""The dashboard and the alerts against a real Prometheus: Debian's server scrapes two
daemons (run as an operator runs them, one per pod) twice a second while `ctxcc replay`
drives recorded agent traffic through them; then every dashboard query is sent as
Grafana would send it, and every alert expression is evaluated, through its HTTP API.

Healthy load must leave every panel with data and every alert quiet."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.e2e.prom import (
    JOB,
    NAMESPACE,
    RULES,
    SCRAPE_SECONDS,
    Run,
    Series,
    dashboard,
    finite,
    grafana_expr,
    replay_under_prometheus,
)

# A small fleet of fresh sidecars serving short agent sessions: two pods, each replaying
# the first 4 requests of its share of the development traces' 17 sessions (Claude
# Code and OpenHands on Anthropic, Llama and OpenAI models), twice over, so the second
# round lands on series Prometheus already knows. One report in four is a session's
# first request, which no provider baseline anchors: healthy, and far less exact.
REPLAY_REQUESTS = 4
PODS_N = 2
ROUNDS = 2
# $__rate_interval: Grafana widens it to cover the scrape; here it covers the whole run.
RATE_INTERVAL = "10m"
# The estimation-error rule as it stood before it was split by method: on this healthy
# load it fires, which is what this test exists to catch.
MIXED_METHOD_RULE = (
    "histogram_quantile(0.95, sum by (le, model_family) "
    "(rate(ctxcc_estimation_error_ratio_bucket[15m]))) > 0.10"
)
PODS = [f"agent-{i}" for i in range(PODS_N)]
# The variables as Grafana sends a multi-value selection: a regex alternation.
FILTERS = {"job": JOB, "namespace": NAMESPACE, "pod": f"({'|'.join(PODS)})"}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    work = tmp_path_factory.mktemp("prom")
    with replay_under_prometheus(work, REPLAY_REQUESTS, pods=PODS_N, rounds=ROUNDS) as done:
        yield done


def _targets() -> list[tuple[str, str, str]]:
    return [
        (p["title"], t["refId"], t["expr"]) for p in dashboard()["panels"] for t in p["targets"]
    ]


def _query(run: Run, expr: str, **variables: str) -> list[Series]:
    return run.prom.query(grafana_expr(expr, FILTERS | variables, RATE_INTERVAL), at=run.at)


def _rules() -> list[dict[str, Any]]:
    plain = yaml.safe_load(RULES.read_text())
    return [r for g in plain["groups"] for r in g["rules"] if "alert" in r]


@pytest.mark.parametrize(("title", "ref", "expr"), _targets(), ids=lambda v: str(v)[:40])
def test_every_dashboard_query_has_data(run: Run, title: str, ref: str, expr: str) -> None:
    got = finite(_query(run, expr))
    assert got, f"{title} / {ref} shows no data: {expr}"
    # The job/namespace/pod variables filter every query: another namespace is empty.
    assert _query(run, expr, namespace="elsewhere") == [], f"{title} / {ref} ignores $namespace"


def test_dashboard_variables_list_the_scraped_target(run: Run) -> None:
    queries = {v["name"]: v["query"] for v in dashboard()["templating"]["list"][1:]}
    assert set(queries) == {"job", "namespace", "pod"}
    for name, query in queries.items():
        # Grafana's label_values(SELECTOR, LABEL) is the series API plus a label.
        found = re.fullmatch(r"label_values\((.+), (\w+)\)", query)
        assert found and found.group(2) == name, query
        selector = grafana_expr(found.group(1), {k: ".*" for k in FILTERS}, RATE_INTERVAL)
        series = run.prom.api("series", **{"match[]": selector})
        want = set(PODS) if name == "pod" else {FILTERS[name]}
        assert {s.get(name) for s in series} == want, (name, series)


def test_pressure_panel_shows_every_layer_the_daemon_measured(run: Run) -> None:
    (pressure,) = [p for p in dashboard()["panels"] if "pressure by layer" in p["title"]]
    shown = {s.labels["layer"] for t in pressure["targets"] for s in finite(_query(run, t["expr"]))}
    measured = set(re.findall(r'^ctxcc_view_tokens_count\{layer="(\w+)"\} [1-9]', run.scrape, re.M))
    # provider_overhead: what the provider counted that no local item explains, so the
    # stack adds up to the estimate; its negative half (the dense provider's session)
    # drawn below zero.
    assert {"pinned", "history", "tool_schema", "provider_overhead"} <= measured
    assert "provider_overhead_negative" in measured
    assert shown == measured
    (below,) = finite(_query(run, pressure["targets"][1]["expr"]))
    assert below.values[0][1] < 0


def test_no_histogram_sum_ever_fell(run: Run) -> None:
    """A histogram's _sum and _count only grow: Prometheus takes a fall for a counter
    reset. A negative provider overhead observed as it was made the overhead's _sum fall
    (the dense provider's session) and rate() of it meaningless."""
    sums = run.prom.query('ctxcc_view_tokens_sum{layer="provider_overhead_negative"}', at=run.at)
    assert sums and all(s.values[0][1] > 0 for s in sums if s.labels["pod"] == "agent-0")
    names = [
        n for n in run.prom.api("label/__name__/values") if re.fullmatch(r"ctxcc_.*_(sum|count)", n)
    ]
    assert "ctxcc_view_tokens_sum" in names
    for name in names:
        resets = run.prom.query(f"resets({name}[{RATE_INTERVAL}]) > 0", at=run.at)
        assert resets == [], (name, [r.labels for r in resets])


def test_no_series_is_a_created_timestamp(run: Run) -> None:
    """prometheus-client's `_created` samples were stored as series of their own, one per
    counter and histogram series (473 of a fresh daemon's 1,098), on every sidecar, read
    by no rule or panel."""
    created = run.prom.query('count({__name__=~"ctxcc_.+_created"})', at=run.at)
    assert created == [], created
    assert run.prom.query('count({__name__=~"ctxcc_.+"})', at=run.at)


def test_rpc_error_panel_shows_the_first_error_of_a_method(run: Run) -> None:
    (panel,) = [p for p in dashboard()["panels"] if "RPC errors" in p["title"]]
    by_code = _query(run, panel["targets"][1]["expr"])
    seen = {(s.labels["method"], s.labels["code"]): s.values[0][1] for s in by_code}
    # One NOT_FOUND before the replay: a series born with it would show a rate of 0.
    assert seen.get(("SessionService/GetSession", "NOT_FOUND"), 0) > 0, seen


def _host_disk_free_ratio() -> float:
    """Free share of the filesystem the daemons' data dirs are on, as they report it."""
    st = os.statvfs("/tmp")  # where replay_under_prometheus puts them
    return st.f_bavail / st.f_blocks


def test_no_alert_fires_on_healthy_load(run: Run) -> None:
    rules = _rules()
    assert len(rules) == 8
    # The data dirs are on the host's disk: on a host whose disk is itself nearly full,
    # CtxccDataDirLowSpace is right to fire, and then it must show that disk's free share.
    host_low = _host_disk_free_ratio() < 0.11
    for rule in rules:
        got = run.prom.query(rule["expr"], at=run.at)
        if rule["alert"] == "CtxccDataDirLowSpace" and host_low:
            ratio = _host_disk_free_ratio()
            assert all(abs(s.values[0][1] - ratio) < 0.01 for s in got), (got, ratio)
            continue
        assert got == [], rule["alert"]
    # Prometheus evaluated the same file every second: loaded, healthy, nothing pending.
    groups = run.prom.api("rules")["groups"]
    loaded = [r for g in groups for r in g["rules"]]
    assert {r["name"] for r in loaded} == {r["alert"] for r in rules}
    assert all(r["health"] == "ok" for r in loaded), loaded
    alerts = run.prom.api("alerts")["alerts"]
    if host_low:
        alerts = [a for a in alerts if a["labels"]["alertname"] != "CtxccDataDirLowSpace"]
    assert alerts == []


def test_this_load_would_fire_a_mixed_method_estimation_rule(run: Run) -> None:
    # The load is one the old rule got wrong: without it, a quiet alert proves nothing.
    fired = run.prom.query(MIXED_METHOD_RULE, at=run.at)
    assert fired, "this load no longer mixes far-off FULL estimates into the p95"
    first = run.prom.query(
        "histogram_quantile(0.95, sum by (le) "
        '(rate(ctxcc_estimation_error_ratio_bucket{method!="baseline_delta"}[15m])))',
        at=run.at,
    )
    assert first and first[0].values[0][1] > 0.10, first


def test_every_scrape_under_load_is_consistent(run: Run) -> None:
    """Counters and histograms are read by a collector at scrape time while the replay
    records into them from the event loop and worker threads: in every sample Prometheus
    took, no counter, bucket or count went down (Prometheus would take it for a restart
    of the daemon and count the whole value again in every rate) and every histogram's
    count is its +Inf bucket (a scrape that copied a series halfway through an
    observation breaks it). The sums are left out: provider overhead tokens are negative
    when the provider counts fewer tokens than the ledger."""
    monotonic = f'{{__name__=~"ctxcc_.+(_total|_bucket|_count)", job="{JOB}"}}'
    # The series Prometheus holds: each counter and histogram the daemons expose.
    seen = run.prom.query(f"count by (__name__) ({monotonic})", at=run.at)
    names = sorted(s.labels["__name__"] for s in seen)
    histograms = [n.removesuffix("_bucket") for n in names if n.endswith("_bucket")]
    assert "ctxcc_compile_duration_seconds" in histograms and len(histograms) >= 6, histograms
    assert "ctxcc_usage_reports_total" in names, names
    window = f"{int(run.at - run.started) + 60}s"
    for name in names:
        resets = run.prom.query(f"resets({name}[{window}]) > 0", at=run.at)
        assert resets == [], (name, [(s.labels, s.values) for s in resets])
    for name in histograms:
        off = run.prom.query_range(
            f'{name}_count - ignoring(le) {name}_bucket{{le="+Inf"}} != 0',
            run.started,
            run.at,
            SCRAPE_SECONDS,
        )
        assert off == [], (name, [(s.labels, s.values[:3]) for s in off])
        samples = run.prom.query_range(f"{name}_count", run.started, run.at, SCRAPE_SECONDS)
        assert samples, f"{name}: no samples over the run"
