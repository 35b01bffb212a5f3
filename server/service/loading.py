"""Loads what one compile needs, reading as little of the log as the projection uses.

With a valid checkpoint only the events after it are read (plus the current user
message when the checkpoint covers it, and, from projection 13, the block of tool calls
its boundary splits when a result of one of them follows it: checkpoints.split_block), so
compile cost follows the projection, not the length of the log. Checkpoint digests are
verified against the log once per process and remembered: the log is immutable, so a
verified range stays verified.

A step reads the session's checkpoints and tools, which change far less often than its
log: they are kept while their tables are not written (kept.py).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from server.compiler.checkpoints import (
    CallBlock,
    CheckpointCandidate,
    answered_after,
    choose_checkpoint,
    split_block,
)
from server.compiler.projection import CALL_BLOCKS, PROJECTION, artifact_ids
from server.compiler.projection_memo import ProjectionMemo, active_turn
from server.compiler.view import FallbackReason
from server.domain.canonical import events_digests
from server.domain.errors import CtxccError, Reason
from server.domain.grown import Grown
from server.domain.model import Event, Route, Session, of_deleted
from server.domain.records import Checkpoint, CheckpointKind, DamagedCheckpoint
from server.domain.tools import ToolRegistry, ToolSpec
from server.service.kept import KeptReads
from server.service.ports import EventStore

_DIGEST_CACHE = 4096
# Covered events read back at first when looking for the call block a checkpoint's
# boundary splits (four times as many again while the block reaches further back).
_BLOCK_READ = 16


@dataclass(frozen=True, slots=True)
class LoadedHistory:
    # Grown: shares the memo's events it read after (projection_memo.extends).
    events: Grown[Event]
    checkpoint: Checkpoint | None
    current_user: Event | None
    fallback_reasons: tuple[FallbackReason, ...]
    tools: tuple[ToolSpec, ...]
    activated: tuple[str, ...]
    artifacts: tuple[tuple[str, int], ...]


class HistoryLoader:
    """Blocking: runs on the service's I/O pool."""

    def __init__(self, store: EventStore) -> None:
        self._store = store
        self._digests: OrderedDict[tuple[str, int, int], str] = OrderedDict()
        # (session, its life, checkpoint id) -> the call block its boundary splits (None:
        # none) and the seq of the event after it that decided whether the view shows it
        # (that of the result that answers one of its calls; 0: another message came
        # first; None: not decided yet). Both follow from the immutable log.
        self._blocks: OrderedDict[tuple[str, int, str], tuple[CallBlock | None, int | None]] = (
            OrderedDict()
        )
        self._lock = threading.Lock()
        self._checkpoint_lists = KeptReads("checkpoints", store)
        self._tool_lists = KeptReads("tools", store)
        self._artifact_sizes_kept = KeptReads("artifacts", store)

    def forget(self, session_id: str, created_ns: int = 0) -> None:
        """The session made at `created_ns` (0: whichever) was deleted: what was read of
        it goes (see `KeptReads.forget`)."""
        for kept in (self._checkpoint_lists, self._tool_lists, self._artifact_sizes_kept):
            kept.forget(session_id, created_ns)
        with self._lock:
            for key in [k for k in self._digests if k[0] == session_id]:
                if of_deleted(key[1], created_ns):
                    del self._digests[key]
            for block_key in [k for k in self._blocks if k[0] == session_id]:
                if of_deleted(block_key[1], created_ns):
                    del self._blocks[block_key]

    def kept(self) -> int:
        """Values and digests kept (for tests: a deleted session's are not)."""
        reads = (self._checkpoint_lists, self._tool_lists, self._artifact_sizes_kept)
        with self._lock:
            digests = len(self._digests) + len(self._blocks)
        return sum(len(kept) for kept in reads) + digests

    def cached_range_digest(self, session: Session, through: int) -> str | None:
        """range_digest when it is known without reading (None: not known)."""
        key = (session.session_id, session.create_time_ns, through)
        with self._lock:
            if key in self._digests:
                self._digests.move_to_end(key)
                return self._digests[key]
        return None

    def range_digest(self, session: Session, through: int, marks: Sequence[int] = ()) -> str | None:
        """The digest of the session's events 1..`through` (None: not all there). With
        `marks`, the digests of the shorter ranges ending at those seqs are kept too,
        made in the same pass: the digest of 1..n is the hash of 1..m carried on."""
        known = self.cached_range_digest(session, through)
        if known is not None:
            return known
        try:
            # Checked against the session's life: one made again under its id since
            # would have its log's digest kept under the gone one's key.
            events = self._store.read_events(
                session.session_id, 0, None, frozenset(), through, session.create_time_ns
            )
        except CtxccError as err:
            if err.reason is not Reason.RECORD_CORRUPT:
                raise
            return None
        if len(events) < through:
            # Not all there yet (a foreign checkpoint's origin behind it): not kept, the
            # log grows and the range may be complete at the next compile.
            return None
        shorter = sorted(
            m
            for m in set(marks)
            if 0 < m < through
            and events[m - 1].seq == m
            and self.cached_range_digest(session, m) is None
        )
        found = events_digests(events, (*shorter, len(events)))
        with self._lock:
            for at, digest in zip((*shorter, through), found, strict=True):
                self._digests[(session.session_id, session.create_time_ns, at)] = digest
                self._digests.move_to_end((session.session_id, session.create_time_ns, at))
            while len(self._digests) > _DIGEST_CACHE:
                self._digests.popitem(last=False)
        return found[-1]

    def _candidate(
        self, session: Session, ck: Checkpoint, boundary: int, marks: Sequence[int] = ()
    ) -> CheckpointCandidate:
        """`marks`: the boundaries of the session's older checkpoints, whose digests the
        pass over this one's range makes too (a compile passing over each of 50
        checkpoints of another route read and hashed the log from its start 50 times:
        4.5 s for the first compile after a restart at 10,000 events, 0.15 s on theirs)."""
        if ck.covers_through_seq > boundary:
            return CheckpointCandidate(ck, None)
        owner = session
        if ck.origin_session_id and ck.origin_session_id != session.session_id:
            try:
                owner = self._store.get_session(ck.origin_session_id)
            except CtxccError:
                return CheckpointCandidate(ck, "")  # origin gone: cannot be verified
            marks = ()  # the others' boundaries are of this session's log
        return CheckpointCandidate(ck, self.range_digest(owner, ck.covers_through_seq, marks))

    def _heads(self, session: Session) -> tuple[Checkpoint | DamagedCheckpoint, ...]:
        """The session's checkpoints, newest first, without their summaries: what a
        compile chooses from (the summaries of them all may take a gigabyte)."""
        sid = session.session_id
        return self._checkpoint_lists.get(
            session, (), lambda: tuple(self._store.list_checkpoint_heads(sid))
        )

    def _whole(self, session: Session, head: Checkpoint) -> Checkpoint | None:
        """The checkpoint `head` names, with its summary (None: its record is gone)."""
        sid = session.session_id
        return self._checkpoint_lists.get(
            session,
            ("whole", head.checkpoint_id),
            lambda: self._store.get_checkpoint(sid, head.create_time_ns, head.checkpoint_id),
        )

    def _checkpoints(
        self, session: Session, boundary: int, until_ns: int | None = None
    ) -> list[Checkpoint | DamagedCheckpoint]:
        checkpoints = list(self._heads(session))
        if boundary < session.head_seq:
            # Time travel: only checkpoints that existed when event boundary+1 arrived.
            nxt = self._store.read_events(session.session_id, boundary, 1)
            if nxt:
                checkpoints = [c for c in checkpoints if c.create_time_ns < nxt[0].create_time_ns]
        if until_ns is not None:
            checkpoints = [c for c in checkpoints if c.create_time_ns <= until_ns]
        return checkpoints

    def load(
        self,
        session: Session,
        boundary: int,
        route: Route,
        *,
        until_ns: int | None = None,
        recorded: tuple[str, tuple[FallbackReason, ...]] | None = None,
        known: ProjectionMemo | None = None,
        projection: int = PROJECTION,
    ) -> LoadedHistory:
        """`until_ns` hides checkpoints made later; `recorded` (checkpoint id, reasons)
        repeats the choice a recorded compile made instead of choosing again; `known`
        holds events already read after the same checkpoint choice (the log is
        append-only, so only later ones are read); `projection`: the version the view is
        projected with (a recorded compile's own), which decides whether a call block
        the checkpoint splits is read back (CALL_BLOCKS)."""
        sid = session.session_id
        chosen: Checkpoint | None = None
        if recorded is not None:
            ck_id, why = recorded
            reasons: list[FallbackReason] = list(why)
            if ck_id:
                head = next(
                    (
                        c
                        for c in self._heads(session)
                        if isinstance(c, Checkpoint) and c.checkpoint_id == ck_id
                    ),
                    None,
                )
                chosen = self._whole(session, head) if head is not None else None
                if chosen is None:
                    raise CtxccError(Reason.RECORD_CORRUPT, "a recorded checkpoint is missing")
        else:
            reasons = []
            listed = self._checkpoints(session, boundary, until_ns)
            own = [
                c.covers_through_seq
                for c in listed
                if isinstance(c, Checkpoint)
                and c.covers_through_seq <= boundary
                and c.origin_session_id in ("", sid)
            ]
            for ck in listed:
                if isinstance(ck, DamagedCheckpoint):
                    # A damaged record is passed over for the next older checkpoint.
                    reasons.append(FallbackReason.PROJECTION_CORRUPT)
                    continue
                pick, why = choose_checkpoint(
                    [self._candidate(session, ck, boundary, own)], sid, route, boundary
                )
                reasons.extend(why)
                if pick is not None:
                    chosen = self._whole(session, pick)
                    if chosen is None:
                        raise CtxccError(Reason.RECORD_CORRUPT, "a chosen checkpoint is missing")
                    break
        if chosen is None or chosen.kind == CheckpointKind.BUILTIN:
            # A built-in checkpoint keeps every message and shortens old tool results:
            # the projection needs the covered events too.
            events, reread = self._read(sid, 0, boundary, chosen, known)
        else:
            after = self._shown_after(session, chosen, boundary, projection)
            events, reread = self._read(sid, after, boundary, chosen, known)
        current = None
        # The events `known` saw are not looked at again for the turn (`_read` put them
        # first: no need to compare them).
        active = active_turn(events, known if reread else None, known=reread)
        if chosen is not None and chosen.kind != CheckpointKind.BUILTIN and active.start < 0:
            current = self._store.last_turn_start(sid, chosen.covers_through_seq)
        turn = events[active.start] if active.start >= 0 else current
        activated = self._store.get_activations(sid, turn.seq) if turn is not None else ()
        return LoadedHistory(
            events=events,
            checkpoint=chosen,
            current_user=current,
            fallback_reasons=tuple(dict.fromkeys(reasons)),
            tools=self._tool_lists.get(
                session, (), lambda: ToolRegistry(self._store.list_tools(sid))
            ),
            activated=activated,
            artifacts=self._artifact_sizes(session, events, current, known if reread else None),
        )

    def _shown_after(self, session: Session, ck: Checkpoint, boundary: int, projection: int) -> int:
        """The seq after which a view standing on model-written checkpoint `ck` shows the
        log: its boundary, or, from projection CALL_BLOCKS, the seq before the call block
        it splits when a result of one of the block's calls follows the boundary (a
        checkpoint of another session's log is not looked into: its covered events are
        not this log's)."""
        through = ck.covers_through_seq
        sid = session.session_id
        if projection < CALL_BLOCKS or (ck.origin_session_id and ck.origin_session_id != sid):
            return through
        key = (sid, session.create_time_ns, ck.checkpoint_id)
        with self._lock:
            entry = self._blocks.get(key)
            if entry is not None:
                self._blocks.move_to_end(key)
        if entry is None:
            entry = (self._split_block(sid, through), None)
        block, answer = entry
        if block is not None and answer is None:
            answer = self._answer(sid, through, boundary, block)
        if entry != (block, answer):
            with self._lock:
                self._blocks[key] = (block, answer)
                if len(self._blocks) > _DIGEST_CACHE:
                    self._blocks.popitem(last=False)
        if block is not None and answer and answer <= boundary:
            return block.start - 1
        return through

    def _split_block(self, sid: str, through: int) -> CallBlock | None:
        """The call block the events through `through` end inside (split_block), read
        back from there as far as it reaches."""
        n = _BLOCK_READ
        while True:
            after = max(0, through - n)
            covered = self._store.read_events(sid, after, None, frozenset(), through)
            decided, block = split_block(covered, whole=after == 0)
            if decided:
                return block
            n *= 4

    def _answer(self, sid: str, through: int, boundary: int, block: CallBlock) -> int | None:
        """The seq of the event after `through` that decides whether `block` is shown
        (answered_after: the answering result's seq; 0: another message came first);
        None when the log through `boundary` does not tell yet."""
        after, n = through, _BLOCK_READ
        while after < boundary:
            following = self._store.read_events(sid, after, n, frozenset(), boundary)
            if not following:
                return None
            decided, seq = answered_after(following, block)
            if decided:
                return seq or 0
            after, n = following[-1].seq, n * 4
        return None

    def _read(
        self,
        sid: str,
        after: int,
        boundary: int,
        chosen: Checkpoint | None,
        known: ProjectionMemo | None,
    ) -> tuple[Grown[Event], bool]:
        """The events, and whether they start with `known`'s (only later ones read: they
        extend `known`'s events, sharing them)."""
        ck_id = chosen.checkpoint_id if chosen is not None else ""
        if known is not None and known.checkpoint_id == ck_id:
            last = known.events[-1].seq if known.events else after
            first = known.events[0].seq if known.events else after + 1
            if first == after + 1 and last <= boundary:
                later = self._store.read_events(sid, last, None, frozenset(), boundary)
                return known.events.extended(later), True
        return Grown(self._store.read_events(sid, after, None, frozenset(), boundary)), False

    def _artifact_sizes(
        self,
        session: Session,
        events: Sequence[Event],
        current: Event | None,
        known: ProjectionMemo | None,
    ) -> tuple[tuple[str, int], ...]:
        """Sizes of the artifacts the events name; `known` (whose events `events` start
        with) has named its own already, so only the events after them are walked."""
        sid = session.session_id
        start = len(known.events) if known is not None else 0
        wanted = [
            *(known.artifact_ids if known is not None else ()),
            *artifact_ids(events[start:]),
            *(artifact_ids([current]) if current else ()),
        ]
        ids = tuple(dict.fromkeys(wanted))
        if not ids:
            return ()

        def sizes() -> tuple[tuple[str, int], ...]:
            out = []
            for aid in ids:
                record = self._store.get_artifact_record(sid, aid)
                if record is not None:
                    out.append((aid, record.size_bytes))
            return tuple(out)

        # One read per artifact the projection names, at every step: kept while the
        # session's artifacts are not written.
        return self._artifact_sizes_kept.get(session, ids, sizes)
