"""Writes deploy/grafana/ctxcc-dashboard.json. The dashboard is code so its queries stay
in step with the metric names; tests/integration/test_observability.py checks that every
metric a query uses exists in a real scrape and that this file is up to date, and
tests/e2e/test_prometheus.py runs every query against a real Prometheus."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# The Kustomize base packs its own copy into a ConfigMap (kustomize reads no file outside
# its directory); both are written here and checked together.
OUTS = (
    ROOT / "deploy" / "grafana" / "ctxcc-dashboard.json",
    ROOT / "deploy" / "kubernetes" / "base" / "dashboards" / "ctxcc-dashboard.json",
)
DS = {"type": "prometheus", "uid": "${datasource}"}
RI = "$__rate_interval"


# Every query is filtered by these; "All" is a regex matching any value, empty included.
FILTERS = ("job", "namespace", "pod")
SEL = ", ".join(f'{name}=~"${name}"' for name in FILTERS)


def m(name: str, *matchers: str) -> str:
    """A metric selector carrying the dashboard's job/namespace/pod filters."""
    return f"{name}{{{', '.join((SEL, *matchers))}}}"


def q(p: float, by: str, bucket: str, *matchers: str) -> str:
    return f"histogram_quantile({p}, sum by ({by}) (rate({m(bucket, *matchers)}[{RI}])))"


def panel(
    pid: int,
    title: str,
    x: int,
    y: int,
    targets: list[tuple[str, str]],
    *,
    unit: str,
    stacked: bool = False,
    description: str = "",
) -> dict[str, Any]:
    """One time series panel: one unit, so one axis."""
    return {
        "id": pid,
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DS,
        "gridPos": {"h": 8, "w": 12, "x": x, "y": y},
        "fieldConfig": {
            "defaults": {
                "unit": unit,
                "custom": {
                    "stacking": {"mode": "normal" if stacked else "none", "group": "A"},
                    "fillOpacity": 60 if stacked else 10,
                },
            },
            "overrides": [],
        },
        "targets": [
            {"refId": chr(65 + i), "datasource": DS, "expr": expr, "legendFormat": legend}
            for i, (expr, legend) in enumerate(targets)
        ],
    }


def variable(name: str, label: str, query: str) -> dict[str, Any]:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DS,
        "query": query,
        "definition": query,
        "refresh": 2,
        "includeAll": True,
        "multi": True,
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "sort": 1,
        "hide": 0,
    }


# The overhead's negative half (metrics.py observes it apart: a histogram's _sum must not
# fall), drawn below zero so that the stack still adds up to the estimate.
NEGATIVE = 'layer="provider_overhead_negative"'
NOT_NEGATIVE = 'layer!="provider_overhead_negative"'
# The reasons CtxccServerErrors counts: the daemon's own failures.
OWN_FAULT = 'reason=~"STORAGE_FAILURE|RECORD_CORRUPT|INTERNAL"'


def panels() -> list[dict[str, Any]]:
    sum_rate = lambda by, name, *ms: f"sum by ({by}) (rate({m(name, *ms)}[{RI}]))"  # noqa: E731
    return [
        panel(
            1,
            "Context pressure by layer (tokens per view)",
            0,
            0,
            [
                (
                    f"{sum_rate('layer', 'ctxcc_view_tokens_sum', NOT_NEGATIVE)} / "
                    f"{sum_rate('layer', 'ctxcc_view_tokens_count', NOT_NEGATIVE)}",
                    "{{layer}}",
                ),
                (
                    f"-1 * {sum_rate('layer', 'ctxcc_view_tokens_sum', NEGATIVE)} / "
                    f"{sum_rate('layer', 'ctxcc_view_tokens_count', NEGATIVE)}",
                    "{{layer}}",
                ),
            ],
            unit="short",
            stacked=True,
            description=(
                "Average estimated tokens of compiled views, per layer. provider_overhead is "
                "what the provider counts that no local item explains, so the stack adds "
                "up to the estimate that utilisation divides by the budget; when the "
                "provider counts fewer tokens than the layers, provider_overhead_negative "
                "is drawn below zero."
            ),
        ),
        panel(
            2,
            "Budget utilisation (estimate / input budget)",
            12,
            0,
            [
                (q(0.5, "le", "ctxcc_budget_utilization_ratio_bucket"), "p50"),
                (q(0.95, "le", "ctxcc_budget_utilization_ratio_bucket"), "p95"),
            ],
            unit="percentunit",
        ),
        panel(
            3,
            "Estimation error by method and route model (p95)",
            0,
            8,
            [
                (
                    q(0.95, "le, method, model", "ctxcc_estimation_error_ratio_bucket"),
                    "{{method}} {{model}}",
                ),
            ],
            unit="percentunit",
            description=(
                "baseline_delta is what CtxccEstimationErrorHigh watches (above 10% means "
                "the model's catalog entry needs a look); full estimates (first requests) "
                "also miss the provider's hidden prompt and run high on healthy traffic."
            ),
        ),
        panel(
            4,
            "Compactions and projection fallbacks",
            12,
            8,
            [
                (
                    sum_rate("kind, performed", "ctxcc_compactions_total"),
                    "compaction {{kind}} performed={{performed}}",
                ),
                (sum_rate("reason", "ctxcc_projection_fallbacks_total"), "fallback {{reason}}"),
                (
                    sum_rate("reason", "ctxcc_compiles_without_basis_total"),
                    "recorded without basis ({{reason}})",
                ),
            ],
            unit="ops",
            description=(
                "Recorded without basis: compiles that cannot be rebuilt, their session's "
                "bases past --max-session-basis-bytes, or repeats of such compiles "
                "(quota), or the basis they name not stored (missing); appends are never "
                "refused for them."
            ),
        ),
        panel(
            5,
            "Compile latency",
            0,
            16,
            [
                (q(0.5, "le", "ctxcc_compile_duration_seconds_bucket"), "p50"),
                (q(0.99, "le", "ctxcc_compile_duration_seconds_bucket"), "p99"),
            ],
            unit="s",
        ),
        panel(
            6,
            "RPC errors by method and code",
            12,
            16,
            [
                (f"sum(rate({m('ctxcc_rpc_errors_total')}[{RI}]))", "all errors"),
                (
                    f"{sum_rate('method, code', 'ctxcc_rpc_errors_total')} > 0",
                    "{{method}} {{code}}",
                ),
            ],
            unit="reqps",
            description="Every method and code starts at zero, so a first error shows.",
        ),
        panel(
            7,
            "Decisions",
            0,
            24,
            [(sum_rate("decision", "ctxcc_compile_decisions_total"), "{{decision}}")],
            unit="ops",
            stacked=True,
        ),
        panel(
            8,
            "Prompt-cache busts by section",
            12,
            24,
            [(sum_rate("section", "ctxcc_prefix_changes_total"), "{{section}}")],
            unit="ops",
        ),
        panel(
            9,
            "Sessions, watchers and calls in flight",
            0,
            32,
            [
                (f"sum({m('ctxcc_sessions')})", "sessions"),
                (f"sum({m('ctxcc_sessions_over_budget')})", "over budget"),
                (f"sum({m('ctxcc_watchers')})", "watchers"),
                (f"sum({m('ctxcc_rpcs_in_flight')})", "calls in flight"),
            ],
            unit="short",
            description="Over budget: sessions whose latest compile, in the last 5 minutes, "
            "was over its input budget (CtxccSessionsOverBudget). "
            "Calls in flight are those a graceful shutdown waits for.",
        ),
        panel(
            10,
            "RocksDB data by part",
            12,
            32,
            [(f"sum by (part) ({m('ctxcc_rocksdb_size_bytes')})", "{{part}}")],
            unit="bytes",
            stacked=True,
            description="Live table files, write-ahead log and memtables.",
        ),
        panel(
            11,
            "Data directory free space (lowest 5 pods)",
            0,
            40,
            [
                (
                    f"bottomk(5, {m('ctxcc_data_dir_free_bytes')} / "
                    f"{m('ctxcc_data_dir_capacity_bytes')})",
                    "{{namespace}}/{{pod}}",
                )
            ],
            unit="percentunit",
            description=(
                "CtxccDataDirLowSpace fires under 10%. A daemon that refuses writes for lack "
                "of space (ctxcc_data_dir_full) may show more: CtxccDataDirFull names it."
            ),
        ),
        panel(
            12,
            "Events appended",
            12,
            40,
            [(f"sum(rate({m('ctxcc_events_appended_total')}[{RI}]))", "events/s")],
            unit="ops",
        ),
        panel(
            13,
            "Durable write latency",
            0,
            48,
            [
                (q(0.5, "le", "ctxcc_storage_write_duration_seconds_bucket"), "p50"),
                (q(0.99, "le", "ctxcc_storage_write_duration_seconds_bucket"), "p99"),
            ],
            unit="s",
        ),
        panel(
            14,
            "Errors by reason",
            12,
            48,
            [
                (f"sum(rate({m('ctxcc_errors_total', OWN_FAULT)}[{RI}]))", "the daemon's own"),
                (f"{sum_rate('reason', 'ctxcc_errors_total')} > 0", "{{reason}}"),
            ],
            unit="ops",
            description=(
                "Every error answered, calls' statuses and CompileStream steps' in-band "
                "errors alike, by ErrorInfo reason: a failing disk (STORAGE_FAILURE) and a "
                "drain (SHUTTING_DOWN) are both UNAVAILABLE by code. The daemon's own: "
                "STORAGE_FAILURE, RECORD_CORRUPT and INTERNAL, which CtxccServerErrors "
                "counts."
            ),
        ),
        panel(
            15,
            "Estimates under the provider's count (share of usage reports, and p95 shortfall)",
            0,
            56,
            [
                (
                    f"{sum_rate('method, model', 'ctxcc_estimation_under_ratio_count')}"
                    f" / {sum_rate('method, model', 'ctxcc_estimation_error_ratio_count')}",
                    "share under {{method}} {{model}}",
                ),
                (
                    q(0.95, "le, method, model", "ctxcc_estimation_under_ratio_bucket"),
                    "p95 shortfall {{method}} {{model}}",
                ),
            ],
            unit="percentunit",
            description=(
                "An estimate under the provider's count is the direction that lets a request "
                "past the model's window; the error panel shows a miss's size only. Healthy "
                "baseline_delta estimates lean high, so a share near 1 there with a "
                "shortfall of more than a few percent means the catalog entry counts low."
            ),
        ),
    ]


def dashboard() -> dict[str, Any]:
    return {
        "uid": "ctxcc-context-pressure",
        "title": "ctxcc — context pressure",
        "tags": ["ctxcc"],
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "30s",
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Prometheus",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                    "hide": 0,
                },
                variable("job", "Job", "label_values(ctxcc_build_info, job)"),
                variable(
                    "namespace",
                    "Namespace",
                    'label_values(ctxcc_build_info{job=~"$job"}, namespace)',
                ),
                variable(
                    "pod",
                    "Pod",
                    'label_values(ctxcc_build_info{job=~"$job", namespace=~"$namespace"}, pod)',
                ),
            ]
        },
        "annotations": {"list": []},
        "panels": panels(),
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    text = render()
    if sys.argv[1:] == ["--check"]:
        stale = [str(p) for p in OUTS if not p.exists() or p.read_text() != text]
        sys.exit(f"stale: {', '.join(stale)}; run make dashboard" if stale else 0)
    for out in OUTS:
        out.write_text(text)
        print(out)
