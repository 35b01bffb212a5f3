"""Median time of one agent step (append and compile over the CompileStream, carrying the
previous view's usage report, the view received) as each client's example agent loop
measures it, against one daemon on its Unix socket. The first step (connection set-up)
is left out."""

from __future__ import annotations

import os
import re
import statistics
import subprocess
from pathlib import Path

from bench.daemon import BenchDaemon
from tests.e2e.proc import CLIENT_LOOPS

STEP_MS = re.compile(r"^step \d+ append \d+-\d+ replayed \w+ ms ([\d.]+) estimate \d+$", re.M)


def run(root: Path, scale: float) -> dict[str, float]:
    steps = max(5, int(40 * scale))
    root.mkdir(parents=True, exist_ok=True)
    daemon = BenchDaemon(root / "data")
    daemon.start()
    daemon.wait_ready(timeout=300)
    out: dict[str, float] = {}
    try:
        target = f"unix://{daemon.endpoints['unix']}"
        for name, cmd in sorted(CLIENT_LOOPS.items()):
            assert Path(cmd[-1]).exists(), f"{cmd[-1]} missing: run `make clients`"
            done = subprocess.run(
                [*cmd, "--steps", str(steps)],
                env={**os.environ, "CTXCC_TARGET": target},
                capture_output=True,
                text=True,
                timeout=600,
                check=False,
            )
            assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
            times = [float(ms) for ms in STEP_MS.findall(done.stdout)]
            assert len(times) == steps, done.stdout[-2000:]
            out[f"client_{name}_step_p50_ms"] = statistics.median(times[1:])
    finally:
        daemon.stop()
    return out
