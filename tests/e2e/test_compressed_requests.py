"""Compressed requests: a few KB of gzip can inflate to the message cap (64 MiB), which
gRPC inflated into memory on its own threads before refusing it, so the daemon accepts
uncompressed requests only and refuses a compressed one before reading its message."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from ctxcc.v1 import session_pb2, session_service_pb2_grpc
from ctxcc.v1 import session_service_pb2 as spb
from tests.e2e.proc import DaemonProcess
from tests.helpers import user

INFLATED = 100_000_000  # over the 64 MiB cap: gRPC inflated 64 MiB of it before refusing


@pytest.fixture
def daemon(short_tmp: Path) -> Iterator[DaemonProcess]:
    plain = DaemonProcess(short_tmp / "data", "--metrics-listen", "none", "--ui-listen", "none")
    with plain.serving() as d:
        yield d


def _peak_rss_kib(daemon: DaemonProcess) -> int:
    assert daemon.proc is not None
    status = Path(f"/proc/{daemon.proc.pid}/status").read_text()
    return next(int(ln.split()[1]) for ln in status.splitlines() if ln.startswith("VmHWM:"))


def test_a_compressed_request_is_refused_before_it_is_inflated(daemon: DaemonProcess) -> None:
    bomb = spb.AppendEventsRequest(session_id="s", events=[user("a" * INFLATED)])
    with grpc.insecure_channel(daemon.target) as plain:
        stub: Any = session_service_pb2_grpc.SessionServiceStub(plain)
        stub.CreateSession(spb.CreateSessionRequest(session=session_pb2.Session(session_id="s")))
    before = _peak_rss_kib(daemon)
    with grpc.insecure_channel(daemon.target, compression=grpc.Compression.Gzip) as gz:
        stub = session_service_pb2_grpc.SessionServiceStub(gz)
        with pytest.raises(grpc.RpcError) as exc:
            stub.AppendEvents(bomb, timeout=120)
        assert exc.value.code() == grpc.StatusCode.UNIMPLEMENTED, exc.value
        assert "gzip" in (exc.value.details() or ""), exc.value
        # A small compressed request is refused the same way: compression is off.
        with pytest.raises(grpc.RpcError) as exc:
            stub.GetSession(spb.GetSessionRequest(session_id="s"), timeout=30)
        assert exc.value.code() == grpc.StatusCode.UNIMPLEMENTED, exc.value
    # Refused from its headers: nothing inflated (it took 64 MiB or more before).
    assert _peak_rss_kib(daemon) - before < 16 * 1024, (before, _peak_rss_kib(daemon))
    with grpc.insecure_channel(daemon.target) as plain:
        stub = session_service_pb2_grpc.SessionServiceStub(plain)
        events = stub.ListEvents(spb.ListEventsRequest(session_id="s"), timeout=30).events
        assert list(events) == []  # nothing was written
