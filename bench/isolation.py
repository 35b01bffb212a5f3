"""Daemon CPU per compile of a session holding a 1 MiB user message, and how long a
health check and an append of another session take meanwhile.

CPU is read from /proc for the daemon's threads (time on a CPU), so client work and
machine load do not count; the latency figures do feel the load.

    python -m bench.isolation [--compiles N]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.daemon import BenchDaemon
from bench.rpc import OPTIONS, ROUTE, Api, _user
from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_pb2
from ctxcc.v1 import session_service_pb2 as spb

MESSAGE_BYTES = 1 << 20


def daemon_cpu_s(pid: int) -> float:
    """CPU seconds of the daemon's live threads, in nanoseconds' precision (schedstat;
    /proc/<pid>/stat counts 10 ms ticks, too coarse for a 5 ms compile)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, IndexError, ValueError):
            continue  # a thread that just ended
    return total / 1e9


def _words(n: int) -> str:
    """Prose-like text with paths in it, n bytes: what a pasted log or file looks like."""
    line = "error in src/pkg/module_42/handler.py line 17: value out of range, retrying now\n"
    return (line * (n // len(line) + 1))[:n]


def run(root: Path, compiles: int = 10) -> dict[str, float]:
    root.mkdir(parents=True, exist_ok=True)
    d = BenchDaemon(root / "data", "--max-event-bytes", str(2 * MESSAGE_BYTES))
    d.start_timed()
    try:
        assert d.proc is not None
        api = Api(d.target)
        out: dict[str, float] = {}
        for name, text in (("word_run", "a" * MESSAGE_BYTES), ("prose", _words(MESSAGE_BYTES))):
            sid = f"big-{name}"
            api.sessions.CreateSession(
                spb.CreateSessionRequest(session=session_pb2.Session(session_id=sid))
            )
            api.sessions.AppendEvents(spb.AppendEventsRequest(session_id=sid, events=[_user(text)]))
            request = cpb.CompileRequest(session_id=sid, route=ROUTE)
            before = daemon_cpu_s(d.proc.pid)
            api.compiles.Compile(request, timeout=120)  # first: tokenizes and scans once
            out[f"compile_1mib_{name}_first_cpu_ms"] = (daemon_cpu_s(d.proc.pid) - before) * 1000
            before = daemon_cpu_s(d.proc.pid)
            walls = []
            for _ in range(compiles):
                t = time.perf_counter()
                api.compiles.Compile(request, timeout=120)
                walls.append(time.perf_counter() - t)
            cpu = (daemon_cpu_s(d.proc.pid) - before) / compiles
            out[f"compile_1mib_{name}_cpu_ms"] = cpu * 1000
            out[f"compile_1mib_{name}_wall_p50_ms"] = statistics.median(walls) * 1000
        out |= _probe_during_compiles(d.target, api, compiles)
        api.channel.close()
        return out
    finally:
        d.stop()


def _probe_during_compiles(target: str, api: Api, compiles: int) -> dict[str, float]:
    """Health and append latency of another session while 1 MiB compiles run back to back."""
    api.sessions.CreateSession(
        spb.CreateSessionRequest(session=session_pb2.Session(session_id="probe"))
    )
    stop = threading.Event()
    lat: list[float] = []

    def probe() -> None:
        with grpc.insecure_channel(target, options=OPTIONS) as ch:
            health: Any = health_pb2_grpc.HealthStub(ch)
            sessions = Api(target).sessions
            while not stop.is_set():
                t = time.perf_counter()
                health.Check(health_pb2.HealthCheckRequest(), timeout=60)
                sessions.AppendEvents(
                    spb.AppendEventsRequest(session_id="probe", events=[_user("ping")])
                )
                lat.append(time.perf_counter() - t)
                time.sleep(0.005)

    th = threading.Thread(target=probe)
    th.start()
    request = cpb.CompileRequest(session_id="big-prose", route=ROUTE)
    for _ in range(compiles):
        api.compiles.Compile(request, timeout=120)
    stop.set()
    th.join()
    q = statistics.quantiles(lat, n=100, method="inclusive") if len(lat) > 1 else lat * 99
    return {"probe_health_plus_append_p99_ms": q[98] * 1000, "probe_samples": float(len(lat))}


def main() -> None:
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--compiles", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ctxcc-bench-iso-", dir="/tmp") as tmp:
        for k, v in run(Path(tmp), args.compiles).items():
            print(f"{k:<40}{v:>10.1f}")


if __name__ == "__main__":
    main()
