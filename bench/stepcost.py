"""Where an agent step's time goes: each part of a step timed alone against the same
daemon, with the daemon's CPU and this client's CPU per call beside the wall time.

Parts: an echo of a view-sized answer and of a tiny one (gRPC and the interceptor, no
work of ours), a unary Compile of an unchanged session, a CompileStream step without
events (compile + delta answer), the same step appending one tool result (+ a durable
append), a ReportUsage, and a bare write+fsync of 200 bytes on the data directory's disk.
A step is the stream step with its append plus the usage report."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from bench.daemon import BenchDaemon
from bench.isolation import daemon_cpu_s
from bench.rpc import Api, StreamAgent, _result, conversation

PARTS = (
    "echo_view",
    "echo_small",
    "compile_unary",
    "stream_compile",
    "stream_append_compile",
    "report_usage",
    "fsync",
)


def _fsync(path: Path) -> Callable[[], None]:
    fd = os.open(path / "fsync.probe", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def once() -> None:
        os.write(fd, b"x" * 200)
        os.fsync(fd)

    return once


def _measure(fn: Callable[[], object], n: int, pid: int | None) -> tuple[float, float, float]:
    """(p50 wall ms, daemon CPU ms per call, this process's CPU ms per call)."""
    for _ in range(3):
        fn()
    times = []
    daemon = daemon_cpu_s(pid) if pid else 0.0
    client = time.process_time()
    for _ in range(n):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    client = (time.process_time() - client) / n
    daemon = (daemon_cpu_s(pid) - daemon) / n if pid else 0.0
    return statistics.median(times) * 1000, daemon * 1000, client * 1000


def run(data_dir: Path, scale: float = 1.0) -> dict[str, float]:
    n = max(20, int(200 * scale))
    d = BenchDaemon(data_dir)
    d.start_timed()
    try:
        assert d.proc is not None
        pid = d.proc.pid
        api = Api(d.target)
        api.session("unchanged", conversation(67, "u"))
        size = len(api.compile("unchanged").SerializeToString())
        api.session("stepped", conversation(67, "p"))
        agent = StreamAgent(api, "stepped")
        agent.step([], report=False)  # the stream's first view is whole
        fns: dict[str, tuple[Callable[[], object], int | None]] = {
            "echo_view": (lambda: api.echo(size), pid),
            "echo_small": (lambda: api.echo(32), pid),
            "compile_unary": (lambda: api.compile("unchanged"), pid),
            "stream_compile": (lambda: agent.step([], report=False), pid),
            "stream_append_compile": (
                lambda: agent.step([_result(f"p{agent.steps}", "ok " * 40)], report=False),
                pid,
            ),
            "report_usage": (agent.report, pid),
            "fsync": (_fsync(data_dir), None),
        }
        out: dict[str, float] = {}
        for name in PARTS:
            fn, who = fns[name]
            wall, daemon, client = _measure(fn, n, who)
            out[f"part_{name}_p50_ms"] = wall
            if who:
                out[f"part_{name}_daemon_cpu_ms"] = daemon
            out[f"part_{name}_client_cpu_ms"] = client
        agent.close()
    finally:
        d.stop()
    return out


def main() -> None:
    import tempfile

    with tempfile.TemporaryDirectory(prefix="ctxcc-stepcost-", dir="/tmp") as tmp:
        rows = run(Path(tmp) / "data")
    print(f"{'part':<24}{'p50 ms':>9}{'daemon CPU ms':>15}{'client CPU ms':>15}")
    for name in PARTS:
        daemon = rows.get(f"part_{name}_daemon_cpu_ms")
        print(
            f"{name:<24}{rows[f'part_{name}_p50_ms']:>9.3f}"
            f"{'' if daemon is None else f'{daemon:.3f}':>15}"
            f"{rows[f'part_{name}_client_cpu_ms']:>15.3f}"
        )


if __name__ == "__main__":
    main()
