"""The benchmark harness runs end to end at tiny scale (the numbers themselves are
`make bench`'s business, never asserted here: machines are noisy)."""

from __future__ import annotations

import json
import subprocess
import sys

from bench.__main__ import TARGETS
from tests.e2e.proc import REPO


def test_bench_smoke_prints_every_figure() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    last = json.loads(done.stdout.strip().splitlines()[-1])
    assert list(last) == list(TARGETS)
    assert all(isinstance(v, float | int) and v > 0 for v in last.values())
    assert "compile_p50_ms" in done.stdout and "echo_p50_ms" in done.stdout
    assert "rss_mb_idle" in done.stdout
    for part in ("echo_small", "stream_append_compile", "report_usage", "fsync"):
        assert f"part_{part}_p50_ms" in done.stdout
    assert "inproc_step_grown_vs_start_cpu" in done.stdout
    assert "inproc_thinking_loop_grown_vs_start_cpu" in done.stdout
    assert "step_after_3_searches_vs_none_cpu" in done.stdout
    for window in ("settled", "outliers"):
        assert f"usage_fit_{window}_vs_plain" in done.stdout
    for side in ("daemon", "client"):
        for size in ("200", "2000"):
            assert f"delta_{side}_cpu_ms_per_step_{size}_msgs" in done.stdout
        for digest in ("apart", "chain"):
            assert f"over_budget_{side}_cpu_ms_per_step_{digest}" in done.stdout
    for client in ("go", "python", "typescript"):
        assert f"client_{client}_step_p50_ms" in done.stdout
