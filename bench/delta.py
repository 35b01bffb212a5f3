"""An agent step over the CompileStream with delta views, through the Python client as an
agent uses it (deltas on, the default): a model turn with a tool call and its result
appended, the view compiled and received whole by the caller (rebuilt from the delta and
its digest checked), the previous view's usage report riding on the step (the client's
`stream.report_usage`): one round trip. Its time with a ~2,000-message view against a
~200-message one, and the bytes the stream received per step against the bytes of the
step's new events. Over budget at ~2,000 messages, the CPU per step on both sides with
the digest the clients ask for (the compaction request hashed apart) against the plain
chained one."""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path

from ctxcc_client import AsyncClient, CompileStream

from bench.daemon import BenchDaemon
from bench.isolation import daemon_cpu_s
from bench.rpc import ROUTE, Api, _assistant, _result, _user, conversation
from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import event_pb2


def _step_events(tag: str, i: int) -> list[event_pb2.Event]:
    """A model turn calling a tool and its result: ~1 KB, like the bench conversation's."""
    call = f"{tag}d{i}"
    return [
        _assistant(f"checking part {i}", call),
        _result(call, f"line {i}: " + "x = compute(y, z) + offset " * 30),
    ]


def long_turn(calls: int) -> list[event_pb2.Event]:
    """A short conversation, then one user turn of `calls` tool calls with their results."""
    events = [*conversation(34, "t"), _user("now work through the whole module on your own")]
    for i in range(calls):
        events += _step_events("turn", i)
    return events


class _Stepper:
    """One stream's steps on one session: the step times, the bytes the stream received
    and the bytes of the steps' new events."""

    def __init__(self, stream: CompileStream, sid: str, *, over_budget: bool = False) -> None:
        self.stream, self.sid = stream, sid
        # A window the ~270k-token view fits in: over budget, every view carries the
        # compaction request, whose prompt holds as much history as the window takes.
        # `over_budget`: the route's own window (gpt-4o's 128k), so every step has one.
        limits = None if over_budget else cpb.ModelLimits(context_window=1_000_000)
        self.req = cpb.CompileRequest(session_id=sid, route=ROUTE, limits=limits)
        self.over_budget = over_budget
        self.times: list[float] = []
        self.received = self.sent = self.steps = 0
        # The daemon's and this process's (the client's) CPU seconds over the kept steps.
        self.cpu = self.client_cpu = 0.0

    async def run(self, n: int, pid: int, *, kept: bool = True) -> None:
        """`n` steps; kept out of the figures when not `kept` (the warm-up). `pid`: the
        daemon's process."""
        cpu, client_cpu = daemon_cpu_s(pid), time.process_time()
        if self.steps == 0:
            await self.stream.step(self.req, [])  # the first view of a stream is whole
        for _ in range(n):
            events = _step_events(self.sid, self.steps)
            self.steps += 1
            before = self.stream.stats.bytes_received
            started = time.perf_counter()
            view, _ = await self.stream.step(self.req, events)
            if view.HasField("compaction") != self.over_budget:
                raise RuntimeError(f"{self.sid}: over budget is {not self.over_budget}")
            # Queued: the next step carries it.
            await self.stream.report_usage(
                view.compile_id,
                input_tokens=view.budget.estimated_input_tokens,
                output_tokens=50,
                route=ROUTE,
            )
            if kept:
                self.times.append(time.perf_counter() - started)
                self.received += self.stream.stats.bytes_received - before
                self.sent += sum(e.ByteSize() for e in events)
        if kept:
            self.cpu += daemon_cpu_s(pid) - cpu
            self.client_cpu += time.process_time() - client_cpu

    def figures(self) -> tuple[float, float, float]:
        """(p50 seconds of a step, bytes received per step, bytes of new events per step)."""
        last = self.stream.last_usage
        assert last is not None and not last.replayed
        n = len(self.times)
        return statistics.median(self.times), self.received / n, self.sent / n


async def _measure(target: str, pid: int, n: int) -> dict[str, float]:
    async with AsyncClient(target) as ctx:
        short, long, turn = (
            _Stepper(ctx.stream(), sid) for sid in ("delta200", "delta2k", "turn2k")
        )
        # Over budget, two streams: the digest the clients ask for (the compaction
        # request hashed apart, once per request) and the plain chained one before it
        # (the request hashed with the rest of the view at every step).
        plain = ctx.stream()
        plain._digest = cpb.DELTA_DIGEST_MESSAGE_CHAIN
        apart = _Stepper(ctx.stream(), "over2k_apart", over_budget=True)
        chained = _Stepper(plain, "over2k_chain", over_budget=True)
        steppers = (short, long, turn, apart, chained)
        for s in steppers:
            await s.run(5, pid, kept=False)
        # The three in alternating blocks: what moves on the machine over the run (the
        # store's background work, other load) then moves all three alike, and the
        # ratios compare steps made at the same times.
        blocks = 10
        for b in range(blocks):
            for s in steppers:
                await s.run(n // blocks + (1 if b < n % blocks else 0), pid)
        short_p50, short_bytes, event_bytes = short.figures()
        long_p50, long_bytes, _ = long.figures()
        turn_p50, _, _ = turn.figures()
        for s in steppers:
            assert s.stream.stats.deltas >= n, f"{s.sid}: steps must use deltas: {s.stream.stats}"
            assert s.stream.stats.resumed == 0
            await s.stream.close()
    return {
        "delta_step_200_msgs_p50_ms": short_p50 * 1000,
        "delta_step_2000_msgs_p50_ms": long_p50 * 1000,
        "delta_bytes_per_step_200_msgs": short_bytes,
        "delta_bytes_per_step_2000_msgs": long_bytes,
        "step_new_event_bytes": event_bytes,
        "step_2000_vs_200_msgs_p50": long_p50 / short_p50,
        "delta_step_in_1800_msg_turn_p50_ms": turn_p50 * 1000,
        "step_in_1800_msg_turn_vs_200_msgs_p50": turn_p50 / short_p50,
        "delta_bytes_per_step_vs_new_event_bytes": long_bytes / event_bytes,
        # The daemon's CPU per step, read from /proc around each block: steadier than
        # wall time on a shared machine, and what a 2,000-message history costs it.
        "delta_daemon_cpu_ms_per_step_200_msgs": short.cpu / len(short.times) * 1000,
        "delta_daemon_cpu_ms_per_step_2000_msgs": long.cpu / len(long.times) * 1000,
        "delta_client_cpu_ms_per_step_200_msgs": short.client_cpu / len(short.times) * 1000,
        "delta_client_cpu_ms_per_step_2000_msgs": long.client_cpu / len(long.times) * 1000,
        # Over budget at ~2,000 messages (a ~420 KB compaction request kept by every delta).
        **{
            f"over_budget_{side}_cpu_ms_per_step_{name}": cpu / len(s.times) * 1000
            for name, s in (("apart", apart), ("chain", chained))
            for side, cpu in (("daemon", s.cpu), ("client", s.client_cpu))
        },
        "over_budget_step_apart_vs_chain_p50": statistics.median(apart.times)
        / statistics.median(chained.times),
    }


def run(data_dir: Path, scale: float = 1.0) -> dict[str, float]:
    n = max(20, int(200 * scale))
    d = BenchDaemon(data_dir)
    d.start_timed()
    try:
        api = Api(d.target)
        api.session("delta200", conversation(67, "a"))  # ~200 messages, ~100 KB view
        api.session("delta2k", conversation(667, "k"))  # ~2,000 messages, ~1 MB view
        # ~2,000 messages again, but the last ~1,800 one turn: a user message, then tool
        # calls and their results, as an agent working alone for 900 steps leaves them.
        api.session("turn2k", long_turn(max(60, int(900 * scale))))
        for sid in ("over2k_apart", "over2k_chain"):  # ~2,000 messages over gpt-4o's window
            api.session(sid, conversation(667, sid))
        api.channel.close()
        assert d.proc is not None
        return asyncio.run(_measure(d.target, d.proc.pid, n))
    finally:
        d.stop()
