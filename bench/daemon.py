"""Starts `ctxcc serve` as a subprocess for benchmarks and waits until it serves."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

ROOT = Path(__file__).resolve().parents[1]


class BenchDaemon:
    def __init__(self, data_dir: Path, *extra: str) -> None:
        self.data_dir = data_dir
        self.log = data_dir.parent / f"{data_dir.name}.log"
        self.args = [
            sys.executable,
            "-m",
            "server",
            "serve",
            "--data-dir",
            str(data_dir),
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "none",
            "--debug-echo",
            "true",
            *extra,
        ]
        self.proc: subprocess.Popen[bytes] | None = None
        self.endpoints: dict[str, Any] = {}

    def start(self) -> float:
        """Starts and returns the seconds until health answers SERVING."""
        started = time.perf_counter()
        out = open(self.log, "wb")  # noqa: SIM115 - owned by the child
        self.proc = subprocess.Popen(
            self.args, cwd=ROOT, stdout=out, stderr=out, env={**os.environ, "PYTHONUNBUFFERED": "1"}
        )
        out.close()
        while time.perf_counter() - started < 300:
            text = self.log.read_text(errors="replace")
            if "serving {" in text:
                self.endpoints = json.loads(text.rsplit("serving ", 1)[1].splitlines()[0])
                with grpc.insecure_channel(self.target) as ch:
                    stub: Any = health_pb2_grpc.HealthStub(ch)
                    try:
                        if stub.Check(health_pb2.HealthCheckRequest(), timeout=2).status == 1:
                            return time.perf_counter() - started
                    except grpc.RpcError:
                        pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited: {text[-2000:]}")
            time.sleep(0.01)
        raise RuntimeError("daemon did not start")

    @property
    def target(self) -> str:
        return f"unix:{self.endpoints['unix']}"

    def rss_mb(self) -> float:
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(60)
