"""CreateSession is retried by every client (Go, TypeScript, Python), each through its
example that creates one session (client/*/examples/create{session,-session,_session}),
against a daemon process:

- started while the daemon is down, it goes through once the daemon is back;
- when the daemon stored the session but the answer was lost (a proxy here forwards the
  first CreateSession and answers the client UNAVAILABLE in place of the daemon's answer),
  the retry meets SESSION_ALREADY_EXISTS, reads the session back and returns it: the same
  id, one session;
- a retry that meets a session of another creator under its id (other creation fields)
  raises ALREADY_EXISTS, and so does a first attempt refused SESSION_ALREADY_EXISTS, even
  for a session whose creation fields equal the request's."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from ctxcc.v1 import artifact_service_pb2 as apb
from ctxcc.v1 import artifact_service_pb2_grpc, session_pb2, session_service_pb2_grpc
from ctxcc.v1 import session_service_pb2 as spb
from tests.e2e.proc import CLIENT_CREATE_SESSION, UPLOAD, DaemonProcess, open_upload

CLIENTS = CLIENT_CREATE_SESSION
CREATE = "/ctxcc.v1.SessionService/CreateSession"
GET = "/ctxcc.v1.SessionService/GetSession"
# The daemon's own id shape, which a client's chosen id has too.
SESSION_ID = re.compile(r"s-[0-9a-f]{24}")
BLOB = bytes(range(256)) * 512  # an upload kept open after its first 64 KiB
FIELDS = {
    "workspace_id": "ws-1",
    "labels": {"team": "infra", "run": "7"},
    "project_root": "/srv/app",
    "working_directory": "/srv/app/pkg",
}


def run_client(client: str, target: str, session: dict[str, Any], retry_seconds: float) -> Any:
    cmd = CLIENTS[client]
    assert Path(cmd[-1]).exists(), f"{cmd[-1]} missing: run `make clients`"
    return subprocess.Popen(
        [*cmd, "--session", json.dumps(session), "--retry-seconds", str(retry_seconds)],
        env={**os.environ, "CTXCC_TARGET": target},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def outcome(proc: Any) -> tuple[str, Any]:
    """("created", the session's fields) or ("error", "CODE REASON") from the example,
    CODE without underscores (ALREADYEXISTS)."""
    out, err = proc.communicate(timeout=180)
    line = out.strip().splitlines()[-1] if out.strip() else ""
    if line.startswith("created "):
        assert proc.returncode == 0, out + err
        return "created", json.loads(line.split(" ", 1)[1])
    assert line.startswith("error ") and proc.returncode == 1, out + err
    # Go names codes AlreadyExists, the others ALREADY_EXISTS.
    code, reason = line.split(" ")[1:]
    return "error", f"{code.replace('_', '').upper()} {reason}"


def sessions_of(target: str, project_id: str) -> list[session_pb2.Session]:
    with grpc.insecure_channel(target) as ch:
        stub: Any = session_service_pb2_grpc.SessionServiceStub(ch)
        page = stub.ListSessions(
            spb.ListSessionsRequest(project_id=project_id, page_size=100), timeout=30
        )
        assert not page.next_page_token
        return list(page.sessions)


def create_direct(target: str, session: session_pb2.Session) -> None:
    with grpc.insecure_channel(target) as ch:
        stub: Any = session_service_pb2_grpc.SessionServiceStub(ch)
        stub.CreateSession(spb.CreateSessionRequest(session=session), timeout=30)


def fields_of(s: session_pb2.Session) -> dict[str, Any]:
    return {
        "session_id": s.session_id,
        "workspace_id": s.workspace_id,
        "project_id": s.project_id,
        "labels": dict(s.labels),
        "project_root": s.project_root,
        "working_directory": s.working_directory,
    }


class Proxy(grpc.GenericRpcHandler):
    """A gRPC proxy in front of the daemon that forwards every unary call as it is, status
    and ErrorInfo included, except the first CreateSession, which `first_create` handles:
    "lose" forwards it and then answers UNAVAILABLE (the session is stored, its answer
    lost); "rival" creates a session of other fields under the requested id at the daemon
    and answers UNAVAILABLE without forwarding. `calls` records each call's method."""

    def __init__(self, upstream: str, first_create: str) -> None:
        self.first_create = first_create
        self.calls: list[str] = []
        self._lock = threading.Lock()
        self._upstream = grpc.insecure_channel(upstream)
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        self._server.add_generic_rpc_handlers([self])
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler[bytes, bytes]:
        method: str = details.method

        def handle(request: bytes, context: grpc.ServicerContext) -> bytes:
            with self._lock:
                self.calls.append(method)
                first = method == CREATE and self.calls.count(CREATE) == 1
            forward: Any = self._upstream.unary_unary(method)
            if first and self.first_create == "rival":
                asked = spb.CreateSessionRequest.FromString(request).session
                rival = session_pb2.Session()
                rival.CopyFrom(asked)
                rival.workspace_id = "someone-else"
                forward(spb.CreateSessionRequest(session=rival).SerializeToString(), timeout=30)
                context.abort(grpc.StatusCode.UNAVAILABLE, "proxy: connection lost")
            try:
                answer: bytes = forward(request, timeout=30)
            except grpc.RpcError as err:
                call: Any = err
                context.set_trailing_metadata(call.trailing_metadata() or ())
                context.abort(call.code(), call.details() or "")
            if first and self.first_create == "lose":
                context.abort(grpc.StatusCode.UNAVAILABLE, "proxy: connection lost")
            return answer

        return grpc.unary_unary_rpc_method_handler(handle)

    def close(self) -> None:
        self._server.stop(None)
        self._upstream.close()


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    d = DaemonProcess(tmp_path_factory.mktemp("create") / "data")
    d.start()
    d.wait_ready()
    yield d
    d.terminate()


@pytest.fixture
def proxy_for(daemon: DaemonProcess) -> Iterator[Any]:
    made: list[Proxy] = []

    def make(first_create: str) -> Proxy:
        made.append(Proxy(str(daemon.endpoints["tcp"]), first_create))
        return made[-1]

    yield make
    for p in made:
        p.close()


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_create_session_waits_for_a_daemon_that_starts_later(client: str, short_tmp: Path) -> None:
    d = DaemonProcess(short_tmp / "data")
    try:
        d.start()
        d.wait_ready()
        target = f"unix://{d.endpoints['unix']}"
        assert d.terminate(60) == 0
        agent = run_client(client, target, {"project_id": "later", **FIELDS}, 120)
        time.sleep(1)  # the client's first attempts find no daemon
        d.start()
        d.wait_ready()
        kind, got = outcome(agent)
        assert kind == "created", got
        assert SESSION_ID.fullmatch(got["session_id"]), got
        assert got == {"session_id": got["session_id"], "project_id": "later", **FIELDS}
        assert [fields_of(s) for s in sessions_of(d.target, "later")] == [got]
        assert d.terminate(60) == 0
    finally:
        d.ensure_stopped()


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_create_session_waits_out_a_rollout(client: str, short_tmp: Path) -> None:
    """SIGTERM while an upload is in flight: the draining daemon answers the client's
    CreateSession UNAVAILABLE/SHUTTING_DOWN (an answer, which a call waiting for the
    channel to be ready does not wait out), exits once the upload is done and is started
    again on the same data directory; the client's retry creates the session there."""
    d = DaemonProcess(short_tmp / "data", "--grace-period", "600").start()
    d.wait_ready()
    assert d.proc is not None
    proc = d.proc
    create_direct(d.target, session_pb2.Session(session_id="uploads"))
    turned_away = {"method": "SessionService/CreateSession", "code": "UNAVAILABLE"}

    async def run() -> tuple[str, Any]:
        async with grpc.aio.insecure_channel(d.target) as ch:
            artifacts: Any = artifact_service_pb2_grpc.ArtifactServiceStub(ch)
            upload = await open_upload(artifacts, "uploads", BLOB)
            await asyncio.to_thread(d.wait_in_flight, UPLOAD, 1)
            os.kill(proc.pid, signal.SIGTERM)
            await asyncio.to_thread(d.wait_health, 2)  # NOT_SERVING: draining
            target = f"unix://{d.endpoints['unix']}"
            agent = run_client(client, target, {"project_id": "rollout", **FIELDS}, 120)
            while d.metric("ctxcc_rpc_errors_total", **turned_away) < 1:
                assert agent.poll() is None, agent.communicate()
                await asyncio.sleep(0.05)
            await upload.write(apb.UploadArtifactRequest(data=BLOB[65536:]))
            await upload.done_writing()
            await upload
        assert await asyncio.to_thread(proc.wait, 120) == 0
        d.start()
        await asyncio.to_thread(d.wait_ready)
        return await asyncio.to_thread(outcome, agent)

    try:
        kind, got = asyncio.run(run())
        assert kind == "created", got
        assert SESSION_ID.fullmatch(got["session_id"]), got
        assert got == {"session_id": got["session_id"], "project_id": "rollout", **FIELDS}
        assert [fields_of(s) for s in sessions_of(d.target, "rollout")] == [got]
        assert d.terminate(60) == 0
    finally:
        d.ensure_stopped()


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_a_lost_answer_returns_the_session_the_first_attempt_stored(
    client: str, daemon: DaemonProcess, proxy_for: Any
) -> None:
    proxy = proxy_for("lose")
    project = f"lost-{client}"
    kind, got = outcome(run_client(client, proxy.target, {"project_id": project, **FIELDS}, 60))
    assert kind == "created", got
    assert SESSION_ID.fullmatch(got["session_id"]), got
    assert got == {"session_id": got["session_id"], "project_id": project, **FIELDS}
    # The first attempt was stored and answered UNAVAILABLE; the second, under the same
    # id, was refused SESSION_ALREADY_EXISTS and the session read back.
    assert proxy.calls == [CREATE, CREATE, GET]
    assert [fields_of(s) for s in sessions_of(daemon.target, project)] == [got]


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_a_retry_meeting_another_session_under_its_id_raises(
    client: str, daemon: DaemonProcess, proxy_for: Any
) -> None:
    proxy = proxy_for("rival")
    project = f"rival-{client}"
    kind, got = outcome(run_client(client, proxy.target, {"project_id": project, **FIELDS}, 60))
    assert kind == "error" and got == "ALREADYEXISTS SESSION_ALREADY_EXISTS", got
    assert proxy.calls == [CREATE, CREATE, GET]
    # Only the rival's session: the client's request was never stored.
    stored = sessions_of(daemon.target, project)
    assert [s.workspace_id for s in stored] == ["someone-else"]
    assert SESSION_ID.fullmatch(stored[0].session_id)


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_a_first_attempt_refused_already_exists_raises(
    client: str, daemon: DaemonProcess, proxy_for: Any
) -> None:
    """The same creation fields: only a retry's refusal may be the client's own session."""
    proxy = proxy_for("pass")
    project = f"taken-{client}"
    asked = {"session_id": f"taken-{client}", "project_id": project, **FIELDS}
    create_direct(daemon.target, session_pb2.Session(**asked))  # type: ignore[arg-type]
    kind, got = outcome(run_client(client, proxy.target, asked, 60))
    assert kind == "error" and got == "ALREADYEXISTS SESSION_ALREADY_EXISTS", got
    assert proxy.calls.count(CREATE) == 1
    assert [fields_of(s) for s in sessions_of(daemon.target, project)] == [asked]
