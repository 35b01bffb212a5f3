"""Where an agent step's time goes: each part of a step timed alone against the same
daemon, with the daemon's CPU and this client's CPU per call beside the wall time.

Parts: an echo of a view-sized answer and of a tiny one (gRPC and the interceptor, no
work of ours), a unary Compile of an unchanged session, a CompileStream step without
events (compile + delta answer), the same step appending a tool call and its result (+ a durable
append), that step also carrying the usage report of the previous step's view
(StepRequest.usage: what an agent step is, one round trip), the same step as two round
trips (the stream step, then a unary ReportUsage of its view: what a step was before
reports rode on steps), a unary ReportUsage alone (a repeat of one compile's report, so
`replayed` after the first: the call's floor, not a fresh report's cost), and a bare
write+fsync of 200 bytes on the data directory's disk.

The same calls are then made in-process, on the daemon's own handlers without gRPC (the
daemon's objects started in this process, its handlers awaited directly, its thread
pools as in production): their CPU is what the daemon spends of its own, so the
difference to the CPU of the same call over gRPC is what gRPC (and its interceptor)
costs."""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from bench.daemon import BenchDaemon
from bench.isolation import daemon_cpu_s
from bench.rpc import ROUTE, Api, StreamAgent, conversation, tool_step
from ctxcc.v1 import common_pb2, session_pb2, view_pb2
from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_service_pb2 as spb
from server.app import Daemon
from server.config import resolve

PARTS = (
    "echo_view",
    "echo_small",
    "compile_unary",
    "stream_compile",
    "stream_append_compile",
    "stream_step_with_usage",
    "step_then_report_usage",
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

        def two_trips() -> None:
            agent.step(tool_step(f"p{agent.steps}"), report=False)
            agent.report()

        fns: dict[str, tuple[Callable[[], object], int | None]] = {
            "echo_view": (lambda: api.echo(size), pid),
            "echo_small": (lambda: api.echo(32), pid),
            "compile_unary": (lambda: api.compile("unchanged"), pid),
            "stream_compile": (lambda: agent.step([], report=False), pid),
            "stream_append_compile": (
                lambda: agent.step(tool_step(f"p{agent.steps}"), report=False),
                pid,
            ),
            "stream_step_with_usage": (
                lambda: agent.step(tool_step(f"p{agent.steps}")),
                pid,
            ),
            "step_then_report_usage": (two_trips, pid),
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
    grow = max(50, int(5000 * scale))
    return out | asyncio.run(_in_process(data_dir.parent / f"{data_dir.name}-inproc", n, grow))


class _Context:
    """What the handlers use of a gRPC context when nothing fails."""

    async def abort_with_status(self, status: object) -> None:
        raise RuntimeError(f"the handler failed: {status}")


# The route of the growth measure: a model with a 1M-token window, so that ~12,000
# messages stay under its budget (on GPT-4o's 128k they would not, and every step would
# also recommend a compaction as long as the history).
WIDE = common_pb2.Route(
    connection=ROUTE.connection, protocol=ROUTE.protocol, endpoint=ROUTE.endpoint, model="gpt-4.1"
)
# The route of the thinking loop: Claude sends back the thinking blocks of every assistant
# message of the current tool loop, so each step of a long loop carries them all.
CLAUDE = common_pb2.Route(
    connection="bench", protocol="anthropic-messages", endpoint="local", model="claude-sonnet-4"
)

# The parts that are calls of the daemon's own handlers (not echoes, not the disk).
IN_PROCESS = tuple(p for p in PARTS if not p.startswith(("echo", "fsync")))


def _usage(compile_id: str) -> cpb.ReportUsageRequest:
    return cpb.ReportUsageRequest(
        compile_id=compile_id, route=ROUTE, input_tokens=30_000, output_tokens=50
    )


def _unary_view(answer: Any) -> Any:
    """The view of a unary Compile's answer (the handler's encoded bytes, in-process)."""
    if not isinstance(answer, cpb.CompileResponse):
        answer = cpb.CompileResponse.FromString(answer.data)
    return answer.view


def _compile_id(answer: Any) -> str:
    """The compile id of a stream answer (a response, or its encoded bytes)."""
    out = answer if isinstance(answer, cpb.CompileStreamResponse) else None
    if out is None:
        out = cpb.CompileStreamResponse.FromString(answer.data)
    kind = out.WhichOneof("response")
    assert kind in ("view", "delta"), kind
    return str(out.view.compile_id if kind == "view" else out.delta.head.compile_id)


async def _parts(
    calls: dict[str, Callable[[], Awaitable[Any]]], last: list[str], n: int
) -> dict[str, float]:
    """p50 and CPU ms of each in-process part's call; `last` follows the stream's views."""
    out: dict[str, float] = {}
    for name in IN_PROCESS:
        times, cpu = [], 0.0
        for i in range(n + 3):
            started, cpu_started = time.perf_counter(), time.process_time()
            answer = await calls[name]()
            if i >= 3:
                times.append(time.perf_counter() - started)
                cpu += time.process_time() - cpu_started
            if name.startswith(("stream", "step")):
                last[0] = _compile_id(answer)  # the client's part: not timed
        out[f"inproc_{name}_p50_ms"] = statistics.median(times) * 1000
        out[f"inproc_{name}_cpu_ms"] = cpu / n * 1000
    return out


async def _grown(step: Callable[[], Awaitable[None]], n: int, grow: int) -> tuple[float, float]:
    """CPU ms of one `step` over `n`, then again after `grow` of them not measured."""

    async def measured() -> float:
        started = time.process_time()
        for _ in range(n):
            await step()
        return (time.process_time() - started) / n * 1000

    for _ in range(3):  # the route's first compiles start its memo
        await step()
    start = await measured()
    for _ in range(grow):
        await step()
    return start, await measured()


async def _in_process(data_dir: Path, n: int, grow: int) -> dict[str, float]:
    """The parts' calls on the daemon's own handlers; then the step that appends, with the
    chained digest the clients ask for, before and after `grow` more such steps (2
    messages each: ~10,000 more at scale 1): a step should cost what is new, whatever
    the history."""
    cfg = resolve(
        {
            "data_dir": str(data_dir),
            "listen": "127.0.0.1:0",
            "metrics_listen": "none",
            "ui_listen": "none",
        },
        env={},
    )
    d = Daemon(cfg)
    await d.start()
    try:
        ss, cs = d.session_servicer, d.compile_servicer
        ctx: Any = _Context()
        assert ss is not None and cs is not None
        for sid, tag in (("unchanged", "u"), ("stepped", "p")):
            session = session_pb2.Session(session_id=sid)
            await ss.CreateSession(spb.CreateSessionRequest(session=session), ctx)
            events = conversation(67, tag)
            await ss.AppendEvents(spb.AppendEventsRequest(session_id=sid, events=events), ctx)
        requests: asyncio.Queue[cpb.CompileStreamRequest | None] = asyncio.Queue()

        async def feed() -> AsyncIterator[cpb.CompileStreamRequest]:
            while (req := await requests.get()) is not None:
                yield req

        answers = aiter(cs.CompileStream(feed(), ctx))
        last = [""]
        compile_req = cpb.CompileRequest(session_id="stepped", route=ROUTE)
        wide_req = cpb.CompileRequest(session_id="stepped", route=WIDE)

        async def stream_step(events: list[Any], carry: bool = False, chained: bool = False) -> Any:
            step = cpb.StepRequest(
                step_id="s",
                events=events,
                compile=wide_req if chained else compile_req,
                delta_base_compile_id=last[0],
            )
            if chained:  # the digest the clients' stream helpers ask for
                step.delta_digest = cpb.DELTA_DIGEST_MESSAGE_CHAIN_COMPACTION_APART
            if carry:  # the usage of the view the previous step returned
                step.usage.CopyFrom(_usage(last[0]))
            await requests.put(cpb.CompileStreamRequest(step=step))
            return await anext(answers)

        async def two_trips(events: list[Any]) -> Any:
            answer = await stream_step(events)
            await cs.ReportUsage(_usage(_compile_id(answer)), ctx)
            return answer

        unchanged = cpb.CompileRequest(session_id="unchanged", route=ROUTE)
        count = [0]

        def appended() -> list[Any]:
            count[0] += 1
            return tool_step(f"p{count[0]}")

        calls: dict[str, Callable[[], Awaitable[Any]]] = {
            "compile_unary": lambda: cs.Compile(unchanged, ctx),
            "stream_compile": lambda: stream_step([]),
            "stream_append_compile": lambda: stream_step(appended()),
            "stream_step_with_usage": lambda: stream_step(appended(), carry=True),
            "step_then_report_usage": lambda: two_trips(appended()),
            "report_usage": lambda: cs.ReportUsage(_usage(last[0]), ctx),
        }
        last[0] = _compile_id(await stream_step([]))
        out = await _parts(calls, last, n)

        async def appending() -> None:
            last[0] = _compile_id(await stream_step(appended(), chained=True))

        start, grown = await _grown(appending, n, grow)
        out["inproc_grown_view_messages"] = float(201 + 2 * count[0])
        out["inproc_step_chained_start_cpu_ms"] = start
        out["inproc_step_chained_grown_cpu_ms"] = grown
        out["inproc_step_grown_vs_start_cpu"] = grown / start
        await requests.put(None)
        async for _ in answers:  # the stream ends with its requests
            pass
        out |= await _thinking_loop(ss, cs, ctx, n, max(10, grow // 10))
    finally:
        await d.stop()
    return out


async def _thinking_loop(ss: Any, cs: Any, ctx: Any, n: int, grow: int) -> dict[str, float]:
    """A stream step that appends, in one Claude tool loop whose every assistant message
    logs its thinking blocks (the body sends all of them back at each step), early in the
    loop and after `grow` more steps (~1,000 more messages at scale 1)."""
    sid = "thinking"
    session = session_pb2.Session(session_id=sid)
    await ss.CreateSession(spb.CreateSessionRequest(session=session), ctx)
    opening = conversation(1, "t")[:1]  # the user message that starts the turn
    await ss.AppendEvents(spb.AppendEventsRequest(session_id=sid, events=opening), ctx)
    compile_req = cpb.CompileRequest(session_id=sid, route=CLAUDE)
    route_id = _unary_view(await cs.Compile(compile_req, ctx)).route_id  # as a client learns it
    requests: asyncio.Queue[cpb.CompileStreamRequest | None] = asyncio.Queue()

    async def feed() -> AsyncIterator[cpb.CompileStreamRequest]:
        while (req := await requests.get()) is not None:
            yield req

    answers = aiter(cs.CompileStream(feed(), ctx))
    last, count = [""], [0]

    async def step() -> None:
        count[0] += 1
        events = tool_step(f"t{count[0]}")
        state = events[0].assistant_message.native_state
        state.route_id, state.kind = route_id, "anthropic.thinking"
        state.data = json.dumps(
            [{"type": "thinking", "thinking": f"step {count[0]}", "signature": "Eq" * 80}]
        ).encode()
        s = cpb.StepRequest(
            step_id="t", events=events, compile=compile_req, delta_base_compile_id=last[0]
        )
        s.delta_digest = cpb.DELTA_DIGEST_MESSAGE_CHAIN_COMPACTION_APART
        await requests.put(cpb.CompileStreamRequest(step=s))
        last[0] = _compile_id(await anext(answers))

    start, grown = await _grown(step, n, grow)
    await requests.put(None)
    async for _ in answers:
        pass
    # Every step's blocks go back: a loop that sent fewer would measure less work.
    view = _unary_view(await cs.Compile(compile_req, ctx))
    sent = next(r.items for r in view.layers if r.layer == view_pb2.LAYER_NATIVE_STATE)
    assert sent == count[0], (sent, count[0])
    return {
        "inproc_thinking_loop_messages": float(1 + 2 * count[0]),
        "inproc_thinking_loop_start_cpu_ms": start,
        "inproc_thinking_loop_grown_cpu_ms": grown,
        "inproc_thinking_loop_grown_vs_start_cpu": grown / start,
    }


def main() -> None:
    import tempfile

    with tempfile.TemporaryDirectory(prefix="ctxcc-stepcost-", dir="/tmp") as tmp:
        rows = run(Path(tmp) / "data")
    print(
        f"{'part':<24}{'p50 ms':>9}{'daemon CPU ms':>15}{'client CPU ms':>15}"
        f"{'no gRPC: CPU ms':>17}{'p50 ms':>9}"
    )
    for name in PARTS:
        daemon = rows.get(f"part_{name}_daemon_cpu_ms")
        own = rows.get(f"inproc_{name}_cpu_ms")
        own_p50 = rows.get(f"inproc_{name}_p50_ms")
        print(
            f"{name:<24}{rows[f'part_{name}_p50_ms']:>9.3f}"
            f"{'' if daemon is None else f'{daemon:.3f}':>15}"
            f"{rows[f'part_{name}_client_cpu_ms']:>15.3f}"
            f"{'' if own is None else f'{own:.3f}':>17}"
            f"{'' if own_p50 is None else f'{own_p50:.3f}':>9}"
        )
    print(
        f"in-process step that appends, at ~{rows['inproc_grown_view_messages']:.0f} messages: "
        f"{rows['inproc_step_chained_grown_cpu_ms']:.3f} ms of CPU, "
        f"{rows['inproc_step_grown_vs_start_cpu']:.2f}x the same step "
        f"({rows['inproc_step_chained_start_cpu_ms']:.3f} ms) before"
    )
    print(
        f"in-process step of a Claude tool loop with thinking, at "
        f"~{rows['inproc_thinking_loop_messages']:.0f} messages: "
        f"{rows['inproc_thinking_loop_grown_cpu_ms']:.3f} ms of CPU, "
        f"{rows['inproc_thinking_loop_grown_vs_start_cpu']:.2f}x the same step "
        f"({rows['inproc_thinking_loop_start_cpu_ms']:.3f} ms) early in the loop"
    )


if __name__ == "__main__":
    main()
