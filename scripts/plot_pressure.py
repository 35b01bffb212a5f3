"""Draws docs/pressure.png from a real replay: per request of the longest development
session, the view's estimated tokens by layer (stacked), the estimate and the tokens the
provider reported — what the Grafana dashboard's pressure panel shows, for one session.

    python scripts/plot_pressure.py [TRACE] [OUT]
"""

from __future__ import annotations

import asyncio
import io
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from bench.paths import dev_traces
from server.replay import run

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("pinned", "tool_schema", "history", "working_set", "native_state")


def main() -> None:
    trace = Path(sys.argv[1]) if len(sys.argv) > 1 else dev_traces()
    out = Path(sys.argv[2]) if len(sys.argv) > 2 else ROOT / "docs/pressure.png"
    with tempfile.TemporaryDirectory() as d:
        rows_path = Path(d) / "rows.jsonl"
        asyncio.run(run(trace, None, rows_path, io.StringIO()))
        rows = [json.loads(line) for line in rows_path.read_text().splitlines()]
    longest = Counter(r["session"] for r in rows).most_common(1)[0][0]
    rows = sorted((r for r in rows if r["session"] == longest), key=lambda r: r["step"])
    steps = [r["step"] for r in rows]
    fig, ax = plt.subplots(figsize=(10, 4.8), dpi=110)
    ax.stackplot(
        steps,
        *[[r["layers"].get(k, 0) for r in rows] for k in LAYERS],
        labels=[k.replace("_", " ") for k in LAYERS],
        alpha=0.75,
    )
    ax.plot(
        steps, [r["reported"] for r in rows], color="black", lw=1.6, label="reported by provider"
    )
    ax.plot(
        steps, [r["estimate"] for r in rows], color="crimson", lw=1, ls="--", label="ctxcc estimate"
    )
    ax.set_xlabel("request (step) in the session")
    ax.set_ylabel("input tokens")
    ax.set_title(
        f"Context pressure by layer, replayed: {rows[0]['source']} session, {rows[0]['model']}"
    )
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    print(out)


if __name__ == "__main__":
    main()
