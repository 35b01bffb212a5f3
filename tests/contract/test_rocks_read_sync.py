"""The log sync a reader makes before acknowledging what it read (RocksKV.sync): only
when a durable write may still be unsynced (a step's append, synced beside its compile)."""

from __future__ import annotations

from pathlib import Path

import pytest

from server.domain.errors import CtxccError, Reason
from storage import open_rocks
from storage.kv import Batch
from tests.contract.test_rocks import _Recording


def _batch(key: bytes) -> Batch:
    b = Batch()
    b.put("meta", key, b"v")
    return b


def test_a_reader_syncs_only_what_a_deferred_write_left_unsynced(tmp_path: Path) -> None:
    kv = open_rocks(tmp_path / "db", sync=True)
    recording = _Recording(kv._db)
    kv._db = recording  # type: ignore[assignment]
    try:
        kv.write(_batch(b"k0"))  # synced in the write
        kv.sync()
        assert [c for c in recording.calls if c[0] == "flush_wal"] == [("flush_wal", True)]
        with kv.deferring_sync() as owed:
            kv.write(_batch(b"k1"))
        kv.sync(strict=False)  # a reader of k1: it is synced now
        kv.sync()
        owed.sync()  # the owed sync is still made (once)
        kv.sync()
        flushes = [c for c in recording.calls if c[0] == "flush_wal"]
        assert len(flushes) == 3, recording.calls
    finally:
        kv._db = recording._db  # type: ignore[assignment]
        kv.close()


def test_a_replay_is_refused_on_a_full_disk_while_a_write_may_be_unsynced(
    tmp_path: Path,
) -> None:
    kv = open_rocks(tmp_path / "db", sync=True)
    try:
        with kv.deferring_sync():
            kv.write(_batch(b"k1"))
        kv._full = True
        kv.sync(strict=False)  # a read still answers
        with pytest.raises(CtxccError) as err:
            kv.sync()
        assert err.value.reason is Reason.DISK_FULL
        assert "may not have been kept" in str(err.value)
        kv._full = False
        kv.sync()
        kv._full = True
        kv.sync()  # nothing left unsynced: a replay may answer
    finally:
        kv._full = False
        kv.close()
