"""checkpoint.proto's covered_digest encoding, computed by the Go and TypeScript
clients (client/go/digest.go, client/typescript/src/digest.ts) from ListEvents, against
a daemon process: every kind of event and field, a blob, non-ASCII text, map keys that
sort differently by UTF-16 and by UTF-8; each client's digest is accepted by
CreateCheckpoint in VERIFY mode and equals the one the daemon computes."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from ctxcc.v1 import (
    artifact_service_pb2,
    artifact_service_pb2_grpc,
    checkpoint_pb2,
    compile_service_pb2_grpc,
    event_pb2,
    session_pb2,
    session_service_pb2_grpc,
)
from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_service_pb2 as spb
from tests.e2e.proc import REPO, DaemonProcess
from tests.helpers import ROUTE, assistant, tool_result, user

CLIENTS = {
    "go": [str(REPO / ".tools/bin/checkpointdigest-go")],
    "typescript": ["node", str(REPO / "client/typescript/dist/examples/checkpoint-digest.js")],
}


@pytest.fixture(scope="module")
def daemon() -> Iterator[DaemonProcess]:
    base = Path("/tmp") / f"ctxcc-digest-{os.getpid()}"
    base.mkdir()
    d = DaemonProcess(base / "data").start()
    d.wait_ready()
    try:
        yield d
    finally:
        assert d.terminate() == 0
        shutil.rmtree(base, ignore_errors=True)


def _events(ref: Any) -> list[event_pb2.Event]:
    evs = [event_pb2.Event(event_id="start", turn_started=event_pb2.TurnStarted(turn_id="t1"))]
    u = user("naïve café — 日本語 😀 \x7f", "u1")
    u.user_message.parts.add(attachment=ref)
    u.user_message.parts.add(text="")
    evs.append(u)
    a = assistant("", ("c1", "shell", '{"cmd": "ls"}'), ("c2", "grep", ""), reasoning="why")
    a.assistant_message.native_state.route_id = "r"
    a.assistant_message.native_state.kind = "opaque"
    a.assistant_message.native_state.data = bytes(range(256))
    a.assistant_message.route.CopyFrom(ROUTE)
    evs.append(a)
    evs.append(tool_result("c1", "x" * 40_000, "shell"))  # becomes a blob reference
    empty = tool_result("c2", "", "grep")
    empty.tool_result.is_error = True
    evs.append(empty)
    call = event_pb2.Event()
    call.tool_call.call_id, call.tool_call.name = "c3", "read"
    evs.append(call)
    evs.append(event_pb2.Event(attachment=ref))
    b = event_pb2.Event()
    b.browser_element.url = "https://example.test/ü"
    b.browser_element.text = "Save"
    # U+FF5E sorts after U+1F600 by UTF-16 units but before it by UTF-8 bytes.
    b.browser_element.attributes.update({"\U0001f600": "emoji", "\uff5e": "tilde", "a": ""})
    evs.append(b)
    imp = event_pb2.Event()
    imp.imported_message.origin_session_id = "elsewhere"
    imp.imported_message.origin_seq = 2**40
    imp.imported_message.role = event_pb2.MESSAGE_ROLE_USER
    imp.imported_message.parts.add(text="imported")
    evs.append(imp)
    plain = assistant("plain answer")
    evs.append(plain)
    cancelled = event_pb2.Event()
    cancelled.turn_cancelled.reason = "stop"
    cancelled.turn_cancelled.keep_reasoning = True
    evs.append(cancelled)
    done = event_pb2.Event()
    done.turn_completed.SetInParent()
    evs.append(done)
    return evs


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_clients_compute_the_daemons_covered_digest(daemon: DaemonProcess, client: str) -> None:
    sid = f"digest-{client}"
    with grpc.insecure_channel(daemon.target) as ch:
        sessions: Any = session_service_pb2_grpc.SessionServiceStub(ch)
        compiles: Any = compile_service_pb2_grpc.CompileServiceStub(ch)
        artifacts: Any = artifact_service_pb2_grpc.ArtifactServiceStub(ch)
        sessions.CreateSession(
            spb.CreateSessionRequest(session=session_pb2.Session(session_id=sid))
        )
        data = b"image bytes"
        header = artifact_service_pb2.ArtifactHeader(
            session_id=sid,
            mime_type="image/png",
            size_bytes=len(data),
            sha256=hashlib.sha256(data).hexdigest(),
            width=3,
        )
        ref = artifacts.UploadArtifact(
            iter(
                [
                    artifact_service_pb2.UploadArtifactRequest(header=header),
                    artifact_service_pb2.UploadArtifactRequest(data=data),
                ]
            )
        ).artifact
        events = _events(ref)
        sessions.AppendEvents(spb.AppendEventsRequest(session_id=sid, events=events))
        listed = sessions.ListEvents(spb.ListEventsRequest(session_id=sid)).events
        assert listed[3].tool_result.WhichOneof("content") == "blob"
        env = {**os.environ, "CTXCC_TARGET": daemon.target}
        digests = {}
        for through in (1, 7, len(events)):
            out = subprocess.run(
                [*CLIENTS[client], sid, str(through)]
                if client == "typescript"
                else [*CLIENTS[client], "-session", sid, "-through", str(through)],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
            )
            digests[through] = out.stdout.strip()
            ck = checkpoint_pb2.Checkpoint(
                session_id=sid,
                covers_through_seq=through,
                summary=f"through {through}",
                covered_digest=digests[through],
            )
            made = compiles.CreateCheckpoint(
                cpb.CreateCheckpointRequest(
                    checkpoint=ck, covered_digest_mode=cpb.COVERED_DIGEST_MODE_VERIFY
                )
            )
            assert not made.digest_computed
            computed = compiles.CreateCheckpoint(
                cpb.CreateCheckpointRequest(
                    checkpoint=checkpoint_pb2.Checkpoint(
                        session_id=sid, covers_through_seq=through, summary="daemon's"
                    ),
                    covered_digest_mode=cpb.COVERED_DIGEST_MODE_COMPUTE,
                )
            )
            assert computed.checkpoint.covered_digest == digests[through]
        assert len(set(digests.values())) == 3
