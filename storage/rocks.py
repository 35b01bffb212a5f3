"""RocksDB engine (rocksdict) for the store: column families, sync writes, one writer.

One process owns a data directory: an advisory `flock` on `<dir>/LOCK.ctxcc` is taken
before RocksDB opens, so a second daemon fails fast with the owner's pid instead of a
RocksDB IO error.

A full disk is a state, not a crash. A write that fails for lack of space answers
DISK_FULL (nothing acknowledged is lost: RocksDB's log holds every write it
acknowledged), later writes are refused at once, and reads keep working. RocksDB's log
writer stays broken after such a failure, so once space is back (`writable()`, polled
by the daemon) the database is closed and reopened in place, after the operations in
progress have finished and while new ones wait. See `storage/space.py` for the reserve
that guarantees room for that reopen and for recovery at start.

Files are private to the daemon's user: the directory 0700, files 0600 (older data
directories are tightened at open; the daemon's umask covers files RocksDB creates).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, NoReturn

import rocksdict

from server.domain.errors import CtxccError, Reason
from storage.kv import COLUMN_FAMILIES, Batch, Footprint, OwedSync, WriteWouldWait
from storage.space import Reserve, free_bytes, is_no_space

log = logging.getLogger("ctxcc.storage")

# Memtables and the write-ahead log are kept small so that replaying the log at open
# (which writes it out as a table file) needs little free space: the reserve covers it.
_WRITE_BUFFER = 16 << 20
_TOTAL_WRITE_BUFFERS = 32 << 20
# How long a reopen waits for operations in progress before trying again later.
_REOPEN_WAIT_S = 5.0
# RocksDB's answer to every write and log sync after one write failed, until reopened.
_WRITER_FAILED = "Writer has previous error"
# How long such an answer waits for the write that failed to tell why (its thread may
# not have yet): a failure for space makes it a full disk's too.
_WHY_WAIT_S = 1.0


class StoreLockedError(RuntimeError):
    """Another process holds the data directory."""


class StoreOpenError(RuntimeError):
    """RocksDB refused to open the store (a damaged file, an I/O error): its own words."""


def _options() -> rocksdict.Options:
    opts = rocksdict.Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.create_missing_column_families(True)
    # Two cores here and in most sidecars: keep background work modest.
    opts.increase_parallelism(2)
    opts.set_write_buffer_size(_WRITE_BUFFER)
    opts.set_db_write_buffer_size(_TOTAL_WRITE_BUFFERS)
    opts.set_max_total_wal_size(_TOTAL_WRITE_BUFFERS)
    # Every open starts a new info log; old ones would otherwise pile up.
    opts.set_keep_log_file_num(4)
    # A record damaged inside the write-ahead log refuses the open (RocksDB's words, exit
    # 1) instead of RocksDB's default, a point-in-time recovery that opened the store as
    # of the record before it: every acknowledged, fsynced write after it gone without a
    # word, and their request ids free to be appended again at seqs acknowledged before.
    # A record cut short at the log's end is still dropped: that is a write a crash
    # interrupted, never acknowledged.
    opts.set_wal_recovery_mode(rocksdict.DBRecoveryMode.tolerate_corrupted_tail_records())
    # Point lookups by session id dominate; bloom filters avoid disk reads on misses.
    table = rocksdict.BlockBasedOptions()
    table.set_bloom_filter(10, False)
    opts.set_block_based_table_factory(table)
    return opts


def disk_full(written: bool = False) -> CtxccError:
    """`written`: the batch reached the log but its fsync failed, so it may or may not be
    there after the engine is reopened (a retry with the same request_id settles it:
    answered as a replay if it is)."""
    what = (
        "the write could not be synced and may not have been kept"
        if written
        else "nothing was written"
    )
    return CtxccError(
        Reason.DISK_FULL,
        f"the disk holding the data directory is full: {what}; reads still "
        "work and writes resume once space is freed",
    )


class ReadFailedError(CtxccError):
    """A read RocksDB failed: it raises its status as a bare Exception. Damaged data is
    RECORD_CORRUPT (DATA_LOSS), anything else (an I/O error) STORAGE_FAILURE; RocksDB's
    words go to the daemon's log (`detail`), not to the client."""

    def __init__(self, status: Exception) -> None:
        damaged = str(status).startswith("Corruption")
        reason = Reason.RECORD_CORRUPT if damaged else Reason.STORAGE_FAILURE
        super().__init__(reason, "stored data is damaged" if damaged else "cannot read the store")
        self.detail = f"RocksDB read: {status}"


def is_write_stall(exc: BaseException) -> bool:
    """A write with `no_slowdown` that would have waited fails with RocksDB's
    `Status::Incomplete("Write stall")`, shown as `Result incomplete: Write stall`."""
    return "incomplete" in str(exc).lower()


class _Owed:
    """The fsync owed by the durable writes a thread made in `RocksKV.deferring_sync`,
    with their time (the storage-write metric sees them as one write, fsync included)
    and the latest of their marks (a sync that covers it already leaves nothing owed)."""

    __slots__ = ("_kv", "_lock", "_mark", "_owed", "_wrote_s")

    def __init__(self, kv: RocksKV) -> None:
        self._kv = kv
        self._wrote_s = 0.0
        self._owed = False
        self._mark = 0
        self._lock = threading.Lock()

    def owe(self, wrote_s: float, mark: int) -> None:
        with self._lock:
            self._wrote_s += wrote_s
            self._mark = max(self._mark, mark)
            self._owed = True

    def owes(self) -> bool:
        with self._lock:
            return self._owed

    def sync(self) -> None:
        with self._lock:
            if not self._owed:
                return
            self._owed = False
            wrote_s, self._wrote_s = self._wrote_s, 0.0
            mark = self._mark
        self._kv._sync_log(wrote_s, mark)


class RocksKV:
    def __init__(
        self,
        path: Path,
        *,
        sync: bool = True,
        on_write: Callable[[float], None] | None = None,
        reserve_bytes: int = 0,
        locked: Callable[[], object] | None = None,
    ) -> None:
        """`locked`: called once the data directory is this process's, before RocksDB
        opens (work to do beside the open, never for a directory another daemon holds)."""
        self.path = path
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        _make_private(path)
        self._lock_file = _take_lock(path)
        if locked is not None:
            locked()
        self._reserve = Reserve(path, reserve_bytes)
        self._gate = threading.Condition(threading.Lock())
        self._active = 0
        self._reopening = False
        self._depth = threading.local()
        # The OwedSync of this thread's `deferring_sync`, if inside one.
        self._deferred = threading.local()
        # Durable writes started, and how many of the first of them a log sync covers:
        # a reader about to acknowledge what it read (a replay, a watch) syncs first when
        # some are not yet covered (a step's append whose sync runs beside its compile).
        self._marks = threading.Lock()
        self._written = 0
        self._synced = 0
        # Marks counted whose write has not returned yet: a sync covers only the marks
        # before the first of them.
        self._writing: set[int] = set()
        # Marks of writes that failed (nothing in the log) not yet passed by `_synced`.
        self._void: set[int] = set()
        self._db: rocksdict.Rdict | None = None
        try:
            # The log replay at open writes a table file: give it the reserved room.
            self._reserve.release_if_short()
            self._open()
        except Exception as exc:
            self._lock_file.close()
            # rocksdict reports RocksDB's own status (Corruption, IO error...) as a bare
            # Exception: the operator gets it with the path, not a traceback.
            if type(exc) is Exception:
                raise StoreOpenError(f"cannot open RocksDB in {path}: {exc}") from exc
            raise
        except BaseException:
            self._lock_file.close()
            raise
        # sync=True: every durable batch is fsynced before the append is acknowledged.
        # The batch is written to the log unsynced and the log then synced: rocksdict
        # holds the GIL through a write, fsync included (~1-10 ms that every thread and
        # the event loop would wait out), while its flush_wal releases it.
        self._sync = sync
        self._lazy_opts = rocksdict.WriteOptions()
        self._lazy_opts.sync = False
        self._no_wait_opts = rocksdict.WriteOptions()
        self._no_wait_opts.sync = False
        self._no_wait_opts.no_slowdown = True
        self._closed = False
        self._on_write = on_write
        # True while writes are refused for lack of space.
        self._full = not self._reserve.ready()
        # True after RocksDB itself failed a write: only a reopen clears it.
        self._broken = False
        # Set once a write or sync failed for space, cleared by the reopen: RocksDB's
        # log writer then fails every other one in progress with `_WRITER_FAILED`.
        self._failed_for_space = threading.Event()
        if self._full:
            log.error("disk full at open: %d bytes free; serving reads only", self._free())

    def _open(self) -> None:
        cfs = {name: _options() for name in COLUMN_FAMILIES}
        db = rocksdict.Rdict(str(self.path), _options(), column_families=cfs)
        self._cf = {name: db.get_column_family(name) for name in COLUMN_FAMILIES}
        self._handles = {name: db.get_column_family_handle(name) for name in COLUMN_FAMILIES}
        self._db = db
        # What the log held is recovered (and its replay written to a table file).
        with self._marks:
            self._synced = self._written
            self._void.clear()

    def _close_db(self) -> list[Exception]:
        """Close every handle; after a failed write RocksDB refuses to flush on close
        (its log already holds every acknowledged write), so errors are collected."""
        errors: list[Exception] = []
        for cf in self._cf.values():
            try:
                cf.close()
            except Exception as exc:
                errors.append(exc)
        # Column-family handles keep the native DB (and its LOCK) alive until dropped.
        self._cf = {}
        self._handles = {}
        if self._db is not None:
            try:
                self._db.close()
            except Exception as exc:
                errors.append(exc)
            self._db = None
        return errors

    def _use(self) -> _InUse:
        """Counts an operation in progress; a reopen waits for none to be left. Nested
        use on one thread (a write inside a scan) never waits, so it cannot deadlock."""
        return _InUse(self)

    def get(self, cf: str, key: bytes) -> bytes | None:
        with self._use():
            try:
                value = self._cf[cf].get(key)
            except Exception as exc:
                if type(exc) is not Exception:
                    raise
                raise ReadFailedError(exc) from exc
        return value if value is None else bytes(value)

    def scan(
        self, cf: str, start: bytes, end: bytes, *, reverse: bool = False
    ) -> Iterator[tuple[bytes, bytes]]:
        with self._use():
            it = self._cf[cf].iter()
            if reverse:
                it.seek_for_prev(end)
                if it.valid() and bytes(it.key()) >= end:
                    it.prev()
                while it.valid():
                    key = bytes(it.key())
                    if key < start:
                        return
                    yield key, bytes(it.value())
                    it.prev()
            else:
                it.seek(start)
                while it.valid():
                    key = bytes(it.key())
                    if key >= end:
                        return
                    yield key, bytes(it.value())
                    it.next()
            # An iterator that hits a damaged block (a checksum that does not match) or
            # an I/O error just stops being valid: without this check a session's log
            # read back as its events up to the damage, as if that were all of it.
            try:
                it.status()
            except Exception as exc:
                if type(exc) is not Exception:
                    raise
                raise ReadFailedError(exc) from exc

    def write(self, batch: Batch) -> None:
        if self._full:
            raise disk_full()
        syncs = batch.durable and self._sync
        owed: _Owed | None = getattr(self._deferred, "owed", None) if syncs else None
        with self._use():
            wb = rocksdict.WriteBatch(raw_mode=True)
            for cf, start, end in batch.ranges:
                wb.delete_range(start, end, self._handles[cf])
            for cf, key in batch.deletes:
                wb.delete(key, self._handles[cf])
            for cf, key, value in batch.puts:
                wb.put(key, value, self._handles[cf])
            started = time.perf_counter()
            written = False
            mark = 0
            if syncs:
                # Counted before the write: a reader that sees it sees it counted.
                with self._marks:
                    self._written += 1
                    mark = self._written
                    self._writing.add(mark)
            try:
                assert self._db is not None
                try:
                    self._db.write(wb, self._no_wait_opts if batch.no_wait else self._lazy_opts)
                    written = True
                finally:
                    if syncs:
                        self._returned(mark, written)
                if syncs and owed is None:
                    target = self._flushable()
                    self._db.flush_wal(True)
                    self._covered(target)
            except Exception as exc:
                self._failed(exc, batch.no_wait, written)
            took = time.perf_counter() - started
        if owed is not None:
            owed.owe(took, mark)
        elif self._on_write is not None:
            self._on_write(took)

    @contextlib.contextmanager
    def deferring_sync(self) -> Iterator[OwedSync]:
        owed = _Owed(self)
        self._deferred.owed = owed
        try:
            yield owed
        finally:
            self._deferred.owed = None

    def _returned(self, mark: int, written: bool) -> None:
        """A durable write's call returned; one that failed wrote nothing to the log, so
        it owes no sync (a replay of an older append must not wait for it)."""
        with self._marks:
            self._writing.discard(mark)
            if not written:
                self._void.add(mark)
                self._pass_void()

    def _pass_void(self) -> None:
        """Moves what is covered past failed writes (under `_marks`)."""
        if self._void:
            while self._synced + 1 in self._void:
                self._synced += 1
            self._void = {m for m in self._void if m > self._synced}

    def _flushable(self) -> int:
        """The marks a log sync starting now covers: those whose write has returned."""
        with self._marks:
            return min(self._writing) - 1 if self._writing else self._written

    def _covered(self, mark: int) -> None:
        with self._marks:
            self._synced = max(self._synced, mark)
            self._pass_void()

    def synced(self) -> bool:
        """Whether every durable write made so far is synced (cheap: no I/O)."""
        if not self._sync:
            return True
        with self._marks:
            return self._synced >= self._written

    def sync(self) -> None:
        """Every durable write made so far synced, by any thread, unmeasured (no write of
        its own), when some may not be yet: a replay's answer acknowledges an append, a
        watch sends events, a compile answers a view, that another thread wrote and may
        not have synced yet (a step's deferred sync). With a write in the log whose sync
        failed for space, it fails as that sync did (DISK_FULL) until the engine is
        reopened: what was read may not be kept."""
        if not self._sync:
            return
        with self._marks:
            if self._synced >= self._written:
                return
        if self._full:
            raise disk_full(True)
        self._flush()

    def _sync_log(self, wrote_s: float, mark: int) -> None:
        """The fsync writes made in `deferring_sync` left (none when a sync made since,
        by a reader's barrier, covers them); measured with them, as one write with its
        fsync."""
        with self._marks:
            covered = self._synced >= mark
        took = 0.0 if covered else self._flush()
        if self._on_write is not None:
            self._on_write(wrote_s + took)

    def _flush(self) -> float:
        """Syncs the log, marking what that covers; its seconds."""
        with self._use():
            target = self._flushable()
            started = time.perf_counter()
            try:
                assert self._db is not None
                self._db.flush_wal(True)
            except Exception as exc:
                self._failed(exc, False, True)
            took = time.perf_counter() - started
        self._covered(target)
        return took

    def _failed(self, exc: Exception, no_wait: bool, written: bool) -> NoReturn:
        if no_wait and is_write_stall(exc):
            raise WriteWouldWait(str(exc)) from None
        if not is_no_space(exc) and not self._failed_after_no_space(exc, no_wait and not written):
            raise exc
        if not self._full:
            log.error("disk full (%d bytes free): refusing writes: %s", self._free(), exc)
        self._full = self._broken = True
        self._failed_for_space.set()
        raise disk_full(written) from None

    def _failed_after_no_space(self, exc: Exception, redoable: bool) -> bool:
        """A write or log sync that RocksDB failed only because another one failed
        before it, for space: a full disk's failure too (DISK_FULL, not an internal
        error), also when that one's thread has not yet said so. A write that must not
        wait (made on the event loop) and was not written does not wait for that thread:
        it is made again from the I/O pool, where the wait blocks no other session."""
        if _WRITER_FAILED not in str(exc):
            return False
        if self._failed_for_space.is_set():
            return True
        if redoable:
            raise WriteWouldWait(str(exc)) from None
        return self._failed_for_space.wait(_WHY_WAIT_S)

    def writable(self) -> bool:
        """False while writes are refused for lack of space. Once space is back (and the
        reserve is in place again), reopens RocksDB if a write had failed, and says True."""
        if self._closed:
            return False
        if not self._full:
            return True
        if not self._reserve.ready():
            return False
        if self._broken and not self._reopen():
            return False
        self._broken = self._full = False
        self._failed_for_space.clear()
        log.warning("disk space is back (%d bytes free): accepting writes", self._free())
        return True

    def _reopen(self) -> bool:
        with self._gate:
            self._reopening = True
            try:
                if not self._gate.wait_for(lambda: self._active == 0, timeout=_REOPEN_WAIT_S):
                    return False
                if self._closed:  # the daemon stopped meanwhile
                    return False
                errors = self._close_db()
                if errors:
                    log.info("closed RocksDB after the failed write: %s", errors[0])
                try:
                    self._open()
                except Exception as exc:
                    log.error("reopening RocksDB failed (will retry): %s", exc)
                    return False
                return True
            finally:
                self._reopening = False
                self._gate.notify_all()

    def _free(self) -> int:
        return free_bytes(self.path)

    def footprint(self) -> Footprint:
        """What the database holds now. Table files alone read 0 until the first flush:
        a young or lightly written database sits in its write-ahead log and memtables."""
        sst = memtables = 0
        with self._use():
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
            writes_refused=self._full,
        )

    def approximate_size(self) -> int:
        return self.footprint().data_bytes

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with self._gate:
            # A synced write syncs the log with the GIL released: closing meanwhile would
            # free the database under it. New operations wait, then find it closed.
            self._reopening = True
            try:
                self._gate.wait_for(lambda: self._active == 0, timeout=_REOPEN_WAIT_S)
                errors = self._close_db()
            finally:
                self._reopening = False
                self._gate.notify_all()
        if errors:
            # Only after a failed write: the log keeps what was acknowledged.
            log.warning("RocksDB closed without flushing: %s", errors[0])
        self._lock_file.close()


class _InUse:
    """One operation in progress (see RocksKV._use). A plain object rather than a
    generator context manager: every read passes here, dozens per compile."""

    __slots__ = ("_depth", "_kv")

    def __init__(self, kv: RocksKV) -> None:
        self._kv = kv
        self._depth = 0

    def __enter__(self) -> None:
        kv = self._kv
        depth = self._depth = getattr(kv._depth, "n", 0)
        with kv._gate:
            if depth == 0 and kv._reopening:
                kv._gate.wait_for(lambda: not kv._reopening)
            if kv._db is None:
                raise CtxccError(
                    Reason.STORAGE_FAILURE, "the database is reopening after a full disk"
                )
            kv._active += 1
        kv._depth.n = depth + 1

    def __exit__(self, *exc: object) -> None:
        kv = self._kv
        kv._depth.n = self._depth
        with kv._gate:
            kv._active -= 1
            # Only a reopen waits for the count to reach zero.
            if kv._active == 0 and kv._reopening:
                kv._gate.notify_all()


def _make_private(path: Path) -> None:
    """Tightens a data directory written by an older version (0755/0644)."""
    os.chmod(path, 0o700)
    for entry in path.iterdir():
        if entry.is_file() and not entry.is_symlink():
            os.chmod(entry, 0o600)


def _take_lock(path: Path) -> IO[str]:
    lock_path = path / "LOCK.ctxcc"
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    handle = os.fdopen(fd, "a+")
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
    path: Path,
    *,
    sync: bool = True,
    on_write: Callable[[float], None] | None = None,
    reserve_bytes: int = 0,
    locked: Callable[[], object] | None = None,
) -> RocksKV:
    return RocksKV(path, sync=sync, on_write=on_write, reserve_bytes=reserve_bytes, locked=locked)
