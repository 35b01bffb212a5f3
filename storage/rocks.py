"""RocksDB engine (rocksdict) for the store: column families, sync writes, one writer.

One process owns a data directory: an advisory `flock` on `<dir>/LOCK.ctxcc` is taken
before RocksDB opens, so a second daemon fails fast with the owner's pid instead of a
RocksDB IO error.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import rocksdict

from storage.kv import COLUMN_FAMILIES, Batch, Footprint


class StoreLockedError(RuntimeError):
    """Another process holds the data directory."""


def _options() -> rocksdict.Options:
    opts = rocksdict.Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.create_missing_column_families(True)
    # Two cores here and in most sidecars: keep background work modest.
    opts.increase_parallelism(2)
    # Point lookups by session id dominate; bloom filters avoid disk reads on misses.
    table = rocksdict.BlockBasedOptions()
    table.set_bloom_filter(10, False)
    opts.set_block_based_table_factory(table)
    return opts


class RocksKV:
    def __init__(
        self, path: Path, *, sync: bool = True, on_write: Callable[[float], None] | None = None
    ) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        self._lock_file = _take_lock(path)
        try:
            cfs = {name: _options() for name in COLUMN_FAMILIES}
            self._db = rocksdict.Rdict(str(path), _options(), column_families=cfs)
        except BaseException:
            self._lock_file.close()
            raise
        self._cf = {name: self._db.get_column_family(name) for name in COLUMN_FAMILIES}
        self._handles = {name: self._db.get_column_family_handle(name) for name in COLUMN_FAMILIES}
        self._write_opts = rocksdict.WriteOptions()
        # sync=True: every batch is fsynced before the append is acknowledged.
        self._write_opts.sync = sync
        self._lazy_opts = rocksdict.WriteOptions()
        self._lazy_opts.sync = False
        self._closed = False
        self._on_write = on_write

    def get(self, cf: str, key: bytes) -> bytes | None:
        value = self._cf[cf].get(key)
        return value if value is None else bytes(value)

    def scan(
        self, cf: str, start: bytes, end: bytes, *, reverse: bool = False
    ) -> Iterator[tuple[bytes, bytes]]:
        it = self._cf[cf].iter()
        if reverse:
            it.seek_for_prev(end)
            if it.valid() and bytes(it.key()) >= end:
                it.prev()
            while it.valid():
                key = bytes(it.key())
                if key < start:
                    break
                yield key, bytes(it.value())
                it.prev()
        else:
            it.seek(start)
            while it.valid():
                key = bytes(it.key())
                if key >= end:
                    break
                yield key, bytes(it.value())
                it.next()

    def write(self, batch: Batch) -> None:
        wb = rocksdict.WriteBatch(raw_mode=True)
        for cf, start, end in batch.ranges:
            wb.delete_range(start, end, self._handles[cf])
        for cf, key in batch.deletes:
            wb.delete(key, self._handles[cf])
        for cf, key, value in batch.puts:
            wb.put(key, value, self._handles[cf])
        started = time.perf_counter()
        self._db.write(wb, self._write_opts if batch.durable else self._lazy_opts)
        if self._on_write is not None:
            self._on_write(time.perf_counter() - started)

    def footprint(self) -> Footprint:
        """What the database holds now. Table files alone read 0 until the first flush:
        a young or lightly written database sits in its write-ahead log and memtables."""
        sst = memtables = 0
        for name in COLUMN_FAMILIES:
            cf = self._cf[name]
            sst += int(cf.property_int_value("rocksdb.live-sst-files-size") or 0)
            memtables += int(cf.property_int_value("rocksdb.cur-size-all-mem-tables") or 0)
        wal = 0
        # The WAL lives in the data directory (no wal_dir is set); files vanish as
        # RocksDB recycles them, so a file listed and gone counts as empty.
        for entry in os.scandir(self.path):
            if entry.name.endswith(".log"):
                with contextlib.suppress(FileNotFoundError):
                    wal += entry.stat().st_size
        disk = os.statvfs(self.path)
        return Footprint(
            live_sst_bytes=sst,
            wal_bytes=wal,
            memtable_bytes=memtables,
            disk_free_bytes=disk.f_bavail * disk.f_frsize,
            disk_capacity_bytes=disk.f_blocks * disk.f_frsize,
        )

    def approximate_size(self) -> int:
        return self.footprint().data_bytes

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for cf in self._cf.values():
            cf.close()
        # Column-family handles keep the native DB (and its LOCK) alive until dropped.
        self._cf.clear()
        self._handles.clear()
        self._db.close()
        self._lock_file.close()


def _take_lock(path: Path) -> IO[str]:
    lock_path = path / "LOCK.ctxcc"
    handle = open(lock_path, "a+")  # noqa: SIM115 - held open for the store's lifetime
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        owner = handle.read().strip() or "unknown"
        handle.close()
        raise StoreLockedError(
            f"data directory {path} is in use by another ctxcc process (pid {owner}); "
            "one daemon owns a data directory at a time"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(str(os.getpid()))
    handle.flush()
    return handle


def open_rocks(
    path: Path, *, sync: bool = True, on_write: Callable[[float], None] | None = None
) -> RocksKV:
    return RocksKV(path, sync=sync, on_write=on_write)
