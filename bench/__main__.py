"""`make bench`: every benchmark, a readable table, a plot (docs/bench.png), and as the
LAST line one JSON object. Figures are ratios against baselines measured in the same run.

    python -m bench            full run (a few minutes)
    python -m bench --smoke    tiny scales: proves the harness works (part of make test)
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import tempfile
from pathlib import Path

from bench import (
    appends,
    claude_vocab,
    clients,
    delta,
    isolation,
    rpc,
    scale,
    searched,
    stepcost,
    tokenizers,
    usage_fit,
)
from bench.paths import dev_traces
from server.replay import run as replay

ROOT = Path(__file__).resolve().parents[1]
DEV = dev_traces()
TARGETS = {
    "compile_vs_echo_p50": ("<=", 1.5),
    "step_vs_echo_p50": ("<=", 3.5),
    "history_10k_vs_200_p50": ("<=", 1.2),
    "steps_vs_echo_throughput": (">=", 0.6),
    "step_2000_vs_200_msgs_p50": ("<=", 1.3),
    "delta_bytes_per_step_vs_new_event_bytes": ("<=", 3.0),
    "durable_appends_vs_fsync": (">=", 0.5),
    "cold_start_1m_events_s": ("<=", 2.0),
    "rss_mb_1k_sessions": ("<=", 300.0),
    "replay_dev_mape_pct": ("<=", 2.0),
    "replay_dev_p95_ape_pct": ("<=", 6.0),
    "replay_dev_with_baseline_mape_pct": ("<=", 0.3),
    "replay_dev_with_baseline_p95_ape_pct": ("<=", 0.6),
    "o200k_speed_vs_tiktoken": (">=", 1.0),
    "compile_1mib_prose_cpu_ms": ("<=", 50.0),
}


def meets(key: str, value: float) -> bool:
    op, target = TARGETS[key]
    return value <= target if op == "<=" else value >= target


def plot(result: dict[str, float], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(TARGETS)
    ratios = [result[k] / TARGETS[k][1] for k in keys]
    colors = ["#2a9d8f" if meets(k, result[k]) else "#e76f51" for k in keys]
    fig, ax = plt.subplots(figsize=(10, 4.2), dpi=110)
    ax.barh(keys, ratios, color=colors)
    ax.axvline(1.0, color="black", lw=1)
    ax.set_xscale("log")
    ax.set_xlabel("measured / target (log scale; left of 1 is better for <= targets)")
    for i, k in enumerate(keys):
        ax.text(
            ratios[i],
            i,
            f"  {result[k]:.3g} ({TARGETS[k][0]} {TARGETS[k][1]:g})",
            va="center",
            fontsize=8,
        )
    ax.set_title("ctxcc benchmarks against their targets (green: met)")
    fig.tight_layout()
    fig.savefig(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--smoke", action="store_true", help="tiny scales, seconds not minutes")
    parser.add_argument("--plot", type=Path, default=ROOT / "docs" / "bench.png")
    args = parser.parse_args()
    s = 0.05 if args.smoke else 1.0
    with tempfile.TemporaryDirectory(prefix="ctxcc-bench-", dir="/tmp") as tmp:
        root = Path(tmp)
        detail: dict[str, float] = {}
        detail |= rpc.run(root / "rpc", scale=s)
        detail |= stepcost.run(root / "stepcost", scale=s)
        detail |= delta.run(root / "delta", scale=s)
        detail |= searched.run(root / "searched", scale=s)
        detail |= appends.run(scale=s)
        detail |= usage_fit.run(scale=s)
        detail |= clients.run(root / "clients", scale=s)
        events = 1_000_000 if not args.smoke else 20_000
        detail["cold_start_1m_events_s"] = scale.cold_start(root, events)
        sessions, each = (1000, 100) if not args.smoke else (20, 30)
        detail |= scale.rss(root, sessions, each)
        trace = DEV
        if args.smoke:
            import lzma

            trace = root / "smoke.jsonl"
            with lzma.open(DEV, "rt") as f:
                trace.write_text("".join(f.readlines()[:30]))
        r = asyncio.run(replay(trace, None, None, io.StringIO()))
        detail["replay_dev_mape_pct"] = float(r["mape_pct"])
        detail["replay_dev_p95_ape_pct"] = float(r["p95_ape_pct"])
        detail["replay_dev_with_baseline_mape_pct"] = float(r["with_baseline_mape_pct"])
        detail["replay_dev_with_baseline_p95_ape_pct"] = float(r["with_baseline_p95_ape_pct"])
        detail |= tokenizers.run(DEV, scale=s)
        detail |= claude_vocab.run(DEV, scale=s)
        detail |= isolation.run(
            root / "isolation", compiles=3 if args.smoke else 20, first_compiles=not args.smoke
        )
    result = {k: round(detail[k], 3) for k in TARGETS}
    print(f"{'measure':<40}{'value':>12}")
    for k, v in sorted(detail.items()):
        print(f"{k:<40}{v:>12.3f}")
    print()
    print(f"{'target':<40}{'value':>10}  {'goal':>8}  met")
    for k, v in result.items():
        op, goal = TARGETS[k]
        print(f"{k:<40}{v:>10.3f}  {op}{goal:>6g}  {'yes' if meets(k, v) else 'NO'}")
    if not args.smoke:
        args.plot.parent.mkdir(parents=True, exist_ok=True)
        plot(result, args.plot)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
