"""An ordered key-value interface with atomic batches, and its in-memory engine."""

from __future__ import annotations

import bisect
import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

COLUMN_FAMILIES = (
    "sessions",  # session id -> Record(Session)
    "events",  # session id 0x00 seq(be64) -> EventRecord
    "event_ids",  # session id 0x00 event id -> seq(be64)
    "requests",  # session id 0x00 request id -> Record(IdempotencyRecord)
    "blobs",  # sha256 hex -> raw content (tool results, artifact bytes)
    "refs",  # b"S" session 0x00 sha | b"B" sha 0x00 session -> b"" (blob reference counting)
    "artifacts",  # session id 0x00 artifact id -> Record(ArtifactRecord)
    "checkpoints",  # session id 0x00 time(be64) checkpoint id -> Record(Checkpoint)
    "routes",  # session id 0x00 route id -> Record(RouteState)
    "compiles",  # session id 0x00 compile suffix -> Record(CompileRecord)
    "sources",  # kind 0x00 scope 0x00 scope id 0x00 id -> Record(Memory/Rule/SkillEntry)
    "tools",  # session 0x00 name -> ToolSpec; session 0x00 0xff turn(be64) -> activations
    "meta",  # schema_version, session_count
)


class WriteWouldWait(Exception):
    """A `no_wait` batch met a write stall: nothing was written."""


@dataclass(slots=True)
class Batch:
    """Writes applied together or not at all."""

    puts: list[tuple[str, bytes, bytes]] = field(default_factory=list)
    deletes: list[tuple[str, bytes]] = field(default_factory=list)
    ranges: list[tuple[str, bytes, bytes]] = field(default_factory=list)
    # False for writes whose loss in a machine crash is harmless (compile records, route
    # baselines): they skip the fsync even in `sync` durability. The log never does.
    durable: bool = True
    # True for writes made on the event loop: rather than wait out a RocksDB write stall
    # (memtables full, too many level-0 files), the write fails with WriteWouldWait,
    # writing nothing, and the caller makes it again from a thread.
    no_wait: bool = False

    def put(self, cf: str, key: bytes, value: bytes) -> None:
        self.puts.append((cf, key, value))

    def delete(self, cf: str, key: bytes) -> None:
        self.deletes.append((cf, key))

    def delete_range(self, cf: str, start: bytes, end: bytes) -> None:
        self.ranges.append((cf, start, end))


@dataclass(frozen=True, slots=True)
class Footprint:
    """The store's size by where the bytes are, and the room left on its filesystem."""

    live_sst_bytes: int
    wal_bytes: int
    memtable_bytes: int
    disk_free_bytes: int
    disk_capacity_bytes: int
    # Writes refused for lack of space (health NOT_SERVING). Not the same as little free
    # space: a daemon restarted on a full disk gives its reserve back, so a quarter of a
    # small volume can be free while it still waits for twice the reserve.
    writes_refused: bool = False

    @property
    def data_bytes(self) -> int:
        return self.live_sst_bytes + self.wal_bytes + self.memtable_bytes


class OwedSync(Protocol):
    def owes(self) -> bool:
        """Whether a write made it owes an fsync."""
        ...

    def sync(self) -> None:
        """Makes durable what the writes it was made for wrote (nothing when they owe
        no fsync); raises as their write would have."""
        ...


class _NothingOwed:
    def owes(self) -> bool:
        return False

    def sync(self) -> None:
        pass


NOTHING_OWED: OwedSync = _NothingOwed()


class KV(Protocol):
    def get(self, cf: str, key: bytes) -> bytes | None: ...

    def scan(
        self, cf: str, start: bytes, end: bytes, *, reverse: bool = False
    ) -> Iterator[tuple[bytes, bytes]]:
        """Items with start <= key < end in key order (or reversed)."""
        ...

    def write(self, batch: Batch) -> None: ...

    def deferring_sync(self) -> contextlib.AbstractContextManager[OwedSync]:
        """Durable writes this thread makes inside leave their fsync to the `sync` of
        what it yields, to be made (on any thread) before they are acknowledged: the
        log is synced while other work runs instead of before it."""
        ...

    def synced(self) -> bool:
        """Whether every durable write made so far is synced (no I/O)."""
        ...

    def sync(self) -> None:
        """Makes durable every durable write made so far, by any thread (a replay
        acknowledges a write another thread may not have synced yet); raises as a failed
        sync of a write would."""
        ...

    def approximate_size(self) -> int: ...

    def footprint(self) -> Footprint: ...

    def writable(self) -> bool:
        """False while writes are refused for lack of disk space."""
        ...

    def close(self) -> None: ...


class MemoryKV:
    """A sorted in-memory engine with the same semantics as RocksKV, for unit tests."""

    def __init__(self) -> None:
        self._data: dict[str, dict[bytes, bytes]] = {cf: {} for cf in COLUMN_FAMILIES}
        self._keys: dict[str, list[bytes]] = {cf: [] for cf in COLUMN_FAMILIES}
        self._lock = threading.Lock()

    def get(self, cf: str, key: bytes) -> bytes | None:
        return self._data[cf].get(key)

    def scan(
        self, cf: str, start: bytes, end: bytes, *, reverse: bool = False
    ) -> Iterator[tuple[bytes, bytes]]:
        with self._lock:
            keys = self._keys[cf]
            chosen = keys[bisect.bisect_left(keys, start) : bisect.bisect_left(keys, end)]
            items = [(k, self._data[cf][k]) for k in chosen]
        return iter(reversed(items) if reverse else items)

    def write(self, batch: Batch) -> None:
        with self._lock:
            # Same order as RocksDB applies a WriteBatch built by RocksKV.write.
            for cf, start, end in batch.ranges:
                for k in [k for k in self._data[cf] if start <= k < end]:
                    self._remove(cf, k)
            for cf, key in batch.deletes:
                self._remove(cf, key)
            for cf, key, value in batch.puts:
                if key not in self._data[cf]:
                    bisect.insort(self._keys[cf], key)
                self._data[cf][key] = value

    @contextlib.contextmanager
    def deferring_sync(self) -> Iterator[OwedSync]:
        yield NOTHING_OWED  # nothing here is ever synced

    def synced(self) -> bool:
        return True

    def sync(self) -> None:
        pass

    def _remove(self, cf: str, key: bytes) -> None:
        if self._data[cf].pop(key, None) is not None:
            keys = self._keys[cf]
            del keys[bisect.bisect_left(keys, key)]

    def approximate_size(self) -> int:
        return sum(len(k) + len(v) for d in self._data.values() for k, v in d.items())

    def footprint(self) -> Footprint:
        return Footprint(self.approximate_size(), 0, 0, 0, 0)

    def writable(self) -> bool:
        return True

    def close(self) -> None:
        pass
