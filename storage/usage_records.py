"""Usage reports: a compile's usage, the session's new baseline on its route (route state)
and what the route's model learns, written in one batch; and the reads of route states
and models.

A report is stored as a record of its own beside its compile's record (key infix
`keys.USAGE`): the compile record, with its table of a row per message, is not written
again. The route state a report writes names its table as the reported compile's instead
of holding a copy (`RouteState.table_of_baseline`). Records of both kinds written before
either existed read as they are."""

from __future__ import annotations

import logging
import math

from server.domain.errors import CtxccError
from server.domain.records import CompileRecord, RouteModel, RouteState, Usage, UsagePlan
from server.domain.replacing import replaced
from storage.codec import CorruptRecordError, decode_value, encode_value
from storage.compiles import CompileRecords, kept_bytes
from storage.keys import ROUTE_MODEL, USAGE, session_key, split_compile_id
from storage.kv import Batch, WriteWouldWait

log = logging.getLogger("ctxcc.storage")


def _damaged_table(sid: str) -> CorruptRecordError:
    return CorruptRecordError(f"the baseline compile of a route state of {sid!r} is missing")


def _same_table(state: RouteState, record: CompileRecord) -> bool:
    """By identity first: a report's state holds its record's table itself."""
    digests, tokens = state.message_digests, state.message_tokens
    return (digests is record.message_digests or digests == record.message_digests) and (
        tokens is record.message_tokens or tokens == record.message_tokens
    )


def _finite(model: RouteModel) -> bool:
    """A NaN or an infinity decodes fine but would turn every estimate on the route into
    an error (an integer cannot be rounded from it)."""
    figures = [model.ratio, model.overhead, model.overhead_spread, model.full_local]
    figures.append(model.framing)
    figures += [x for pair in model.ratio_observations for x in pair]
    return all(math.isfinite(x) for x in figures)


class UsageRecords(CompileRecords):
    def record_usage(
        self,
        compile_id: str,
        usage: Usage,
        plan: UsagePlan,
    ) -> tuple[CompileRecord, bool]:
        """Usage, the session's new baseline and (through the learner, called once per
        report, never on a repeat) the route's model, in one atomic batch; `plan` makes
        the baseline and the learner from the record as read here (see ports.UsagePlan),
        so the record is read once."""
        done = self._record_usage(compile_id, usage, plan, True)
        assert done is not None  # waiting, it always gets its locks
        return done

    def try_record_usage(
        self,
        compile_id: str,
        usage: Usage,
        plan: UsagePlan,
    ) -> tuple[CompileRecord, bool] | None:
        """record_usage, or None (nothing written) when it would wait for a lock or for a
        RocksDB write stall."""
        return self._record_usage(compile_id, usage, plan, False)

    def _record_usage(
        self,
        compile_id: str,
        usage: Usage,
        plan: UsagePlan,
        wait: bool,
    ) -> tuple[CompileRecord, bool] | None:
        sid, suffix = split_compile_id(compile_id)
        lock = self._lock(sid)
        if not lock.acquire(blocking=wait):
            return None
        try:
            record = self.get_compile(compile_id)
            # Made before the repeat check: its refusals (a route mismatch) hold for a
            # repeated report too.
            route_state, learn = plan(record)
            if record.usage is not None:
                return record, True
            updated = replaced(record, usage=usage)
            # Losing a baseline only means the next estimate is a full one.
            batch = Batch(durable=False, no_wait=not wait)
            # The report goes under a key of its own beside the record: the record (its
            # table of a row per message) is neither split nor encoded nor written again.
            batch.put("compiles", session_key(sid, USAGE + suffix), encode_value(usage))
            route_id = record.route.route_id
            state_key = session_key(sid, route_id.encode())
            current = self._reported_state(batch, sid, record, route_state)
            keys: list[bytes] = []
            if current is not None:
                stored_state, state_chunks = self._state_form(sid, current, record)
                # Usually known from the record's own write (a record written before
                # chunks existed has none stored yet).
                keys = self._stage_parts(batch, sid, state_chunks)
                state_bytes = encode_value(stored_state)
                batch.put("routes", state_key, state_bytes)
            # The record kept decoded is kept with its usage: it goes right before the
            # write (a reader meanwhile reads both keys from the store), back after it.
            record_key = session_key(sid, suffix)
            if learn is None:
                kept_size = self._forget_kept(record_key)
                self._write(batch, sid)
            else:
                # Sessions on one route report concurrently.
                if not self._models_lock.acquire(blocking=wait):
                    return None
                try:
                    model = learn(self.get_route_model(route_id))
                    model_key = ROUTE_MODEL + model.route_id.encode()
                    model_bytes = encode_value(model)
                    batch.put("routes", model_key, model_bytes)
                    kept_size = self._forget_kept(record_key)
                    self._write(batch, sid, model.route_id)
                    if _finite(model):  # as a read of it would find it
                        self._remember_decoded("routes", model_key, model, len(model_bytes))
                finally:
                    self._models_lock.release()
            if kept_size is not None:
                self._remember_decoded("compiles", record_key, updated, kept_size)
            if current is not None:
                self._remember_decoded(
                    "routes",
                    state_key,
                    current,
                    kept_bytes(state_bytes, current, stored_state),
                )
                if keys:
                    self._known_parts(keys)
                self._staged_now(sid, stored_state)
            return updated, False
        except WriteWouldWait:
            return None
        finally:
            lock.release()

    def _newer_baseline(self, sid: str, route_id: str, record: CompileRecord) -> bool:
        """Whether the session's stored baseline on the route is of a later compile than
        `record` (a later boundary, or the same one compiled later) and can still serve
        as one (its table is its compile's, which may be gone or damaged)."""
        try:
            stored = self._stored_value("routes", session_key(sid, route_id.encode()), RouteState)
        except CorruptRecordError:
            return False  # overwritten by this report, as before
        if stored is None:
            return False
        at = (stored.baseline_seq, stored.baseline_create_ns)
        if not stored.baseline_seq:
            # Written before states kept these: its compile's record has them.
            try:
                base = self.get_compile(stored.baseline_compile_id)
            except CtxccError:
                return False
            at = (base.event_boundary, base.create_time_ns)
        if at <= (record.event_boundary, record.create_time_ns):
            return False
        try:
            return self.get_route_state(sid, route_id) is not None
        except CtxccError:
            return False

    def _reported_state(
        self, batch: Batch, sid: str, record: CompileRecord, state: RouteState | None
    ) -> RouteState | None:
        """The session's new baseline on the route from a report of `record` whose plan
        made `state`; None when it leaves the stored one: a late report of an older
        compile (kept, its error measured, the route's model taught) or one the plan took
        for no baseline (None: part of the input). Unless late, the report moves the
        session's route (in `batch`) for its latest compile, baseline or not: a request
        was sent on it."""
        if self._newer_baseline(sid, record.route.route_id, record):
            return None
        if self._moves_route(sid, record):
            self._move_route(batch, sid, record.route)
        return state

    def _moves_route(self, sid: str, record: CompileRecord) -> bool:
        """A report moves the session's current route only for its latest compile: one
        of an earlier compile, on a route the session has left, must not take it back
        (a checkpoint made next is bound to the current route)."""
        last = self.get_last_compile(sid)
        return last is None or last.compile_id == record.compile_id

    def _state_form(
        self, sid: str, state: RouteState, record: CompileRecord
    ) -> tuple[RouteState, tuple[tuple[str, object], ...]]:
        """The form of a report's route state to write: without its table when that is
        the reported compile's (as a report's is: split, encoded and written once, with
        the record); else as any record with a table."""
        if state.baseline_compile_id == record.compile_id and _same_table(state, record):
            return replaced(
                state, message_digests=b"", message_tokens=(), table_of_baseline=True
            ), ()
        return self._split(sid, state)

    def _forget_kept(self, key: bytes) -> int | None:
        """Drops the compile record kept decoded under `key`: the size it counted, if kept."""
        with self._decoded_lock:
            kept = self._decoded.pop(("compiles", key), None)
            if kept is None:
                return None
            self._decoded_bytes -= kept[1]
            return kept[1]

    def get_route_model(self, route_id: str) -> RouteModel | None:
        """None also for a damaged model: it is only learned advice, so the route starts
        over (the next report rewrites it) instead of failing every compile on it."""
        key = ROUTE_MODEL + route_id.encode()
        kept = self._decoded_value("routes", key, RouteModel)
        if kept is not None:
            return kept
        raw = self._kv.get("routes", key)
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

    def get_route_state(self, session_id: str, route_id: str) -> RouteState | None:
        key = session_key(session_id, route_id.encode())
        kept = self._decoded_value("routes", key, RouteState)
        if kept is not None:
            return kept
        raw = self._kv.get("routes", key)
        if raw is None:
            return None
        state = decode_value(raw, RouteState)
        if not state.table_of_baseline:
            return self._joined(session_id, state)
        try:
            if split_compile_id(state.baseline_compile_id)[0] != session_id:
                raise _damaged_table(session_id)
            record = self.get_compile(state.baseline_compile_id)
        except CorruptRecordError:
            raise
        except CtxccError:  # the compile's record is gone: the state cannot be whole
            raise _damaged_table(session_id) from None
        return replaced(
            state,
            message_digests=record.message_digests,
            message_tokens=record.message_tokens,
            table_of_baseline=False,
        )
