"""What every part of the event store shares: engine, locks, caches, generations.

The per-record-kind parts (`storage.sessions`, `storage.events`, `storage.compiles`,
`storage.registry`) extend `StoreCore`; `storage.store.KVEventStore` combines them.
"""

from __future__ import annotations

import contextlib
import threading
import zlib
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from server.domain.errors import CtxccError, Reason, session_not_found
from server.domain.generation import Generation
from server.domain.model import Session
from server.domain.sources import SourceEntry
from server.domain.table_chunks import Splitter
from storage.basis_bytes import move_basis_bytes
from storage.codec import CorruptRecordError, decode_value
from storage.generations import Generations
from storage.keys import SEP, session_key
from storage.kv import KV, Batch
from storage.schema import ensure_schema
from storage.tails import Tails

_STRIPES = 256
# Locks over blob ids (sha256), taken after a session's lock: see `_blob_locks`.
_BLOB_STRIPES = 64
# Decoded records kept (see StoreCore._decoded): at most this many, and at most this many
# bytes as encoded (a decoded record takes a few times its encoded size in memory; a
# compile record of a long session holds a row per message of its view, ~50 bytes each).
_DECODED = 256
DECODED_BYTES = 16 << 20
_DECODED_CFS = frozenset({"compiles", "routes", "sessions"})
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class StoreLimits:
    max_sessions: int = 100_000
    max_session_bytes: int = 1 << 30
    # Bytes of basis parts a session's compiles may store (Session.basis_bytes), apart
    # from max_session_bytes: past it compiles are recorded without their basis; 0
    # stores none.
    max_session_basis_bytes: int = 1 << 30


class StoreCore:
    def __init__(
        self, kv: KV, limits: StoreLimits | None = None, splitter: Splitter | None = None
    ) -> None:
        self._kv = kv
        self.limits = limits or StoreLimits()
        # Sessions whose damaged record was logged (sessions.page_sessions): once each.
        self._told_damaged: set[str] = set()
        self.opened_schema_version = ensure_schema(kv)
        # Sessions of a store whose basis parts counted in stored_bytes get them apart.
        self.basis_bytes_moved = move_basis_bytes(kv)
        # Compiles recorded without their basis since the store opened, by why: the
        # basis quota ("quota") or a basis that is not stored ("missing").
        self.bases_dropped: dict[str, int] = {"quota": 0, "missing": 0}
        # Sessions whose compile past the basis quota was logged (once each).
        self._told_basis_full: OrderedDict[str, None] = OrderedDict()
        # Basis parts left unstored for the quota, by key: a repeat of such a compile
        # names one (counted and logged as the quota, not as a missing basis).
        self._over_quota: OrderedDict[bytes, None] = OrderedDict()
        self._stripes = [threading.Lock() for _ in range(_STRIPES)]
        self._blob_stripes = [threading.Lock() for _ in range(_BLOB_STRIPES)]
        self._sessions_lock = threading.Lock()
        self._models_lock = threading.Lock()
        # Decoded source lists by key prefix: every compile reads nine of them, and
        # they change only through this store. A write bumps `_sources_gen`, so a
        # list read before it is never kept after it, and clears them before the write
        # generation moves.
        self._sources: OrderedDict[bytes, tuple[SourceEntry, ...]] = OrderedDict()
        self._sources_gen = 0
        self._sources_lock = threading.Lock()
        # Compile parts (content-addressed) known to be stored: most compiles repeat
        # their sources and settings, so their existence is not read again each time.
        self._parts: OrderedDict[bytes, None] = OrderedDict()
        # Per session, the table chunk names last written with its records (all stored):
        # a step's records name the same chunks several times over.
        self._staged: OrderedDict[str, tuple[str, ...]] = OrderedDict()
        # Names of the per-message table chunks records are written with: the compiles'
        # own (see CompileUseCases), so that the basis of a step's compile, which holds
        # the table of the record the step before wrote, finds that table's split by
        # identity instead of comparing it, thousands of entries, with an earlier one.
        self._splitter = splitter or Splitter()
        # Bumped by every write (through `_write`), so the service can keep what a
        # compile read for as long as nothing it read was written.
        self._generations = Generations()
        # Records a step reads back right after they were written, kept as the values
        # written: a compile's record (read by its usage report), the session's latest
        # compile (its section digests, read by the next compile), a route state (the
        # baseline a report writes, read by the next compile); each holds the view's
        # per-message table, which msgspec decodes at ~35 ns a message. And the session
        # an append wrote, which the step then reads four times (~8 us a read), and the
        # route model a report wrote (read by the next compile). Only writers fill it,
        # under the lock its writers hold (the session's; the models' for a route model)
        # and after their write; every write drops the keys it touches first (`_write`).
        self._decoded: OrderedDict[tuple[str, bytes], tuple[object, int]] = OrderedDict()
        self._decoded_bytes = 0
        self._decoded_lock = threading.Lock()
        # The latest events of each session, as its appends wrote them (tails.py).
        self._tails = Tails()

    def generation(self, session_id: str, route_id: str) -> Generation:
        return self._generations.of(session_id, route_id)

    def table_generation(self, session_id: str, table: str) -> tuple[int, int]:
        return self._generations.of_table(session_id, table)

    def _write(self, batch: Batch, session_id: str = "", route_id: str = "") -> None:
        """Every write goes through here. One that names no session (sources) may change
        what any session's compile reads."""
        self._forget_decoded(batch)
        self._kv.write(batch)
        if not session_id:
            # Before the bump: a compile that takes the new generation on another thread
            # must not read a source list kept from before the write (it would be
            # repeated as current until the next write).
            self._sources_changed()
        tables = {put[0] for put in batch.puts}
        tables.update(cf for cf, _ in batch.deletes)
        tables.update(cf for cf, _, _ in batch.ranges)
        self._generations.wrote(session_id, route_id, everything=not session_id, tables=tables)

    def _forget_decoded(self, batch: Batch) -> None:
        """Before a write: the kept values of the keys it changes are dropped (all of them
        for a range), so a reader meanwhile reads the store, never a value it replaces."""
        if any(cf == "events" for cf, _, _ in batch.ranges):
            self._tails.forget()  # a session deleted: rare, so every tail goes
        with self._decoded_lock:
            if not self._decoded:
                return
            if any(cf in _DECODED_CFS for cf, _, _ in batch.ranges):
                self._decoded.clear()
                self._decoded_bytes = 0
                return
            for cf, key, _ in batch.puts:
                self._drop_decoded((cf, key))
            for cf, key in batch.deletes:
                self._drop_decoded((cf, key))

    def _drop_decoded(self, key: tuple[str, bytes]) -> None:
        kept = self._decoded.pop(key, None)
        if kept is not None:
            self._decoded_bytes -= kept[1]

    def _remember_decoded(self, cf: str, key: bytes, value: object, size: int) -> None:
        """After the write of `value` (`size` bytes encoded) under `key`, made holding the
        session's lock. A value over the whole budget is not kept."""
        with self._decoded_lock:
            self._drop_decoded((cf, key))
            if size > DECODED_BYTES:
                return
            self._decoded[(cf, key)] = (value, size)
            self._decoded_bytes += size
            while len(self._decoded) > _DECODED or self._decoded_bytes > DECODED_BYTES:
                self._decoded_bytes -= self._decoded.popitem(last=False)[1][1]

    def _decoded_value(self, cf: str, key: bytes, cls: type[T]) -> T | None:
        with self._decoded_lock:
            kept = self._decoded.get((cf, key))
        return kept[0] if kept is not None and isinstance(kept[0], cls) else None

    def _stored_value(self, cf: str, key: bytes, cls: type[T]) -> T | None:
        """The value under `key` as kept decoded, else as read (not kept: a look, not a
        use); None when there is none. Raises CorruptRecordError when it does not decode."""
        kept = self._decoded_value(cf, key, cls)
        if kept is not None:
            return kept
        raw = self._kv.get(cf, key)
        return None if raw is None else decode_value(raw, cls)

    def decoded_footprint(self) -> tuple[int, int]:
        """(records, encoded bytes) of the decoded records kept now."""
        with self._decoded_lock:
            return len(self._decoded), self._decoded_bytes

    def _lock(self, session_id: str) -> threading.Lock:
        return self._stripes[zlib.crc32(session_id.encode()) % _STRIPES]

    @contextlib.contextmanager
    def _blob_locks(self, shas: Iterable[str]) -> Iterator[None]:
        """Holds the locks of these blobs. A blob is shared by every session holding it,
        under session locks of their own: a session's delete decides that a blob has no
        other holder, and another session's write decides that the blob is already stored
        and adds only its reference. Each holds the blob's lock from that decision to its
        write, or the delete could remove a blob the other just acknowledged. Taken in
        stripe order, after the session's lock and never before one, so no two wait on
        each other."""
        stripes = sorted({zlib.crc32(sha.encode()) % _BLOB_STRIPES for sha in shas})
        with contextlib.ExitStack() as held:
            for stripe in stripes:
                held.enter_context(self._blob_stripes[stripe])
            yield

    def session_of_life(self, session_id: str, created_ns: int) -> Session:
        """The session, when it is the one made at `created_ns` (0: any). Else
        SESSION_NOT_FOUND: the one a caller read (its log, its artifacts, its registry)
        was deleted since and another made under the id, which must not get what was
        meant for the first. Called under the session's lock by writers."""
        session = self.get_session(session_id)
        if created_ns and session.create_time_ns != created_ns:
            raise session_not_found(session_id)
        return session

    def get_session(self, session_id: str) -> Session:
        kept = self._decoded_value("sessions", session_id.encode(), Session)
        if kept is not None:
            return kept
        raw = self._kv.get("sessions", session_id.encode())
        if raw is None:
            raise session_not_found(session_id)
        try:
            return decode_value(raw, Session)
        except CorruptRecordError as exc:
            exc.detail = f"session {session_id!r}: {exc.detail}"  # the log says which
            raise

    def _check_quota(self, session: Session, added: int) -> None:
        if session.stored_bytes + added > self.limits.max_session_bytes:
            raise CtxccError(
                Reason.QUOTA_EXCEEDED,
                f"session {session.session_id!r} would hold {session.stored_bytes + added} bytes, "
                f"over its limit of {self.limits.max_session_bytes}",
                quota="max_session_bytes",
            )

    def _add_blobs(self, batch: Batch, sid: str, blobs: tuple[tuple[str, bytes], ...]) -> int:
        """Stage content-addressed blobs and this session's references; returns new bytes.
        The caller holds the blobs' locks (`_blob_locks`) until the batch is written."""
        added = 0
        for sha, data in blobs:
            ref = b"S" + session_key(sid, sha.encode())
            if self._kv.get("refs", ref) is not None:
                continue  # the session already holds this blob
            if self._kv.get("blobs", sha.encode()) is None:
                batch.put("blobs", sha.encode(), data)
            batch.put("refs", ref, b"")
            batch.put("refs", b"B" + sha.encode() + SEP + sid.encode(), b"")
            added += len(data)
        return added

    def get_blob(self, sha256: str) -> bytes | None:
        return self._kv.get("blobs", sha256.encode())

    def _sources_changed(self) -> None:
        with self._sources_lock:
            self._sources_gen += 1
            self._sources.clear()
            # Also after a session is deleted: its compile parts went with it.
            self._parts.clear()
            self._staged.clear()
