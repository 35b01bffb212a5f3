"""Cost of a compile and of an agent step against the transport floor (an echo RPC in
the same server returning the same number of bytes), history-length independence and
throughput with 8 concurrent agents.

A step is what the clients do: one CompileStream round trip (append + compile, answered
with a ViewDelta against the view the client holds, applied and digest-checked here with
the Python client's own code) that also carries the usage report of the previous step's
view (StepRequest.usage): one round trip per step, so the throughput is compared with
one echo per step. A unary Compile of an unchanged session is measured on its own
(`compile_vs_echo_p50`)."""

from __future__ import annotations

import queue
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc
from ctxcc_client import ViewAssembler
from ctxcc_client.deltas import HeldView

from bench.daemon import BenchDaemon
from ctxcc.v1 import (
    checkpoint_pb2,
    common_pb2,
    compile_service_pb2_grpc,
    event_pb2,
    session_pb2,
    session_service_pb2_grpc,
)
from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_service_pb2 as spb

ROUTE = common_pb2.Route(
    connection="bench", protocol="openai-chat", endpoint="local", model="gpt-4o"
)
OPTIONS = [
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.max_send_message_length", 64 << 20),
]


def _user(text: str) -> event_pb2.Event:
    ev = event_pb2.Event()
    ev.user_message.parts.add(text=text)
    return ev


def _assistant(text: str, call: str) -> event_pb2.Event:
    ev = event_pb2.Event()
    ev.assistant_message.parts.add(text=text)
    ev.assistant_message.tool_calls.add(
        call_id=call, name="read", arguments_json='{"path": "a.py"}'
    )
    return ev


def _result(call: str, text: str) -> event_pb2.Event:
    ev = event_pb2.Event()
    ev.tool_result.call_id, ev.tool_result.tool_name, ev.tool_result.text = call, "read", text
    return ev


class Api:
    def __init__(self, target: str) -> None:
        self.channel = grpc.insecure_channel(target, options=OPTIONS)
        self.sessions: Any = session_service_pb2_grpc.SessionServiceStub(self.channel)
        self.compiles: Any = compile_service_pb2_grpc.CompileServiceStub(self.channel)
        self._echo: Any = self.channel.unary_unary("/ctxcc.debug.Echo/Echo")

    def echo(self, size: int) -> bytes:
        out: bytes = self._echo(str(size).encode())
        return out

    def session(self, sid: str, events: list[event_pb2.Event]) -> None:
        self.sessions.CreateSession(
            spb.CreateSessionRequest(session=session_pb2.Session(session_id=sid))
        )
        for i in range(0, len(events), 1000):
            self.sessions.AppendEvents(
                spb.AppendEventsRequest(session_id=sid, events=events[i : i + 1000])
            )

    def compile(self, sid: str) -> cpb.CompileResponse:
        return self.compiles.Compile(cpb.CompileRequest(session_id=sid, route=ROUTE))  # type: ignore[no-any-return]


def conversation(turns: int, tag: str) -> list[event_pb2.Event]:
    """Turns of (user, assistant with a call, tool result), ~1.5 KB of view each: 67 turns
    make the ~200-message, ~100 KB view of the benchmark."""
    out = []
    for i in range(turns):
        out += [
            _user(f"{tag} question {i}: " + "please look at the module and its tests " * 10),
            _assistant(f"answer {i}: " + "reading the file now to check it " * 10, f"{tag}c{i}"),
            _result(f"{tag}c{i}", f"line {i}: " + "x = compute(y, z) + offset " * 24),
        ]
    return out


class StreamAgent:
    """One agent's open CompileStream, stepped as the clients step it: each step names
    the last view applied as its delta base, and the answer is applied to that view."""

    def __init__(self, api: Api, sid: str) -> None:
        self.api, self.sid = api, sid
        self._requests: queue.SimpleQueue[cpb.CompileStreamRequest | None] = queue.SimpleQueue()
        self._answers: Any = api.compiles.CompileStream(iter(self._requests.get, None))
        self.held: HeldView | None = None
        self._chunks = ViewAssembler()
        self.steps = 0
        self.deltas = 0
        self.bytes_received = 0

    def step(self, events: list[event_pb2.Event], *, report: bool = True) -> None:
        """One round trip; with `report`, the step carries the usage of the view the
        previous step returned, as the clients' `report_usage` queues it."""
        self.steps += 1
        step = cpb.StepRequest(
            step_id=str(self.steps),
            events=events,
            request_id=f"{self.sid}-{self.steps}",
            compile=cpb.CompileRequest(session_id=self.sid, route=ROUTE),
            delta_base_compile_id=self.held.view.compile_id if self.held else "",
            # The digest the clients' stream helpers ask for, and like them, the base's
            # compaction kept when it is recommended again.
            delta_digest=cpb.DELTA_DIGEST_MESSAGE_CHAIN_COMPACTION_APART,
            keep_compaction=self.held is not None,
        )
        if report and self.held is not None:
            step.usage.CopyFrom(self._usage(self.held.view))
        self._requests.put(cpb.CompileStreamRequest(step=step))
        if self.held is not None:
            # As the Python client's stream helper does: the view the answer's delta will
            # be applied to is copied for the caller while the daemon works.
            self.held.prepare()
        out: cpb.CompileStreamResponse = next(self._answers)
        if report and step.HasField("usage") and not out.HasField("usage"):
            raise RuntimeError(f"step {self.steps}'s usage report was not recorded: {out.error}")
        self.bytes_received += out.ByteSize()
        kind = out.WhichOneof("response")
        while kind == "chunk":  # a whole view over the chunk size
            whole = self._chunks.add(out.chunk)
            if whole is not None:
                self.held = HeldView.of(whole, chained=True, apart=True)
                break
            out = next(self._answers)
            self.bytes_received += out.ByteSize()
            kind = out.WhichOneof("response")
        if kind == "delta" and self.held is not None:
            self.held = self.held.apply(out.delta)
            self.deltas += 1
        elif kind == "view":
            self.held = HeldView.of(out.view, chained=True, apart=True)
        elif kind != "chunk":
            raise RuntimeError(f"step {self.steps} answered {kind}: {out.error}")
        assert self.held is not None

    @staticmethod
    def _usage(view: Any) -> cpb.ReportUsageRequest:
        return cpb.ReportUsageRequest(
            compile_id=view.compile_id,
            route=ROUTE,
            input_tokens=view.budget.estimated_input_tokens,
            output_tokens=50,
        )

    def report(self) -> None:
        """The usage of the last view by the unary ReportUsage (a second round trip)."""
        assert self.held is not None
        self.api.compiles.ReportUsage(self._usage(self.held.view))

    def close(self) -> None:
        self._requests.put(None)


def tool_step(call: str) -> list[event_pb2.Event]:
    """What an agent appends at a step of a turn: the model's message calling a tool and
    the tool's result (a result without its call would be an orphan, which the daemon
    keeps apart from the pairing of the conversation)."""
    return [_assistant("calling the tool", call), _result(call, "ok " * 40)]


def stepper(api: Api, sid: str, opened: list[StreamAgent]) -> Callable[[], None]:
    """An agent step over its stream: append a tool call with its result and compile,
    carrying the previous view's usage report."""
    agent = StreamAgent(api, sid)
    opened.append(agent)

    def step() -> None:
        agent.step(tool_step(f"{sid}{agent.steps + 1}"))

    return step


def p50(fn: Callable[[], object], n: int, warmup: int = 5) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def history(api: Api, n: int) -> tuple[float, float]:
    """Compile p50 with 200 events vs 10,000 events behind a checkpoint; both views hold
    the same ~200 messages."""
    long_log = conversation(3334, "h")
    api.session("hist10k", long_log[:9_800])
    api.compiles.CreateCheckpoint(
        cpb.CreateCheckpointRequest(
            checkpoint=checkpoint_pb2.Checkpoint(
                session_id="hist10k",
                covers_through_seq=9_800,
                summary="Earlier work: reviewed 3,200 files.",
                portable=True,
            )
        )
    )
    api.sessions.AppendEvents(
        spb.AppendEventsRequest(session_id="hist10k", events=long_log[9_800:10_000])
    )
    api.session("hist200", long_log[9_800:10_000])
    short_p50 = p50(lambda: api.compile("hist200"), n)
    long_p50 = p50(lambda: api.compile("hist10k"), n)
    probe = api.compile("hist10k").view
    assert probe.checkpoint_id and len(probe.messages) > 150, "the checkpoint must be used"
    return short_p50, long_p50


def hammer(
    d: BenchDaemon, seconds: float, work: Callable[[int], None]
) -> tuple[float, float, float]:
    """Calls/s of 8 threads calling `work`, the daemon's CPU (cores) meanwhile, and this
    process's CPU per call (ms)."""
    # Imported here: bench.isolation imports this module.
    from bench.isolation import daemon_cpu_s

    count = [0] * 8
    assert d.proc is not None
    cpu = daemon_cpu_s(d.proc.pid)
    mine = time.process_time()
    stop = time.perf_counter() + seconds

    def worker(k: int) -> None:
        while time.perf_counter() < stop:
            work(k)
            count[k] += 1

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    calls = max(1, sum(count))
    return (
        sum(count) / seconds,
        (daemon_cpu_s(d.proc.pid) - cpu) / seconds,
        (time.process_time() - mine) / calls * 1000,
    )


def run(data_dir: Any, scale: float = 1.0) -> dict[str, float]:
    # Imported here: bench.isolation imports this module.
    from bench.isolation import daemon_cpu_s

    n = max(20, int(200 * scale))
    d = BenchDaemon(data_dir)
    d.start_timed()
    try:
        api = Api(d.target)
        api.session("view200", conversation(67, "a"))  # ~200 messages, ~100 KB view
        view_bytes = len(api.compile("view200").SerializeToString())
        echo_p50 = p50(lambda: api.echo(view_bytes), n)
        compile_p50 = p50(lambda: api.compile("view200"), n)

        api.session("steps", conversation(67, "s"))
        assert d.proc is not None
        cpu_before = daemon_cpu_s(d.proc.pid)
        opened: list[StreamAgent] = []
        step_p50 = p50(stepper(api, "steps", opened), n, warmup=0)
        cpu_per_step = (daemon_cpu_s(d.proc.pid) - cpu_before) / n

        short_p50, long_p50 = history(api, n)

        # Throughput: 8 agents stepping concurrently vs echo calls with 8 in flight.
        seconds = max(1.0, 4.0 * scale)

        agents = [Api(d.target) for _ in range(8)]
        for k, a in enumerate(agents):
            a.session(f"agent{k}", conversation(20, f"g{k}"))
        streams = [StreamAgent(a, f"agent{k}") for k, a in enumerate(agents)]
        opened += streams

        def agent_step(k: int) -> None:
            streams[k].step([_user(f"step {streams[k].steps + 1} " * 10)])

        steps_per_s, step_cores, step_client_ms = hammer(d, seconds, agent_step)

        def echo(k: int) -> None:
            agents[k].echo(view_bytes)

        echo_per_s, echo_cores, echo_client_ms = hammer(d, seconds, echo)

        def unchanged_step(k: int) -> None:
            streams[k].step([], report=False)

        # The floor of a step over the same streams, clients and daemon: nothing new to
        # append, compile or record (a repeat answered by a delta of nothing).
        unchanged_per_s, _, _ = hammer(d, seconds, unchanged_step)
        deltas = sum(a.deltas for a in opened) / max(1, sum(a.steps for a in opened))
        for agent in opened:
            agent.close()
    finally:
        d.stop()
    return {
        "echo_p50_ms": echo_p50 * 1000,
        "compile_p50_ms": compile_p50 * 1000,
        "step_p50_ms": step_p50 * 1000,
        "daemon_cpu_ms_per_step": cpu_per_step * 1000,
        "compile_200_events_p50_ms": short_p50 * 1000,
        "compile_10k_events_p50_ms": long_p50 * 1000,
        "steps_per_s_8_agents": steps_per_s,
        "echo_per_s_8_in_flight": echo_per_s,
        # The daemon's CPU in cores while 8 agents step (its Python work holds the GIL,
        # so about 1 when that work is the bound) and while they echo.
        "daemon_cores_8_agents_stepping": step_cores,
        "daemon_cores_8_in_flight_echo": echo_cores,
        # The CPU this process (the 8 agents: the Python client's stream helper code, its
        # gRPC, one GIL) spends per step and per echo: at most one core of it, so it alone
        # bounds steps/s at 1000 / that, whatever the daemon costs.
        "client_cpu_ms_per_step_8_agents": step_client_ms,
        "client_cpu_ms_per_echo_8_in_flight": echo_client_ms,
        "client_bound_steps_vs_echo_throughput": (1000 / step_client_ms) / echo_per_s,
        "unchanged_steps_per_s_8_agents": unchanged_per_s,
        "unchanged_steps_vs_echo_throughput": unchanged_per_s / echo_per_s,
        "view_bytes": float(view_bytes),
        "stream_steps_answered_by_delta": deltas,
        "compile_vs_echo_p50": compile_p50 / echo_p50,
        "step_vs_echo_p50": step_p50 / echo_p50,
        "history_10k_vs_200_p50": long_p50 / short_p50,
        # A step is one round trip (the stream step carries the usage report), so one
        # echo per step is the floor.
        "steps_vs_echo_throughput": steps_per_s / echo_per_s,
    }
