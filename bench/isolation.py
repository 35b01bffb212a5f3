"""Daemon CPU per compile of a session holding a 1 MiB user message, and how long a
health check and an append of another session take meanwhile; and the CPU of the first
compile of ordinary big sessions, against the default compile CPU budget.

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
from bench.rpc import OPTIONS, ROUTE, Api, _assistant, _result, _user
from ctxcc.v1 import common_pb2, event_pb2, session_pb2, tool_service_pb2_grpc
from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_service_pb2 as spb
from ctxcc.v1 import tool_service_pb2 as tpb
from server.service.compile_types import CompilerSettings

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


def run(root: Path, compiles: int = 10, first_compiles: bool = True) -> dict[str, float]:
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
        if first_compiles:  # ~40 MB of setup: left out of the smoke run
            out |= _first_compiles(d, api)
            out |= _probe_during_big_first_compile(d, api)
            out |= _probe_during_tool_registry(d, api)
        api.channel.close()
        return out
    finally:
        d.stop()


def _first_compile_ms(d: BenchDaemon, api: Api, sid: str, model: str) -> float:
    assert d.proc is not None
    request = cpb.CompileRequest(session_id=sid, route=common_pb2.Route(model=model))
    before = daemon_cpu_s(d.proc.pid)
    try:
        api.compiles.Compile(request, timeout=300)
    except grpc.RpcError as err:
        # A view over the unary limit is refused after the compile did its work.
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err
    return (daemon_cpu_s(d.proc.pid) - before) * 1000


def _first_compiles(d: BenchDaemon, api: Api) -> dict[str, float]:
    """First compiles (nothing counted or scanned before) of big but ordinary sessions:
    2,000 messages of an agent loop (~1 MB), and 34 MB of history (17 user/assistant
    pairs of 1 MB, the hostile corpus' case), on a GPT (o200k) and a Claude route."""
    out: dict[str, float] = {}
    budget_ms = CompilerSettings().cpu_budget_ms
    for model, tag in (("gpt-4o", "gpt"), ("claude-sonnet-4", "claude")):
        sid = f"loop-{tag}"
        api.sessions.CreateSession(
            spb.CreateSessionRequest(session=session_pb2.Session(session_id=sid))
        )
        events = [_user(f"task {tag}: fix the failing test in src/pkg/module.py")]
        for i in range(666):
            call = f"c{i}"
            events += [
                _assistant(f"step {i} ({tag}): reading the file to see what fails", call),
                _result(call, f"line {i}: def handler_{i}(x): return x * {i}  # {tag}\n" * 8),
            ]
        events.append(_user(f"and now run the tests ({tag})"))
        for lo in range(0, len(events), 500):
            api.sessions.AppendEvents(
                spb.AppendEventsRequest(session_id=sid, events=events[lo : lo + 500])
            )
        out[f"first_compile_2000_msgs_{tag}_cpu_ms"] = _first_compile_ms(d, api, sid, model)
    line = "the build failed in src/pkg/module_42/handler.py, retrying with a clean cache\n"
    api.sessions.CreateSession(
        spb.CreateSessionRequest(session=session_pb2.Session(session_id="history"))
    )
    for i in range(17):
        body = f"message {i}\n" + line * (1_000_000 // len(line))
        reply = event_pb2.Event()
        reply.assistant_message.parts.add(text=body)
        pair = [_user(body), reply]
        api.sessions.AppendEvents(spb.AppendEventsRequest(session_id="history", events=pair))
    out["first_compile_34mb_history_gpt_cpu_ms"] = _first_compile_ms(d, api, "history", "gpt-4o")
    out["budget_over_worst_first_compile"] = budget_ms / max(out.values())
    out["compile_cpu_budget_ms"] = float(budget_ms)
    return out


def _probe_during_big_first_compile(d: BenchDaemon, api: Api) -> dict[str, float]:
    """Health and append latency of another session during the first compile of a session
    of 100,000 small events (~16 MB view), and for 2 s after it (what the compile leaves
    for the garbage collector shows there): p50, p99, the worst call, and how many calls
    took over 100 ms. With the compile's wall time and daemon CPU."""
    assert d.proc is not None
    sid = "events-100k"
    api.sessions.CreateSession(
        spb.CreateSessionRequest(session=session_pb2.Session(session_id=sid))
    )
    events = [_user("task: fix the failing test in src/pkg/module.py")]
    i = 0
    while len(events) < 100_000:
        call = f"c{i}"
        events += [
            _assistant(f"step {i}: reading the file to see what fails", call),
            _result(call, f"line {i}: def handler_{i}(x): return x * {i}  # note\n" * 3),
        ]
        if i % 50 == 49:
            events.append(_user(f"continue with part {i}"))
        i += 1
    for lo in range(0, len(events), 1000):
        api.sessions.AppendEvents(
            spb.AppendEventsRequest(session_id=sid, events=events[lo : lo + 1000]), timeout=120
        )
    del events
    stop = threading.Event()
    lat: list[tuple[float, float]] = []

    def probe() -> None:
        with grpc.insecure_channel(d.target, options=OPTIONS) as ch:
            health: Any = health_pb2_grpc.HealthStub(ch)
            sessions = Api(d.target).sessions
            while not stop.is_set():
                t = time.perf_counter()
                health.Check(health_pb2.HealthCheckRequest(), timeout=60)
                lat.append((t, time.perf_counter() - t))
                t = time.perf_counter()
                sessions.AppendEvents(
                    spb.AppendEventsRequest(session_id="probe", events=[_user("ping")])
                )
                lat.append((t, time.perf_counter() - t))
                time.sleep(0.005)

    th = threading.Thread(target=probe)
    th.start()
    time.sleep(0.5)
    before = daemon_cpu_s(d.proc.pid)
    t0 = time.perf_counter()
    request = cpb.CompileRequest(session_id=sid, route=common_pb2.Route(model="gpt-4o"))
    api.compiles.Compile(request, timeout=600)
    t1 = time.perf_counter()
    cpu = daemon_cpu_s(d.proc.pid) - before
    time.sleep(2.5)
    stop.set()
    th.join()
    during = [x for start, x in lat if start <= t1 + 2 and start + x >= t0]
    q = statistics.quantiles(during, n=100, method="inclusive")
    return {
        "first_compile_100k_events_wall_ms": (t1 - t0) * 1000,
        "first_compile_100k_events_cpu_ms": cpu * 1000,
        "probe_during_100k_compile_p50_ms": q[49] * 1000,
        "probe_during_100k_compile_p99_ms": q[98] * 1000,
        "probe_during_100k_compile_max_ms": max(during) * 1000,
        "probe_during_100k_compile_over_100ms": float(sum(x > 0.1 for x in during)),
        "probe_during_100k_compile_samples": float(len(during)),
    }


def _probe_during_tool_registry(d: BenchDaemon, api: Api) -> dict[str, float]:
    """Another session's steps (an append, then a compile of it) while a session registers
    200 direct tools of ~250 KB schemas (~50 MB, the hostile corpus' tool-set case),
    compiles twice with them and lists them: each step's p50, p99 and worst, over the calls that
    overlapped the registration and compiles."""
    from tests.e2e.test_hostile_tools import tool_set

    sid = "tools-50mb"
    api.sessions.CreateSession(
        spb.CreateSessionRequest(session=session_pb2.Session(session_id=sid))
    )
    api.sessions.AppendEvents(
        spb.AppendEventsRequest(session_id=sid, events=[_user("use the tools")])
    )
    api.sessions.CreateSession(
        spb.CreateSessionRequest(session=session_pb2.Session(session_id="tools-probe"))
    )
    register = tpb.RegisterToolsRequest(session_id=sid, tools=tool_set())
    stop = threading.Event()
    steps: list[tuple[float, float]] = []

    def probe() -> None:
        probe_api = Api(d.target)
        step = cpb.CompileRequest(session_id="tools-probe", route=ROUTE)
        while not stop.is_set():
            t = time.perf_counter()
            probe_api.sessions.AppendEvents(
                spb.AppendEventsRequest(session_id="tools-probe", events=[_user("ping")])
            )
            probe_api.compiles.Compile(step, timeout=60)
            steps.append((t, time.perf_counter() - t))
            time.sleep(0.005)
        probe_api.channel.close()

    th = threading.Thread(target=probe)
    th.start()
    time.sleep(0.5)
    tools: Any = tool_service_pb2_grpc.ToolServiceStub(api.channel)
    t0 = time.perf_counter()
    tools.RegisterTools(register, timeout=300)
    request = cpb.CompileRequest(session_id=sid, route=common_pb2.Route(model="gpt-4o"))
    for _ in range(2):
        api.compiles.Compile(request, timeout=300)
    tools.ListTools(tpb.ListToolsRequest(session_id=sid), timeout=300)
    t1 = time.perf_counter()
    time.sleep(0.5)
    stop.set()
    th.join()
    during = [x for start, x in steps if start <= t1 and start + x >= t0]
    q = statistics.quantiles(during, n=100, method="inclusive") if len(during) > 1 else during * 99
    return {
        "tools_50mb_register_compiles_list_wall_ms": (t1 - t0) * 1000,
        "probe_step_during_tools_50mb_p50_ms": q[49] * 1000,
        "probe_step_during_tools_50mb_p99_ms": q[98] * 1000,
        "probe_step_during_tools_50mb_max_ms": max(during) * 1000,
        "probe_step_during_tools_50mb_samples": float(len(during)),
    }


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
    parser.add_argument(
        "--only-tools", action="store_true", help="only the 50 MB tool-set case's probe"
    )
    args = parser.parse_args()
    if args.only_tools:
        with tempfile.TemporaryDirectory(prefix="ctxcc-bench-iso-", dir="/tmp") as tmp:
            d = BenchDaemon(Path(tmp) / "data")
            d.start_timed()
            try:
                api = Api(d.target)
                for k, v in _probe_during_tool_registry(d, api).items():
                    print(f"{k:<44}{v:>10.1f}")
                api.channel.close()
            finally:
                d.stop()
        return
    with tempfile.TemporaryDirectory(prefix="ctxcc-bench-iso-", dir="/tmp") as tmp:
        for k, v in run(Path(tmp), args.compiles).items():
            print(f"{k:<40}{v:>10.1f}")


if __name__ == "__main__":
    main()
