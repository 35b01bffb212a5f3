"""Session records of the event store: create, count, list, delete (with all they hold)."""

from __future__ import annotations

import logging

from server.domain.errors import CtxccError, Reason
from server.domain.model import DeleteResult, Session
from server.domain.sources import Scope, SourceKind
from storage.codec import CorruptRecordError, decode_value, encode_value
from storage.keys import COUNT_KEY, END, SEP, be64, key_after, session_prefix, source_prefix
from storage.kv import Batch
from storage.store_core import StoreCore

log = logging.getLogger("ctxcc.storage")


class SessionRecords(StoreCore):
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
            batch.put("meta", COUNT_KEY, be64(count + 1))
            self._write(batch, session.session_id)
            return session

    def count_sessions(self) -> int:
        raw = self._kv.get("meta", COUNT_KEY)
        return 0 if raw is None else int.from_bytes(raw, "big")

    def list_sessions(self, after: str, limit: int, project_id: str = "") -> list[Session]:
        return self.page_sessions(after, limit, project_id)[0]

    def page_sessions(
        self, after: str, limit: int, project_id: str = "", examine: int = 0
    ) -> tuple[list[Session], str]:
        """Up to `limit` sessions after `after`, in id order, of `project_id` if given.
        With `examine`, the scan stops after that many records, matching or not, and the
        id of the last one examined comes back: the next page starts after it (a
        filtered listing decodes every session it passes, so a page of a rare project
        among 100,000 sessions would otherwise read them all in one call). "" when the
        scan stopped for another reason."""
        start = after.encode() + SEP if after else b""
        out: list[Session] = []
        for seen, (key, raw) in enumerate(self._kv.scan("sessions", start, b"\xff"), start=1):
            try:
                session = decode_value(raw, Session)
            except CorruptRecordError as exc:
                # Listed by its id alone, so that it can be found and deleted: one damaged
                # record must not fail every listing (and the retention sweep's pages).
                sid = key.decode(errors="replace")
                if sid not in self._told_damaged:  # once: listings and sweeps repeat
                    self._told_damaged.add(sid)
                    log.warning(
                        "session %r: its record is damaged (listed by its id alone; "
                        "DeleteSession removes it): %s",
                        sid,
                        exc.detail,
                    )
                session = Session(sid, 0, 0)
                if project_id:
                    continue
            if not project_id or session.project_id == project_id:
                out.append(session)
                if len(out) >= limit:
                    break
            if examine and seen >= examine:
                return out, session.session_id
        return out, ""

    def delete_session(self, session_id: str) -> DeleteResult:
        with self._sessions_lock, self._lock(session_id):
            try:
                session = self.get_session(session_id)
            except CorruptRecordError as exc:
                # Its key, and so everything stored under it, is known: a damaged record
                # is no reason to keep the session (nothing else could remove it).
                log.warning(
                    "session %r: deleted with its record damaged: %s", session_id, exc.detail
                )
                session = Session(session_id, 0, 0, head_seq=self._last_seq(session_id))
            return self._delete_locked(session)

    def _last_seq(self, session_id: str) -> int:
        """The seq of the session's last stored event (0: none), from its key."""
        lo, hi = session_prefix(session_id), session_id.encode() + END
        for key, _ in self._kv.scan("events", lo, hi, reverse=True):
            return int.from_bytes(key[len(lo) : len(lo) + 8], "big")
        return 0

    def delete_idle_session(self, session_id: str, before_ns: int) -> DeleteResult | None:
        """Deletes the session if nothing was appended to it or compiled of it since
        `before_ns`; None (nothing done) when something was, or when it is gone already.
        Checked under the session's lock: an append or a compile that lands while the
        retention sweep decides keeps the session (the sweep read its record earlier)."""
        with self._sessions_lock, self._lock(session_id):
            try:
                session = self.get_session(session_id)
            except CorruptRecordError:
                # When it was last used is unknown: kept (listed and logged by its id, and
                # DeleteSession removes it).
                return None
            except CtxccError as err:
                if err.reason is Reason.SESSION_NOT_FOUND:
                    return None
                raise
            if max(session.update_time_ns, self._last_compile_ns(session_id)) >= before_ns:
                return None
            return self._delete_locked(session)

    def _last_compile_ns(self, session_id: str) -> int:
        """When the session's latest compile was recorded (0: never); the store that
        holds the compile records says."""
        raise NotImplementedError

    def _delete_locked(self, session: Session) -> DeleteResult:
        """Holding the sessions' lock and the session's."""
        session_id = session.session_id
        ref_prefix = b"S" + session_prefix(session_id)
        # The session's lock keeps its own references as they are; the blobs' locks
        # keep other sessions from taking a blob up between the holder check below and
        # the write (see `_blob_locks`).
        refs = [
            key[len(ref_prefix) :]
            for key, _ in self._kv.scan("refs", ref_prefix, b"S" + session_id.encode() + END)
        ]
        with self._blob_locks(sha.decode() for sha in refs):
            return self._delete_session(session, refs)

    def _delete_session(self, session: Session, refs: list[bytes]) -> DeleteResult:
        """The delete itself, holding the session's lock and its blobs' locks."""
        session_id = session.session_id
        batch = Batch()
        deleted_blobs = 0
        ref_prefix = b"S" + session_prefix(session_id)
        for sha in refs:
            batch.delete("refs", ref_prefix + sha)
            batch.delete("refs", b"B" + sha + SEP + session_id.encode())
            # The scan is no name of this frame: stopped at the first other holder, it
            # is closed at once, not kept open (an engine operation in progress, which
            # a reopen after a full disk waits for) by a refused write's traceback.
            if all(
                k[len(sha) + 2 :] == session_id.encode()
                for k, _ in self._kv.scan("refs", b"B" + sha + SEP, b"B" + sha + END)
            ):
                batch.delete("blobs", sha)
                deleted_blobs += 1
        lo, hi = session_prefix(session_id), session_id.encode() + END
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
            prefix = source_prefix(kind, Scope.SESSION, session_id)
            batch.delete_range("sources", prefix, key_after(prefix))
        batch.delete("sessions", session_id.encode())
        batch.put("meta", COUNT_KEY, be64(max(0, self.count_sessions() - 1)))
        self._forget_decoded(batch)
        self._kv.write(batch)
        self._sources_changed()  # before the bump, as in `_write`
        self._generations.forget(session_id)
        with self._sources_lock:
            self._told_basis_full.pop(session_id, None)  # one made again is logged anew
        return DeleteResult(
            deleted_events=session.head_seq,
            deleted_blobs=deleted_blobs,
            create_time_ns=session.create_time_ns,
        )
