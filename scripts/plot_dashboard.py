"""Draws docs/dashboard.png: the Grafana dashboard's panels as a real Prometheus answers
them while it scrapes a daemon under a replay of the development traces — the same
harness and queries as tests/e2e/test_prometheus.py (Grafana itself is not installable
where ctxcc is developed, so matplotlib draws what its queries return).

    python scripts/plot_dashboard.py [REQUESTS] [ROUNDS] [OUT]
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.ticker import FuncFormatter, PercentFormatter

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the harness lives with the tests

from tests.e2e.prom import JOB, NAMESPACE, Run, dashboard, grafana_expr  # noqa: E402
from tests.e2e.prom import replay_under_prometheus as replay  # noqa: E402

RATE_INTERVAL = "15s"  # short enough to show the replay's course, long enough to smooth it
STEP = 1.0


def _legend(fmt: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt) or "value"


def _axis(ax: Any, unit: str) -> None:
    if unit == "percentunit":
        ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    elif unit == "bytes":
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v / 2**20:.0f} MiB"))
    elif unit == "s":
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v * 1000:g} ms"))
    elif unit in ("ops", "reqps"):
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}/s"))


def draw(run: Run, out: Path) -> None:
    panels = dashboard()["panels"]
    cols = 3
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(16, 3.1 * rows), dpi=90)
    variables = {"job": JOB, "namespace": NAMESPACE, "pod": ".*"}
    for ax, p in zip(axes.flat, panels, strict=False):
        stacked = p["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] == "normal"
        lines = []
        for t in p["targets"]:
            expr = grafana_expr(t["expr"], variables, RATE_INTERVAL)
            for s in run.prom.query_range(expr, run.started, run.at, STEP):
                xs = [ts - run.started for ts, _ in s.values]
                lines.append((_legend(t["legendFormat"], s.labels), xs, [v for _, v in s.values]))
        if stacked and lines:
            # Stack on a common time axis: a series absent at a step counts 0 there.
            grid = sorted({x for _, xs, _ in lines for x in xs})
            ys = [dict(zip(xs, vs, strict=True)) for _, xs, vs in lines]
            ax.stackplot(grid, *[[y.get(x, 0.0) for x in grid] for y in ys], alpha=0.75)
            ax.legend([name for name, _, _ in lines], fontsize=6, loc="upper left")
        else:
            for name, xs, vs in lines:
                ax.plot(xs, vs, lw=1.2, label=name)
            if lines:
                ax.legend(fontsize=6, loc="upper left")
        ax.set_title(p["title"], fontsize=9)
        ax.set_xlim(0, run.at - run.started)
        top = ax.get_ylim()[1]
        ax.set_ylim(0, top * 1.1 if top > 0 else 1)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        _axis(ax, p["fieldConfig"]["defaults"]["unit"])
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.supxlabel("seconds since the first scrape", fontsize=8)
    fig.suptitle(
        "ctxcc dashboard, as a real Prometheus answers its queries while scraping a daemon "
        "under a replay of the development traces",
        fontsize=10,
    )
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)


def main() -> None:
    requests = int(sys.argv[1]) if len(sys.argv) > 1 else 400
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    out = Path(sys.argv[3]) if len(sys.argv) > 3 else ROOT / "docs" / "dashboard.png"
    with tempfile.TemporaryDirectory() as d, replay(Path(d), requests, rounds=rounds) as run:
        draw(run, out)
    print(out)


if __name__ == "__main__":
    main()
