"""A full disk, for real: the daemon's data directory on a small tmpfs that a filler file
fills up. Appends answer RESOURCE_EXHAUSTED/DISK_FULL, health turns NOT_SERVING, reads
keep answering, freeing space brings writes back without a restart, SIGTERM exits 0,
a restart on the still-full disk recovers, and nothing acknowledged is lost."""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2

from ctxcc.v1 import compile_service_pb2_grpc, session_pb2, session_service_pb2_grpc
from ctxcc.v1 import session_service_pb2 as spb
from server.app import LIVENESS_SERVICE
from tests.e2e.proc import DaemonProcess, tmpfs
from tests.helpers import compile_request, error_info, user

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
RESERVE = 4 << 20
# Quick answers are part of the contract: a read must not hang behind the full disk.
READ_DEADLINE_S = 5


@pytest.fixture
def small_fs(short_tmp: Path) -> Iterator[Path]:
    with tmpfs(short_tmp / "fs", 48 << 20, "a disk-full test") as mnt:
        yield mnt


def fill(mnt: Path) -> Path:
    """Takes every free byte of the filesystem, down to the last page."""
    filler = mnt / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for chunk in (1 << 20, 4096):
            try:
                while True:
                    os.write(fd, b"\0" * chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)
    return filler


class Agent:
    """Appends to one session over the socket and remembers what was acknowledged."""

    def __init__(self, d: DaemonProcess) -> None:
        self.channel = grpc.insecure_channel(d.target)
        self.sessions: Any = session_service_pb2_grpc.SessionServiceStub(self.channel)
        self.compiles: Any = compile_service_pb2_grpc.CompileServiceStub(self.channel)
        self.acked: list[str] = []
        self.n = 0

    def append(self, size: int = 100_000) -> str:
        """'OK' or the status code and reason of the refusal."""
        self.n += 1
        text = f"event {self.n} " + "lorem ipsum " * (size // 12)
        req = spb.AppendEventsRequest(session_id="a", request_id=f"r{self.n}", events=[user(text)])
        try:
            self.sessions.AppendEvents(req, timeout=READ_DEADLINE_S)
        except grpc.RpcError as err:
            return f"{err.code().name}/{error_info(err).reason}"
        self.acked.append(text)
        return "OK"

    def append_until_refused(self) -> str:
        for _ in range(500):
            outcome = self.append()
            if outcome != "OK":
                return outcome
        raise AssertionError("the full disk never refused an append")

    def stored(self) -> list[str]:
        texts: list[str] = []
        token = ""
        while True:
            page = self.sessions.ListEvents(
                spb.ListEventsRequest(session_id="a", page_token=token, page_size=10),
                timeout=READ_DEADLINE_S,
            )
            texts += [e.user_message.parts[0].text for e in page.events]
            token = page.next_page_token
            if not token:
                return texts

    def close(self) -> None:
        self.channel.close()


def wait_health(d: DaemonProcess, want: int, within: float = 20) -> float:
    started = time.monotonic()
    while time.monotonic() - started < within:
        if d.health() == want:
            return time.monotonic() - started
        time.sleep(0.1)
    raise AssertionError(f"health never became {want}; log:\n{d.log()[-3000:]}")


def wait_started(d: DaemonProcess, starts_before: int) -> None:
    """Started and answering, SERVING or not (wait_ready insists on SERVING)."""
    assert d.proc is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if d.log().count("serving {") > starts_before and d.health() is not None:
            return
        assert d.proc.poll() is None, d.log()
        time.sleep(0.1)
    raise AssertionError(d.log())


def test_full_disk_refuses_writes_keeps_reads_and_recovers_in_place(small_fs: Path) -> None:
    data = small_fs / "data"
    # The reserve is small here (the filesystem is 48 MiB); through the environment, as
    # an operator might set it.
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "CTXCC_DISK_RESERVE_BYTES": str(RESERVE)}
    log = small_fs.parent / "daemon.log"  # not on the filesystem that fills up
    d = DaemonProcess(data, "--grace-period", "10", env=env, log_path=log).start()
    d.wait_ready()
    agent = Agent(d)
    try:
        agent.sessions.CreateSession(
            spb.CreateSessionRequest(session=session_pb2.Session(session_id="a"))
        )
        for _ in range(5):
            assert agent.append() == "OK"

        filler = fill(small_fs)
        assert agent.append_until_refused() == "RESOURCE_EXHAUSTED/DISK_FULL"
        print(f"\nfull: {len(agent.acked)} appends acknowledged")
        wait_health(d, NOT_SERVING)
        # Alive all the same: liveness probes must not restart it for a full disk.
        assert d.health(LIVENESS_SERVICE) == SERVING
        # Reads answer, quickly; a compile still gives the agent its view.
        assert agent.stored() == agent.acked
        view = agent.compiles.Compile(compile_request("a"), timeout=READ_DEADLINE_S).view
        assert view.event_boundary == len(agent.acked)
        assert agent.append() == "RESOURCE_EXHAUSTED/DISK_FULL"

        filler.unlink()
        took = wait_health(d, SERVING)
        print(f"space freed: SERVING again after {took:.1f} s, no restart")
        assert agent.append() == "OK"
        assert agent.stored() == agent.acked

        # Full again, then SIGTERM: a clean exit even though RocksDB cannot flush.
        filler = fill(small_fs)
        assert agent.append_until_refused() == "RESOURCE_EXHAUSTED/DISK_FULL"
        agent.close()
        assert d.terminate(30) == 0

        # A restart on the still-full disk: RocksDB replays its log into the reserve.
        starts = d.log().count("serving {")
        d.start()
        wait_started(d, starts)
        agent.channel = grpc.insecure_channel(d.target)
        agent.sessions = session_service_pb2_grpc.SessionServiceStub(agent.channel)
        assert d.health() == NOT_SERVING
        assert agent.stored() == agent.acked  # nothing acknowledged was lost
        assert agent.append() == "RESOURCE_EXHAUSTED/DISK_FULL"
        filler.unlink()
        wait_health(d, SERVING)
        assert agent.append() == "OK"
        assert agent.stored() == agent.acked
        print(f"restarted full, recovered: {len(agent.acked)} events, none lost")
    finally:
        agent.close()
        d.ensure_stopped()
