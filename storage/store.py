"""The event store: the canonical history of R-HIST-1 over an ordered KV engine.

Rules the store keeps (its parts live in `storage.sessions`, `storage.events`,
`storage.compiles`, `storage.usage_records` and `storage.registry`, over
`storage.store_core` and `storage.keys`):
- every mutating call builds one Batch and writes it once: all or nothing;
- appends to one session are serialized by a striped lock, so "read head, check,
  write" cannot interleave; different sessions append in parallel and share fsyncs
  through RocksDB's group commit;
- events are never rewritten; only DeleteSession removes them, all at once.
"""

from __future__ import annotations

import contextlib

from storage.events import EventRecords, IdempotencyRecord
from storage.kv import Footprint, OwedSync
from storage.registry import RegistryRecords
from storage.sessions import SessionRecords
from storage.store_core import StoreLimits
from storage.usage_records import UsageRecords

__all__ = ["IdempotencyRecord", "KVEventStore", "StoreLimits"]


class KVEventStore(SessionRecords, EventRecords, UsageRecords, RegistryRecords):
    def _last_compile_ns(self, session_id: str) -> int:
        # The outcome alone: the record's table chunks are not read.
        last = self.last_compile_outcome(session_id)
        return 0 if last is None else last[1]

    def approximate_size(self) -> int:
        return self._kv.approximate_size()

    def footprint(self) -> Footprint:
        return self._kv.footprint()

    def writable(self) -> bool:
        """False while the disk is too full to write; may recover the engine in place."""
        return self._kv.writable()

    def deferring_sync(self) -> contextlib.AbstractContextManager[OwedSync]:
        return self._kv.deferring_sync()

    def reads_synced(self) -> bool:
        """Whether everything readable is durable (no I/O: on the event loop)."""
        return self._kv.synced()

    def sync_reads(self) -> None:
        """The log synced if a write made so far may not be yet (cheap when none): what
        was read before is durable after."""
        self._kv.sync()

    def close(self) -> None:
        self._kv.close()
