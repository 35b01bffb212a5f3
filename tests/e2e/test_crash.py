"""Crash safety of the event log (R-HIST-1): nothing acknowledged is lost or duplicated.

Several clients append concurrently with `sync` durability while the daemon is killed
with SIGKILL at random moments, ten times. Clients retry every unacknowledged append
with its original request_id across restarts. At the end every acknowledged event is
present exactly once, seqs are contiguous, and every record decodes (none is torn).
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import grpc
import pytest

from ctxcc.v1 import event_pb2, session_pb2, session_service_pb2_grpc
from ctxcc.v1 import session_service_pb2 as spb
from tests.e2e.proc import FAST_RECONNECT, DaemonProcess
from tests.helpers import user

CLIENTS = 6
SESSIONS = ("crash-a", "crash-b")
KILLS = 10


class Client(threading.Thread):
    def __init__(self, n: int, target: str, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.n = n
        self.target = target
        self.stop_flag = stop
        self.acked: dict[str, tuple[str, int, int, list[str]]] = {}  # request_id -> result
        self.retries_replayed = 0
        self.errors: list[str] = []

    def run(self) -> None:
        with grpc.insecure_channel(self.target, options=FAST_RECONNECT) as ch:
            stub = session_service_pb2_grpc.SessionServiceStub(ch)
            i = 0
            while not self.stop_flag.is_set():
                sid = SESSIONS[(self.n + i) % len(SESSIONS)]
                rid = f"c{self.n}-r{i}"
                texts = [f"{rid}-e{k}" for k in range(1 + i % 3)]
                req = spb.AppendEventsRequest(
                    session_id=sid, request_id=rid, events=[user(t) for t in texts]
                )
                attempts = 0
                while True:  # retry the same request until it is acknowledged
                    attempts += 1
                    try:
                        resp = stub.AppendEvents(req, timeout=10, wait_for_ready=True)
                    except grpc.RpcError as err:
                        if err.code() not in (
                            grpc.StatusCode.UNAVAILABLE,
                            grpc.StatusCode.DEADLINE_EXCEEDED,
                            grpc.StatusCode.CANCELLED,
                        ):
                            self.errors.append(f"{rid}: {err.code()} {err.details()}")
                            return
                        if self.stop_flag.is_set() and attempts > 50:
                            return
                        time.sleep(0.02)
                        continue
                    if resp.replayed:
                        self.retries_replayed += 1
                    self.acked[rid] = (sid, resp.first_seq, resp.last_seq, texts)
                    break
                i += 1


@pytest.mark.slow
def test_sigkill_never_loses_or_duplicates_acknowledged_events(short_tmp: Path) -> None:
    data = short_tmp / "data"
    rng = random.Random(20261129)
    daemon = DaemonProcess(data, "--durability", "sync").start()
    daemon.wait_ready()
    with grpc.insecure_channel(daemon.target) as ch:
        stub = session_service_pb2_grpc.SessionServiceStub(ch)
        for sid in SESSIONS:
            stub.CreateSession(
                spb.CreateSessionRequest(session=session_pb2.Session(session_id=sid)), timeout=10
            )
    stop = threading.Event()
    clients = [Client(n, daemon.target, stop) for n in range(CLIENTS)]
    for c in clients:
        c.start()

    def acks() -> int:
        return sum(len(c.acked) for c in clients)

    def await_acked(at_least: int) -> None:
        # However slow the machine, each daemon is killed only once it has acknowledged
        # appends of its own, and the run ends with enough of them to prove something.
        deadline = time.monotonic() + 60
        while acks() < at_least and time.monotonic() < deadline:
            time.sleep(0.02)

    try:
        for _ in range(KILLS):
            await_acked(acks() + 5)
            time.sleep(rng.uniform(0.3, 1.2))
            daemon.kill()
            daemon.start()
            daemon.wait_ready()
        await_acked(max(acks() + 5, 51))
        time.sleep(0.5)
    finally:
        stop.set()
        for c in clients:
            c.join(60)
    try:
        assert all(not c.is_alive() for c in clients)
        assert [e for c in clients for e in c.errors] == []
        acked = {rid: v for c in clients for rid, v in c.acked.items()}
        assert len(acked) > 50, "the clients made too little progress to prove anything"
        with grpc.insecure_channel(daemon.target) as ch:
            stub = session_service_pb2_grpc.SessionServiceStub(ch)
            for sid in SESSIONS:
                events: list[event_pb2.Event] = []
                token = ""
                while True:
                    page = stub.ListEvents(
                        spb.ListEventsRequest(session_id=sid, page_size=1000, page_token=token),
                        timeout=30,
                    )
                    events.extend(page.events)
                    token = page.next_page_token
                    if not token:
                        break
                head = stub.GetSession(spb.GetSessionRequest(session_id=sid)).session.head_seq
                seqs = [e.seq for e in events]
                assert seqs == list(range(1, head + 1)), "seqs are not contiguous"
                texts = [e.user_message.parts[0].text for e in events]
                assert len(texts) == len(set(texts)), "an event was stored twice"
                by_seq = dict(zip(seqs, texts, strict=True))
                for rid, (s, first, last, want) in acked.items():
                    if s != sid:
                        continue
                    got = [by_seq[q] for q in range(first, last + 1)]
                    assert got == want, f"acknowledged append {rid} is not where it was acked"
        print(
            f"crash test: {KILLS} SIGKILLs, {len(acked)} acknowledged appends, "
            f"{sum(c.retries_replayed for c in clients)} retries answered as replays"
        )
    finally:
        assert daemon.terminate() == 0


def _acknowledged_then_killed(data: Path, appends: int) -> DaemonProcess:
    """A daemon (sync durability) that acknowledged `appends` appends of ~1.6 KB, each
    with a request id, then was killed: every one of them is only in its write-ahead
    log."""
    d = DaemonProcess(data).start()
    d.wait_ready()
    with grpc.insecure_channel(d.target) as ch:
        stub = session_service_pb2_grpc.SessionServiceStub(ch)
        stub.CreateSession(spb.CreateSessionRequest(session=session_pb2.Session(session_id="w")))
        for k in range(appends):
            event = user(f"message {k} " + "payload " * 200)
            stub.AppendEvents(
                spb.AppendEventsRequest(session_id="w", request_id=f"r{k}", events=[event])
            )
    d.kill()
    return d


def _newest_log(data: Path) -> Path:
    return max((data / "db").glob("*.log"), key=lambda p: p.stat().st_mtime)


def test_a_record_damaged_inside_the_write_ahead_log_refuses_the_start(short_tmp: Path) -> None:
    """64 bytes flipped a third into the log of 200 acknowledged appends: RocksDB's
    default recovery opened the store as of the record before the damage (66 events)
    and the daemon served it without a word, a resent request id appended again at a
    seq acknowledged before. The start is refused with RocksDB's words (exit 1)."""
    data = short_tmp / "data"
    d = _acknowledged_then_killed(data, 200)
    wal = _newest_log(data)
    damaged = bytearray(wal.read_bytes())
    at = len(damaged) // 3
    damaged[at : at + 64] = bytes(b ^ 0xFF for b in damaged[at : at + 64])
    wal.write_bytes(bytes(damaged))
    d.start()
    assert d.proc is not None
    try:
        assert d.proc.wait(timeout=60) == 1
    finally:
        d.ensure_stopped()
    assert f"cannot open RocksDB in {data / 'db'}: Corruption" in d.log()
    assert "Traceback" not in d.log()


def test_a_record_cut_short_at_the_end_of_the_log_is_dropped(short_tmp: Path) -> None:
    """What a crash in the middle of a write leaves: the last record cut short. It was
    never acknowledged, so the store opens without it, and everything before it."""
    data = short_tmp / "data"
    d = _acknowledged_then_killed(data, 20)
    wal = _newest_log(data)
    whole = wal.read_bytes()
    wal.write_bytes(whole[: len(whole) - 100])  # into the last append's record
    d.start()
    try:
        d.wait_ready()
        with grpc.insecure_channel(d.target) as ch:
            stub = session_service_pb2_grpc.SessionServiceStub(ch)
            events = stub.ListEvents(spb.ListEventsRequest(session_id="w")).events
            assert [e.seq for e in events] == list(range(1, 20))
            # Its client resends it (never acknowledged, as far as it knows): appended.
            again = user("message 19 " + "payload " * 200)
            resent = stub.AppendEvents(
                spb.AppendEventsRequest(session_id="w", request_id="r19", events=[again])
            )
            assert (resent.first_seq, resent.replayed) == (20, False)
    finally:
        assert d.terminate() == 0
