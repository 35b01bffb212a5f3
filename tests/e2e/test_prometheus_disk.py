"""The data-directory alerts against a real disk running out of room: one daemon on a
256 MiB tmpfs with the default 64 MiB reserve, another on the host's disk, both scraped
by a real Prometheus (Debian's, as in test_prometheus.py) evaluating ctxcc's rules with
their durations cut to a second (promtool's unit tests check the durations).

The free-space metrics must be what statvfs says; CtxccDataDirLowSpace fires for the
small disk under 10% and never for the big one; a daemon refusing writes is named by an
alert whatever its free share, which a restart on the full disk raises to a quarter
(the reserve is given back) while writes stay refused until twice the reserve is free:
that is where CtxccDataDirLowSpace alone used to go quiet."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2

from ctxcc.v1 import session_pb2, session_service_pb2_grpc
from ctxcc.v1 import session_service_pb2 as spb
from tests.e2e.proc import DaemonProcess, tmpfs
from tests.e2e.prom import Prometheus, _free_port, rules_firing_at_once, until
from tests.e2e.test_disk_full import fill, wait_started
from tests.helpers import error_info, user

NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVING = health_pb2.HealthCheckResponse.SERVING
SIZE = 256 << 20
RESERVE = 64 << 20  # the default: set here too, so the test does not move with it
LOW, FULL = "CtxccDataDirLowSpace", "CtxccDataDirFull"
SMALL, BIG = "agent-0", "agent-1"


@pytest.fixture
def volume(short_tmp: Path) -> Iterator[Path]:
    with tmpfs(short_tmp / "vol", SIZE, "a small filesystem") as mnt:
        yield mnt


def statvfs_space(path: Path) -> tuple[int, int]:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


def append(stub: Any, n: int) -> str:
    req = spb.AppendEventsRequest(session_id="s", events=[user(f"step {n} " + "x" * 20_000)])
    try:
        stub.AppendEvents(req, timeout=10)
    except grpc.RpcError as err:
        return f"{err.code().name}/{error_info(err).reason}"
    return "OK"


def test_data_dir_alerts_on_a_disk_that_fills_up(
    volume: Path, short_tmp: Path, tmp_path: Path
) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "CTXCC_DISK_RESERVE_BYTES": str(RESERVE)}
    # A fixed metrics port: Prometheus keeps scraping the same target across the restart.
    metrics = f"127.0.0.1:{_free_port()}"
    small = DaemonProcess(
        volume / "data", "--metrics-listen", metrics, env=env, log_path=tmp_path / "small.log"
    ).start()
    big = DaemonProcess(short_tmp / "big", log_path=tmp_path / "big.log").start()
    prom: Prometheus | None = None
    channel = None
    try:
        small.wait_ready()
        targets = {SMALL: metrics, BIG: str(big.wait_ready()["metrics"])}
        prom = Prometheus(tmp_path, targets, rules_firing_at_once(tmp_path))
        prom.start()
        prom.wait_scrapes(2)
        channel = grpc.insecure_channel(small.target)
        stub: Any = session_service_pb2_grpc.SessionServiceStub(channel)
        stub.CreateSession(spb.CreateSessionRequest(session=session_pb2.Session(session_id="s")))
        assert append(stub, 0) == "OK"

        # The metrics are statvfs's numbers: what the daemon's user may write (f_bavail)
        # and the filesystem's size. The reserve file is held, so it is not free.
        def same_as_statvfs() -> bool:
            before = statvfs_space(volume)
            free = small.metric("ctxcc_data_dir_free_bytes")
            capacity = small.metric("ctxcc_data_dir_capacity_bytes")
            return before == statvfs_space(volume) and (free, capacity) == before

        until("the free-space metrics match statvfs", same_as_statvfs)
        free, capacity = statvfs_space(volume)
        assert capacity == SIZE
        assert free <= SIZE - RESERVE
        assert small.metric("ctxcc_data_dir_full") == 0

        # Healthy: nothing pending or firing for the small disk, nor for the host's when
        # it has room (a host itself nearly full is rightly named).
        host_free, host_capacity = statvfs_space(short_tmp)
        host_roomy = host_free / host_capacity > 0.11
        prom.wait_scrapes(3)
        for name in (LOW, FULL):
            for state in ("pending", "firing"):
                named = set(prom.alerts(name, state))
                assert SMALL not in named, (name, state)
                assert BIG not in named or (name == LOW and not host_roomy), (name, state)

        # Another file takes the disk down to 5% free: the small pod's alert fires with
        # the share statvfs gives; the daemon still takes writes.
        filler = volume / "filler"
        with filler.open("wb") as f:
            while statvfs_space(volume)[0] > SIZE // 20:
                f.write(b"\0" * (1 << 20))
        low = until(f"{LOW} fires", lambda: prom.alerts(LOW).get(SMALL))
        free, _ = statvfs_space(volume)
        assert abs(float(low["value"]) - free / SIZE) < 0.005, (low, free / SIZE)
        assert float(low["value"]) < 0.10
        assert "% of its filesystem free" in low["annotations"]["summary"]
        assert append(stub, 1) == "OK"
        assert prom.alerts(FULL) == {}
        if host_roomy:
            assert BIG not in prom.alerts(LOW) and BIG not in prom.alerts(LOW, "pending")

        # Full: appends refused, and the daemon says so.
        fill(volume)
        n = 2
        while (outcome := append(stub, n)) == "OK":
            n += 1
        assert outcome == "RESOURCE_EXHAUSTED/DISK_FULL"
        refused_at = time.time()

        def naming_small() -> set[str]:
            return {name for name in (LOW, FULL) if SMALL in prom.alerts(name)}

        until("an alert names the full pod", lambda: LOW in naming_small())
        prom.wait_scrapes(2)  # Prometheus has seen the full daemon (checked below)

        # Restarted on the full disk: the reserve is given back, a quarter of the volume
        # is free, and writes stay refused until twice the reserve is. The free share is
        # over 10% now; an alert must still name the pod.
        channel.close()
        stopped_at = time.time()
        assert small.terminate() == 0
        starts = small.log().count("serving {")
        small.start()
        wait_started(small, starts)
        channel = grpc.insecure_channel(small.target)
        stub = session_service_pb2_grpc.SessionServiceStub(channel)
        assert small.health() == NOT_SERVING
        assert append(stub, n + 1) == "RESOURCE_EXHAUSTED/DISK_FULL"
        free, _ = statvfs_space(volume)
        assert free / SIZE > 0.10 and free < 2 * RESERVE, free
        until(
            "the low-space alert resolves at a quarter free",
            lambda: (
                prom.query(f'ctxcc_data_dir_free_bytes{{pod="{SMALL}"}}')
                and SMALL not in prom.alerts(LOW) | prom.alerts(LOW, "pending")
            ),
        )
        assert until("an alert names the pod that refuses writes", naming_small) == {FULL}
        assert append(stub, n + 2) == "RESOURCE_EXHAUSTED/DISK_FULL"  # still refused
        assert prom.alerts(FULL)[SMALL]["labels"]["severity"] == "critical"
        assert small.metric("ctxcc_data_dir_full") == 1
        # Before the restart too, from the write that found the disk full.
        (seen,) = prom.query(
            f'max_over_time(ctxcc_data_dir_full{{pod="{SMALL}"}}'
            f"[{int(stopped_at - refused_at) + 1}s])",
            at=stopped_at,
        )
        assert seen.values[0][1] == 1

        # Space freed: writes come back without a restart and the alerts resolve.
        filler.unlink()
        small.wait_health(SERVING)
        assert append(stub, n + 3) == "OK"
        assert small.metric("ctxcc_data_dir_full") == 0
        until(
            "the alerts resolve",
            lambda: not naming_small() and SMALL not in prom.alerts(FULL, "pending"),
        )
        print(f"\nrestarted on the full disk: {free / SIZE:.1%} free, writes refused")
    finally:
        if channel is not None:
            channel.close()
        if prom is not None:
            prom.stop()
        for d in (small, big):
            d.terminate()
            d.ensure_stopped()
