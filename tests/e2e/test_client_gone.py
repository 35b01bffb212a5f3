"""Clients that go away while their watch or stream step is being answered (closed,
killed, a pod restarted): the daemon logs no error and no traceback for it, only a
DEBUG line of its own, and keeps serving. grpc's asyncio server logged each such
disconnect at ERROR with a traceback (`ExecuteBatchError raised in core by servicer
method`), which an alert on error logs takes for a fault of the daemon."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc

from ctxcc.v1 import (
    common_pb2,
    compile_service_pb2_grpc,
    event_pb2,
    session_pb2,
    session_service_pb2_grpc,
)
from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_service_pb2 as spb
from tests.e2e.proc import REPO, DaemonProcess

# A client that reads a few messages of a watch of large events, then stops reading
# (gRPC's send of the next ones waits on it) until it is killed.
_WATCHER = """
import sys, time, grpc
sys.path.insert(0, {repo!r})
from ctxcc.v1 import session_service_pb2_grpc
from ctxcc.v1 import session_service_pb2 as spb
stub = session_service_pb2_grpc.SessionServiceStub(grpc.insecure_channel({target!r}))
for n, _ in enumerate(stub.WatchSession(spb.WatchSessionRequest(session_id="w"))):
    if n == 2:
        print("reading", flush=True)
        time.sleep(60)
"""

# A client that sends stream steps whose views (~8 MB, sent in chunks) it stops reading.
_STEPPER = """
import sys, time, grpc
sys.path.insert(0, {repo!r})
from ctxcc.v1 import compile_service_pb2_grpc, common_pb2
from ctxcc.v1 import compile_service_pb2 as cpb
stub = compile_service_pb2_grpc.CompileServiceStub(grpc.insecure_channel({target!r}))
route = common_pb2.Route(connection="c", protocol="openai-chat", endpoint="e", model="gpt-4.1")
def steps():
    for i in range(50):
        yield cpb.CompileStreamRequest(step=cpb.StepRequest(
            step_id=str(i), compile=cpb.CompileRequest(session_id="w", route=route)))
answers = stub.CompileStream(steps())
next(answers)
print("reading", flush=True)
time.sleep(60)
"""


def _big_event(i: int) -> event_pb2.Event:
    ev = event_pb2.Event()
    ev.user_message.parts.add(text=f"message {i}: " + "lorem ipsum dolor sit amet " * 7_500)
    return ev


def _leave(script: str, target: str, sig: signal.Signals) -> None:
    """Runs a client of `script` until it reads, then ends it with `sig`."""
    child = subprocess.Popen(
        [sys.executable, "-c", script.format(repo=str(REPO), target=target)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "reading"
        time.sleep(0.3)  # the daemon's next sends now wait on it
    finally:
        child.send_signal(sig)
        child.wait(30)


def test_clients_gone_mid_answer_leave_no_error_in_the_log(short_tmp: Path) -> None:
    d = DaemonProcess(short_tmp / "data", "--log-level", "debug").start()
    try:
        d.wait_ready()
        big = [("grpc.max_receive_message_length", 64 << 20)]  # the last compile's view
        with grpc.insecure_channel(d.target, options=big) as ch:
            sessions = session_service_pb2_grpc.SessionServiceStub(ch)
            sessions.CreateSession(
                spb.CreateSessionRequest(session=session_pb2.Session(session_id="w"))
            )
            for i in range(40):  # ~8 MB of history: a view sent in chunks, big watch pages
                sessions.AppendEvents(
                    spb.AppendEventsRequest(session_id="w", events=[_big_event(i)])
                )
            for k in range(6):
                sig = signal.SIGKILL if k % 2 else signal.SIGTERM
                _leave(_WATCHER, d.target, sig)
                _leave(_STEPPER, d.target, sig)
            # Still serving: an append and a compile after them all.
            sessions.AppendEvents(spb.AppendEventsRequest(session_id="w", events=[_big_event(99)]))
            compiles = compile_service_pb2_grpc.CompileServiceStub(ch)
            route = common_pb2.Route(
                connection="c", protocol="openai-chat", endpoint="e", model="gpt-4.1"
            )
            answer = compiles.Compile(cpb.CompileRequest(session_id="w", route=route))
            assert answer.view.event_boundary == 41
            time.sleep(1.0)  # the last disconnects are seen by the daemon
    finally:
        assert d.terminate() == 0
    log = d.log()
    assert "ExecuteBatchError" not in log, log[-3000:]
    assert "Traceback" not in log, log[-3000:]
    assert " ERROR " not in log, log[-3000:]
    # The disconnects did happen mid-send (the test would prove nothing otherwise): each
    # is one DEBUG line of the daemon's own.
    gone = [ln for ln in log.splitlines() if "went away while a message was sent" in ln]
    for method in ("SessionService/WatchSession", "CompileService/CompileStream"):
        assert any(f"/ctxcc.v1.{method} call" in ln for ln in gone), (method, gone)
    assert all(" DEBUG ctxcc.transport:" in ln for ln in gone), gone
