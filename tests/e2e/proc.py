"""The daemon as a subprocess, as an operator runs it."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from ctxcc.v1 import artifact_service_pb2 as apb

REPO = Path(__file__).resolve().parents[2]
# A client beside a sidecar should retry its connection quickly: grpc's default backoff
# (1 s, growing 1.6x) outgrows the second or so a restarted daemon is up between two kills.
FAST_RECONNECT = [
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.min_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 300),
]
# The example agent loop of each client, as `make clients` builds them.
CLIENT_LOOPS = {
    "go": [str(REPO / ".tools" / "bin" / "agentloop-go")],
    "typescript": ["node", str(REPO / "client/typescript/dist/examples/agent-loop.js")],
    "python": [sys.executable, str(REPO / "client/python/examples/agent_loop.py")],
}
# The example that creates one session, of each client, as `make clients` builds them.
CLIENT_CREATE_SESSION = {
    "go": [str(REPO / ".tools" / "bin" / "createsession-go")],
    "typescript": ["node", str(REPO / "client/typescript/dist/examples/create-session.js")],
    "python": [sys.executable, str(REPO / "client/python/examples/create_session.py")],
}


@contextmanager
def tmpfs(mnt: Path, size: int, why: str) -> Iterator[Path]:
    """A tmpfs of `size` bytes mounted on `mnt` (made here) while in use: a filesystem of
    its own to fill or make read-only. Mounting needs root; without it the test is
    skipped, saying `why` it needs one."""
    mnt.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(mnt)]
    done = subprocess.run(mount, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        reason = done.stderr.strip() or f"exit {done.returncode}"
        pytest.skip(f"{why} needs to mount a small tmpfs (root), and mount said: {reason}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _message(line: str) -> str:
    """A log line's message: the line as it is, or its `message` under --log-format json."""
    if line.startswith("{"):
        return str(json.loads(line)["message"])
    return line


class DaemonProcess:
    def __init__(
        self,
        data_dir: Path,
        *extra: str,
        command: list[str] | None = None,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        log_path: Path | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.log_path = log_path or data_dir.parent / f"{data_dir.name}.log"
        self.env = env
        self.cwd = cwd
        self.args = command or [
            sys.executable,
            "-m",
            "server",
            "serve",
            "--data-dir",
            str(data_dir),
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
            "--ui-listen",
            "127.0.0.1:0",
            *extra,
        ]
        self.proc: subprocess.Popen[bytes] | None = None
        self.endpoints: dict[str, str | None] = {}
        self._ready_lines = 0

    def start(self) -> DaemonProcess:
        self._ready_lines = self.log().count("serving {")
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it
        env = self.env if self.env is not None else {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            self.args,
            cwd=self.cwd or REPO,
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
            env=env,
        )
        log.close()
        return self

    @contextmanager
    def serving(self) -> Iterator[DaemonProcess]:
        """Started and SERVING for the block, stopped after it whatever happens."""
        self.start()
        try:
            self.wait_ready()
            yield self
        finally:
            self.ensure_stopped()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait_ready(self, timeout: float = 60) -> dict[str, str | None]:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            # Whole lines only: the daemon may be writing the one read here.
            text = self.log()
            whole = text[: text.rfind("\n") + 1]
            lines = [_message(ln) for ln in whole.splitlines() if "serving {" in ln]
            if len(lines) > self._ready_lines:
                self.endpoints = json.loads(lines[-1].split("serving ", 1)[1])
                if self.health() == health_pb2.HealthCheckResponse.SERVING:
                    return self.endpoints
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited with {self.proc.returncode}:\n{self.log()}")
            time.sleep(0.05)
        raise AssertionError(f"daemon not ready in {timeout}s:\n{self.log()}")

    @property
    def target(self) -> str:
        return f"unix:{self.endpoints['unix']}"

    def health(self, service: str = "") -> int | None:
        with grpc.insecure_channel(self.target) as ch:
            try:
                stub: Any = health_pb2_grpc.HealthStub(ch)
                resp = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=2)
            except grpc.RpcError:
                return None
            return int(resp.status)

    def wait_health(self, want: int, timeout: float = 60) -> None:
        """Polls the health check until it answers `want`: a state change the test waits
        for rather than sleeps through (a loaded machine may take seconds to get there)."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while (seen := self.health()) != want:
            assert self.proc.poll() is None, f"daemon exited before health {want}:\n{self.log()}"
            assert time.monotonic() < deadline, f"health is {seen}, not {want}, after {timeout}s"
            time.sleep(0.02)

    def metric(self, name: str, **labels: str) -> float:
        """The sum of the samples called `name` whose labels include `labels`, as the
        daemon's /metrics shows them now."""
        url = f"http://{self.endpoints['metrics']}/metrics"
        with urllib.request.urlopen(url, timeout=30) as resp:
            text = resp.read().decode()
        return sum(
            s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == name and labels.items() <= s.labels.items()
        )

    def wait_in_flight(self, method: str, calls: int, timeout: float = 60) -> None:
        """Polls `ctxcc_rpcs_in_flight` until `calls` calls of `method` are in their handler."""
        deadline = time.monotonic() + timeout
        while self.metric("ctxcc_rpcs_in_flight", method=method) < calls:
            assert time.monotonic() < deadline, f"{calls} {method} never reached their handler"
            time.sleep(0.05)

    def wait_in_flight_at_most(self, method: str, calls: int, timeout: float = 60) -> None:
        """Polls `ctxcc_rpcs_in_flight` until at most `calls` calls of `method` are in their
        handler."""
        deadline = time.monotonic() + timeout
        while (now := self.metric("ctxcc_rpcs_in_flight", method=method)) > calls:
            assert time.monotonic() < deadline, f"{now} {method} still in their handler"
            time.sleep(0.05)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def terminate(self, timeout: float = 30) -> int:
        # A bound, not a wait: the default grace period is 10 s, and a loaded machine
        # may take seconds more to stop the servers and close RocksDB.
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout)
        if rc < 0:
            # Killed by a signal (a native crash): the log holds the stacks faulthandler wrote.
            print(f"daemon exited with signal {-rc}; its log:\n{self.log()[-20000:]}")
        return rc

    def ensure_stopped(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


UPLOAD = "ArtifactService/UploadArtifact"


async def open_upload(artifacts: Any, session_id: str, blob: bytes, first: int = 65536) -> Any:
    """An UploadArtifact call (on an aio ArtifactService stub) that has sent its header and
    the first `first` bytes of `blob`, and stays in its handler until the caller writes the
    rest: a call in flight for exactly as long as the test wants, however slow the machine."""
    call = artifacts.UploadArtifact()
    head = apb.ArtifactHeader(
        session_id=session_id,
        mime_type="image/png",
        size_bytes=len(blob),
        sha256=hashlib.sha256(blob).hexdigest(),
    )
    await call.write(apb.UploadArtifactRequest(header=head))
    await call.write(apb.UploadArtifactRequest(data=blob[:first]))
    return call
