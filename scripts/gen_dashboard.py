"""Writes deploy/grafana/ctxcc-dashboard.json. The dashboard is code so its queries stay
in step with the metric names; tests/integration/test_observability.py checks that every
metric a query uses exists in a real scrape, and that this file is up to date."""

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


def panel(
    pid: int,
    title: str,
    x: int,
    y: int,
    targets: list[tuple[str, str]],
    *,
    unit: str = "short",
    stacked: bool = False,
    description: str = "",
) -> dict[str, Any]:
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


def dashboard() -> dict[str, Any]:
    q = lambda p, expr: f"histogram_quantile({p}, {expr})"  # noqa: E731
    panels = [
        panel(
            1,
            "Context pressure by layer (tokens per view)",
            0,
            0,
            [
                (
                    f"sum by (layer) (rate(ctxcc_view_tokens_sum[{RI}])) / "
                    f"sum by (layer) (rate(ctxcc_view_tokens_count[{RI}]))",
                    "{{layer}}",
                )
            ],
            stacked=True,
            description="Average estimated tokens of compiled views, per layer.",
        ),
        panel(
            2,
            "Budget utilisation (estimate / input budget)",
            12,
            0,
            [
                (q(0.5, f"sum by (le) (rate(ctxcc_budget_utilization_ratio_bucket[{RI}]))"), "p50"),
                (
                    q(0.95, f"sum by (le) (rate(ctxcc_budget_utilization_ratio_bucket[{RI}]))"),
                    "p95",
                ),
            ],
            unit="percentunit",
        ),
        panel(
            3,
            "Estimation error by model family",
            0,
            8,
            [
                (
                    q(
                        0.5,
                        "sum by (le, model_family) "
                        f"(rate(ctxcc_estimation_error_ratio_bucket[{RI}]))",
                    ),
                    "p50 {{model_family}}",
                ),
                (
                    q(
                        0.95,
                        "sum by (le, model_family) "
                        f"(rate(ctxcc_estimation_error_ratio_bucket[{RI}]))",
                    ),
                    "p95 {{model_family}}",
                ),
            ],
            unit="percentunit",
        ),
        panel(
            4,
            "Compactions and projection fallbacks",
            12,
            8,
            [
                (
                    f"sum by (kind, performed) (rate(ctxcc_compactions_total[{RI}]))",
                    "compaction {{kind}} performed={{performed}}",
                ),
                (
                    f"sum by (reason) (rate(ctxcc_projection_fallbacks_total[{RI}]))",
                    "fallback {{reason}}",
                ),
            ],
            unit="ops",
        ),
        panel(
            5,
            "Compile latency",
            0,
            16,
            [
                (q(0.5, f"sum by (le) (rate(ctxcc_compile_duration_seconds_bucket[{RI}]))"), "p50"),
                (
                    q(0.99, f"sum by (le) (rate(ctxcc_compile_duration_seconds_bucket[{RI}]))"),
                    "p99",
                ),
            ],
            unit="s",
        ),
        panel(
            6,
            "RPC errors by method and code",
            12,
            16,
            [
                (
                    "sum by (method, code) "
                    f'(rate(ctxcc_rpc_duration_seconds_count{{code!="OK"}}[{RI}]))',
                    "{{method}} {{code}}",
                ),
            ],
            unit="reqps",
        ),
        panel(
            7,
            "Decisions",
            0,
            24,
            [(f"sum by (decision) (rate(ctxcc_compile_decisions_total[{RI}]))", "{{decision}}")],
            unit="ops",
            stacked=True,
        ),
        panel(
            8,
            "Prompt-cache busts by section",
            12,
            24,
            [(f"sum by (section) (rate(ctxcc_prefix_changes_total[{RI}]))", "{{section}}")],
            unit="ops",
        ),
        panel(
            9,
            "Sessions, watchers and storage",
            0,
            32,
            [
                ("ctxcc_sessions", "sessions"),
                ("ctxcc_watchers", "watchers"),
                ("ctxcc_rocksdb_size_bytes / 1048576", "RocksDB MiB"),
            ],
        ),
        panel(
            10,
            "Appends and durable write latency",
            12,
            32,
            [
                (f"rate(ctxcc_events_appended_total[{RI}])", "events/s"),
                (
                    q(
                        0.99,
                        f"sum by (le) (rate(ctxcc_storage_write_duration_seconds_bucket[{RI}]))",
                    ),
                    "write p99 (s)",
                ),
            ],
        ),
    ]
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
                }
            ]
        },
        "annotations": {"list": []},
        "panels": panels,
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
