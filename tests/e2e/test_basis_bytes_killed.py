"""A daemon SIGKILLed while sessions compile with their rules edited before each step:
reopened, each session's basis_bytes is exactly what the basis parts it holds take, and
every compile the store recorded with a basis is rebuilt."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import grpc

from ctxcc.v1 import compile_service_pb2_grpc as cpb_grpc
from ctxcc.v1 import session_pb2
from ctxcc.v1 import session_service_pb2 as spb
from ctxcc.v1 import session_service_pb2_grpc as spb_grpc
from server.domain.model import Session
from server.service.basis import recall
from storage.basis_bytes import split_basis_bytes
from storage.codec import decode_value
from storage.rocks import open_rocks
from storage.store import KVEventStore
from tests.e2e.proc import DaemonProcess
from tests.helpers import compile_request, user

SESSIONS = 4


def _work(target: str, proj: Path, sid: str, stop: threading.Event, seed: int) -> None:
    rng = random.Random(seed)
    rules = proj / ".ctxcc" / "rules"
    with grpc.insecure_channel(target) as ch:
        sessions = spb_grpc.SessionServiceStub(ch)
        compiles = cpb_grpc.CompileServiceStub(ch)
        step = 0
        while not stop.is_set():
            step += 1
            text = f"step {rng.randrange(6)} " + "Keep it tidy. " * rng.randrange(100, 3000)
            (rules / "r.md").write_text(
                f"---\nname: r\ndescription: r\nactivation: on_demand\n---\n{text}"
            )
            try:
                sessions.AppendEvents(
                    spb.AppendEventsRequest(session_id=sid, events=[user(f"{step}")]), timeout=10
                )
                compiles.Compile(compile_request(sid), timeout=10)
            except grpc.RpcError:
                return  # the daemon was killed


def _check(data: Path) -> tuple[int, int]:
    kv = open_rocks(data / "db")
    try:
        store = KVEventStore(kv)
        held = rebuilt = 0
        for _, raw in kv.scan("sessions", b"", b"\xff"):
            s = decode_value(raw, Session)
            split = split_basis_bytes(kv, s.session_id)
            assert s.basis_bytes == split.held, (s.session_id, s.basis_bytes, split)
            held += split.held
            for record in store.list_compile_heads(s.session_id):
                if record.basis_digest:
                    assert recall(store, s.session_id, record.basis_digest)
                    rebuilt += 1
        return held, rebuilt
    finally:
        kv.close()


def test_basis_bytes_are_exact_after_a_kill(short_tmp: Path) -> None:
    data = short_tmp / "data"
    work = short_tmp / "work"
    projects = []
    for n in range(SESSIONS):
        proj = work / f"p{n}"
        (proj / ".ctxcc" / "rules").mkdir(parents=True)
        projects.append(proj)
    flags = ("--workspace-roots", str(work), "--max-session-basis-bytes", "30000000")
    rng = random.Random(7)
    for round_ in range(3):
        d = DaemonProcess(data, *flags).start()
        try:
            d.wait_ready()
            if round_ == 0:
                with grpc.insecure_channel(d.target) as ch:
                    for n, proj in enumerate(projects):
                        spb_grpc.SessionServiceStub(ch).CreateSession(
                            spb.CreateSessionRequest(
                                session=session_pb2.Session(
                                    session_id=f"s{n}",
                                    project_id="p",
                                    project_root=str(proj),
                                    working_directory=str(proj),
                                )
                            ),
                            timeout=10,
                        )
            stop = threading.Event()
            workers = [
                threading.Thread(target=_work, args=(d.target, p, f"s{n}", stop, n + 10 * round_))
                for n, p in enumerate(projects)
            ]
            for w in workers:
                w.start()
            time.sleep(0.5 + rng.random() * 1.5)
            d.kill()
            stop.set()
            for w in workers:
                w.join(30)
        finally:
            d.ensure_stopped()
        held, kept = _check(data)
        print(f"round {round_}: {held} basis bytes held, {kept} compiles with a basis")
        assert held > 0 and kept > 0
