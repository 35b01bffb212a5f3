"""Values a compile reads from the store that change far less often than a session's log
(its checkpoint and tool lists, the API sources it sees), kept between compiles.

The store counts the writes to each table of a session (`EventStore.table_generation`;
any source write and any session's deletion move every count). A value is kept with the
count taken before it was read, and read again as soon as the count moved: a kept value
is never older than the last write that landed before the compile began, so a compile
sees what it would have read. Kept per session incarnation (id and creation time), in an
LRU bounded by entries and by the approximate bytes of the values' texts; in memory only.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import TypeVar

from server.domain.model import Session, of_deleted
from server.service.ports import EventStore

T = TypeVar("T")

# At most this many values and about this many bytes of their texts (a value larger
# than a quarter of it is read at every compile, never kept).
MAX_ENTRIES = 1024
MAX_BYTES = 32 << 20
# What an item costs beyond its texts.
ITEM_BYTES = 256


def approx_bytes(value: object, depth: int = 3) -> int:
    """About the memory a value holds: its texts and bytes, and a fixed part per item,
    through tuples and slotted frozen values (the records and inputs kept here)."""
    if isinstance(value, str | bytes):
        return len(value)
    if depth == 0:
        return ITEM_BYTES
    if isinstance(value, tuple):
        return ITEM_BYTES + sum(approx_bytes(v, depth - 1) for v in value)
    slots = getattr(type(value), "__slots__", ())
    return ITEM_BYTES + sum(approx_bytes(getattr(value, s, None), depth - 1) for s in slots)


class KeptReads:
    """Values read from one table of a session, each with the table's write count."""

    def __init__(self, table: str, store: EventStore) -> None:
        self._table = table
        self._store = store
        self._entries: OrderedDict[tuple[object, ...], tuple[tuple[int, int], object, int]]
        self._entries = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, session: Session, key: tuple[object, ...], read: Callable[[], T]) -> T:
        """`read()`'s value, kept under `key` (of this incarnation of the session) while
        the session's table was not written."""
        full = (session.session_id, session.create_time_ns, *key)
        gen = self._store.table_generation(session.session_id, self._table)  # before reading
        with self._lock:
            hit = self._entries.get(full)
            if hit is not None and hit[0] == gen:
                self._entries.move_to_end(full)
                return hit[1]  # type: ignore[return-value]
        value = read()
        size = approx_bytes(value)
        if size > MAX_BYTES // 4:
            return value
        with self._lock:
            old = self._entries.pop(full, None)
            if old is not None:
                self._bytes -= old[2]
            self._entries[full] = (gen, value, size)
            self._bytes += size
            while len(self._entries) > MAX_ENTRIES or self._bytes > MAX_BYTES:
                _, (_, _, dropped) = self._entries.popitem(last=False)
                self._bytes -= dropped
        return value

    def forget(self, session_id: str, created_ns: int = 0) -> None:
        """The session made at `created_ns` (0: whichever) was deleted: its values, which
        no compile can ask for again (their key holds its create time), go now instead
        of holding the LRU's room until it reaches them."""
        with self._lock:
            gone = [
                k
                for k in self._entries
                # Keys are (session id, its create time, ...): see `get`.
                if k[0] == session_id and isinstance(k[1], int) and of_deleted(k[1], created_ns)
            ]
            for key in gone:
                self._bytes -= self._entries.pop(key)[2]

    def __len__(self) -> int:
        """Values kept (for tests: a deleted session's are not)."""
        return len(self._entries)
