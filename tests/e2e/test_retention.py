"""--session-retention on a daemon run as an operator runs it: a session nobody appends
to or compiles is deleted once it has been idle that long (its watch ends, the metric
counts it, the log says so); sessions kept busy by appends or by compiles alone stay."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import grpc

from ctxcc.v1 import (
    common_pb2,
    compile_service_pb2,
    compile_service_pb2_grpc,
    session_pb2,
    session_service_pb2,
    session_service_pb2_grpc,
)
from tests.e2e.proc import DaemonProcess
from tests.helpers import error_info, user

ROUTE = common_pb2.Route(connection="agent", protocol="openai-chat", endpoint="api", model="gpt-4o")
# Long enough that the busy sessions' activity every 0.2 s never leaves a gap this long
# on a loaded machine; the sweep passes every second at this retention.
RETENTION_S = 8


def test_idle_sessions_are_deleted_and_busy_ones_kept(short_tmp: Path) -> None:
    d = DaemonProcess(short_tmp / "data", "--session-retention", f"{RETENTION_S}s").start()
    try:
        d.wait_ready()
        with grpc.insecure_channel(d.target) as ch:
            sessions: Any = session_service_pb2_grpc.SessionServiceStub(ch)
            compiles: Any = compile_service_pb2_grpc.CompileServiceStub(ch)
            for sid in ("idle", "appending", "compiling"):
                session = session_pb2.Session(session_id=sid)
                sessions.CreateSession(session_service_pb2.CreateSessionRequest(session=session))
                sessions.AppendEvents(
                    session_service_pb2.AppendEventsRequest(session_id=sid, events=[user("hi")])
                )
            watch = sessions.WatchSession(
                session_service_pb2.WatchSessionRequest(session_id="idle", after_seq=1)
            )
            ended: list[grpc.RpcError] = []

            def follow() -> None:
                try:
                    for _ in watch:
                        pass
                except grpc.RpcError as err:
                    ended.append(err)

            watcher = threading.Thread(target=follow, daemon=True)
            watcher.start()
            deadline = time.monotonic() + 20 * RETENTION_S
            step = 0
            while True:
                step += 1
                sessions.AppendEvents(
                    session_service_pb2.AppendEventsRequest(
                        session_id="appending", events=[user(f"step {step}")]
                    )
                )
                compiles.Compile(
                    compile_service_pb2.CompileRequest(session_id="compiling", route=ROUTE)
                )
                try:
                    sessions.GetSession(session_service_pb2.GetSessionRequest(session_id="idle"))
                except grpc.RpcError as err:
                    assert err.code() == grpc.StatusCode.NOT_FOUND, err
                    assert error_info(err).reason == "SESSION_NOT_FOUND"
                    break
                assert time.monotonic() < deadline, "the idle session was never deleted"
                time.sleep(0.2)
            for sid in ("appending", "compiling"):
                got = sessions.GetSession(session_service_pb2.GetSessionRequest(session_id=sid))
                assert got.session.session_id == sid
            watcher.join(30)
            assert ended and ended[0].code() == grpc.StatusCode.NOT_FOUND, ended
            assert d.metric("ctxcc_sessions_expired_total") == 1
            assert d.metric("ctxcc_sessions") == 2
    finally:
        assert d.terminate() == 0
    assert f"session idle deleted: idle for over {RETENTION_S} s (1 events, 0 blobs)" in d.log()
