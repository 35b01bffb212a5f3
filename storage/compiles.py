"""Checkpoints, compile records and routes (per-session state and daemon-wide models)."""

from __future__ import annotations

import dataclasses
import logging
from typing import TypeVar

from server.domain.errors import CtxccError, Reason
from server.domain.generation import Generation
from server.domain.model import Route, Session
from server.domain.records import (
    Checkpoint,
    CompileRecord,
    DamagedCheckpoint,
    RouteState,
    Usage,
)
from server.domain.replacing import replaced
from server.domain.table_chunks import (
    PendingChunk,
    TableChunk,
    Tabled,
    pending,
    stored_form,
    whole,
)
from storage.codec import CorruptRecordError, decode_value, encode_value
from storage.keys import (
    AT_BOUNDARY,
    END,
    LAST_COMPILE,
    PART,
    USAGE,
    be64,
    session_key,
    session_prefix,
    split_compile_id,
)
from storage.kv import Batch, WriteWouldWait
from storage.store_core import StoreCore

T = TypeVar("T")

# Compile part keys remembered as stored.
_KNOWN_PARTS = 8_192

log = logging.getLogger("ctxcc.storage")


def kept_bytes(encoded: bytes, value: CompileRecord | RouteState, written: object) -> int:
    """What a record kept decoded counts against the store's budget: its encoding, with
    the whole table when the form `written` names chunks instead of holding it."""
    if written is value:
        return len(encoded)
    return len(encoded) + len(value.message_digests) + 3 * len(value.message_tokens)


def _ignored_last(session_id: str, exc: CorruptRecordError) -> None:
    log.warning(
        "the copy of session %r's latest compile record is damaged and ignored (the next "
        "compile replaces it): %s",
        session_id,
        exc.detail,
    )


def _damaged_chunk(sid: str) -> CorruptRecordError:
    return CorruptRecordError(f"a table chunk of a record of session {sid!r} is missing")


class CompileRecords(StoreCore):
    def put_checkpoint(self, checkpoint: Checkpoint, session_created_ns: int = 0) -> Checkpoint:
        """Stores the checkpoint, or returns the one already stored under its id: creates
        racing with one request id store one record (the session lock orders them).
        `session_created_ns`: the create time of the session whose log the checkpoint's
        digest was computed from, when it is checked."""
        sid = checkpoint.session_id
        key = session_key(sid, be64(checkpoint.create_time_ns) + checkpoint.checkpoint_id.encode())
        with self._lock(sid):
            existing = self.find_checkpoint(sid, checkpoint.checkpoint_id)
            if existing is not None:
                return existing
            # Deleted after its log was read and created again under its id: the
            # checkpoint summarises a log that is gone (as in `_move_route`).
            session = self.session_of_life(sid, session_created_ns)
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
        prefix = session_prefix(session_id)
        out: list[Checkpoint | DamagedCheckpoint] = []
        for key, raw in self._kv.scan(
            "checkpoints", prefix, session_id.encode() + END, reverse=True
        ):
            out.append(self._checkpoint_entry(session_id, prefix, key, raw))
        return out

    def find_checkpoint(self, session_id: str, checkpoint_id: str) -> Checkpoint | None:
        """The checkpoint stored under this id (None: none, or its record is damaged),
        read one record at a time: a session may hold a gigabyte of summaries, which a
        whole list decoded under the session's lock held at once on every create."""
        prefix = session_prefix(session_id)
        wanted = checkpoint_id.encode()
        for key, raw in self._kv.scan(
            "checkpoints", prefix, session_id.encode() + END, reverse=True
        ):
            if key[len(prefix) + 8 :] == wanted:
                try:
                    return decode_value(raw, Checkpoint)
                except CorruptRecordError:
                    return None
        return None

    def get_checkpoint(
        self, session_id: str, create_time_ns: int, checkpoint_id: str
    ) -> Checkpoint | None:
        """The checkpoint under its key (its create time and id, as a head names them);
        None when there is none or its record is damaged."""
        key = session_key(session_id, be64(create_time_ns) + checkpoint_id.encode())
        raw = self._kv.get("checkpoints", key)
        if raw is None:
            return None
        try:
            return decode_value(raw, Checkpoint)
        except CorruptRecordError:
            return None

    def list_checkpoint_heads(self, session_id: str) -> list[Checkpoint | DamagedCheckpoint]:
        """`list_checkpoint_entries` with every summary left empty, read one record at a
        time: what a compile chooses from, small enough to keep between compiles (the
        summaries of a session's checkpoints may take a gigabyte, and a list over a few
        MiB was read whole at every compile). The chosen one is read whole with
        `get_checkpoint`."""
        prefix = session_prefix(session_id)
        out: list[Checkpoint | DamagedCheckpoint] = []
        for key, raw in self._kv.scan(
            "checkpoints", prefix, session_id.encode() + END, reverse=True
        ):
            entry = self._checkpoint_entry(session_id, prefix, key, raw)
            out.append(
                dataclasses.replace(entry, summary="") if isinstance(entry, Checkpoint) else entry
            )
        return out

    def page_checkpoint_entries(
        self, session_id: str, left: int | None, size: int, max_bytes: int
    ) -> tuple[list[Checkpoint | DamagedCheckpoint], int]:
        """A page of `list_checkpoint_entries`: newest first, up to `size` checkpoints
        from the one `left` places from the oldest (None: the newest on), ending after
        the one that takes the records read past `max_bytes`; with how many older ones
        are left after it. Only the page's records are decoded (a listing decoded every
        summary of the session for each page of one)."""
        prefix = session_prefix(session_id)
        end = session_id.encode() + END
        if left is not None:
            # The key `left` places from the oldest: the page begins there.
            if left <= 0:
                return [], 0
            first = None
            for n, (key, _) in enumerate(self._kv.scan("checkpoints", prefix, end), start=1):
                first = key
                if n == left:
                    break
            if first is None:
                return [], 0
            end = first + b"\x00"
        page: list[Checkpoint | DamagedCheckpoint] = []
        read, after = 0, 0
        for key, raw in self._kv.scan("checkpoints", prefix, end, reverse=True):
            if len(page) >= size or (page and read > max_bytes):
                after += 1  # counted, not decoded
                continue
            read += len(raw)
            page.append(self._checkpoint_entry(session_id, prefix, key, raw))
        return page, after

    def _checkpoint_entry(
        self, session_id: str, prefix: bytes, key: bytes, raw: bytes
    ) -> Checkpoint | DamagedCheckpoint:
        try:
            return decode_value(raw, Checkpoint)
        except CorruptRecordError:
            rest = key[len(prefix) :]
            ckpt_id = rest[8:].decode(errors="replace")
            return DamagedCheckpoint(ckpt_id, session_id, int.from_bytes(rest[:8], "big"))

    def list_checkpoints(self, session_id: str) -> list[Checkpoint]:
        """Newest first, damaged records left out."""
        entries = self.list_checkpoint_entries(session_id)
        return [c for c in entries if isinstance(c, Checkpoint)]

    def put_compile(
        self,
        record: CompileRecord,
        parts: tuple[tuple[str, object], ...] = (),
        wait: bool = True,
        route_since: Generation | None = None,
    ) -> bool:
        """Stores the record, the parts it names that are not stored yet (content-addressed
        by the caller's digest, so unchanged sources cost nothing), and the boundary index.
        The parts' bytes count in the session's basis bytes, apart from the bytes of its
        events and artifacts (an append is never refused for them); a record whose new
        parts would take the session past --max-session-basis-bytes is stored without its
        basis (and none of them): the compile is not refused, it cannot be rebuilt
        (COMPILE_NOT_FOUND). So is a record naming a basis that is not stored (a repeat
        of such a compile, counted as the quota too).
        Without `wait`, writes nothing and answers False when the session's lock is held
        (an append may hold it through its fsync) or RocksDB would stall the write.
        `route_since`: a generation after which the session's current route was the
        record's; while it holds, the session is not read to check that again."""
        sid, suffix = split_compile_id(record.compile_id)
        stored, chunks = self._split(sid, record)
        encoded = encode_value(stored)
        # A repeat names none; the record's own basis is looked for only in `_parts`.
        keys, puts = self._new_parts(sid, self._unstaged(sid, parts), record.basis_digest)
        # What the record's sources, tools and settings add counts in its basis bytes; its
        # own basis, new at every step a usage report moves the route state, is the
        # compile's, like the record (neither counts): counted, every step rewrote and
        # re-read the session record (~0.1-0.15 ms of an agent's step).
        own = session_key(sid, PART + record.basis_digest.encode()) if record.basis_digest else b""
        # A compile record lost in a machine crash only turns its usage report into
        # COMPILE_NOT_FOUND: not worth an fsync on every step.
        batch = Batch(durable=False)
        chunk_keys = self._stage_parts(batch, sid, chunks)
        record_key, last_key = session_key(sid, suffix), session_key(sid, LAST_COMPILE)
        batch.put("compiles", session_key(sid, AT_BOUNDARY + be64(record.event_boundary)), suffix)
        batch.no_wait = not wait
        lock = self._lock(sid)
        if not lock.acquire(blocking=wait):
            return False
        try:
            # A compile of the session that read the same new parts may have written
            # them since they were looked for: they are not written or counted again.
            puts = self._still_new(puts, own)
            added = sum(len(value) for key, value in puts if key != own)
            session = None
            # Every write of the session record holds this lock and moves the generation
            # before it lets go: an unmoved generation is an unchanged current route.
            # A deletion moves the generation too: one that holds also holds the session
            # the compile read.
            if (
                added
                or route_since is None
                or self.generation(sid, record.route.route_id) != route_since
            ):
                # Deleted during the compile and created again under its id: the compile
                # answers as one whose session is gone, and this session gets nothing of
                # it (the parts it names may have gone with the deletion).
                session = self.session_of_life(sid, record.session_create_time_ns)
            why, kind = self._refused_basis(sid, record, bool(puts), session, added)
            kept_basis = bool(record.basis_digest) and not why
            if kept_basis and session is not None and added:
                session = dataclasses.replace(session, basis_bytes=session.basis_bytes + added)
            if not kept_basis and record.basis_digest:
                record = dataclasses.replace(record, basis_digest="")
                stored = dataclasses.replace(stored, basis_digest="")
                encoded = encode_value(stored)
                keys = chunk_keys
            else:
                keys += chunk_keys
                for key, value in puts:
                    batch.put("compiles", key, value)
            batch.put("compiles", record_key, encoded)
            batch.put("compiles", last_key, encoded)
            if session is not None:
                moved = session.current_route != record.route
                if moved:
                    session = dataclasses.replace(session, current_route=record.route)
                if moved or (kept_basis and added):
                    batch.put("sessions", sid.encode(), encode_value(session))
            self._write(batch, sid)
            # Once written: a write that would wait is made again, and counted then.
            self._tell_dropped(sid, record.compile_id, own, why, kind)
            self._remember_decoded(
                "compiles", record_key, record, kept_bytes(encoded, record, stored)
            )
            self._remember_decoded(
                "compiles", last_key, record, kept_bytes(encoded, record, stored)
            )
            if keys:
                # Still under the session's lock, which its deletion takes: parts known
                # after a deletion cleared the set would be taken as stored in the
                # session created next under its id.
                self._known_parts(keys)
            self._staged_now(sid, stored)
        except WriteWouldWait:
            return False
        finally:
            lock.release()
        return True

    def _still_new(self, puts: list[tuple[bytes, bytes]], own: bytes) -> list[tuple[bytes, bytes]]:
        """Under the session's lock: `puts` without the parts written since `_new_parts`
        found them missing (known, else read; the record's own basis is not read, see
        `_new_parts`)."""
        with self._sources_lock:
            unknown = [(key, value) for key, value in puts if key not in self._parts]
        return [
            (key, value)
            for key, value in unknown
            if key == own or self._kv.get("compiles", key) is None
        ]

    def _refused_basis(
        self, sid: str, record: CompileRecord, puts: bool, session: Session | None, added: int
    ) -> tuple[str, str]:
        """Why `record` is written without its basis, and the reason it is counted under
        ("", "": it keeps it, or it has none): it is kept when stored, or among the parts
        written with it (`puts`), whose `added` bytes fit the session's basis quota."""
        if not record.basis_digest:
            return "", ""
        most = self.limits.max_session_basis_bytes
        if not puts and not self._basis_stored(sid, record.basis_digest):
            with self._sources_lock:
                # A repeat of a compile recorded without its basis for the quota names
                # the basis that was not stored then: the quota again, not a loss.
                over = own_key(sid, record.basis_digest) in self._over_quota
            if over:
                return "the compile it repeats was past --max-session-basis-bytes", "quota"
            return "the basis it names is not stored", "missing"
        if most == 0:
            return "--max-session-basis-bytes is 0", "quota"
        if session is not None and session.basis_bytes + added > most:
            return (
                f"its {added} bytes of new basis parts would take the session's "
                f"{session.basis_bytes} bytes of bases past --max-session-basis-bytes "
                f"({most})",
                "quota",
            )
        return "", ""

    def _tell_dropped(self, sid: str, compile_id: str, own: bytes, why: str, kind: str) -> None:
        """A compile written without its basis (`why`, not empty): counted, and logged
        (see below)."""
        if not why:
            return
        with self._sources_lock:
            self.bases_dropped[kind] += 1
            told = kind == "quota" and sid in self._told_basis_full
            if kind == "quota":
                self._over_quota[own] = None
                self._over_quota.move_to_end(own)
                while len(self._over_quota) > _KNOWN_PARTS:
                    self._over_quota.popitem(last=False)
                # A session at its basis quota drops the basis of nearly every compile
                # after: the first is logged, the rest counted (ctxcc_compiles_without_
                # basis_total) and logged at debug.
                if not told:
                    self._told_basis_full[sid] = None
                    while len(self._told_basis_full) > _KNOWN_PARTS:
                        self._told_basis_full.popitem(last=False)
        log.log(
            logging.DEBUG if told else logging.WARNING,
            "compile %s is recorded without its basis (it cannot be rebuilt): %s%s",
            compile_id,
            why,
            ""
            if kind != "quota" or told
            else "; later ones of the session are counted "
            "in ctxcc_compiles_without_basis_total, not logged",
        )

    def _basis_stored(self, sid: str, digest: str) -> bool:
        """Whether the basis part `digest` is stored (known, else read)."""
        key = session_key(sid, PART + digest.encode())
        with self._sources_lock:
            if key in self._parts:
                return True
        return self._kv.get("compiles", key) is not None

    def _new_parts(
        self, sid: str, parts: tuple[tuple[str, object], ...], new: str = ""
    ) -> tuple[list[bytes], list[tuple[bytes, bytes]]]:
        """The keys of `parts`, to be marked known once written (under the session's lock),
        and the encoded puts of those not known to be stored. The part named `new` is put
        unless known, without reading the store for it: a compile's basis holds its route
        state and model, which a report changes at every step, so that read (a miss
        through every level's filter) nearly always found nothing; a basis that was
        stored after all is written again as the same bytes under the same name (not
        counted: a record's own basis never is, see `put_compile`)."""
        named: dict[bytes, tuple[str, object]] = {}
        for digest, value in parts:  # the same content twice is one part
            named.setdefault(session_key(sid, PART + digest.encode()), (digest, value))
        keys = list(named)
        with self._sources_lock:
            known = {key for key in keys if key in self._parts}
        puts: list[tuple[bytes, bytes]] = []
        for key, (digest, value) in named.items():
            if key in known or (digest != new and self._kv.get("compiles", key) is not None):
                continue
            made = value.cut() if isinstance(value, PendingChunk) else value
            puts.append((key, encode_value(made)))
        return keys, puts

    def _stage_parts(
        self, batch: Batch, sid: str, parts: tuple[tuple[str, object], ...]
    ) -> list[bytes]:
        """Puts the parts (chunks of a table) not known to be stored into `batch`; their
        keys, to be marked known once the batch is written (see `_new_parts`)."""
        keys, puts = self._new_parts(sid, parts)
        for key, value in puts:
            batch.put("compiles", key, value)
        return keys

    def _split(self, sid: str, value: Tabled) -> tuple[Tabled, tuple[tuple[str, object], ...]]:
        """The form of `value` to write, and its table's chunks to store unless they are
        those last written for the session (under its lock, as is the write)."""
        written, split = stored_form(value, self._splitter)
        if split is None:
            return written, ()
        with self._sources_lock:
            if self._staged.get(sid) == written.table_chunks:
                return written, ()
        return written, pending(split)

    def _unstaged(
        self, sid: str, parts: tuple[tuple[str, object], ...]
    ) -> tuple[tuple[str, object], ...]:
        """`parts` without the chunks of a table whose chunks are all those last written
        for the session (see `_split`): a compile's basis names the chunks of its route
        state's table, nearly always the table of the record the step before wrote."""
        with self._sources_lock:
            staged = self._staged.get(sid)
        if not staged:
            return parts
        return tuple(
            part
            for part in parts
            if not (isinstance(part[1], PendingChunk) and part[1].split.names == staged)
        )

    def _staged_now(self, sid: str, written: CompileRecord | RouteState) -> None:
        """After a write (under the session's lock): the chunks `written` names are stored."""
        names = written.table_chunks
        if names:
            with self._sources_lock:
                self._staged[sid] = names
                self._staged.move_to_end(sid)
                while len(self._staged) > _KNOWN_PARTS // 8:
                    self._staged.popitem(last=False)

    def _joined(self, sid: str, value: Tabled) -> Tabled:
        def chunk(name: str) -> TableChunk | None:
            return self.get_compile_part(sid, name, TableChunk)

        return whole(value, chunk, lambda: _damaged_chunk(sid))

    def _known_parts(self, keys: list[bytes]) -> None:
        with self._sources_lock:
            for key in keys:
                self._parts[key] = None
                self._parts.move_to_end(key)
            while len(self._parts) > _KNOWN_PARTS:
                self._parts.popitem(last=False)

    def _move_route(self, batch: Batch, sid: str, route: Route, created_ns: int = 0) -> None:
        """Session.current_route follows the latest compile (and the report of that compile:
        see UsageRecords._moves_route). `created_ns`:
        the create time of the session the record's compile read, when it is checked."""
        # Deleted during the compile and created again under its id: the compile answers
        # as one whose session is gone, and this session gets nothing of it (the parts it
        # names may have gone with the deletion).
        session = self.session_of_life(sid, created_ns)
        if session.current_route != route:
            moved = dataclasses.replace(session, current_route=route)
            batch.put("sessions", sid.encode(), encode_value(moved))

    def get_last_compile(self, session_id: str) -> CompileRecord | None:
        """The copy of the session's latest compile record; None when there is none, or
        when the copy is damaged: it is derived (the records themselves stay), and what
        reads it (a compile's previous sections, a tool search's route, GetSession's
        compile id) goes on as if the session had not compiled, instead of failing every
        compile of the session for good."""
        key = session_key(session_id, LAST_COMPILE)
        kept = self._decoded_value("compiles", key, CompileRecord)
        if kept is not None:
            return kept
        raw = self._kv.get("compiles", key)
        if raw is None:
            return None
        try:
            return self._joined(session_id, decode_value(raw, CompileRecord))
        except CorruptRecordError as exc:
            _ignored_last(session_id, exc)
            return None

    def last_compile_outcome(self, session_id: str) -> tuple[int, int] | None:
        """(decision, create time in ns) of the session's latest compile, read without the
        chunks its table may be stored in: a daemon reads this for every session at start.
        None when there is none or its copy is damaged (get_last_compile)."""
        try:
            record = self._stored_value(
                "compiles", session_key(session_id, LAST_COMPILE), CompileRecord
            )
        except CorruptRecordError as exc:
            _ignored_last(session_id, exc)
            return None
        return None if record is None else (record.decision, record.create_time_ns)

    def list_compiles(self, session_id: str) -> list[CompileRecord]:
        return self._list_compiles(session_id, joined=True)

    def list_compile_heads(self, session_id: str) -> list[CompileRecord]:
        return self._list_compiles(session_id, joined=False)

    def _list_compiles(self, session_id: str, *, joined: bool) -> list[CompileRecord]:
        # Suffixes are random hex, so key order is not time order; the usage reports sit
        # at 0xfc, the boundary index, the parts and the copy of the latest record at
        # 0xfd..0xff, past every hex suffix: the reports are read in the same scan.
        prefix = session_prefix(session_id)
        usages: dict[bytes, Usage] = {}
        records: list[tuple[bytes, CompileRecord]] = []
        for key, raw in self._kv.scan("compiles", prefix, prefix + AT_BOUNDARY):
            suffix = key[len(prefix) :]
            if suffix.startswith(USAGE):
                usages[suffix[len(USAGE) :]] = decode_value(raw, Usage)
            else:
                record = decode_value(raw, CompileRecord)
                records.append(
                    (suffix, self._joined(session_id, record) if joined else _headed(record))
                )
        out = [
            r if r.usage is not None or s not in usages else replaced(r, usage=usages[s])
            for s, r in records
        ]
        return sorted(out, key=lambda r: (r.create_time_ns, r.compile_id))

    def get_compile_part(self, session_id: str, digest: str, cls: type[T]) -> T | None:
        raw = self._kv.get("compiles", session_key(session_id, PART + digest.encode()))
        return None if raw is None else decode_value(raw, cls)

    def compile_at(self, session_id: str, boundary: int) -> CompileRecord | None:
        """The latest recorded compile whose event boundary is `boundary`."""
        suffix = self._kv.get("compiles", session_key(session_id, AT_BOUNDARY + be64(boundary)))
        if suffix is None:
            return None
        raw = self._kv.get("compiles", session_key(session_id, suffix))
        if raw is None:
            return None
        return self._reported(session_id, suffix, decode_value(raw, CompileRecord))

    def get_compile(self, compile_id: str) -> CompileRecord:
        """The record with its usage, whether the report is held in it (as records were
        written before usage had a key of its own) or beside it."""
        sid, suffix = split_compile_id(compile_id)
        key = session_key(sid, suffix)
        # A kept record is kept with its usage (see _record_usage).
        kept = self._decoded_value("compiles", key, CompileRecord)
        if kept is not None:
            return kept
        raw = self._kv.get("compiles", key)
        if raw is None:
            raise CtxccError(
                Reason.COMPILE_NOT_FOUND,
                f"compile {compile_id!r} does not exist",
                compile_id=compile_id,
            )
        return self._reported(sid, suffix, decode_value(raw, CompileRecord))

    def _reported(self, sid: str, suffix: bytes, record: CompileRecord) -> CompileRecord:
        """A record as read, whole, with the usage report stored beside it if any."""
        record = self._joined(sid, record)
        if record.usage is not None:
            return record
        raw = self._kv.get("compiles", session_key(sid, USAGE + suffix))
        return record if raw is None else replaced(record, usage=decode_value(raw, Usage))


def own_key(sid: str, digest: str) -> bytes:
    """The key of the compile part `digest` of session `sid`."""
    return session_key(sid, PART + digest.encode())


def _headed(record: CompileRecord) -> CompileRecord:
    """A record without its per-message table (list_compile_heads)."""
    if not record.message_digests and not record.message_tokens and not record.table_chunks:
        return record
    return dataclasses.replace(record, message_digests=b"", message_tokens=(), table_chunks=())
