"""SIGTERM against the daemon as a process: calls in flight finish or are turned away
with a reason the clients retry on, idle CompileStreams are ended at once, exit 0."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ctxcc.v1 import artifact_service_pb2 as apb
from ctxcc.v1 import (
    artifact_service_pb2_grpc,
    compile_service_pb2_grpc,
    session_pb2,
    session_service_pb2_grpc,
    view_pb2,
)
from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_service_pb2 as spb
from tests.e2e.proc import UPLOAD, DaemonProcess, open_upload
from tests.helpers import ROUTE, error_info, user

APPENDS = 32
BLOB = bytes(range(256)) * 512  # 128 KiB: its first 64 KiB are sent before SIGTERM
ALL_FORMATS = (
    view_pb2.RENDER_FORMAT_OPENAI_CHAT,
    view_pb2.RENDER_FORMAT_OPENAI_RESPONSES,
    view_pb2.RENDER_FORMAT_ANTHROPIC_MESSAGES,
    view_pb2.RENDER_FORMAT_GEMINI,
)


def _outcome(err: grpc.aio.AioRpcError) -> str:
    try:
        reason = error_info(err).reason
    except AssertionError:
        reason = "no ErrorInfo"
    return f"{err.code().name}/{reason}"


def _append(i: int) -> spb.AppendEventsRequest:
    # ~1 MB per append, fsynced: long enough that many are in the daemon at SIGTERM.
    events = [user(f"append {i} part {k} " + "x" * 50_000) for k in range(20)]
    return spb.AppendEventsRequest(session_id=f"s{i}", request_id=f"r{i}", events=events)


def test_appends_in_flight_at_sigterm_finish_or_get_shutting_down(short_tmp: Path) -> None:
    d = DaemonProcess(short_tmp / "data", "--grace-period", "15").start()
    d.wait_ready()
    assert d.proc is not None
    pid = d.proc.pid

    async def run() -> tuple[list[str], str]:
        async with grpc.aio.insecure_channel(d.target) as ch:
            stub: Any = session_service_pb2_grpc.SessionServiceStub(ch)
            artifacts: Any = artifact_service_pb2_grpc.ArtifactServiceStub(ch)
            for i in range(APPENDS):
                sid = f"s{i}"
                await stub.CreateSession(
                    spb.CreateSessionRequest(session=session_pb2.Session(session_id=sid))
                )

            async def one(i: int) -> str:
                try:
                    await stub.AppendEvents(_append(i), timeout=30)
                    return "OK"
                except grpc.aio.AioRpcError as err:
                    return _outcome(err)

            # An upload held open across SIGTERM keeps the daemon draining until the test
            # lets it finish: the call made after SIGTERM meets a draining daemon however
            # quickly the appends end, and however long the daemon takes to see the signal.
            held = await open_upload(artifacts, "s0", BLOB)
            await asyncio.to_thread(d.wait_in_flight, UPLOAD, 1)
            calls = [asyncio.create_task(one(i)) for i in range(APPENDS)]
            # SIGTERM once the daemon is answering: the rest are on the wire or running.
            await asyncio.wait(calls, return_when=asyncio.FIRST_COMPLETED)
            os.kill(pid, signal.SIGTERM)
            await asyncio.to_thread(d.wait_health, health_pb2.HealthCheckResponse.NOT_SERVING)
            try:
                await stub.GetSession(spb.GetSessionRequest(session_id="s0"), timeout=10)
                late = "OK"
            except grpc.aio.AioRpcError as err:
                late = _outcome(err)
            await held.write(apb.UploadArtifactRequest(data=BLOB[65536:]))
            await held.done_writing()
            assert (await held).artifact.size_bytes == len(BLOB)
            return list(await asyncio.gather(*calls)), late

    results, late = asyncio.run(run())
    assert d.proc.wait(30) == 0
    print(f"\n{APPENDS} appends at SIGTERM: {dict(Counter(results))}; a new call: {late}")
    assert set(results) <= {"OK", "UNAVAILABLE/SHUTTING_DOWN"}, results
    assert late == "UNAVAILABLE/SHUTTING_DOWN"

    # Restarted, every append resent with its request id: the acknowledged ones are
    # replays, the turned-away ones were never written and land now.
    d.start()
    d.wait_ready()

    async def resend() -> list[bool]:
        async with grpc.aio.insecure_channel(d.target) as ch:
            stub: Any = session_service_pb2_grpc.SessionServiceStub(ch)
            answers = [await stub.AppendEvents(_append(i)) for i in range(APPENDS)]
            return [a.replayed for a in answers]

    try:
        replayed = asyncio.run(resend())
    finally:
        assert d.terminate() == 0
    assert replayed == [r == "OK" for r in results]


def test_idle_compile_streams_end_at_once_on_sigterm(short_tmp: Path) -> None:
    d = DaemonProcess(short_tmp / "data", "--grace-period", "20").start()
    d.wait_ready()
    assert d.proc is not None
    pid = d.proc.pid

    details: list[str] = []

    async def run() -> tuple[list[str], float]:
        async with grpc.aio.insecure_channel(d.target) as ch:
            sessions: Any = session_service_pb2_grpc.SessionServiceStub(ch)
            compiles: Any = compile_service_pb2_grpc.CompileServiceStub(ch)
            queues: list[asyncio.Queue[cpb.CompileStreamRequest]] = []
            answers = []
            for k in range(4):
                sid = f"idle{k}"
                await sessions.CreateSession(
                    spb.CreateSessionRequest(session=session_pb2.Session(session_id=sid))
                )
                queue: asyncio.Queue[cpb.CompileStreamRequest] = asyncio.Queue()

                async def requests(q: asyncio.Queue[cpb.CompileStreamRequest]) -> Any:
                    while True:
                        yield await q.get()

                it = compiles.CompileStream(requests(queue)).__aiter__()
                step = cpb.StepRequest(
                    step_id="1",
                    events=[user(f"hello {k}")],
                    request_id=f"{sid}-1",
                    compile=cpb.CompileRequest(session_id=sid, route=ROUTE),
                )
                await queue.put(cpb.CompileStreamRequest(step=step))
                first = await it.__anext__()
                assert first.WhichOneof("response") == "view"
                queues.append(queue)
                answers.append(it)
            # Every stream now waits for its agent's next step, idle for longer than the
            # drain's settle time (which then ended them as calls over the grace period).
            await asyncio.sleep(1.0)
            started = time.monotonic()
            os.kill(pid, signal.SIGTERM)
            ends = []
            for it in answers:
                try:
                    await asyncio.wait_for(it.__anext__(), 30)
                    ends.append("a message")
                except grpc.aio.AioRpcError as err:
                    ends.append(_outcome(err))
                    details.append(str(err.details()))
            await asyncio.to_thread(d.proc.wait, 60)  # type: ignore[union-attr]
            return ends, time.monotonic() - started

    ends, exit_s = asyncio.run(run())
    print(f"\nSIGTERM with 4 idle CompileStreams: exited in {exit_s:.2f} s")
    assert ends == ["UNAVAILABLE/SHUTTING_DOWN"] * 4
    # Ended by their own answer, not cut as calls still running at the grace period's end.
    assert details and all("ended this call before it finished" not in m for m in details), details
    assert d.proc.returncode == 0
    # The grace period is 20 s: an exit well before it means nobody waited for idle streams
    # (about 1 s here; the bound leaves a loaded machine room to stop and exit).
    assert exit_s < 12, exit_s


def test_a_step_in_progress_at_sigterm_is_answered_then_the_stream_ends(short_tmp: Path) -> None:
    d = DaemonProcess(short_tmp / "data", "--grace-period", "20").start()
    d.wait_ready()
    assert d.proc is not None
    pid = d.proc.pid

    async def run() -> tuple[str, str, float]:
        options = [("grpc.max_receive_message_length", 64 << 20)]
        async with grpc.aio.insecure_channel(d.target, options=options) as ch:
            sessions: Any = session_service_pb2_grpc.SessionServiceStub(ch)
            compiles: Any = compile_service_pb2_grpc.CompileServiceStub(ch)
            await sessions.CreateSession(
                spb.CreateSessionRequest(session=session_pb2.Session(session_id="busy"))
            )
            # A long history, rendered for every provider: a step that takes a while.
            for k in range(4):
                events = [user(f"message {k}.{i} " + "text " * 2000) for i in range(50)]
                await sessions.AppendEvents(
                    spb.AppendEventsRequest(session_id="busy", events=events)
                )
            queue: asyncio.Queue[cpb.CompileStreamRequest] = asyncio.Queue()

            async def requests() -> Any:
                while True:
                    yield await queue.get()

            it = compiles.CompileStream(requests()).__aiter__()
            step = cpb.StepRequest(
                step_id="1",
                request_id="busy-1",
                events=[user("one more question")],
                compile=cpb.CompileRequest(
                    session_id="busy", route=ROUTE, render_formats=list(ALL_FORMATS)
                ),
            )
            await queue.put(cpb.CompileStreamRequest(step=step))
            # The daemon has taken the step once its event is in the log (a step appends
            # before it compiles): SIGTERM now finds it at work, never still on the wire.
            for _ in range(6000):
                got = await sessions.GetSession(spb.GetSessionRequest(session_id="busy"))
                if got.session.head_seq == 201:
                    break
                await asyncio.sleep(0.01)
            else:
                raise AssertionError("the step's event never reached the log")
            started = time.monotonic()
            os.kill(pid, signal.SIGTERM)
            first = await asyncio.wait_for(it.__anext__(), 30)
            kind = first.WhichOneof("response")
            while kind == "chunk" and first.chunk.index + 1 < first.chunk.count:
                first = await asyncio.wait_for(it.__anext__(), 30)
            try:
                await asyncio.wait_for(it.__anext__(), 30)
                end = "another message"
            except grpc.aio.AioRpcError as err:
                end = _outcome(err)
            return str(kind), end, time.monotonic() - started

    answer, end, took = asyncio.run(run())
    assert d.proc.wait(30) == 0
    print(f"\nstep in progress at SIGTERM: {answer}, then {end} after {took:.2f} s")
    assert answer in ("view", "chunk")
    assert end == "UNAVAILABLE/SHUTTING_DOWN"


def test_a_watch_whose_client_stopped_reading_does_not_hold_the_drain(short_tmp: Path) -> None:
    """A watch of a 16 MB log whose client read one event and then stopped: its handler
    waits on flow control in the middle of the backlog and never sees the hub close. The
    drain used to count it busy and wait the whole grace period (600 s here) for it; it
    now stops as with idle streams, and the client, once it reads again, gets what was
    sent and then UNAVAILABLE, on which the clients' watches reopen after the last event."""
    d = DaemonProcess(short_tmp / "data", "--grace-period", "600").start()
    d.wait_ready()
    assert d.proc is not None
    pid = d.proc.pid

    async def run() -> tuple[int, str]:
        async with grpc.aio.insecure_channel(d.target) as ch:
            sessions: Any = session_service_pb2_grpc.SessionServiceStub(ch)
            await sessions.CreateSession(
                spb.CreateSessionRequest(session=session_pb2.Session(session_id="w"))
            )
            for k in range(16):
                events = [user(f"{k}-{j} " + "x" * (256 << 10)) for j in range(4)]
                await sessions.AppendEvents(spb.AppendEventsRequest(session_id="w", events=events))
            watch = sessions.WatchSession(spb.WatchSessionRequest(session_id="w"))
            updates = watch.__aiter__()
            first = await asyncio.wait_for(updates.__anext__(), 30)
            assert first.event.seq == 1
            await asyncio.to_thread(d.wait_in_flight, "SessionService/WatchSession", 1)
            os.kill(pid, signal.SIGTERM)
            # Not reading: a bound far under the grace period, far over a drain's second.
            code = await asyncio.to_thread(d.proc.wait, 120)  # type: ignore[union-attr]
            last = first.event.seq
            try:
                async for update in updates:
                    assert update.event.seq == last + 1
                    last = update.event.seq
                end = "a clean end"
            except grpc.aio.AioRpcError as err:
                end = err.code().name
            return code, f"{end} after seq {last}"

    try:
        code, end = asyncio.run(run())
    finally:
        d.ensure_stopped()
    print(f"\nSIGTERM with a watch stalled in its backlog: exit {code}, the watch: {end}")
    assert code == 0
    assert end.startswith("UNAVAILABLE"), end
    assert "calls still running" not in d.log()


async def _held_upload(ch: grpc.aio.Channel, d: DaemonProcess) -> Any:
    """An upload to a new session "s0" that stays in its handler (and the daemon draining)
    until the test writes the rest of BLOB (open_upload)."""
    sessions: Any = session_service_pb2_grpc.SessionServiceStub(ch)
    artifacts: Any = artifact_service_pb2_grpc.ArtifactServiceStub(ch)
    await sessions.CreateSession(
        spb.CreateSessionRequest(session=session_pb2.Session(session_id="s0"))
    )
    held = await open_upload(artifacts, "s0", BLOB)
    await asyncio.to_thread(d.wait_in_flight, UPLOAD, 1)
    return held


# How a call still running when the drain ends is answered.
CUT = (
    "UNAVAILABLE/SHUTTING_DOWN: the daemon is shutting down and ended this call before it "
    "finished (its grace period was over, or a second stop signal came): reconnect and "
    "resend with the same request id"
)


def _upload_cut(d: DaemonProcess, signals: int) -> tuple[str, int]:
    """Holds an upload open (_held_upload) in the started daemon `d`, sends SIGTERM
    (`signals` 2: again once it drains) and waits for the upload's end: its outcome
    (_outcome; with the status's message when it is SHUTTING_DOWN) and the daemon's exit
    code."""
    d.wait_ready()
    assert d.proc is not None
    pid = d.proc.pid

    async def run() -> str:
        async with grpc.aio.insecure_channel(d.target) as ch:
            held = await _held_upload(ch, d)
            os.kill(pid, signal.SIGTERM)
            if signals == 2:
                await asyncio.to_thread(d.wait_health, health_pb2.HealthCheckResponse.NOT_SERVING)
                os.kill(pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(held, 60)
                return "OK"
            except grpc.aio.AioRpcError as err:
                outcome = _outcome(err)
                if outcome.endswith("SHUTTING_DOWN"):
                    outcome += f": {err.details()}"
                return outcome

    try:
        ended = asyncio.run(run())
        return ended, d.proc.wait(60)
    finally:
        d.ensure_stopped()


def test_liveness_stays_serving_while_the_daemon_drains(short_tmp: Path) -> None:
    """SIGTERM turns the overall health NOT_SERVING (readiness) at once; the service the
    startup and liveness probes ask, ctxcc.liveness, answers SERVING as long as the process
    runs, the drain included. grpc's enter_graceful_shutdown turned it NOT_SERVING too,
    for as long as the drain lasted (up to the grace period)."""
    d = DaemonProcess(
        short_tmp / "data", "--grace-period", "600", "--health-listen", "127.0.0.1:0"
    ).start()
    d.wait_ready()
    assert d.proc is not None
    pid = d.proc.pid

    def on_probe_port(service: str) -> int:
        with grpc.insecure_channel(str(d.endpoints["health"])) as ch:
            stub: Any = health_pb2_grpc.HealthStub(ch)
            req = health_pb2.HealthCheckRequest(service=service)
            return int(stub.Check(req, timeout=10).status)

    async def run() -> tuple[int, int, int]:
        async with grpc.aio.insecure_channel(d.target) as ch:
            # An upload held open keeps the daemon draining until the test lets it finish.
            held = await _held_upload(ch, d)
            before = await asyncio.to_thread(on_probe_port, "ctxcc.liveness")
            os.kill(pid, signal.SIGTERM)
            await asyncio.to_thread(d.wait_health, health_pb2.HealthCheckResponse.NOT_SERVING)
            draining = await asyncio.to_thread(on_probe_port, "ctxcc.liveness")
            overall = await asyncio.to_thread(on_probe_port, "")
            await held.write(apb.UploadArtifactRequest(data=BLOB[65536:]))
            await held.done_writing()
            assert (await held).artifact.size_bytes == len(BLOB)
            return before, draining, overall

    try:
        before, draining, overall = asyncio.run(run())
        code = d.proc.wait(120)
    finally:
        d.ensure_stopped()
    serving, not_serving = (
        health_pb2.HealthCheckResponse.SERVING,
        health_pb2.HealthCheckResponse.NOT_SERVING,
    )
    assert (before, draining, overall) == (serving, serving, not_serving)
    assert code == 0


def test_a_second_sigterm_stops_waiting_for_calls_in_flight(short_tmp: Path) -> None:
    """With a 600 s grace period and an upload that never finishes, the first SIGTERM
    drains (and would wait the whole grace); a second one, an operator's second Ctrl-C,
    cuts the wait short: the upload is ended, the store still closes and the data
    directory opens again. Before, only SIGKILL stopped it sooner."""
    d = DaemonProcess(short_tmp / "data", "--grace-period", "600").start()
    ended, code = _upload_cut(d, signals=2)
    assert code == 0
    # Ended with a reason (grpc's own stop ended it without ErrorInfo).
    assert ended == CUT, ended
    log = d.log()
    assert "SIGTERM again: not waiting for the calls still in flight" in log
    # Cut by the signal, not by the end of the grace period (600 s away).
    assert "calls still running at the second stop signal: 1 ended with SHUTTING_DOWN" in log
    assert "grace period:" not in log
    assert "stopped (calls in flight cut short)" in log
    again = DaemonProcess(short_tmp / "data").start()
    try:
        again.wait_ready()
        with grpc.insecure_channel(again.target) as ch:
            stub: Any = session_service_pb2_grpc.SessionServiceStub(ch)
            got = stub.GetSession(spb.GetSessionRequest(session_id="s0"), timeout=10)
            assert got.session.session_id == "s0"
    finally:
        again.ensure_stopped()


def test_a_call_over_the_grace_period_ends_with_shutting_down(short_tmp: Path) -> None:
    """An upload still running when a 1 s grace period is over is ended with SHUTTING_DOWN
    ("reconnect and resend"), and the log says how many calls were ended so. grpc's own
    stop ended it with a bare CANCELLED (or UNAVAILABLE) without ErrorInfo."""
    d = DaemonProcess(short_tmp / "data", "--grace-period", "1").start()
    ended, code = _upload_cut(d, signals=1)
    assert code == 0
    assert ended == CUT, ended
    assert "calls still running after the 1.0s grace period: 1 ended with SHUTTING_DOWN" in (
        d.log()
    ), d.log()[-2000:]


def test_the_log_counts_the_calls_over_the_grace_period_not_idle_streams(
    short_tmp: Path,
) -> None:
    """Health watches are cut at the end of the drain with the calls over the grace
    period (both answer SHUTTING_DOWN), but they are no call the drain waited for: the
    warning counted them as calls still running (3 for one held upload and two watches
    of a load balancer)."""
    d = DaemonProcess(short_tmp / "data", "--grace-period", "1").start()
    d.wait_ready()
    assert d.proc is not None
    pid = d.proc.pid

    async def run() -> list[str]:
        async with grpc.aio.insecure_channel(d.target) as ch:
            health: Any = health_pb2_grpc.HealthStub(ch)
            watches = [health.Watch(health_pb2.HealthCheckRequest(service="")) for _ in range(2)]
            for watch in watches:
                await watch.read()
            held = await _held_upload(ch, d)
            os.kill(pid, signal.SIGTERM)
            ends = []
            for call in (held, *watches):
                try:
                    await asyncio.wait_for(call if call is held else _drained(call), 60)
                    ends.append("OK")
                except grpc.aio.AioRpcError as err:
                    ends.append(_outcome(err))
            return ends

    try:
        ends = asyncio.run(run())
        code = d.proc.wait(60)
    finally:
        d.ensure_stopped()
    assert code == 0
    assert ends == ["UNAVAILABLE/SHUTTING_DOWN"] * 3, ends
    assert "calls still running after the 1.0s grace period: 1 ended with SHUTTING_DOWN" in (
        d.log()
    ), d.log()[-2000:]


async def _drained(call: Any) -> None:
    """Reads a stream to its end."""
    while await call.read() is not grpc.aio.EOF:
        pass
