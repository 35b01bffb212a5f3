"""Checkpoint use cases: a checkpoint is stored only after its digest matches the log."""

from __future__ import annotations

import dataclasses
import hashlib

from server.domain.canonical import events_digest
from server.domain.errors import CtxccError, Reason, invalid, session_not_found
from server.domain.records import Checkpoint, CheckpointKind, DamagedCheckpoint
from server.domain.validation import check_id, check_route_fields
from server.service.blocking import Blocking
from server.service.compile_types import route_fields
from server.service.lanes import PendingWork
from server.service.ports import Clock, EventStore, IdSource
from server.service.watch import WatchHub

MAX_SUMMARY_CHARS = 1 << 20


class CheckpointUseCases:
    def __init__(
        self,
        store: EventStore,
        blocking: Blocking,
        hub: WatchHub,
        clock: Clock,
        ids: IdSource,
        pending: PendingWork | None = None,
    ) -> None:
        self._store = store
        # Shared with the compiles: a new checkpoint sends the next one off the light lane.
        self._pending = pending or PendingWork()
        self._blocking = blocking
        self._hub = hub
        self._clock = clock
        self._ids = ids

    async def create(
        self, template: Checkpoint, request_id: str = "", *, require_digest: bool = False
    ) -> Checkpoint:
        """`require_digest` is the explicit VERIFY mode: without it an empty covered_digest
        is computed from the log, so nothing is checked (the COMPUTE mode)."""
        return (await self.create_reporting(template, request_id, require_digest=require_digest))[0]

    async def create_reporting(
        self,
        template: Checkpoint,
        request_id: str = "",
        *,
        require_digest: bool = False,
        life: int = 0,
    ) -> tuple[Checkpoint, bool]:
        """create, and whether this call stored the checkpoint (False when a retry or a
        racing built-in compaction of the same range had stored it first). `life`: the
        create time of the session the checkpoint is for, when the caller read it (a
        compile's built-in compaction): a session deleted and made again under its id
        since is SESSION_NOT_FOUND, never shortened by a compile of the one that is gone."""
        sid = template.session_id
        check_id("checkpoint.session_id", sid)
        check_id("request_id", request_id, required=False)
        # Stored with the checkpoint and read back by every compile of the session.
        check_id("checkpoint.origin_session_id", template.origin_session_id, required=False)
        if template.source_route is not None:
            check_route_fields(route_fields(template.source_route), "checkpoint.source_route")
            if not template.source_route.model:
                # Every compile's route names its model: bound to a route without one,
                # the checkpoint would hold on none, passed over at every compile.
                raise invalid(
                    "checkpoint.source_route.model",
                    "checkpoint.source_route.model is required when a source route is set",
                )
        if require_digest and not template.covered_digest:
            raise invalid(
                "checkpoint.covered_digest",
                "covered_digest is required in COVERED_DIGEST_MODE_VERIFY",
            )
        if template.kind == CheckpointKind.BUILTIN:
            # The daemon's own compaction: no summary, usable on any route.
            template = dataclasses.replace(template, summary="", portable=True)
        elif not template.summary.strip():
            raise invalid("checkpoint.summary", "a checkpoint needs a summary")
        if len(template.summary) > MAX_SUMMARY_CHARS:
            raise invalid("checkpoint.summary", f"summary is over {MAX_SUMMARY_CHARS} characters")
        session = await self._blocking.run(self._store.get_session, sid)
        if life and session.create_time_ns != life:
            raise session_not_found(sid)
        asked = template  # as the client sent it: a retry is compared with this
        if not template.portable and template.source_route is None:
            # A view's compaction request names no route, and agents make their
            # checkpoints from it: the summary was written on the route of the session's
            # latest recorded compile (its current route), which a later switch must not
            # reuse it on (R-ROUTE-2). With no compile yet the route is not known, and the
            # checkpoint holds on any.
            template = dataclasses.replace(template, source_route=session.current_route)
        n = template.covers_through_seq
        if not 1 <= n <= session.head_seq:
            raise CtxccError(
                Reason.CHECKPOINT_INVALID,
                f"covers_through_seq {n} is outside the log (1..{session.head_seq})",
                head_seq=str(session.head_seq),
            )
        if request_id:
            # The id derives from the request id, so a retry finds the first checkpoint.
            ckpt_id = "c-" + hashlib.sha256(f"{sid}\x00{request_id}".encode()).hexdigest()[:24]
            existing = await self._blocking.run(self._store.find_checkpoint, sid, ckpt_id)
            if existing is not None:
                return _retried(existing, asked, request_id), False
        elif template.kind == CheckpointKind.BUILTIN:
            # One built-in compaction of a range is one checkpoint: compiles of the session
            # at once, each over its window, each ask for it (put_checkpoint keeps the first
            # stored under this id and returns it to the others).
            ckpt_id = "c-" + hashlib.sha256(f"{sid}\x00builtin\x00{n}".encode()).hexdigest()[:24]
        else:
            ckpt_id = self._ids.new_id("c-")
        events = await self._blocking.run(
            self._store.read_events, sid, 0, None, frozenset(), n, session.create_time_ns
        )
        digest = await self._blocking.run(events_digest, events)
        if template.covered_digest and template.covered_digest != digest:
            raise CtxccError(
                Reason.CHECKPOINT_INVALID,
                "covered_digest does not match events 1.."
                f"{n} of the log; recompute it from a fresh compaction request",
            )
        checkpoint = dataclasses.replace(
            template,
            checkpoint_id=ckpt_id,
            covered_digest=digest,
            create_time_ns=self._clock.now_ns(),
        )
        stored = await self._blocking.run(
            self._store.put_checkpoint, checkpoint, session.create_time_ns
        )
        created = stored is checkpoint  # not a racing retry answered with the first one
        if not created and request_id:
            _retried(stored, asked, request_id)
        if created:
            self._pending.reprojected(sid)
            self._hub.publish(sid, [checkpoint], session.head_seq, session.create_time_ns)
        return stored, created

    async def page_for(
        self, session_id: str, created_ns: int, left: int | None, size: int, max_bytes: int
    ) -> tuple[list[Checkpoint | DamagedCheckpoint], int, int]:
        """A page of the session's checkpoints, newest first (see
        `EventStore.page_checkpoint_entries`: `left` older ones from the oldest end on),
        with how many older ones are left after it and the create time of the session
        they are of; damaged records are listed (marked) rather than failing the page.
        With `created_ns` (a listing's next page), of the session made then only:
        deleted and made again under its id since, SESSION_NOT_FOUND, never the new
        session's checkpoints at the old one's position."""
        check_id("session_id", session_id)

        def read() -> tuple[list[Checkpoint | DamagedCheckpoint], int, int]:
            made = self._store.get_session(session_id).create_time_ns
            if created_ns and made != created_ns:
                raise session_not_found(session_id)
            page, after = self._store.page_checkpoint_entries(session_id, left, size, max_bytes)
            if self._store.get_session(session_id).create_time_ns != made:
                raise session_not_found(session_id)  # made again while they were read
            return page, after, made

        return await self._blocking.run(read)


def _retried(stored: Checkpoint, asked: Checkpoint, request_id: str) -> Checkpoint:
    """The checkpoint stored under `request_id`, when `asked` is the same checkpoint again
    (a retry); REQUEST_ID_REUSED when it is another, as for appends and uploads: answered
    with the first, an agent reusing one id for every compaction would take each new
    summary for stored. What the daemon fills in is not compared: the digest when none
    was sent, and the route a checkpoint without one is bound to, which a compile on
    another route between the two calls moves."""
    same = (
        stored.covers_through_seq == asked.covers_through_seq
        and stored.kind == asked.kind
        and stored.summary == asked.summary
        and stored.portable == asked.portable
        and stored.origin_session_id == asked.origin_session_id
        and asked.source_route in (None, stored.source_route)
        and asked.covered_digest in ("", stored.covered_digest)
    )
    if not same:
        raise CtxccError(
            Reason.REQUEST_ID_REUSED,
            f"request_id {request_id!r} was used for a different checkpoint",
            request_id=request_id,
        )
    return stored
