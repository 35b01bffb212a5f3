"""Crash safety beyond appends: SIGKILL while clients create checkpoints, upload
artifacts, compile and report usage. After each restart nothing acknowledged is lost and
nothing half-written is visible: checkpoints verify against the log, artifacts match
their sha256, usage reports are remembered (a repeat is answered as a replay)."""

from __future__ import annotations

import hashlib
import random
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import pytest

from ctxcc.v1 import artifact_service_pb2 as apb
from ctxcc.v1 import (
    artifact_service_pb2_grpc,
    checkpoint_pb2,
    common_pb2,
    compile_service_pb2_grpc,
    session_pb2,
    session_service_pb2_grpc,
    view_pb2,
)
from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_service_pb2 as spb
from tests.e2e.proc import FAST_RECONNECT, DaemonProcess
from tests.helpers import assistant, user

ROUTE = common_pb2.Route(model="gpt-4o")
RETRYABLE = (
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.CANCELLED,
)


class Worker(threading.Thread):
    def __init__(self, n: int, target: str, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.n, self.target, self.stop_flag = n, target, stop
        self.sid = f"mixed{n}"
        self.checkpoints: dict[str, int] = {}
        self.artifacts: dict[str, str] = {}
        self.usages: dict[str, int] = {}
        self.errors: list[str] = []
        self.rng = random.Random(n)

    def retry(self, fn: Any, *args: Any) -> Any:
        for _ in range(400):
            try:
                return fn(*args, timeout=10, wait_for_ready=True)
            except grpc.RpcError as err:
                e: Any = err
                if e.code() not in RETRYABLE:
                    raise
                if self.stop_flag.is_set():
                    return None
                time.sleep(0.03)
        return None

    def run(self) -> None:
        try:
            with grpc.insecure_channel(self.target, options=FAST_RECONNECT) as ch:
                s: Any = session_service_pb2_grpc.SessionServiceStub(ch)
                c: Any = compile_service_pb2_grpc.CompileServiceStub(ch)
                a: Any = artifact_service_pb2_grpc.ArtifactServiceStub(ch)
                i = 0
                while not self.stop_flag.is_set():
                    i += 1
                    op = self.rng.choice(["checkpoint", "artifact", "usage"])
                    if op == "checkpoint":
                        req = spb.AppendEventsRequest(
                            session_id=self.sid,
                            request_id=f"a{i}",
                            events=[user(f"q{i}"), assistant(f"a{i}")],
                        )
                        head = self.retry(s.AppendEvents, req)
                        if head is None:
                            return
                        ck = cpb.CreateCheckpointRequest(
                            request_id=f"ck{i}",
                            checkpoint=checkpoint_pb2.Checkpoint(
                                session_id=self.sid,
                                covers_through_seq=head.last_seq,
                                summary=f"up to {i}",
                            ),
                        )
                        made = self.retry(c.CreateCheckpoint, ck)
                        if made is not None:
                            self.checkpoints[made.checkpoint.checkpoint_id] = (
                                made.checkpoint.covers_through_seq
                            )
                    elif op == "artifact":
                        data = self.rng.randbytes(self.rng.randrange(50_000, 300_000))
                        sha = hashlib.sha256(data).hexdigest()

                        def upload(data: bytes, sha: str, **kw: Any) -> Any:
                            head = apb.ArtifactHeader(
                                session_id=self.sid,
                                mime_type="image/png",
                                size_bytes=len(data),
                                sha256=sha,
                            )
                            msgs = [apb.UploadArtifactRequest(header=head)] + [
                                apb.UploadArtifactRequest(data=data[k : k + 65536])
                                for k in range(0, len(data), 65536)
                            ]
                            return a.UploadArtifact(iter(msgs), **kw)

                        done = self.retry(upload, data, sha)
                        if done is not None:
                            self.artifacts[done.artifact.artifact_id] = sha
                    else:
                        view = self.retry(
                            c.Compile, cpb.CompileRequest(session_id=self.sid, route=ROUTE)
                        )
                        if view is None:
                            return
                        tokens = view.view.budget.estimated_input_tokens + 11
                        rep = cpb.ReportUsageRequest(
                            compile_id=view.view.compile_id,
                            route=ROUTE,
                            input_tokens=tokens,
                            output_tokens=5,
                        )
                        if self.retry(c.ReportUsage, rep):
                            self.usages[view.view.compile_id] = tokens
        except Exception as exc:  # pragma: no cover - reported by the test
            self.errors.append(repr(exc))


@pytest.mark.slow
def test_sigkill_during_checkpoints_uploads_compiles_and_usage(short_tmp: Path) -> None:
    d = DaemonProcess(short_tmp / "data", "--durability", "sync").start()
    d.wait_ready()
    with grpc.insecure_channel(d.target) as ch:
        s: Any = session_service_pb2_grpc.SessionServiceStub(ch)
        for n in range(4):
            s.CreateSession(
                spb.CreateSessionRequest(session=session_pb2.Session(session_id=f"mixed{n}"))
            )
    stop = threading.Event()
    workers = [Worker(n, d.target, stop) for n in range(4)]
    for w in workers:
        w.start()
    rng = random.Random(7)

    def acked() -> int:
        return sum(len(x) for w in workers for x in (w.checkpoints, w.artifacts, w.usages))

    def await_progress(since: int) -> None:
        # Kill only once the restarted daemon has acknowledged more work, so each
        # restart is proven by traffic however slow the machine is.
        deadline = time.monotonic() + 60
        while acked() < since + 2 and time.monotonic() < deadline:
            time.sleep(0.02)

    try:
        for _ in range(6):
            await_progress(acked())
            time.sleep(rng.uniform(0.4, 1.2))
            d.kill()
            d.start()
            d.wait_ready()
        # The last daemon too proves itself by traffic, and the run ends with enough.
        await_progress(max(acked(), 19))
        time.sleep(0.5)
    finally:
        stop.set()
        for w in workers:
            w.join(60)
    try:
        assert [e for w in workers for e in w.errors] == []
        counts = [sum(len(x) for x in (w.checkpoints, w.artifacts, w.usages)) for w in workers]
        assert sum(counts) > 20, counts
        with grpc.insecure_channel(
            d.target, options=[("grpc.max_receive_message_length", 64 << 20)]
        ) as ch:
            c: Any = compile_service_pb2_grpc.CompileServiceStub(ch)
            a: Any = artifact_service_pb2_grpc.ArtifactServiceStub(ch)
            for w in workers:
                listed = c.ListCheckpoints(
                    cpb.ListCheckpointsRequest(session_id=w.sid, page_size=1000)
                )
                stored = {k.checkpoint_id: k.covers_through_seq for k in listed.checkpoints}
                for ck_id, covers in w.checkpoints.items():
                    assert stored.get(ck_id) == covers, f"acknowledged checkpoint {ck_id} lost"
                view = c.Compile(cpb.CompileRequest(session_id=w.sid, route=ROUTE)).view
                assert (
                    view_pb2.FALLBACK_REASON_CHECKPOINT_DIGEST_MISMATCH not in view.fallback_reasons
                )
                for art_id, sha in w.artifacts.items():
                    parts = list(
                        a.DownloadArtifact(
                            apb.DownloadArtifactRequest(session_id=w.sid, artifact_id=art_id)
                        )
                    )
                    data = b"".join(p.data for p in parts[1:])
                    assert hashlib.sha256(data).hexdigest() == sha == parts[0].artifact.sha256
                for compile_id, tokens in w.usages.items():
                    again = c.ReportUsage(
                        cpb.ReportUsageRequest(
                            compile_id=compile_id, route=ROUTE, input_tokens=tokens, output_tokens=5
                        )
                    )
                    assert again.replayed, f"acknowledged usage report of {compile_id} lost"
        print(
            "\nmixed crash test: 6 SIGKILLs, "
            f"{sum(len(w.checkpoints) for w in workers)} checkpoints, "
            f"{sum(len(w.artifacts) for w in workers)} artifacts, "
            f"{sum(len(w.usages) for w in workers)} usage reports acknowledged and found"
        )
    finally:
        assert d.terminate() == 0
