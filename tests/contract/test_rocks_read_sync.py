"""The log sync a reader makes before acknowledging what it read (RocksKV.sync): only
when a durable write may still be unsynced (a step's append, synced beside its compile);
never claiming a write still in progress; never waiting for a write that failed."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from server.domain.errors import CtxccError, Reason
from server.domain.model import AppendBatch, ContentPart, NewEvent, Session, UserMessage
from storage import KVEventStore, open_rocks
from storage.kv import Batch
from tests.contract.test_rocks import NoSpaceOnSync, _Recording


def _batch(key: bytes) -> Batch:
    b = Batch()
    b.put("meta", key, b"v")
    return b


def test_a_reader_syncs_only_what_a_deferred_write_left_unsynced(tmp_path: Path) -> None:
    """A reader's sync covers the deferred write, and then the owed sync has nothing left
    to make (one fsync for the write, not two)."""
    samples: list[float] = []
    kv = open_rocks(tmp_path / "db", sync=True, on_write=samples.append)
    recording = _Recording(kv._db)
    kv._db = recording  # type: ignore[assignment]
    try:
        kv.write(_batch(b"k0"))  # synced in the write
        kv.sync()
        assert [c for c in recording.calls if c[0] == "flush_wal"] == [("flush_wal", True)]
        with kv.deferring_sync() as owed:
            kv.write(_batch(b"k1"))
        assert not kv.synced()
        kv.sync()  # a reader of k1: it is synced now
        assert kv.synced()
        kv.sync()
        owed.sync()  # covered already: no fsync of its own
        kv.sync()
        flushes = [c for c in recording.calls if c[0] == "flush_wal"]
        assert len(flushes) == 2, recording.calls
        assert len(samples) == 2  # the owed write still measured once
    finally:
        kv._db = recording._db  # type: ignore[assignment]
        kv.close()


def test_reads_and_replays_are_refused_on_a_full_disk_while_a_write_may_be_unsynced(
    tmp_path: Path,
) -> None:
    kv = open_rocks(tmp_path / "db", sync=True)
    try:
        with kv.deferring_sync():
            kv.write(_batch(b"k1"))
        kv._full = True
        with pytest.raises(CtxccError) as err:
            kv.sync()
        assert err.value.reason is Reason.DISK_FULL
        assert "may not have been kept" in str(err.value)
        kv._full = False
        kv.sync()
        kv._full = True
        kv.sync()  # nothing left unsynced: a replay or a read may answer
    finally:
        kv._full = False
        kv.close()


class _HeldWrite:
    """The engine's handle with the writes of the thread named "slow" held inside."""

    def __init__(self, db: Any) -> None:
        self._db = db
        self.inside = threading.Event()
        self.release = threading.Event()

    def write(self, batch: object, opts: object) -> None:
        if threading.current_thread().name == "slow":
            self.inside.set()
            assert self.release.wait(10)
        self._db.write(batch, opts)

    def flush_wal(self, sync: bool) -> None:
        self._db.flush_wal(sync)


def test_a_sync_does_not_cover_a_write_that_has_not_returned(tmp_path: Path) -> None:
    kv = open_rocks(tmp_path / "db", sync=True)
    db = _HeldWrite(kv._db)
    kv._db = db  # type: ignore[assignment]

    def slow() -> None:
        with kv.deferring_sync():
            kv.write(_batch(b"slow"))

    writer = threading.Thread(target=slow, name="slow")
    try:
        writer.start()
        assert db.inside.wait(5)
        with kv.deferring_sync():
            kv.write(_batch(b"fast"))  # a later mark, returned
        kv.sync()  # a reader of "fast"
        assert not kv.synced(), "the sync claimed the write still in progress"
        db.release.set()
        writer.join(5)
        kv.sync()
        assert kv.synced()
    finally:
        db.release.set()
        writer.join(5)
        kv._db = db._db
        kv.close()


class _NoSpaceOnWrite:
    def __init__(self, db: Any) -> None:
        self._db = db

    def write(self, batch: object, opts: object) -> None:
        raise Exception("IO error: No space left on device: While appending to file")

    def flush_wal(self, sync: bool) -> None:
        self._db.flush_wal(sync)


def _append(store: KVEventStore, eid: str, rid: str) -> Any:
    ev = NewEvent(eid, UserMessage((ContentPart(text="x"),)))
    return store.append(AppendBatch("s", (ev,), now_ns=7, request_id=rid, request_digest="d"))


def test_a_write_that_failed_owes_no_sync_to_a_replay_of_an_older_append(tmp_path: Path) -> None:
    """An append acknowledged (and synced) long before is replayed on a full disk: the
    append that failed for space wrote nothing to the log, so nothing is unsynced."""
    kv = open_rocks(tmp_path / "db", sync=True)
    store = KVEventStore(kv)
    store.create_session(Session("s", 1, 1))
    _append(store, "e1", "r1")
    real = kv._db
    kv._db = _NoSpaceOnWrite(real)  # type: ignore[assignment]
    try:
        with pytest.raises(CtxccError) as err:
            _append(store, "e2", "r2")
        assert err.value.reason is Reason.DISK_FULL and "nothing was written" in err.value.message
        kv._db = real
        assert kv.synced()
        replay = _append(store, "e1", "r1")
        assert replay.replayed and replay.last_seq == 1
    finally:
        kv._db = real
        kv._full = kv._broken = False
        store.close()


def test_after_a_step_sync_failed_for_space_its_events_are_not_read_as_durable(
    tmp_path: Path,
) -> None:
    """The step was refused (its sync failed): a watch's read and a compile's barrier
    answer DISK_FULL instead of handing out its events, until the engine is reopened."""
    kv = open_rocks(tmp_path / "db", sync=True)
    store = KVEventStore(kv)
    store.create_session(Session("s", 1, 1))
    real = kv._db
    kv._db = NoSpaceOnSync(real)  # type: ignore[assignment]
    try:
        with store.deferring_sync() as owed:
            _append(store, "e1", "r1")
        with pytest.raises(CtxccError) as refused:
            owed.sync()
        assert "may not have been kept" in refused.value.message
        assert not store.reads_synced()
        # A watch's page and a compile sync what they read through `sync_reads`.
        with pytest.raises(CtxccError) as err:
            store.sync_reads()
        assert err.value.reason is Reason.DISK_FULL
        kv._db = real
        assert store.writable()  # space back (no reserve here): reopened, log recovered
        assert store.reads_synced()
        store.sync_reads()
        assert [e.event_id for e in store.read_events("s", 0, 10)] == ["e1"]
    finally:
        kv._db = real
        kv._full = kv._broken = False
        store.close()
