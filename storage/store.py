"""The event store: the canonical history of R-HIST-1 over an ordered KV engine.

Rules this module keeps:
- every mutating call builds one Batch and writes it once: all or nothing;
- appends to one session are serialized by a striped lock, so "read head, check,
  write" cannot interleave; different sessions append in parallel and share fsyncs
  through RocksDB's group commit;
- events are never rewritten; only DeleteSession removes them, all at once.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import zlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from server.domain.errors import CtxccError, Reason, session_not_found
from server.domain.generation import Generation
from server.domain.model import (
    AppendBatch,
    AppendResult,
    DeleteResult,
    Event,
    EventKind,
    Route,
    Session,
    ToolResult,
    starts_turn,
)
from server.domain.records import (
    ArtifactRecord,
    Checkpoint,
    CompileRecord,
    DamagedCheckpoint,
    RouteModel,
    RouteState,
    Usage,
)
from server.domain.sources import (
    MemoryEntry,
    RuleEntry,
    Scope,
    SkillEntry,
    SourceEntry,
    SourceKind,
    entry_id,
    kind_of_entry,
)
from server.domain.tools import ToolActivations, ToolSpec
from storage.codec import (
    CorruptRecordError,
    decode_event,
    decode_value,
    encode_event,
    encode_value,
)
from storage.generations import Generations
from storage.kv import KV, Batch, Footprint
from storage.schema import ensure_schema

T = TypeVar("T")

_SEP = b"\x00"
_END = b"\x01"  # sid + _END sorts right after every key with prefix sid + _SEP
# Daemon-wide route models in `routes`: no session id starts with 0x00, so these keys
# never fall inside a session's key range (and survive its deletion).
_ROUTE_MODEL = _SEP + b"model" + _SEP
_COUNT_KEY = b"session_count"
_STRIPES = 256

log = logging.getLogger("ctxcc.storage")


def _finite(model: RouteModel) -> bool:
    """A NaN or an infinity decodes fine but would turn every estimate on the route into
    an error (an integer cannot be rounded from it)."""
    figures = [model.ratio, model.overhead, model.overhead_spread, model.full_local]
    figures.append(model.framing)
    figures += [x for pair in model.ratio_observations for x in pair]
    return all(math.isfinite(x) for x in figures)


# Key suffix of the copy of a session's latest compile record; compile suffixes are hex.
_LAST_COMPILE = b"\xff"
# Key infix of the parts compiles read (sources, tools, settings), by content digest.
_PART = b"\xfe"
# Key infix of "latest compile at event boundary N" (big-endian N -> compile suffix).
_AT_BOUNDARY = b"\xfd"
# (UTF-8 never yields 0xfd-0xff, so no client-given compile id can name these keys.)
# Key infix of tool activations; tool names never start with 0xff.
_ACTIVATIONS = b"\xff"
_SOURCE_TYPES: dict[SourceKind, type[SourceEntry]] = {
    SourceKind.MEMORY: MemoryEntry,
    SourceKind.RULE: RuleEntry,
    SourceKind.SKILL: SkillEntry,
}


def _source_prefix(kind: SourceKind, scope: Scope | None = None, scope_id: str = "") -> bytes:
    key = kind.value.encode() + _SEP
    if scope is not None:
        key += str(int(scope)).encode() + _SEP + scope_id.encode() + _SEP
    return key


_MAX_SEQ = (1 << 64) - 1
# Source lists kept decoded (three scopes and three kinds per session compiled).
_SOURCE_LISTS = 4_096
# Compile part keys remembered as stored.
_KNOWN_PARTS = 8_192


def _be64(n: int) -> bytes:
    return n.to_bytes(8, "big")


def _prefix(session_id: str) -> bytes:
    return session_id.encode() + _SEP


def _key(session_id: str, suffix: bytes) -> bytes:
    return _prefix(session_id) + suffix


def _after(prefix: bytes) -> bytes:
    """The smallest key greater than every key starting with `prefix` (ends in 0x00)."""
    return prefix[:-1] + bytes([prefix[-1] + 1])


@dataclass(frozen=True, slots=True)
class IdempotencyRecord:
    digest: str
    first_seq: int
    last_seq: int
    event_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class StoreLimits:
    max_sessions: int = 100_000
    max_session_bytes: int = 1 << 30


def split_compile_id(compile_id: str) -> tuple[str, bytes]:
    """Compile ids are `<session id>:<suffix>`, so usage reports find their session."""
    session_id, sep, suffix = compile_id.partition(":")
    if not sep or not session_id or not suffix:
        raise CtxccError(Reason.COMPILE_NOT_FOUND, f"compile {compile_id!r} does not exist")
    return session_id, suffix.encode()


class KVEventStore:
    def __init__(self, kv: KV, limits: StoreLimits | None = None) -> None:
        self._kv = kv
        self.limits = limits or StoreLimits()
        self.opened_schema_version = ensure_schema(kv)
        self._stripes = [threading.Lock() for _ in range(_STRIPES)]
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
        # Bumped by every write (through `_write`), so the service can keep what a
        # compile read for as long as nothing it read was written.
        self._generations = Generations()

    def generation(self, session_id: str, route_id: str) -> Generation:
        return self._generations.of(session_id, route_id)

    def _write(self, batch: Batch, session_id: str = "", route_id: str = "") -> None:
        """Every write goes through here. One that names no session (sources) may change
        what any session's compile reads."""
        self._kv.write(batch)
        if not session_id:
            # Before the bump: a compile that takes the new generation on another thread
            # must not read a source list kept from before the write (it would be
            # repeated as current until the next write).
            self._sources_changed()
        self._generations.wrote(session_id, route_id, everything=not session_id)

    def _lock(self, session_id: str) -> threading.Lock:
        return self._stripes[zlib.crc32(session_id.encode()) % _STRIPES]

    # -- sessions -----------------------------------------------------------------

    def create_session(self, session: Session) -> Session:
        with self._sessions_lock, self._lock(session.session_id):
            if self._kv.get("sessions", session.session_id.encode()) is not None:
                raise CtxccError(
                    Reason.SESSION_ALREADY_EXISTS,
                    f"session {session.session_id!r} already exists",
                    session_id=session.session_id,
                )
            count = self.count_sessions()
            if count >= self.limits.max_sessions:
                raise CtxccError(
                    Reason.QUOTA_EXCEEDED,
                    f"the daemon holds {count} sessions, its limit",
                    quota="max_sessions",
                )
            batch = Batch()
            batch.put("sessions", session.session_id.encode(), encode_value(session))
            batch.put("meta", _COUNT_KEY, _be64(count + 1))
            self._write(batch, session.session_id)
            return session

    def get_session(self, session_id: str) -> Session:
        raw = self._kv.get("sessions", session_id.encode())
        if raw is None:
            raise session_not_found(session_id)
        return decode_value(raw, Session)

    def count_sessions(self) -> int:
        raw = self._kv.get("meta", _COUNT_KEY)
        return 0 if raw is None else int.from_bytes(raw, "big")

    def list_sessions(self, after: str, limit: int, project_id: str = "") -> list[Session]:
        start = after.encode() + _SEP if after else b""
        out: list[Session] = []
        for _, raw in self._kv.scan("sessions", start, b"\xff"):
            session = decode_value(raw, Session)
            if project_id and session.project_id != project_id:
                continue
            out.append(session)
            if len(out) >= limit:
                break
        return out

    def delete_session(self, session_id: str) -> DeleteResult:
        with self._sessions_lock, self._lock(session_id):
            session = self.get_session(session_id)
            batch = Batch()
            deleted_blobs = 0
            ref_prefix = b"S" + _prefix(session_id)
            for key, _ in self._kv.scan("refs", ref_prefix, b"S" + session_id.encode() + _END):
                sha = key[len(ref_prefix) :]
                batch.delete("refs", key)
                batch.delete("refs", b"B" + sha + _SEP + session_id.encode())
                holders = self._kv.scan("refs", b"B" + sha + _SEP, b"B" + sha + _END)
                if all(k[len(sha) + 2 :] == session_id.encode() for k, _ in holders):
                    batch.delete("blobs", sha)
                    deleted_blobs += 1
            lo, hi = _prefix(session_id), session_id.encode() + _END
            for cf in (
                "events",
                "event_ids",
                "requests",
                "artifacts",
                "checkpoints",
                "routes",
                "tools",
            ):
                batch.delete_range(cf, lo, hi)
            batch.delete_range("compiles", lo, hi)
            for kind in SourceKind:  # session-scoped memory, rules and skills go too
                prefix = _source_prefix(kind, Scope.SESSION, session_id)
                batch.delete_range("sources", prefix, _after(prefix))
            batch.delete("sessions", session_id.encode())
            batch.put("meta", _COUNT_KEY, _be64(max(0, self.count_sessions() - 1)))
            self._kv.write(batch)
            self._sources_changed()  # before the bump, as in `_write`
            self._generations.forget(session_id)
            return DeleteResult(deleted_events=session.head_seq, deleted_blobs=deleted_blobs)

    # -- events -------------------------------------------------------------------

    def append(self, batch_in: AppendBatch) -> AppendResult:
        sid = batch_in.session_id
        with self._lock(sid):
            session = self.get_session(sid)
            if batch_in.request_id:
                replay = self._replayed(sid, batch_in)
                if replay is not None:
                    return replay
            head = session.head_seq
            if batch_in.expected_last_seq is not None and batch_in.expected_last_seq != head:
                raise CtxccError(
                    Reason.SEQUENCE_MISMATCH,
                    f"expected_last_seq {batch_in.expected_last_seq}, session head {head}",
                    head_seq=str(head),
                )
            self._check_event_ids(sid, batch_in)
            batch = Batch()
            added = 0
            ids: list[str] = []
            for offset, new in enumerate(batch_in.events, start=1):
                record = encode_event(head + offset, new.event_id, batch_in.now_ns, new.payload)
                batch.put("events", _key(sid, _be64(head + offset)), record)
                batch.put("event_ids", _key(sid, new.event_id.encode()), _be64(head + offset))
                added += len(record)
                ids.append(new.event_id)
            added += self._add_blobs(batch, sid, batch_in.blobs)
            last = head + len(batch_in.events)
            self._check_quota(session, added)
            result = AppendResult(first_seq=head + 1, last_seq=last, event_ids=tuple(ids))
            if batch_in.request_id:
                idem = IdempotencyRecord(batch_in.request_digest, head + 1, last, tuple(ids))
                batch.put("requests", _key(sid, batch_in.request_id.encode()), encode_value(idem))
            updated = dataclasses.replace(
                session,
                head_seq=last,
                update_time_ns=batch_in.now_ns,
                stored_bytes=session.stored_bytes + added,
            )
            batch.put("sessions", sid.encode(), encode_value(updated))
            self._write(batch, sid)
            return result

    def _replayed(self, sid: str, batch_in: AppendBatch) -> AppendResult | None:
        raw = self._kv.get("requests", _key(sid, batch_in.request_id.encode()))
        if raw is None:
            return None
        idem = decode_value(raw, IdempotencyRecord)
        if idem.digest != batch_in.request_digest:
            raise CtxccError(
                Reason.REQUEST_ID_REUSED,
                f"request_id {batch_in.request_id!r} was used for a different append",
                request_id=batch_in.request_id,
            )
        return AppendResult(idem.first_seq, idem.last_seq, idem.event_ids, replayed=True)

    def _check_event_ids(self, sid: str, batch_in: AppendBatch) -> None:
        seen: set[str] = set()
        for new in batch_in.events:
            taken = new.event_id in seen
            taken = taken or self._kv.get("event_ids", _key(sid, new.event_id.encode())) is not None
            if taken:
                raise CtxccError(
                    Reason.EVENT_ID_CONFLICT,
                    f"event id {new.event_id!r} already exists in session {sid!r}",
                    event_id=new.event_id,
                )
            seen.add(new.event_id)

    def _add_blobs(self, batch: Batch, sid: str, blobs: tuple[tuple[str, bytes], ...]) -> int:
        """Stage content-addressed blobs and this session's references; returns new bytes."""
        added = 0
        for sha, data in blobs:
            ref = b"S" + _key(sid, sha.encode())
            if self._kv.get("refs", ref) is not None:
                continue  # the session already holds this blob
            if self._kv.get("blobs", sha.encode()) is None:
                batch.put("blobs", sha.encode(), data)
            batch.put("refs", ref, b"")
            batch.put("refs", b"B" + sha.encode() + _SEP + sid.encode(), b"")
            added += len(data)
        return added

    def _check_quota(self, session: Session, added: int) -> None:
        if session.stored_bytes + added > self.limits.max_session_bytes:
            raise CtxccError(
                Reason.QUOTA_EXCEEDED,
                f"session {session.session_id!r} would hold {session.stored_bytes + added} bytes, "
                f"over its limit of {self.limits.max_session_bytes}",
                quota="max_session_bytes",
            )

    def read_events(
        self,
        session_id: str,
        after_seq: int = 0,
        limit: int | None = None,
        kinds: frozenset[EventKind] = frozenset(),
        through_seq: int | None = None,
    ) -> list[Event]:
        if after_seq >= _MAX_SEQ:
            return []  # nothing can follow the largest sequence number
        start = _key(session_id, _be64(after_seq + 1))
        end = (
            _key(session_id, _be64(through_seq + 1))
            if through_seq is not None and through_seq < _MAX_SEQ
            else session_id.encode() + _END
        )
        out: list[Event] = []
        for key, raw in self._kv.scan("events", start, end):
            event = decode_event(raw, int.from_bytes(key[-8:], "big"))
            if kinds and event.kind not in kinds:
                continue
            out.append(event)
            if limit is not None and len(out) >= limit:
                break
        return out

    def last_turn_start(self, session_id: str, through_seq: int) -> Event | None:
        """The latest user message (original or imported) at or before `through_seq`."""
        start, end = _key(session_id, _be64(1)), _key(session_id, _be64(through_seq + 1))
        for key, raw in self._kv.scan("events", start, end, reverse=True):
            event = decode_event(raw, int.from_bytes(key[-8:], "big"))
            if starts_turn(event.payload):
                return event
        return None

    def find_tool_result(self, session_id: str, call_id: str) -> Event | None:
        """The latest result event of a call."""
        lo, hi = _prefix(session_id), session_id.encode() + _END
        for key, raw in self._kv.scan("events", lo, hi, reverse=True):
            event = decode_event(raw, int.from_bytes(key[-8:], "big"))
            if isinstance(event.payload, ToolResult) and event.payload.call_id == call_id:
                return event
        return None

    # -- tool registry ------------------------------------------------------------

    def put_tools(self, session_id: str, specs: tuple[ToolSpec, ...], replace_all: bool) -> int:
        with self._lock(session_id):
            self.get_session(session_id)
            batch = Batch()
            current = {s.name for s in self.list_tools(session_id)}
            if replace_all:
                for name in current - {s.name for s in specs}:
                    batch.delete("tools", _key(session_id, name.encode()))
                current = set()
            for spec in specs:
                batch.put("tools", _key(session_id, spec.name.encode()), encode_value(spec))
            self._write(batch, session_id)
            return len(current | {s.name for s in specs})

    def list_tools(self, session_id: str) -> list[ToolSpec]:
        lo, hi = _prefix(session_id), _key(session_id, _ACTIVATIONS)
        return [decode_value(raw, ToolSpec) for _, raw in self._kv.scan("tools", lo, hi)]

    def add_activations(self, session_id: str, turn_seq: int, names: tuple[str, ...]) -> None:
        key = _key(session_id, _ACTIVATIONS + _be64(turn_seq))
        with self._lock(session_id):
            old = self.get_activations(session_id, turn_seq)
            merged = ToolActivations(turn_seq, tuple(sorted(set(old) | set(names))))
            batch = Batch()
            batch.put("tools", key, encode_value(merged))
            self._write(batch, session_id)

    def get_activations(self, session_id: str, turn_seq: int) -> tuple[str, ...]:
        raw = self._kv.get("tools", _key(session_id, _ACTIVATIONS + _be64(turn_seq)))
        return () if raw is None else decode_value(raw, ToolActivations).names

    def get_blob(self, sha256: str) -> bytes | None:
        return self._kv.get("blobs", sha256.encode())

    # -- artifacts ----------------------------------------------------------------

    def put_artifact(self, record: ArtifactRecord, data: bytes) -> ArtifactRecord:
        """Stores the artifact, or returns the one already stored under its id (an upload
        retried with its request id), never storing or counting the bytes twice."""
        sid = record.session_id
        with self._lock(sid):
            session = self.get_session(sid)
            existing = self.get_artifact_record(sid, record.artifact_id)
            if existing is not None:
                if existing.sha256 != record.sha256:
                    raise CtxccError(
                        Reason.REQUEST_ID_REUSED,
                        "request_id was used for an upload with other content",
                    )
                return existing
            batch = Batch()
            added = self._add_blobs(batch, sid, ((record.sha256, data),))
            encoded = encode_value(record)
            added += len(encoded)
            self._check_quota(session, added)
            batch.put("artifacts", _key(sid, record.artifact_id.encode()), encoded)
            updated = dataclasses.replace(session, stored_bytes=session.stored_bytes + added)
            batch.put("sessions", sid.encode(), encode_value(updated))
            self._write(batch, sid)
            return record

    def get_artifact_record(self, session_id: str, artifact_id: str) -> ArtifactRecord | None:
        raw = self._kv.get("artifacts", _key(session_id, artifact_id.encode()))
        return None if raw is None else decode_value(raw, ArtifactRecord)

    def get_artifact(self, session_id: str, artifact_id: str) -> tuple[ArtifactRecord, bytes]:
        raw = self._kv.get("artifacts", _key(session_id, artifact_id.encode()))
        data = None
        if raw is not None:
            record = decode_value(raw, ArtifactRecord)
            data = self.get_blob(record.sha256)
        if raw is None or data is None:
            raise CtxccError(
                Reason.ARTIFACT_NOT_FOUND,
                f"artifact {artifact_id!r} does not exist in session {session_id!r}",
                artifact_id=artifact_id,
            )
        return record, data

    # -- checkpoints, compiles, routes -------------------------------------------

    def put_checkpoint(self, checkpoint: Checkpoint) -> Checkpoint:
        """Stores the checkpoint, or returns the one already stored under its id: creates
        racing with one request id store one record (the session lock orders them)."""
        sid = checkpoint.session_id
        key = _key(sid, _be64(checkpoint.create_time_ns) + checkpoint.checkpoint_id.encode())
        with self._lock(sid):
            for existing in self.list_checkpoints(sid):
                if existing.checkpoint_id == checkpoint.checkpoint_id:
                    return existing
            session = self.get_session(sid)
            encoded = encode_value(checkpoint)
            # Summaries count against the session's byte quota like events do.
            self._check_quota(session, len(encoded))
            batch = Batch()
            batch.put("checkpoints", key, encoded)
            updated = dataclasses.replace(session, stored_bytes=session.stored_bytes + len(encoded))
            batch.put("sessions", sid.encode(), encode_value(updated))
            self._write(batch, sid)
            return checkpoint

    def list_checkpoint_entries(self, session_id: str) -> list[Checkpoint | DamagedCheckpoint]:
        """Newest first; a record that does not decode is listed as damaged, not raised."""
        prefix = _prefix(session_id)
        out: list[Checkpoint | DamagedCheckpoint] = []
        for key, raw in self._kv.scan(
            "checkpoints", prefix, session_id.encode() + _END, reverse=True
        ):
            try:
                out.append(decode_value(raw, Checkpoint))
            except CorruptRecordError:
                rest = key[len(prefix) :]
                ckpt_id = rest[8:].decode(errors="replace")
                out.append(DamagedCheckpoint(ckpt_id, session_id, int.from_bytes(rest[:8], "big")))
        return out

    def list_checkpoints(self, session_id: str) -> list[Checkpoint]:
        """Newest first, damaged records left out."""
        entries = self.list_checkpoint_entries(session_id)
        return [c for c in entries if isinstance(c, Checkpoint)]

    def put_compile(
        self,
        record: CompileRecord,
        parts: tuple[tuple[str, object], ...] = (),
        wait: bool = True,
    ) -> bool:
        """Stores the record, the parts it names that are not stored yet (content-addressed
        by the caller's digest, so unchanged sources cost nothing), and the boundary index.
        Without `wait`, writes nothing and answers False when the session's lock is held
        (an append may hold it through its fsync)."""
        sid, suffix = split_compile_id(record.compile_id)
        encoded = encode_value(record)
        # A compile record lost in a machine crash only turns its usage report into
        # COMPILE_NOT_FOUND: not worth an fsync on every step.
        batch = Batch(durable=False)
        keys = [_key(sid, _PART + digest.encode()) for digest, _ in parts]
        with self._sources_lock:
            known = [key in self._parts for key in keys]
        for key, (_, value), stored in zip(keys, parts, known, strict=True):
            if not stored and self._kv.get("compiles", key) is None:
                batch.put("compiles", key, encode_value(value))
        batch.put("compiles", _key(sid, suffix), encoded)
        batch.put("compiles", _key(sid, _LAST_COMPILE), encoded)
        batch.put("compiles", _key(sid, _AT_BOUNDARY + _be64(record.event_boundary)), suffix)
        lock = self._lock(sid)
        if not lock.acquire(blocking=wait):
            return False
        try:
            self._move_route(batch, sid, record.route)
            self._write(batch, sid)
        finally:
            lock.release()
        with self._sources_lock:
            for key in keys:
                self._parts[key] = None
                self._parts.move_to_end(key)
            while len(self._parts) > _KNOWN_PARTS:
                self._parts.popitem(last=False)
        return True

    def _move_route(self, batch: Batch, sid: str, route: Route) -> None:
        """Session.current_route follows the latest compile or usage report."""
        session = self.get_session(sid)
        if session.current_route != route:
            moved = dataclasses.replace(session, current_route=route)
            batch.put("sessions", sid.encode(), encode_value(moved))

    def get_last_compile(self, session_id: str) -> CompileRecord | None:
        raw = self._kv.get("compiles", _key(session_id, _LAST_COMPILE))
        return None if raw is None else decode_value(raw, CompileRecord)

    def list_compiles(self, session_id: str) -> list[CompileRecord]:
        # Suffixes are random hex, so key order is not time order; the boundary index,
        # the parts and the copy of the latest record sit at 0xfd..0xff, past every hex
        # suffix, and are excluded.
        prefix = _prefix(session_id)
        items = self._kv.scan("compiles", prefix, prefix + _AT_BOUNDARY)
        records = [decode_value(raw, CompileRecord) for _, raw in items]
        return sorted(records, key=lambda r: (r.create_time_ns, r.compile_id))

    def get_compile_part(self, session_id: str, digest: str, cls: type[T]) -> T | None:
        raw = self._kv.get("compiles", _key(session_id, _PART + digest.encode()))
        return None if raw is None else decode_value(raw, cls)

    def compile_at(self, session_id: str, boundary: int) -> CompileRecord | None:
        """The latest recorded compile whose event boundary is `boundary`."""
        suffix = self._kv.get("compiles", _key(session_id, _AT_BOUNDARY + _be64(boundary)))
        if suffix is None:
            return None
        raw = self._kv.get("compiles", _key(session_id, suffix))
        return None if raw is None else decode_value(raw, CompileRecord)

    def get_compile(self, compile_id: str) -> CompileRecord:
        sid, suffix = split_compile_id(compile_id)
        raw = self._kv.get("compiles", _key(sid, suffix))
        if raw is None:
            raise CtxccError(Reason.COMPILE_NOT_FOUND, f"compile {compile_id!r} does not exist")
        return decode_value(raw, CompileRecord)

    def record_usage(
        self,
        compile_id: str,
        usage: Usage,
        route_state: RouteState,
        learn: Callable[[RouteModel | None], RouteModel] | None = None,
    ) -> tuple[CompileRecord, bool]:
        """Usage, the session's new baseline and (through `learn`, called once per
        report, never on a repeat) the route's model, in one atomic batch."""
        done = self._record_usage(compile_id, usage, route_state, learn, True)
        assert done is not None  # waiting, it always gets its locks
        return done

    def try_record_usage(
        self,
        compile_id: str,
        usage: Usage,
        route_state: RouteState,
        learn: Callable[[RouteModel | None], RouteModel] | None = None,
    ) -> tuple[CompileRecord, bool] | None:
        """record_usage, or None (nothing written) when it would wait for a lock."""
        return self._record_usage(compile_id, usage, route_state, learn, False)

    def _record_usage(
        self,
        compile_id: str,
        usage: Usage,
        route_state: RouteState,
        learn: Callable[[RouteModel | None], RouteModel] | None,
        wait: bool,
    ) -> tuple[CompileRecord, bool] | None:
        sid, suffix = split_compile_id(compile_id)
        lock = self._lock(sid)
        if not lock.acquire(blocking=wait):
            return None
        try:
            record = self.get_compile(compile_id)
            if record.usage is not None:
                return record, True
            updated = dataclasses.replace(record, usage=usage)
            # Losing a baseline only means the next estimate is a full one.
            batch = Batch(durable=False)
            batch.put("compiles", _key(sid, suffix), encode_value(updated))
            self._move_route(batch, sid, record.route)
            batch.put("routes", _key(sid, route_state.route_id.encode()), encode_value(route_state))
            if learn is None:
                self._write(batch, sid)
                return updated, False
            # Sessions on one route report concurrently.
            if not self._models_lock.acquire(blocking=wait):
                return None
            try:
                model = learn(self.get_route_model(route_state.route_id))
                batch.put("routes", _ROUTE_MODEL + model.route_id.encode(), encode_value(model))
                self._write(batch, sid, model.route_id)
            finally:
                self._models_lock.release()
            return updated, False
        finally:
            lock.release()

    def get_route_model(self, route_id: str) -> RouteModel | None:
        """None also for a damaged model: it is only learned advice, so the route starts
        over (the next report rewrites it) instead of failing every compile on it."""
        raw = self._kv.get("routes", _ROUTE_MODEL + route_id.encode())
        if raw is None:
            return None
        try:
            model = decode_value(raw, RouteModel)
        except CorruptRecordError as exc:
            log.warning("route model %s ignored and relearned: %s", route_id, exc.detail)
            return None
        if not _finite(model):
            log.warning("route model %s ignored and relearned: a non-finite figure", route_id)
            return None
        return model

    # -- sources: memory, rules, skills registered over the API ------------------------

    def put_source(self, entry: SourceEntry) -> None:
        kind = kind_of_entry(entry)
        key = _source_prefix(kind, entry.scope, entry.scope_id) + entry_id(entry).encode()
        batch = Batch()
        batch.put("sources", key, encode_value(entry))
        self._write(batch)

    def list_sources(
        self, kind: SourceKind, scope: Scope | None = None, scope_id: str = ""
    ) -> list[SourceEntry]:
        prefix = _source_prefix(kind, scope, scope_id)
        with self._sources_lock:
            hit = self._sources.get(prefix)
            if hit is not None:
                self._sources.move_to_end(prefix)
                return list(hit)
            gen = self._sources_gen
        cls = _SOURCE_TYPES[kind]
        found = tuple(
            decode_value(raw, cls) for _, raw in self._kv.scan("sources", prefix, _after(prefix))
        )
        with self._sources_lock:
            if gen == self._sources_gen:
                self._sources[prefix] = found
                if len(self._sources) > _SOURCE_LISTS:
                    self._sources.popitem(last=False)
        return list(found)

    def delete_source(self, kind: SourceKind, scope: Scope, scope_id: str, ident: str) -> None:
        key = _source_prefix(kind, scope, scope_id) + ident.encode()
        if self._kv.get("sources", key) is None:
            raise CtxccError(
                Reason.SOURCE_NOT_FOUND, f"{kind.value} {ident!r} does not exist in that scope"
            )
        batch = Batch()
        batch.delete("sources", key)
        self._write(batch)

    def _sources_changed(self) -> None:
        with self._sources_lock:
            self._sources_gen += 1
            self._sources.clear()
            # Also after a session is deleted: its compile parts went with it.
            self._parts.clear()

    def get_route_state(self, session_id: str, route_id: str) -> RouteState | None:
        raw = self._kv.get("routes", _key(session_id, route_id.encode()))
        return None if raw is None else decode_value(raw, RouteState)

    def approximate_size(self) -> int:
        return self._kv.approximate_size()

    def footprint(self) -> Footprint:
        return self._kv.footprint()

    def writable(self) -> bool:
        """False while the disk is too full to write; may recover the engine in place."""
        return self._kv.writable()

    def close(self) -> None:
        self._kv.close()
