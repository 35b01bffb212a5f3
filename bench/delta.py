"""An agent step over the CompileStream with delta views, through the Python client as an
agent uses it (deltas on, the default): a model turn with a tool call and its result
appended, the view compiled and received whole by the caller (rebuilt from the delta and
its digest checked), the previous view's usage report riding on the step (the client's
`stream.report_usage`): one round trip. Its time with a ~2,000-message view against a
~200-message one, and the bytes the stream received per step against the bytes of the
step's new events."""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path

from ctxcc_client import AsyncClient, CompileStream

from bench.daemon import BenchDaemon
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


async def _steps(
    stream: CompileStream, sid: str, n: int, warmup: int
) -> tuple[float, float, float]:
    """(p50 seconds of a step, bytes received per step, bytes of new events per step)."""
    # A window the ~270k-token view fits in: over budget, every answer (delta or whole)
    # would carry the compaction prompt, which holds the whole history as text.
    req = cpb.CompileRequest(
        session_id=sid, route=ROUTE, limits=cpb.ModelLimits(context_window=1_000_000)
    )
    await stream.step(req, [])  # the first view of a stream is whole: left out
    times, received, sent = [], 0, 0
    for i in range(warmup + n):
        events = _step_events(sid, i)
        before = stream.stats.bytes_received
        started = time.perf_counter()
        view, _ = await stream.step(req, events)
        # Queued: the next step carries it.
        await stream.report_usage(
            view.compile_id,
            input_tokens=view.budget.estimated_input_tokens,
            output_tokens=50,
            route=ROUTE,
        )
        if i >= warmup:
            times.append(time.perf_counter() - started)
            received += stream.stats.bytes_received - before
            sent += sum(e.ByteSize() for e in events)
    assert stream.last_usage is not None and not stream.last_usage.replayed
    return statistics.median(times), received / n, sent / n


async def _measure(target: str, n: int) -> dict[str, float]:
    async with AsyncClient(target) as ctx:
        short, long = ctx.stream(), ctx.stream()
        short_p50, short_bytes, event_bytes = await _steps(short, "delta200", n, 5)
        long_p50, long_bytes, _ = await _steps(long, "delta2k", n, 5)
        turn = ctx.stream()
        turn_p50, _, _ = await _steps(turn, "turn2k", n, 5)
        assert short.stats.deltas >= n and long.stats.deltas >= n, "steps must use deltas"
        assert turn.stats.deltas >= n
        assert short.stats.resumed == long.stats.resumed == turn.stats.resumed == 0
        await short.close()
        await long.close()
        await turn.close()
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
        api.channel.close()
        return asyncio.run(_measure(d.target, n))
    finally:
        d.stop()
