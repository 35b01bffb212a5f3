"""A peer that opens connections and holds them idle, each a file descriptor of the
daemon's: every gRPC listener takes at most an eighth of the process's descriptors and
the /metrics port 64 connections, so the agent's own connection keeps being served
whole, instruction files included."""

from __future__ import annotations

import select
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import compile_service_pb2_grpc, session_pb2, session_service_pb2_grpc
from ctxcc.v1 import session_service_pb2 as spb
from server.adapters.metrics_http import MAX_CONNECTIONS
from server.web import server as web_server
from tests.e2e.proc import REPO, DaemonProcess
from tests.helpers import ROUTE, user

FILES = 512  # the daemon's descriptor limit here
FLOOD = 600  # idle connections: past FILES, which took every descriptor
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes(3) + b"\x04" + bytes(5)  # + SETTINGS


@pytest.fixture
def workspace(short_tmp: Path) -> Path:
    project = short_tmp / "ws" / "proj"
    project.mkdir(parents=True)
    (project / "AGENTS.md").write_text("Run the linter before committing.\n")
    return project


@pytest.fixture
def daemon(short_tmp: Path, workspace: Path) -> Iterator[DaemonProcess]:
    serve = [sys.executable, "-m", "server", "serve", "--data-dir", str(short_tmp / "data")]
    flags = ["--listen", "none", "--metrics-listen", "127.0.0.1:0", "--ui-listen", "none"]
    flags += ["--workspace-roots", str(workspace.parent)]
    # The limit of the daemon's process alone (a shell sets it, then becomes the daemon).
    command = ["sh", "-c", f'ulimit -n {FILES} && exec "$@"', "sh", *serve, *flags]
    with DaemonProcess(short_tmp / "data", command=command, cwd=REPO).serving() as d:
        yield d


def _descriptors(d: DaemonProcess) -> int:
    assert d.proc is not None
    return len(list(Path(f"/proc/{d.proc.pid}/fd").iterdir()))


def _flood(d: DaemonProcess) -> list[socket.socket]:
    """FLOOD connections that sent the HTTP/2 preface and stay idle, each taken by the
    daemon (its SETTINGS came back) or turned away (closed), or, when the daemon ran out
    of descriptors, left waiting."""
    held = []
    for _ in range(FLOOD):
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect(str(d.endpoints["unix"]))
            s.sendall(PREFACE)
        except OSError:  # turned away already
            s.close()
            continue
        held.append(s)
    waiting = set(held)
    while waiting and _descriptors(d) < FILES - 8:
        ready, _, _ = select.select(list(waiting), [], [], 1.0)
        waiting -= set(ready)
    return held


def _flood_metrics(d: DaemonProcess) -> list[socket.socket]:
    """FLOOD connections to /metrics that sent half a request and wait, until the daemon
    closed those past its cap or ran out of descriptors."""
    host, port = str(d.endpoints["metrics"]).rsplit(":", 1)
    held = []
    for i in range(FLOOD):
        # Once the daemon has no descriptor left, a connection would wait in the listen
        # backlog until its connect timed out.
        if i % 16 == 0 and _descriptors(d) >= FILES - 8:
            break
        try:
            s = socket.create_connection((host, int(port)), timeout=30)
            s.sendall(b"GET /metrics HTTP/1.1\r\n")
        except OSError:
            continue
        held.append(s)
    closed: set[socket.socket] = set()
    while len(closed) < len(held) - MAX_CONNECTIONS and _descriptors(d) < FILES - 8:
        ready, _, _ = select.select([s for s in held if s not in closed], [], [], 1.0)
        closed |= set(ready)
    return held


def _compile_reads_the_workspace(channel: grpc.Channel, workspace: Path, text: str) -> None:
    compiles: Any = compile_service_pb2_grpc.CompileServiceStub(channel)
    # Changed, so that the compile reads it again rather than from a memo.
    (workspace / "AGENTS.md").write_text(text)
    view = compiles.Compile(cpb.CompileRequest(session_id="s", route=ROUTE), timeout=60)
    prompt = "".join(section.text for section in view.view.system_sections)
    assert text.strip() in prompt, list(view.view.notes)
    assert not any("Too many open files" in n for n in view.view.notes)


def test_idle_metrics_connections_leave_the_daemon_descriptors_for_its_files(
    daemon: DaemonProcess, workspace: Path
) -> None:
    with grpc.insecure_channel(daemon.target) as ch:
        sessions: Any = session_service_pb2_grpc.SessionServiceStub(ch)
        session = session_pb2.Session(
            session_id="s", project_root=str(workspace), working_directory=str(workspace)
        )
        sessions.CreateSession(spb.CreateSessionRequest(session=session), timeout=30)
        sessions.AppendEvents(spb.AppendEventsRequest(session_id="s", events=[user("hi")]))
        _compile_reads_the_workspace(ch, workspace, "Run the linter before committing.\n")
        flood = _flood_metrics(daemon)
        try:
            _compile_reads_the_workspace(ch, workspace, "Run the tests before committing.\n")
            assert _descriptors(daemon) < FILES // 2
        finally:
            for s in flood:
                s.close()


def test_idle_connections_leave_the_daemon_descriptors_for_its_files(
    daemon: DaemonProcess, workspace: Path
) -> None:
    with grpc.insecure_channel(daemon.target) as ch:
        sessions: Any = session_service_pb2_grpc.SessionServiceStub(ch)
        compiles: Any = compile_service_pb2_grpc.CompileServiceStub(ch)
        session = session_pb2.Session(
            session_id="s", project_root=str(workspace), working_directory=str(workspace)
        )
        sessions.CreateSession(spb.CreateSessionRequest(session=session), timeout=30)
        sessions.AppendEvents(spb.AppendEventsRequest(session_id="s", events=[user("hi")]))
        flood = _flood(daemon)
        try:
            # Changed, so that the compile reads it again rather than from a memo.
            (workspace / "AGENTS.md").write_text("Run the tests before committing.\n")
            view = compiles.Compile(cpb.CompileRequest(session_id="s", route=ROUTE), timeout=60)
            prompt = "".join(section.text for section in view.view.system_sections)
            assert "Run the tests before committing." in prompt, list(view.view.notes)
            assert not any("Too many open files" in n for n in view.view.notes)
            sessions.AppendEvents(
                spb.AppendEventsRequest(session_id="s", events=[user("more")]), timeout=30
            )
            assert _descriptors(daemon) < FILES // 2
        finally:
            for s in flood:
                s.close()


def test_a_burst_of_inspector_connections_leaves_at_most_its_cap_open(short_tmp: Path) -> None:
    """The inspector takes at most MAX_CONNECTIONS connections however fast they come:
    asyncio makes the protocols of all the connections one wake-up accepts (up to 100)
    before any of them is made, and a cap counted when the protocol was made left 301 of
    a burst of 600 open past a cap of 256."""
    with DaemonProcess(short_tmp / "data", "--metrics-listen", "none").serving() as d:
        host, port = str(d.endpoints["ui"]).rsplit(":", 1)
        burst = [socket.create_connection((host, int(port)), timeout=60) for _ in range(FLOOD)]
        taken = 0
        try:
            for s in burst:
                try:
                    s.sendall(b"GET /no-such-page HTTP/1.1\r\nHost: x\r\n\r\n")
                    answer = s.recv(64)
                except ConnectionResetError:  # turned away, its 503 lost to the reset
                    continue
                assert answer.startswith(b"HTTP/1.1 "), answer
                taken += not answer.startswith(b"HTTP/1.1 503 ")
        finally:
            for s in burst:
                s.close()
    assert 0 < taken <= web_server.MAX_CONNECTIONS, taken
