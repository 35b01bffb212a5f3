"""Edges of the basis quota, against daemons on RocksDB in temp dirs: repeated compiles
of a session whose bases are not stored, the quota reached exactly, basis bytes against
the parts a store holds across restarts."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from ctxcc.storage.v1 import records_pb2
from ctxcc.v1 import session_pb2, tool_pb2
from ctxcc.v1 import session_service_pb2 as spb
from ctxcc.v1 import tool_service_pb2 as tspb
from server.app import Daemon
from server.compiler.budget import BudgetConfig
from server.compiler.compile import CompileInputs
from server.compiler.sources import SourceInputs
from server.domain.catalog import ModelInfo
from server.domain.model import Route, Session
from server.domain.records import CompileRecord
from server.domain.table_chunks import Splitter
from server.service.basis import CompileBasis, SettingsPart, basis_of
from storage.basis_bytes import MARKER, split_basis_bytes
from storage.codec import decode_value, encode_value
from storage.keys import LAST_COMPILE, PART, session_key
from storage.kv import Batch, WriteWouldWait
from storage.rocks import open_rocks
from storage.store import KVEventStore, StoreLimits
from tests.conftest import make_config, stubs_for
from tests.helpers import compile_request, user
from tests.integration.test_basis_quota import SID, _dropped, _held, _rebuilds, _rule, said_hi


async def test_repeats_of_a_compile_without_basis_are_counted_as_its_quota(
    short_tmp: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """With --max-session-basis-bytes 0, the same request compiled again (a repeat of
    the first compile, nothing read having changed) is recorded without a basis for the
    same reason, the quota: not as one naming a basis that is missing, warned of at every
    repeat."""
    async with said_hi(short_tmp, max_session_basis_bytes="0") as (d, api):
        ids = []
        with caplog.at_level(logging.INFO, "ctxcc.storage"):
            for _ in range(5):
                ids.append((await api.compiles.Compile(compile_request(SID))).view.compile_id)
        assert len(set(ids)) == 5
        for cid in ids:
            assert not await _rebuilds(api, cid)
        assert (await _held(api)).basis_bytes == 0
        assert (_dropped(d, "quota"), _dropped(d, "missing")) == (5, 0)
        warned = [
            r
            for r in caplog.records
            if r.levelno >= logging.WARNING and "without its basis" in r.getMessage()
        ]
        assert len(warned) == 1, [r.getMessage() for r in warned]


def _parts_held(data: Path) -> dict[str, tuple[int, int]]:
    """A scan of the store, the daemon stopped: per session, (its Session.basis_bytes,
    the bytes of the basis parts it holds: every part but the compiles' own bases)."""
    kv = open_rocks(data / "db")
    try:
        out = {}
        for _, raw in kv.scan("sessions", b"", b"\xff"):
            s = decode_value(raw, Session)
            start, end = session_key(s.session_id, PART), session_key(s.session_id, LAST_COMPILE)
            held = 0
            for _, part in kv.scan("compiles", start, end):
                if records_pb2.Record.FromString(part).type != "CompileBasis":
                    held += len(part)
            assert held == split_basis_bytes(kv, s.session_id).held
            out[s.session_id] = (s.basis_bytes, held)
        return out
    finally:
        kv.close()


def _tools(n: int, tag: str) -> list[tool_pb2.ToolDefinition]:
    return [
        tool_pb2.ToolDefinition(
            name=f"t{i}",
            description=f"{tag} tool {i} \u00e9",
            input_schema_json='{"type":"object","description":"%s"}' % (tag * 300),
        )
        for i in range(n)
    ]


async def test_basis_bytes_are_the_parts_held_across_restarts_and_racing_compiles(
    short_tmp: Path,
) -> None:
    """Rules edited back and forth, tool sets of 16 and 17 definitions, three compiles of
    the session at once after each edit, and restarts between steps: after every run the
    session's basis_bytes is exactly the bytes of the basis parts the store holds (each
    counted once), and the quota is reached exactly, never passed."""
    work = short_tmp / "work"
    proj = work / "proj"
    rules = proj / ".ctxcc" / "rules"
    rules.mkdir(parents=True)
    data = short_tmp / "data"
    texts = [f"text {n} " + "Keep it short. " * (400 + 50 * n) for n in range(4)]
    # Room for the first steps' parts and not all of them: found by the first run below.
    flags = {"workspace_roots": str(work)}
    session = session_pb2.Session(
        session_id=SID, project_id="p", project_root=str(proj), working_directory=str(proj)
    )
    created = False
    step = 0
    seen: list[int] = []
    for run in range(4):
        d = Daemon(make_config(data, **flags))
        await d.start()
        api = stubs_for(f"unix:{d.endpoints.unix}")
        try:
            if not created:
                await api.sessions.CreateSession(spb.CreateSessionRequest(session=session))
                created = True
            for _ in range(3):
                step += 1
                _rule(rules / "edited.md", texts[step % len(texts)])
                if step % 2:
                    await api.tools.RegisterTools(
                        tspb.RegisterToolsRequest(
                            session_id=SID,
                            tools=_tools(16 + step % 2 * (step % 3), str(step % 3)),
                            replace_all=True,
                        )
                    )
                await api.sessions.AppendEvents(
                    spb.AppendEventsRequest(session_id=SID, events=[user(f"step {step}")])
                )
                views = await asyncio.gather(
                    *(api.compiles.Compile(compile_request(SID)) for _ in range(3))
                )
                for v in views:
                    assert await _rebuilds(api, v.view.compile_id)
            seen.append((await _held(api)).basis_bytes)
            listed = await api.sessions.ListSessions(spb.ListSessionsRequest())
            assert [s.basis_bytes for s in listed.sessions if s.session_id == SID] == seen[-1:]
        finally:
            await api.channel.close()
            await d.stop()
        counted, held = _parts_held(data)[SID]
        assert counted == held, (run, counted, held)
    print("basis bytes after each run:", seen)
    assert seen == sorted(seen) and seen[0] > 0


def _compile_parts(n: int, note: str) -> tuple[CompileRecord, tuple[tuple[str, object], ...]]:
    session = Session("s", 1, 1)
    settings = SettingsPart("kernel", BudgetConfig(), 1, 1)
    sources = SourceInputs(notes=(note,))
    inputs = CompileInputs(f"s:{n}", session, (), 0, Route(model="m"), sources=sources)
    digest, parts = basis_of(inputs, ModelInfo("m", "m"), settings, Splitter())
    record = CompileRecord(f"s:{n:04x}", "s", Route(model="m"), 0, 1, 1, 1)
    return replace(record, basis_digest=digest), parts


def _held_size(parts: tuple[tuple[str, object], ...]) -> int:
    return sum(len(encode_value(p)) for _, p in parts if not isinstance(p, CompileBasis))


@pytest.mark.parametrize("slack", [-1, 0, 1])
def test_the_basis_quota_is_reached_exactly(short_tmp: Path, slack: int) -> None:
    """A compile whose new parts take the session's basis bytes exactly to the quota keeps
    its basis; one byte less of quota and it is recorded without. A compile that adds
    nothing new keeps its basis at the quota."""
    first, parts = _compile_parts(0, "a note " * 50)
    size = _held_size(parts)
    kv = open_rocks(short_tmp / "db")
    try:
        store = KVEventStore(kv, StoreLimits(max_session_basis_bytes=size + slack))
        store.create_session(Session("s", 1, 1))
        store.put_compile(first, parts)
        kept = store.get_compile(first.compile_id).basis_digest == first.basis_digest
        assert kept == (slack >= 0)
        assert store.get_session("s").basis_bytes == (size if kept else 0)
        # The same sources again, a new basis (another compile id in its inputs).
        again, parts2 = _compile_parts(1, "a note " * 50)
        assert _held_size(parts2) == size
        store.put_compile(again, parts2)
        assert (store.get_compile(again.compile_id).basis_digest != "") == kept
        assert store.get_session("s").basis_bytes == (size if kept else 0)
        assert store.bases_dropped["missing"] == 0
    finally:
        kv.close()


_OPEN = """
import sys, time
from pathlib import Path
from storage.rocks import open_rocks
from storage.store import KVEventStore
kv = open_rocks(Path(sys.argv[1]))
print("open", flush=True)
start = time.monotonic()
moved = KVEventStore(kv).basis_bytes_moved
print(moved, time.monotonic() - start, flush=True)
kv.close()
"""


def _aged_store(db: Path, sessions: int) -> dict[str, tuple[int, int]]:
    """A store as a daemon of 4413fe6 left it: sessions whose basis parts (~60 KB each)
    count in stored_bytes, basis_bytes 0, no marker. Returns what each session should
    hold once moved: (stored_bytes, basis_bytes)."""
    kv = open_rocks(db)
    want = {}
    try:
        store = KVEventStore(kv)
        for n in range(sessions):
            sid = f"s{n}"
            store.create_session(Session(sid, 1, 1))
            record, parts = _compile_parts(n, f"note {n} " + "z" * 60_000)
            store.put_compile(replace(record, compile_id=f"{sid}:{n:04x}", session_id=sid), parts)
            s = store.get_session(sid)
            assert s.basis_bytes > 60_000
            want[sid] = (s.stored_bytes + 100 * n, s.basis_bytes)  # as if events were held
        batch = Batch()
        for sid, (stored, basis) in want.items():
            old = replace(store.get_session(sid), stored_bytes=stored + basis, basis_bytes=0)
            batch.put("sessions", sid.encode(), encode_value(old))
        batch.delete("meta", MARKER)
        kv.write(batch)
    finally:
        kv.close()
    return want


def _sessions(db: Path) -> tuple[bool, dict[str, tuple[int, int]]]:
    kv = open_rocks(db)
    try:
        marked = kv.get("meta", MARKER) is not None
        got = {}
        for _, raw in kv.scan("sessions", b"", b"\xff"):
            s = decode_value(raw, Session)
            got[s.session_id] = (s.stored_bytes, s.basis_bytes)
        return marked, got
    finally:
        kv.close()


def test_a_move_killed_midway_is_all_or_nothing(short_tmp: Path) -> None:
    """The first open of a store of 300 sessions whose bases counted in stored_bytes,
    SIGKILLed at times spread over the move: each time the store is either as it was (no
    marker, nothing moved) or moved whole (marker, every session exact), and the open
    after moves it whole, once."""
    db = short_tmp / "db"
    want = _aged_store(db, 300)
    aged = {sid: (stored + basis, 0) for sid, (stored, basis) in want.items()}
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    done = subprocess.run(
        [sys.executable, "-c", _OPEN, str(db)], env=env, capture_output=True, check=False
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    moved, took = done.stdout.split()[1:]
    assert moved == b"300"
    assert _sessions(db) == (True, want)
    outcomes = {True: 0, False: 0}
    for k in range(12):
        _aged_store_again(db, aged)
        proc = subprocess.Popen(
            [sys.executable, "-c", _OPEN, str(db)], env=env, stdout=subprocess.PIPE
        )
        assert proc.stdout is not None and proc.stdout.readline() == b"open\n"
        time.sleep(float(took) * k / 10)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
        marked, got = _sessions(db)
        assert got == (want if marked else aged), k
        outcomes[marked] += 1
        done = subprocess.run(
            [sys.executable, "-c", _OPEN, str(db)], env=env, capture_output=True, check=False
        )
        assert done.stdout.split()[1] == (b"0" if marked else b"300")
        assert _sessions(db) == (True, want)
    print(f"move of 300 sessions took {float(took):.3f}s; killed: {outcomes}")
    assert outcomes[False] > 0


def _aged_store_again(db: Path, aged: dict[str, tuple[int, int]]) -> None:
    kv = open_rocks(db)
    try:
        batch = Batch()
        for sid, (stored, basis) in aged.items():
            s = decode_value(kv.get("sessions", sid.encode()) or b"", Session)
            batch.put(
                "sessions",
                sid.encode(),
                encode_value(replace(s, stored_bytes=stored, basis_bytes=basis)),
            )
        batch.delete("meta", MARKER)
        kv.write(batch)
    finally:
        kv.close()


class _StallsOnce:
    """A RocksDB whose first write made without waiting meets a stall (WriteWouldWait,
    nothing written), as a compile's record written on the event loop may."""

    def __init__(self, kv: Any) -> None:
        self._kv = kv
        self.stalled = 0

    def write(self, batch: Batch) -> None:
        if batch.no_wait and not self.stalled:
            self.stalled += 1
            raise WriteWouldWait
        self._kv.write(batch)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._kv, name)


def test_a_compile_written_again_after_a_stall_is_counted_once(
    short_tmp: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A record written without its basis whose write would have waited (False: written
    again from a thread) is counted and logged when it is written, once."""
    kv = open_rocks(short_tmp / "db")
    try:
        stalls = _StallsOnce(kv)
        store = KVEventStore(stalls, StoreLimits(max_session_basis_bytes=0))
        store.create_session(Session("s", 1, 1))
        record, parts = _compile_parts(0, "a note")
        with caplog.at_level(logging.DEBUG, "ctxcc.storage"):
            assert not store.put_compile(record, parts, wait=False)
            assert stalls.stalled == 1
            assert store.bases_dropped == {"quota": 0, "missing": 0}
            assert store.put_compile(record, parts, wait=False)
        assert store.get_compile(record.compile_id).basis_digest == ""
        assert store.bases_dropped == {"quota": 1, "missing": 0}
        told = [r for r in caplog.records if "without its basis" in r.getMessage()]
        assert [r.levelno for r in told] == [logging.WARNING]
    finally:
        kv.close()


def test_a_session_made_again_under_its_id_has_its_whole_basis_quota(
    short_tmp: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A session at its basis quota, deleted and made again under its id: the compile
    refused its basis before keeps it now (the quota counts from 0, the parts known
    as stored went with the first), and the next one past the quota is warned of again."""
    first, parts = _compile_parts(0, "first " * 40)
    second, parts2 = _compile_parts(1, "second " * 40)
    size = _held_size(parts)
    kv = open_rocks(short_tmp / "db")
    try:
        store = KVEventStore(kv, StoreLimits(max_session_basis_bytes=size + 10))
        for life in range(2):
            store.create_session(Session("s", 1 + life, 1 + life))
            with caplog.at_level(logging.INFO, "ctxcc.storage"):
                for record, made in ((first, parts), (second, parts2)):
                    store.put_compile(replace(record, session_create_time_ns=1 + life), made)
            assert store.get_compile(first.compile_id).basis_digest == first.basis_digest
            assert store.get_compile(second.compile_id).basis_digest == ""
            assert store.get_session("s").basis_bytes == size
            if not life:
                store.delete_session("s")
        assert store.bases_dropped == {"quota": 2, "missing": 0}
        warned = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warned) == 2
    finally:
        kv.close()


async def test_time_travel_with_a_basis_quota_of_0(short_tmp: Path) -> None:
    """No basis stored: an as_of_seq compile is made from today's sources (not refused),
    and a rebuild of any compile answers COMPILE_NOT_FOUND."""
    d = Daemon(make_config(short_tmp, max_session_basis_bytes="0"))
    await d.start()
    api = stubs_for(f"unix:{d.endpoints.unix}")
    try:
        session = session_pb2.Session(session_id=SID)
        await api.sessions.CreateSession(spb.CreateSessionRequest(session=session))
        ids = []
        for n in range(3):
            await api.sessions.AppendEvents(
                spb.AppendEventsRequest(session_id=SID, events=[user(f"message {n}")])
            )
            ids.append((await api.compiles.Compile(compile_request(SID))).view.compile_id)
        past = (await api.compiles.Compile(compile_request(SID, as_of_seq=1))).view
        assert past.event_boundary == 1
        assert [m.parts[0].text for m in past.messages][-1:] == ["message 0"]
        for cid in ids:
            assert not await _rebuilds(api, cid)
        assert (await _held(api)).basis_bytes == 0
    finally:
        await api.channel.close()
        await d.stop()


def test_a_move_run_again_moves_nothing_twice(short_tmp: Path) -> None:
    """The store's marker gone (a move run a second time): a session whose bases this
    daemon counted apart keeps its stored_bytes (before: its basis bytes were taken out
    of them again, 9,000 bytes of events read back as 3,408)."""
    db = short_tmp / "db"
    kv = open_rocks(db)
    try:
        store = KVEventStore(kv)
        store.create_session(Session("s", 1, 1))
        record, parts = _compile_parts(0, "x" * 5_000)
        store.put_compile(record, parts)
        held = store.get_session("s").basis_bytes
        assert held > 5_000
        batch = Batch()
        as_if = replace(store.get_session("s"), stored_bytes=9_000)
        batch.put("sessions", b"s", encode_value(as_if))
        batch.delete("meta", MARKER)
        kv.write(batch)
    finally:
        kv.close()
    kv = open_rocks(db)
    try:
        store = KVEventStore(kv)
        assert store.basis_bytes_moved == 0
        got = store.get_session("s")
        assert (got.stored_bytes, got.basis_bytes) == (9_000, held)
        assert kv.get("meta", MARKER) == b"1"
    finally:
        kv.close()


def test_racing_writes_of_the_same_new_parts_count_them_once(short_tmp: Path) -> None:
    """Four threads write compiles of one session naming the same new parts at once (each
    read them as missing before any was written: the session's lock held meanwhile), 30
    texts over: each part is counted once, and basis_bytes is what the parts held take."""
    kv = open_rocks(short_tmp / "db")
    try:
        store = KVEventStore(kv)
        store.create_session(Session("s", 1, 1))
        for n in range(30):
            made = [_compile_parts(4 * n + k, f"text {n} " * 300) for k in range(4)]
            # Held while the four look their parts up: they all find them missing, then
            # write one after the other.
            lock = store._lock("s")
            with lock:
                threads = [threading.Thread(target=store.put_compile, args=m) for m in made]
                for t in threads:
                    t.start()
                time.sleep(0.05)
            for t in threads:
                t.join()
        assert store.get_session("s").basis_bytes == split_basis_bytes(kv, "s").held
        assert store.bases_dropped == {"quota": 0, "missing": 0}
    finally:
        kv.close()
