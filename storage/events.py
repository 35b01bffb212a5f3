"""Events and artifacts of the event store: what a session holds, counted against its quota."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass

from server.domain.errors import CtxccError, Reason
from server.domain.model import (
    AppendBatch,
    AppendResult,
    Event,
    EventKind,
    EventPage,
    ToolResult,
    starts_turn,
)
from server.domain.records import ArtifactRecord
from storage.codec import decode_event, decode_value, encode_event, encode_value
from storage.keys import END, MAX_SEQ, be64, session_key, session_prefix
from storage.kv import Batch
from storage.store_core import StoreCore


@dataclass(frozen=True, slots=True)
class IdempotencyRecord:
    digest: str
    first_seq: int
    last_seq: int
    event_ids: tuple[str, ...]


class EventRecords(StoreCore):
    def append(self, batch_in: AppendBatch) -> AppendResult:
        sid = batch_in.session_id
        with self._lock(sid), self._blob_locks(sha for sha, _ in batch_in.blobs):
            # Its references were checked against this session: one made again under the
            # id since holds none of those artifacts.
            session = self.session_of_life(sid, batch_in.session_created_ns)
            if batch_in.request_id:
                replay = self._replayed(sid, batch_in)
                if replay is not None:
                    # The append it replays may be written and not yet synced (a step's
                    # fsync runs beside its compile): acknowledged only once durable.
                    self._kv.sync()
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
            sizes: list[int] = []
            for offset, new in enumerate(batch_in.events, start=1):
                record = encode_event(head + offset, new.event_id, batch_in.now_ns, new.payload)
                batch.put("events", session_key(sid, be64(head + offset)), record)
                batch.put("event_ids", session_key(sid, new.event_id.encode()), be64(head + offset))
                added += len(record)
                ids.append(new.event_id)
                sizes.append(len(record))
            added += self._add_blobs(batch, sid, batch_in.blobs)
            last = head + len(batch_in.events)
            self._check_quota(session, added)
            result = AppendResult(
                first_seq=head + 1,
                last_seq=last,
                event_ids=tuple(ids),
                session_create_ns=session.create_time_ns,
            )
            if batch_in.request_id:
                idem = IdempotencyRecord(batch_in.request_digest, head + 1, last, tuple(ids))
                batch.put(
                    "requests", session_key(sid, batch_in.request_id.encode()), encode_value(idem)
                )
            updated = dataclasses.replace(
                session,
                head_seq=last,
                update_time_ns=batch_in.now_ns,
                stored_bytes=session.stored_bytes + added,
            )
            session_bytes = encode_value(updated)
            batch.put("sessions", sid.encode(), session_bytes)
            self._write(batch, sid)
            self._remember_decoded("sessions", sid.encode(), updated, len(session_bytes))
            written = [
                Event(head + offset, new.event_id, batch_in.now_ns, new.payload)
                for offset, new in enumerate(batch_in.events, start=1)
            ]
            self._tails.wrote(sid, written, sizes)
            return result

    def _replayed(self, sid: str, batch_in: AppendBatch) -> AppendResult | None:
        raw = self._kv.get("requests", session_key(sid, batch_in.request_id.encode()))
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
            taken = (
                taken
                or self._kv.get("event_ids", session_key(sid, new.event_id.encode())) is not None
            )
            if taken:
                raise CtxccError(
                    Reason.EVENT_ID_CONFLICT,
                    f"event id {new.event_id!r} already exists in session {sid!r}",
                    event_id=new.event_id,
                )
            seen.add(new.event_id)

    def read_events(
        self,
        session_id: str,
        after_seq: int = 0,
        limit: int | None = None,
        kinds: frozenset[EventKind] = frozenset(),
        through_seq: int | None = None,
        session_created_ns: int = 0,
    ) -> list[Event]:
        """Events after `after_seq` (through `through_seq`), up to `limit`, of `kinds`.
        `session_created_ns`: the create time of the session whose log the caller reads
        (a watch's), when it is checked: the log is read by session id alone, and a
        session deleted and made again under its id before the read would hand over
        the new log's events at the seqs the caller expects of the old one. Checked after
        the read, so anything the read saw of another log is refused (SESSION_NOT_FOUND,
        as a deleted session's watch ends)."""
        out = self._read_events(session_id, after_seq, limit, kinds, through_seq)
        self._check_incarnation(session_id, session_created_ns)
        return out

    def read_event_page(
        self,
        session_id: str,
        after_seq: int,
        limit: int,
        kinds: frozenset[EventKind],
        max_bytes: int,
        session_created_ns: int = 0,
    ) -> EventPage:
        out: list[Event] = []
        more = False
        read = largest = 0
        for key, raw in self._scan_events(session_id, after_seq, None):
            if len(out) >= limit or (out and read > max_bytes):
                more = True  # stopped with this one left
                break
            event = decode_event(raw, int.from_bytes(key[-8:], "big"))
            read += len(raw)
            if not kinds or event.kind in kinds:
                out.append(event)
                largest = max(largest, len(raw))
        self._check_incarnation(session_id, session_created_ns)
        return EventPage(tuple(out), more, read, largest)

    def _check_incarnation(self, session_id: str, created_ns: int) -> None:
        """Refuses a read made for the session created at `created_ns` (when given) that a
        session deleted and made again under its id answered (see `read_events`)."""
        if created_ns:  # else nothing to check, nor a session to read
            self.session_of_life(session_id, created_ns)

    def _scan_events(
        self, session_id: str, after_seq: int, through_seq: int | None
    ) -> Iterator[tuple[bytes, bytes]]:
        """(key, stored event) of the log after `after_seq` through `through_seq` (to the
        end when None), in order."""
        if after_seq >= MAX_SEQ:
            return iter(())  # nothing can follow the largest sequence number
        start = session_key(session_id, be64(after_seq + 1))
        end = (
            session_key(session_id, be64(through_seq + 1))
            if through_seq is not None and through_seq < MAX_SEQ
            else session_id.encode() + END
        )
        return self._kv.scan("events", start, end)

    def _read_events(
        self,
        session_id: str,
        after_seq: int,
        limit: int | None,
        kinds: frozenset[EventKind],
        through_seq: int | None,
    ) -> list[Event]:
        if after_seq >= MAX_SEQ:
            return []  # nothing can follow the largest sequence number
        if through_seq is not None and limit is None and not kinds:
            # A step's compile asks for what its append just wrote: kept (tails.py).
            kept = self._tails.read(session_id, after_seq, through_seq)
            if kept is not None:
                return kept
        out: list[Event] = []
        for key, raw in self._scan_events(session_id, after_seq, through_seq):
            event = decode_event(raw, int.from_bytes(key[-8:], "big"))
            if kinds and event.kind not in kinds:
                continue
            out.append(event)
            if limit is not None and len(out) >= limit:
                break
        return out

    def last_turn_start(self, session_id: str, through_seq: int) -> Event | None:
        """The latest user message (original or imported) at or before `through_seq`."""
        start, end = (
            session_key(session_id, be64(1)),
            session_key(session_id, be64(through_seq + 1)),
        )
        for key, raw in self._kv.scan("events", start, end, reverse=True):
            event = decode_event(raw, int.from_bytes(key[-8:], "big"))
            if starts_turn(event.payload):
                return event
        return None

    def find_tool_result(self, session_id: str, call_id: str) -> Event | None:
        """The latest result event of a call."""
        lo, hi = session_prefix(session_id), session_id.encode() + END
        for key, raw in self._kv.scan("events", lo, hi, reverse=True):
            event = decode_event(raw, int.from_bytes(key[-8:], "big"))
            if isinstance(event.payload, ToolResult) and event.payload.call_id == call_id:
                return event
        return None

    # -- artifacts ----------------------------------------------------------------

    def put_artifact(
        self, record: ArtifactRecord, data: bytes, session_created_ns: int = 0
    ) -> ArtifactRecord:
        """Stores the artifact, or returns the one already stored under its id (an upload
        retried with its request id), never storing or counting the bytes twice.
        `session_created_ns`: the create time of the session the upload began in, when
        it is checked."""
        sid = record.session_id
        with self._lock(sid), self._blob_locks((record.sha256,)):
            # Deleted while the bytes were on their way and made again under its id: the
            # new session never uploaded them.
            session = self.session_of_life(sid, session_created_ns)
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
            batch.put("artifacts", session_key(sid, record.artifact_id.encode()), encoded)
            updated = dataclasses.replace(session, stored_bytes=session.stored_bytes + added)
            batch.put("sessions", sid.encode(), encode_value(updated))
            self._write(batch, sid)
            return record

    def get_artifact_record(self, session_id: str, artifact_id: str) -> ArtifactRecord | None:
        raw = self._kv.get("artifacts", session_key(session_id, artifact_id.encode()))
        return None if raw is None else decode_value(raw, ArtifactRecord)

    def get_artifact(self, session_id: str, artifact_id: str) -> tuple[ArtifactRecord, bytes]:
        raw = self._kv.get("artifacts", session_key(session_id, artifact_id.encode()))
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
