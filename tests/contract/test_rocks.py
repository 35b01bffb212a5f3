"""What only the RocksDB engine can show: persistence, schema checks, the directory lock."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest

from server.domain.errors import CtxccError
from server.domain.model import AppendBatch, ContentPart, NewEvent, Route, Session, UserMessage
from server.domain.records import CompileRecord, RouteState, Usage
from server.domain.sources import Scope, SourceKind
from storage import KVEventStore, StoreLockedError, open_rocks, rocks
from storage.codec import CorruptRecordError
from storage.keys import be64, session_key, source_prefix
from storage.kv import Batch, WriteWouldWait
from storage.schema import SCHEMA_VERSION, SchemaError, ensure_schema
from tests.contract.test_store_contract import planned


def _append(store: KVEventStore, sid: str, text: str, eid: str, rid: str = "") -> None:
    ev = NewEvent(eid, UserMessage((ContentPart(text=text),)))
    store.append(AppendBatch(sid, (ev,), now_ns=7, request_id=rid, request_digest="d"))


def test_events_survive_reopen_and_retries_stay_idempotent(tmp_path: Path) -> None:
    store = KVEventStore(open_rocks(tmp_path / "db"))
    store.create_session(Session("s", 1, 1))
    _append(store, "s", "hello", "e1", rid="r1")
    store.close()
    store = KVEventStore(open_rocks(tmp_path / "db"))
    try:
        assert [e.event_id for e in store.read_events("s")] == ["e1"]
        _append(store, "s", "hello", "e1-retry", rid="r1")  # same request after a restart
        assert store.get_session("s").head_seq == 1
        assert store.count_sessions() == 1
    finally:
        store.close()


def test_second_open_of_a_data_dir_fails_fast(tmp_path: Path) -> None:
    kv = open_rocks(tmp_path / "db")
    try:
        with pytest.raises(StoreLockedError, match="in use by another ctxcc process"):
            open_rocks(tmp_path / "db")
    finally:
        kv.close()
    open_rocks(tmp_path / "db").close()  # released on close


def test_newer_schema_is_refused_and_current_is_stamped(tmp_path: Path) -> None:
    kv = open_rocks(tmp_path / "db")
    try:
        assert ensure_schema(kv) == SCHEMA_VERSION
        b = Batch()
        b.put("meta", b"schema_version", str(SCHEMA_VERSION + 1).encode())
        kv.write(b)
        with pytest.raises(SchemaError, match="newer than this ctxcc supports"):
            KVEventStore(kv)
    finally:
        kv.close()


def test_older_schema_is_migrated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from storage import schema

    calls: list[int] = []

    def step(kv: object, batch: Batch) -> None:
        calls.append(1)
        batch.put("meta", b"migrated", b"yes")

    monkeypatch.setitem(schema.MIGRATIONS, SCHEMA_VERSION, step)
    kv = open_rocks(tmp_path / "db")
    try:
        ensure_schema(kv)
        assert ensure_schema(kv, target=SCHEMA_VERSION + 1) == SCHEMA_VERSION
        assert calls == [1]
        assert kv.get("meta", b"migrated") == b"yes"
        assert schema.stored_version(kv) == SCHEMA_VERSION + 1
    finally:
        kv.close()


def test_a_torn_record_is_reported_not_returned(tmp_path: Path) -> None:
    kv = open_rocks(tmp_path / "db")
    store = KVEventStore(kv)
    try:
        store.create_session(Session("s", 1, 1))
        _append(store, "s", "hello", "e1")
        key, value = next(kv.scan("events", b"s\x00", b"s\x01"))
        b = Batch()
        b.put("events", key, value[: len(value) // 2])
        kv.write(b)
        with pytest.raises(CorruptRecordError):
            store.read_events("s")
    finally:
        store.close()


def test_footprint_counts_what_sits_in_the_wal_and_memtables(tmp_path: Path) -> None:
    # Synced writes stay in the write-ahead log and memtables until a flush, which a
    # young daemon has not done: table files alone read 0 here.
    kv = open_rocks(tmp_path / "db")
    try:
        empty = kv.footprint()
        store = KVEventStore(kv)
        store.create_session(Session("s", 1, 1))
        for i in range(200):
            _append(store, "s", "x" * 2000 + str(i), f"e{i}")
        now = kv.footprint()
        wal_on_disk = sum(p.stat().st_size for p in (tmp_path / "db").glob("*.log"))
        assert now.live_sst_bytes == 0
        assert now.wal_bytes == wal_on_disk > 400_000
        assert now.memtable_bytes > 400_000 > empty.memtable_bytes
        assert kv.approximate_size() == now.data_bytes >= now.wal_bytes + now.memtable_bytes
        fs = os.statvfs(tmp_path)
        assert now.disk_capacity_bytes == fs.f_blocks * fs.f_frsize
        assert 0 < now.disk_free_bytes <= now.disk_capacity_bytes
    finally:
        kv.close()


class _Recording:
    """The engine's RocksDB handle, recording the calls that decide durability."""

    def __init__(self, db: object) -> None:
        self._db = db
        self.calls: list[tuple[str, bool]] = []

    def write(self, batch: object, opts: object) -> None:
        self.calls.append(("write", bool(getattr(opts, "sync", False))))
        self._db.write(batch, opts)  # type: ignore[attr-defined]

    def flush_wal(self, sync: bool) -> None:
        self.calls.append(("flush_wal", sync))
        self._db.flush_wal(sync)  # type: ignore[attr-defined]


class NoSpaceOnSync:
    """The engine's RocksDB handle whose writes go through and whose log sync fails as
    RocksDB's does on a full disk."""

    def __init__(self, db: Any) -> None:
        self._db = db

    def write(self, batch: object, opts: object) -> None:
        self._db.write(batch, opts)

    def flush_wal(self, sync: bool) -> None:
        raise Exception("IO error: No space left on device: While fsync")


@pytest.mark.parametrize("sync", [True, False])
def test_durable_batches_are_synced_with_the_gil_released(tmp_path: Path, sync: bool) -> None:
    """rocksdict holds the GIL through Rdict.write, fsync included, and releases it in
    flush_wal: a durable batch is written unsynced and the log synced before write()
    returns; other batches (and every batch with durability off) are never synced."""
    kv = open_rocks(tmp_path / "db", sync=sync)
    recording = _Recording(kv._db)
    kv._db = recording  # type: ignore[assignment]
    try:
        durable, lazy = Batch(), Batch(durable=False)
        durable.put("meta", b"k1", b"v")
        lazy.put("meta", b"k2", b"v")
        kv.write(durable)
        kv.write(lazy)
        synced = [("write", False), ("flush_wal", True)] if sync else [("write", False)]
        assert recording.calls == [*synced, ("write", False)]
        assert kv.get("meta", b"k1") == kv.get("meta", b"k2") == b"v"
    finally:
        kv._db = recording._db  # type: ignore[assignment]
        kv.close()


def test_a_deferred_sync_is_made_once_by_the_owed_sync_and_measured_with_its_write(
    tmp_path: Path,
) -> None:
    """Inside `deferring_sync` a durable batch is written unsynced and its fsync is left
    to the owed `sync` (made on another thread, once however often called); a lazy batch
    owes none. The storage-write metric sees the write and its fsync as one sample."""
    samples: list[float] = []
    kv = open_rocks(tmp_path / "db", sync=True, on_write=samples.append)
    recording = _Recording(kv._db)
    kv._db = recording  # type: ignore[assignment]
    try:
        durable, other, lazy = Batch(), Batch(), Batch(durable=False)
        durable.put("meta", b"k1", b"v")
        other.put("meta", b"k3", b"v")
        lazy.put("meta", b"k2", b"v")
        with kv.deferring_sync() as owed:
            assert not owed.owes()
            kv.write(lazy)
            assert not owed.owes()  # a lazy batch owes none
            kv.write(durable)
        assert owed.owes()
        assert recording.calls == [("write", False), ("write", False)]
        assert kv.get("meta", b"k1") == b"v"  # readable before the sync
        assert len(samples) == 1  # the lazy batch's; the durable one waits for its sync
        syncer = threading.Thread(target=owed.sync)
        syncer.start()
        syncer.join(5)
        assert not owed.owes()
        owed.sync()  # nothing owed any more
        assert recording.calls[2:] == [("flush_wal", True)]
        assert len(samples) == 2
        kv.write(other)  # outside: synced in the write again
        assert recording.calls[3:] == [("write", False), ("flush_wal", True)]
    finally:
        kv._db = recording._db  # type: ignore[assignment]
        kv.close()


def test_nothing_is_owed_with_durability_off_or_for_lazy_batches_only(tmp_path: Path) -> None:
    kv = open_rocks(tmp_path / "db", sync=False)
    recording = _Recording(kv._db)
    kv._db = recording  # type: ignore[assignment]
    try:
        durable = Batch()
        durable.put("meta", b"k1", b"v")
        with kv.deferring_sync() as owed:
            kv.write(durable)
        assert not owed.owes()
        owed.sync()
        assert recording.calls == [("write", False)]
    finally:
        kv._db = recording._db  # type: ignore[assignment]
        kv.close()


def test_a_deferred_sync_failing_for_space_refuses_writes_as_a_failed_write_does(
    tmp_path: Path,
) -> None:
    kv = open_rocks(tmp_path / "db", sync=True)
    recording = _Recording(kv._db)
    kv._db = NoSpaceOnSync(recording)  # type: ignore[assignment]
    try:
        durable = Batch()
        durable.put("meta", b"k1", b"v")
        with kv.deferring_sync() as owed:
            kv.write(durable)
        with pytest.raises(CtxccError) as refused:
            owed.sync()
        assert refused.value.reason.name == "DISK_FULL"
        assert "could not be synced" in refused.value.message
        assert kv._full and kv._broken  # what a write failing for space leaves
        with pytest.raises(CtxccError) as again:
            kv.write(durable)
        assert again.value.reason.name == "DISK_FULL"
        assert "nothing was written" in again.value.message
    finally:
        kv._db = recording._db  # type: ignore[assignment]
        kv._full = kv._broken = False
        kv.close()


def test_close_waits_for_a_write_syncing_the_log(tmp_path: Path) -> None:
    """The log sync runs with the GIL released: close() must not free the database
    under it (a segfault at shutdown), and a write after close fails cleanly."""
    kv = open_rocks(tmp_path / "db", sync=True)
    recording = _Recording(kv._db)
    started, release = threading.Event(), threading.Event()

    def slow_flush(sync: bool) -> None:
        started.set()
        release.wait(5)
        recording.flush_wal(sync)

    slow: Any = type("Slow", (), {"write": recording.write, "flush_wal": staticmethod(slow_flush)})
    kv._db = slow()
    batch = Batch()
    batch.put("meta", b"k", b"v")
    writer = threading.Thread(target=kv.write, args=(batch,))
    writer.start()
    assert started.wait(5)

    def close() -> None:
        kv._db = recording._db  # type: ignore[assignment]
        kv.close()

    closer = threading.Thread(target=close)
    closer.start()
    closer.join(0.3)
    assert closer.is_alive(), "close() must wait for the write in progress"
    release.set()
    writer.join(5)
    closer.join(5)
    assert not closer.is_alive() and not writer.is_alive()
    assert recording.calls == [("write", False), ("flush_wal", True)]


class _Stalling:
    """The engine's RocksDB handle in a write stall (memtables full, too many level-0
    files): a write with `no_slowdown` fails with the status RocksDB gives it, any other
    write goes through (as RocksDB's would, once it has waited the stall out)."""

    def __init__(self, db: object) -> None:
        self._db = db
        self.no_slowdown: list[bool] = []

    def write(self, batch: object, opts: Any) -> None:
        self.no_slowdown.append(bool(opts.no_slowdown))
        if opts.no_slowdown:
            raise Exception("Result incomplete: Write stall")
        self._db.write(batch, opts)  # type: ignore[attr-defined]

    def flush_wal(self, sync: bool) -> None:
        self._db.flush_wal(sync)  # type: ignore[attr-defined]


def test_writes_made_on_the_event_loop_never_wait_out_a_write_stall(tmp_path: Path) -> None:
    """A compile record or usage report written without `wait` (on the event loop) asks
    RocksDB not to stall it: in a stall it is declined, nothing written and no generation
    moved, and made again with `wait` (from a thread) it is written."""
    kv = open_rocks(tmp_path / "db")
    store = KVEventStore(kv)
    store.create_session(Session("s", 1, 1))
    route = Route(model="m")
    rec = CompileRecord("s:x1", "s", route, 1, 100, 1, 5)
    assert store.put_compile(rec, wait=False) is True  # the real engine takes it
    stalling = _Stalling(kv._db)
    kv._db = stalling  # type: ignore[assignment]
    try:
        rec2 = CompileRecord("s:x2", "s", route, 1, 100, 1, 5)
        before = store.generation("s", route.route_id)
        assert store.put_compile(rec2, wait=False) is False
        with pytest.raises(CtxccError):
            store.get_compile("s:x2")
        state = RouteState(route.route_id, 120, "s:x1", 30, 6)
        assert store.try_record_usage("s:x1", Usage(120, 30), planned(state)) is None
        assert store.get_compile("s:x1").usage is None
        assert store.generation("s", route.route_id) == before
        assert stalling.no_slowdown == [True, True]
        assert store.put_compile(rec2) is True
        done = store.record_usage("s:x1", Usage(120, 30), planned(state))
        assert done[0].usage == Usage(120, 30)
        assert store.get_compile("s:x2") == rec2
        assert stalling.no_slowdown[2:] == [False, False]
    finally:
        kv._db = stalling._db  # type: ignore[assignment]
        kv.close()


def damaged_table(path: Path, at: float = 0.5) -> None:
    """Flips 256 bytes of the largest table file, `at` its length (the middle, or 0 for
    its first data block): a data block whose checksum no longer matches."""
    table = max(path.glob("*.sst"), key=lambda p: p.stat().st_size)
    data = bytearray(table.read_bytes())
    start = int(len(data) * at)
    for i in range(start, start + 256):
        data[i] ^= 0x5A
    table.write_bytes(bytes(data))


def test_a_damaged_table_block_fails_the_read_instead_of_ending_it(tmp_path: Path) -> None:
    """RocksDB's iterator stops at a block whose checksum fails and keeps the error in
    its status: a scan read the keys before the damage as if they were all there was (a
    session's log of 200 events read back as 105). A read through the damage fails."""
    store = KVEventStore(open_rocks(tmp_path / "db"))
    store.create_session(Session("s", 1, 1))
    for k in range(200):
        _append(store, "s", f"message {k} " + "lorem ipsum " * 120, f"e{k}")
    store.close()
    open_rocks(tmp_path / "db").close()  # the log replayed into a table file at open
    damaged_table(tmp_path / "db")
    kv = open_rocks(tmp_path / "db")
    store = KVEventStore(kv)
    try:
        assert store.get_session("s").head_seq == 200
        with pytest.raises(CtxccError) as err:
            list(store.read_events("s"))
        assert err.value.reason.value == "RECORD_CORRUPT"
        assert "Corruption" in getattr(err.value, "detail", "")
        for reverse in (False, True):
            with pytest.raises(CtxccError):
                list(kv.scan("events", b"", b"\xff" * 8, reverse=reverse))
        # A point read of a key in the damaged block fails the same way.
        failed = 0
        for seq in range(1, 201):
            try:
                kv.get("events", session_key("s", be64(seq)))
            except CtxccError as exc:
                assert exc.reason.value == "RECORD_CORRUPT"
                failed += 1
        assert failed > 0
    finally:
        store.close()


class NoSpaceOnWrite:
    """The engine's RocksDB handle whose writes fail as RocksDB's do on a full disk."""

    def __init__(self, db: Any) -> None:
        self._db = db

    def write(self, batch: object, opts: object) -> None:
        raise Exception("IO error: No space left on device: While appending to file")

    def flush_wal(self, sync: bool) -> None:
        self._db.flush_wal(sync)


def test_a_delete_refused_for_space_leaves_no_read_open_that_keeps_the_engine_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once space is back the engine reopens when no operation is in progress. A delete
    of a session whose blob another session holds stopped reading the blob's holders
    at the first other one and left that read open in its frame; the write refused for
    space then kept the frame, and the read, for as long as the error lived (in the
    daemon, until the cycle collector freed it): under traffic the reopen waited 5 s
    for it, gave up, and the daemon stayed NOT_SERVING with the disk freed (the crash
    attack's full disk: no recovery in 60 s)."""
    monkeypatch.setattr(rocks, "_REOPEN_WAIT_S", 0.2)  # the failing case ends sooner
    kv = open_rocks(tmp_path / "db")
    store = KVEventStore(kv)
    shared = ("ab" * 32, b"a large tool result")
    for sid in ("a", "b"):
        store.create_session(Session(sid, 1, 1))
        ev = NewEvent(f"e-{sid}", UserMessage((ContentPart(text="hi"),)))
        store.append(AppendBatch(sid, (ev,), now_ns=7, blobs=(shared,)))
    real = kv._db
    kv._db = NoSpaceOnWrite(real)  # type: ignore[assignment]
    try:
        with pytest.raises(CtxccError) as refused:
            store.delete_session("a")
    finally:
        kv._db = real
    assert refused.value.reason.name == "DISK_FULL"
    # The error is still held here, its traceback and frames with it, as a call's
    # error is in the daemon until the cycle collector gets to it.
    assert kv._active == 0
    assert kv.writable()
    store.delete_session("a")
    assert [k for k, _ in kv.scan("refs", b"", b"\xff")] == [
        b"B" + shared[0].encode() + b"\x00b",
        b"S" + session_key("b", shared[0].encode()),
    ]
    kv.close()


class WriterFailed:
    """The engine's RocksDB handle once a write failed (for space, or an I/O error): the
    next write fails so, and from then on RocksDB's log writer fails every sync with its
    sticky error."""

    def __init__(self, db: Any, why: str) -> None:
        self._db = db
        self._why = why

    def write(self, batch: object, opts: object) -> None:
        raise Exception(f"IO error: {self._why}: While appending to file")

    def flush_wal(self, sync: bool) -> None:
        raise Exception("IO error: Writer has previous error.")


def test_a_sync_failed_by_another_writes_failure_for_space_is_disk_full(tmp_path: Path) -> None:
    """A step's append is written, its log sync deferred; another session's write then
    fails for space, and RocksDB fails the step's sync with `Writer has previous error`.
    That sync used to raise RocksDB's words as they were (the step answered INTERNAL
    with an incident, seen under the crash attack's full disk); it is the full disk's
    failure, DISK_FULL, saying the write may not have been kept."""
    kv = open_rocks(tmp_path / "db", sync=True)
    real = kv._db
    try:
        step = Batch()
        step.put("meta", b"step", b"v")
        with kv.deferring_sync() as owed:
            kv.write(step)
        kv._db = WriterFailed(real, "No space left on device")  # type: ignore[assignment]
        other = Batch()
        other.put("meta", b"other", b"v")
        with pytest.raises(CtxccError) as first:
            kv.write(other)
        assert first.value.reason.name == "DISK_FULL"
        with pytest.raises(CtxccError) as refused:
            owed.sync()
        assert refused.value.reason.name == "DISK_FULL"
        assert "could not be synced" in refused.value.message
    finally:
        kv._db = real
        kv.close()


@pytest.mark.parametrize("listing", ["tools", "rules"])
def test_a_damaged_record_in_a_listing_leaves_no_read_open_that_keeps_the_engine_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, listing: str
) -> None:
    """A session's tools, or a scope's rules, were decoded in a comprehension over the
    store's read: a damaged record's error kept the comprehension's frame, and the read
    open in it (an engine operation in progress on that thread), for as long as the
    error lived. A reopen after a full disk then waited for it and gave up, as for the
    delete above; they are decoded in a loop now, which closes the read as the error
    leaves it."""
    monkeypatch.setattr(rocks, "_REOPEN_WAIT_S", 0.2)  # the failing case ends sooner
    kv = open_rocks(tmp_path / "db")
    store = KVEventStore(kv)
    store.create_session(Session("s", 1, 1))
    damaged = Batch()
    if listing == "tools":
        damaged.put("tools", session_key("s", b"t"), b"not a record")
        damaged.put("tools", session_key("s", b"u"), b"not a record")
    else:
        prefix = source_prefix(SourceKind.RULE, Scope.SESSION, "s")
        damaged.put("sources", prefix + b"r1", b"not a record")
        damaged.put("sources", prefix + b"r2", b"not a record")
    kv.write(damaged)
    with pytest.raises(CorruptRecordError) as failed:
        if listing == "tools":
            store.list_tools("s")
        else:
            store.list_sources(SourceKind.RULE, Scope.SESSION, "s")
    assert failed.value is not None  # still held, as a call's error is in the daemon
    assert kv._active == 0
    real = kv._db
    kv._db = NoSpaceOnWrite(real)  # type: ignore[assignment]
    try:
        with pytest.raises(CtxccError):
            kv.write(damaged)
    finally:
        kv._db = real
    assert kv.writable()
    kv.close()


def test_a_sync_failed_by_another_writes_io_error_is_no_full_disk(tmp_path: Path) -> None:
    """`Writer has previous error` is a full disk's failure only when a write failed for
    space: after an I/O error it is RocksDB's error as it was (INTERNAL, an incident), and
    the store does not call itself full (writes refused until space comes back)."""
    kv = open_rocks(tmp_path / "db", sync=True)
    real = kv._db
    try:
        step = Batch()
        step.put("meta", b"step", b"v")
        with kv.deferring_sync() as owed:
            kv.write(step)
        kv._db = WriterFailed(real, "Input/output error")  # type: ignore[assignment]
        other = Batch()
        other.put("meta", b"other", b"v")
        with pytest.raises(Exception, match="Input/output error") as first:
            kv.write(other)
        assert not isinstance(first.value, CtxccError)
        with pytest.raises(Exception, match="Writer has previous error") as refused:
            owed.sync()
        assert not isinstance(refused.value, CtxccError)
        assert not kv._full
    finally:
        kv._db = real
        kv.close()


class WriterHasPreviousError:
    """The engine's RocksDB handle after another thread's write failed, before that thread
    said why: every write fails with RocksDB's sticky error."""

    def __init__(self, db: Any) -> None:
        self._db = db

    def write(self, batch: object, opts: object) -> None:
        raise Exception("IO error: Writer has previous error.")


def test_a_write_on_the_event_loop_does_not_wait_to_learn_why_another_write_failed(
    tmp_path: Path,
) -> None:
    """A `no_wait` batch is made on the event loop: when RocksDB fails it with `Writer
    has previous error` before the failing write's thread has said it was for space, it
    used to wait up to a second for that (every session's calls waiting with it), and
    after an I/O error the whole second, every time. Nothing was written, so it is a
    write that would wait, made again from the I/O pool; once a write failed for space,
    it is the full disk's DISK_FULL at once."""
    kv = open_rocks(tmp_path / "db", sync=True)
    real = kv._db
    try:
        kv._db = WriterHasPreviousError(real)  # type: ignore[assignment]
        on_loop = Batch(no_wait=True)
        on_loop.put("meta", b"k", b"v")
        with pytest.raises(WriteWouldWait):
            kv.write(on_loop)
        kv._failed_for_space.set()  # the other thread's write failed for space
        with pytest.raises(CtxccError) as full:
            kv.write(on_loop)
        assert full.value.reason.name == "DISK_FULL"
    finally:
        kv._db = real
        kv.close()
