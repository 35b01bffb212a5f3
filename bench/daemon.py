"""The daemon as a subprocess for benchmarks: the test harness's launcher, with the echo
baseline switched on, a start-to-SERVING timer and an RSS reading."""

from __future__ import annotations

import time
from pathlib import Path

from tests.e2e.proc import DaemonProcess


class BenchDaemon(DaemonProcess):
    def __init__(self, data_dir: Path, *extra: str) -> None:
        super().__init__(data_dir, "--metrics-listen", "none", "--debug-echo", "true", *extra)

    def start_timed(self) -> float:
        """Starts and returns the seconds until health answers SERVING."""
        started = time.perf_counter()
        self.start()
        self.wait_ready(timeout=300)
        return time.perf_counter() - started

    def rss_mb(self) -> float:
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def stop(self) -> None:
        self.terminate(60)
