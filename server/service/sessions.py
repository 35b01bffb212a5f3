"""Session and event-log use cases: create, read, list, delete, append, watch."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence

import msgspec

from server.domain.errors import CtxccError, Reason, invalid, session_not_found, too_large
from server.domain.model import (
    AppendBatch,
    AppendResult,
    BlobRef,
    DeleteResult,
    Event,
    EventKind,
    EventPage,
    NewEvent,
    Payload,
    Session,
    ToolResult,
)
from server.domain.validation import (
    check_id,
    check_labels,
    check_session_paths,
    check_workspace_id,
)
from server.service.blocking import Blocking
from server.service.lanes import PendingWork
from server.service.limits import ServiceLimits
from server.service.ports import Clock, EventStore, IdSource, Telemetry
from server.service.references import names_artifacts, resolve_references
from server.service.watch import (
    API,
    Closed,
    Deleted,
    Holding,
    Resync,
    Update,
    WatchBytes,
    WatchHub,
)

_encoder = msgspec.msgpack.Encoder()
# Sessions a filtered ListSessions page decodes at most (~6 ms of a storage thread each
# 1,000): a rare project among 100,000 sessions took ~650 ms a call, and a few such
# calls at once held every storage thread. Its page may come back short (even empty)
# with a token to go on.
EXAMINE_PER_PAGE = 4_096
# Events a watch's backlog page reads at most, as stored (and one more): a watcher that
# stops reading holds its page, and 1,000 events of 1 MiB each held ~450 MB. Less when
# the watches' bytes in memory leave less room (WatchBytes).
WATCH_PAGE_BYTES = 3 << 20

# What an append's write returns: the batch it wrote, the events' encoded bytes, the result.
Written = tuple[AppendBatch, int, AppendResult]


def request_digest(events: Sequence[NewEvent], expected_last_seq: int | None) -> str:
    """Identity of an append request, to tell a retry from a reused request_id."""
    h = hashlib.sha256()
    h.update(_encoder.encode([expected_last_seq, list(events)]))
    return h.hexdigest()


def preview_of(text: str, chars: int) -> str:
    return text[:chars]


class SessionUseCases:
    def __init__(
        self,
        store: EventStore,
        blocking: Blocking,
        hub: WatchHub,
        clock: Clock,
        ids: IdSource,
        limits: ServiceLimits,
        telemetry: Telemetry,
        pending: PendingWork | None = None,
        watch_bytes: WatchBytes | None = None,
    ) -> None:
        self._store = store
        # What the watches hold in flight, together (their pages here, their messages in
        # the transport).
        self.watch_bytes = watch_bytes or WatchBytes()
        # Shared with the compiles: what each session's next compile has not seen.
        self._pending = pending or PendingWork()
        self._blocking = blocking
        self._hub = hub
        self._clock = clock
        self._ids = ids
        self.limits = limits
        self._telemetry = telemetry
        # Called with a deleted session's id and create time (0: unknown): what the
        # compiles keep of it goes (wired by the composition root, which builds the
        # compiles after the sessions).
        self._on_delete: list[Callable[[str, int], None]] = []

    def on_delete(self, forget: Callable[[str, int], None]) -> None:
        self._on_delete.append(forget)

    async def create(self, template: Session) -> Session:
        sid = template.session_id or self._ids.new_id("s-")
        check_id("session.session_id", sid)
        check_session_paths(template.project_root, template.working_directory)
        check_id("session.project_id", template.project_id, required=False)
        check_labels(dict(template.labels))
        check_workspace_id(template.workspace_id)
        now = self._clock.now_ns()
        session = dataclasses.replace(
            template,
            session_id=sid,
            create_time_ns=now,
            update_time_ns=now,
            head_seq=0,
            stored_bytes=0,
            basis_bytes=0,
            current_route=None,
        )
        made = await self._blocking.run(self._store.create_session, session)
        self._pending.made(made.session_id, made.create_time_ns)
        return made

    async def get(self, session_id: str) -> Session:
        check_id("session_id", session_id)
        return await self._blocking.run(self._store.get_session, session_id)

    async def recorded_compile(self, session_id: str, at_seq: int) -> str:
        """Id of the latest compile recorded at event boundary `at_seq` (0: the session's
        latest recorded compile), "" when none: the view an agent got there."""
        check_id("session_id", session_id)

        def find() -> str:
            if at_seq:
                record = self._store.compile_at(session_id, at_seq)
            else:
                record = self._store.get_last_compile(session_id)
            return record.compile_id if record else ""

        return await self._blocking.run(find)

    async def list_sessions(
        self, after: str, limit: int, project_id: str
    ) -> tuple[list[Session], str]:
        """A page of sessions, and where the next starts when the scan stopped short of
        filling it (a filtered listing examines at most EXAMINE_PER_PAGE sessions)."""
        examine = EXAMINE_PER_PAGE if project_id else 0
        return await self._blocking.run(
            self._store.page_sessions, after, limit, project_id, examine
        )

    async def active_times(self, sessions: Sequence[Session]) -> list[int]:
        """Each session's latest append or recorded compile, the later, in ns (0: neither):
        what the retention sweep measures idleness from (delete_idle)."""

        def read() -> list[int]:
            out = []
            for s in sessions:
                last = self._store.last_compile_outcome(s.session_id)
                out.append(max(s.update_time_ns, 0 if last is None else last[1]))
            return out

        return await self._blocking.run(read)

    async def delete(self, session_id: str) -> DeleteResult:
        check_id("session_id", session_id)
        result = await self._blocking.run(self._store.delete_session, session_id)
        self._deleted(session_id, result.create_time_ns)
        return result

    async def delete_idle(self, session_id: str, before_ns: int) -> DeleteResult | None:
        """Deletes the session if nothing was appended to it or compiled of it since
        `before_ns` (the retention sweep); None when something was, or it is gone."""
        result = await self._blocking.run(self._store.delete_idle_session, session_id, before_ns)
        if result is not None:
            self._deleted(session_id, result.create_time_ns)
        return result

    def _deleted(self, session_id: str, created_ns: int) -> None:
        """What is kept about the deleted session made at `created_ns` (0: unknown, all of
        the id's) outside the store goes; its watches end. Only that session's: the
        delete's storage thread may hand its result back after the session was made
        again under its id, and watched (that watch ended SESSION_NOT_FOUND on a session
        that exists)."""
        self._hub.deleted(session_id, created_ns)
        self._pending.forget(session_id, created_ns)
        for forget in self._on_delete:
            forget(session_id, created_ns)

    def page_size(self, requested: int) -> int:
        if requested == 0:
            return self.limits.default_page_size
        return min(requested, self.limits.max_page_size)

    def check_event_count(self, count: int) -> None:
        """Before any per-event work: transports call it before converting events."""
        if count > self.limits.max_events_per_append:
            raise CtxccError(
                Reason.TOO_MANY_EVENTS,
                f"{count} events in one append, over the limit of "
                f"{self.limits.max_events_per_append}",
                limit=str(self.limits.max_events_per_append),
            )

    async def append(
        self,
        session_id: str,
        events: Sequence[NewEvent],
        request_id: str = "",
        expected_last_seq: int | None = None,
    ) -> AppendResult:
        return await self.append_converted(
            session_id, len(events), lambda: events, request_id, expected_last_seq
        )

    async def append_converted(
        self,
        session_id: str,
        count: int,
        convert: Callable[[], Sequence[NewEvent]],
        request_id: str = "",
        expected_last_seq: int | None = None,
    ) -> AppendResult:
        """append, for `count` events that `convert` makes on the storage thread (see
        `writer`)."""
        write = self.writer(session_id, count, convert, request_id, expected_last_seq)
        return await self._blocking.run_landing(write, functools.partial(self.landed, session_id))

    def _synced_page(
        self, session_id: str, created_ns: int, after_seq: int, limit: int, max_bytes: int
    ) -> EventPage:
        """Blocking: a page of a watch's events, the log synced first when they may not
        be durable yet (a step's append is synced beside its compile): a watcher is never
        told of an event a crash could take back. Only of the session made at `created_ns`
        (the one the watch subscribed to): deleted and made again under its id since,
        SESSION_NOT_FOUND, as the watch of a deleted session ends, and never a page of the
        new log (its seqs start over). At most `max_bytes` of events as stored (and one):
        a watcher that does not read holds its page."""
        page = self._store.read_event_page(
            session_id, after_seq, limit, frozenset(), max_bytes, created_ns
        )
        if page.events:
            self._store.sync_reads()
        return page

    def writer(
        self,
        session_id: str,
        count: int,
        convert: Callable[[], Sequence[NewEvent]],
        request_id: str = "",
        expected_last_seq: int | None = None,
    ) -> Callable[[], Written]:
        """The append's checks (now: ids and the event count), and its blocking write (for
        the I/O pool, or a stream step's compute thread, which runs it right before the
        step's compile: Prior), which first makes the `count` events with `convert`;
        `landed` takes what the write returns, on the event loop. Converting a request's events
        copies every text, and digests, encodes and blob hashing follow: with the write,
        so that a 32 MiB tool result (~16 ms to convert alone) never stalls the loop."""
        check_id("session_id", session_id)
        check_id("request_id", request_id, required=False)
        if not count:
            raise invalid("events", "an append needs at least one event")
        self.check_event_count(count)

        def write() -> Written:
            return self._write(session_id, convert(), request_id, expected_last_seq)

        return write

    def landed(self, session_id: str, written: Written) -> AppendResult:
        """A written append, measured and published to the session's watchers."""
        batch, size, result = written
        if result.replayed:
            return result
        prepared = batch.events
        self._telemetry.appended(len(prepared), size + sum(len(b) for _, b in batch.blobs))
        self._pending.landed(session_id, size)
        # An agent's session is mostly watched by nobody: no events made for nobody.
        if self._hub.watched(session_id):
            published: list[Update] = [
                Event(seq, new.event_id, batch.now_ns, new.payload)
                for seq, new in zip(
                    range(result.first_seq, result.last_seq + 1), prepared, strict=True
                )
            ]
            self._hub.publish(session_id, published, result.last_seq, result.session_create_ns)
        return result

    def _write(
        self,
        session_id: str,
        events: Sequence[NewEvent],
        request_id: str,
        expected_last_seq: int | None,
    ) -> Written:
        batch, size = self._prepare_batch(session_id, events, request_id, expected_last_seq)
        return batch, size, self._store.append(batch)

    def _prepare_batch(
        self,
        session_id: str,
        events: Sequence[NewEvent],
        request_id: str,
        expected_last_seq: int | None,
    ) -> tuple[AppendBatch, int]:
        digest = request_digest(events, expected_last_seq)
        # References are checked against the session as it is now, outside its lock: the
        # store writes the events only to this session, never to one made again under
        # its id meanwhile, which holds none of these artifacts. Read only when there
        # are references (appends without are the hot path).
        life = (
            self._store.get_session(session_id).create_time_ns
            if any(names_artifacts(e.payload) for e in events)
            else 0
        )
        prepared: list[NewEvent] = []
        blobs: dict[str, bytes] = {}
        size = 0
        for i, new in enumerate(events):
            check_id(f"events[{i}].event_id", new.event_id, required=False)
            payload = resolve_references(self._store, session_id, new.payload, f"events[{i}]")
            payload, blob = self._externalize(i, payload)
            if blob is not None:
                blobs[blob[0]] = blob[1]
            encoded = len(_encoder.encode(payload))
            if encoded > self.limits.max_event_bytes:
                raise too_large(f"events[{i}]", encoded, self.limits.max_event_bytes)
            size += encoded
            prepared.append(NewEvent(new.event_id or self._ids.new_id("e-"), payload))
        batch = AppendBatch(
            session_id=session_id,
            events=tuple(prepared),
            now_ns=self._clock.now_ns(),
            request_id=request_id,
            request_digest=digest,
            expected_last_seq=expected_last_seq,
            blobs=tuple(sorted(blobs.items())),
            session_created_ns=life,
        )
        return batch, size

    def _externalize(
        self, index: int, payload: Payload
    ) -> tuple[Payload, tuple[str, bytes] | None]:
        """Move a large inline tool result to a content-addressed blob (R-TOOL-3)."""
        if not isinstance(payload, ToolResult) or payload.text is None:
            return payload, None
        data = payload.text.encode()
        if len(data) > self.limits.max_tool_result_bytes:
            raise too_large(
                f"events[{index}].tool_result.text", len(data), self.limits.max_tool_result_bytes
            )
        if len(data) <= self.limits.blob_threshold_bytes:
            return payload, None
        sha = hashlib.sha256(data).hexdigest()
        ref = BlobRef(sha, len(data), preview_of(payload.text, self.limits.blob_preview_chars))
        return dataclasses.replace(payload, text=None, blob=ref), (sha, data)

    async def list_events(
        self,
        session_id: str,
        after_seq: int,
        limit: int,
        kinds: frozenset[EventKind],
        max_bytes: int,
        created_ns: int = 0,
    ) -> tuple[EventPage, int]:
        """Up to `limit` events of `kinds` after `after_seq`, read until they hold more
        than `max_bytes` as stored (a page's room: 1,000 events of 1 MiB each were read
        and decoded to send three), and the create time of the session they are of. With
        `created_ns` (a listing's next page), of the session made then only: deleted and
        made again under its id since, SESSION_NOT_FOUND, never the new log's events
        after the old one's seq."""
        check_id("session_id", session_id)
        session = await self.get(session_id)
        if created_ns and session.create_time_ns != created_ns:
            raise session_not_found(session_id)
        page = await self._blocking.run(
            self._store.read_event_page,
            session_id,
            after_seq,
            limit,
            kinds,
            max_bytes,
            session.create_time_ns,
        )
        return page, session.create_time_ns

    async def _watch_page(
        self, holding: Holding, session_id: str, created_ns: int, after_seq: int, limit: int
    ) -> tuple[EventPage, int]:
        """A page of a watch's events, read once the watches' bytes in memory leave room
        for it (WatchBytes), and the bytes it holds of them: given back by the caller once
        it has handed the page on."""
        # A page may read one event past its room; its messages in flight (one at a time)
        # are counted twice, as the transport counts them (`Holding.sending`): reserved
        # as if of the largest event, and once read, of the page's largest. No more than
        # half the budget: under a --max-event-bytes near it, a watch of small events
        # kept every other watch from reading (what a page really holds is taken anyway).
        over = 3 * self.limits.max_event_bytes
        if self.watch_bytes.limit:
            over = min(over, self.watch_bytes.limit // 2)
        room = await holding.reserve(WATCH_PAGE_BYTES, over)
        try:
            page = await self._blocking.run(
                self._synced_page, session_id, created_ns, after_seq, limit, room
            )
        except BaseException:
            holding.give(room + over)
            raise
        return page, holding.read(room + over, page.stored_bytes, 2 * page.largest_bytes)

    async def _pages(
        self,
        part: Holding,
        session_id: str,
        created_ns: int,
        after_seq: int,
        through_seq: int | None = None,
    ) -> AsyncGenerator[Event, None]:
        """A watch's events after `after_seq` from the log, through `through_seq` (None:
        to its end), page by page: each page held of the watches' bytes in memory until
        the last of its events is handed on."""
        last = after_seq
        while through_seq is None or last < through_seq:
            most = self.limits.max_page_size
            count = most if through_seq is None else min(through_seq - last, most)
            page, held = await self._watch_page(part, session_id, created_ns, last, count)
            try:
                for event in page.events:
                    last = event.seq
                    yield event
            finally:
                part.handed_on(held)
            if not page.more:
                return

    async def watch(
        self,
        session_id: str,
        after_seq: int,
        *,
        announce: bool = False,
        subscribed: Callable[[int], Awaitable[None]] | None = None,
        pool: str = API,
        holding: Holding | None = None,
    ) -> AsyncIterator[Update]:
        """Backlog after `after_seq` from the log, then live updates, without gaps or repeats.
        With `announce`, a Resync of the head comes first, once the watch is subscribed: a
        reader that took its snapshot before subscribing (a rendered page) re-reads then,
        and misses nothing written between its snapshot and the subscription.
        `subscribed` is called once subscribed, before anything is yielded, with the create
        time of the session watched (the one whose updates alone the watch gets): a
        client told it can tell a watch reopened later on a session made again under the
        id, even when the first watch delivered nothing it could ask for again.
        `holding`: the watch's part of the watches' bytes in memory (WatchBytes), whose
        `end` ends the call if it stalls (none: a part that cannot end it)."""
        # Looked up before the watcher caps are charged too: past them, a session that
        # does not exist would answer QUOTA_EXCEEDED ("retry later") instead of NOT_FOUND.
        session = await self.get(session_id)
        head = session.head_seq
        if after_seq > head:
            # A position this log never reached (a client's, from a log that lost its
            # unsynced tail in a crash, or another session's): waiting would skip every
            # event up to it without a word.
            raise CtxccError(
                Reason.SEQ_OUT_OF_RANGE,
                f"after_seq {after_seq} is beyond the session head {head}",
                head_seq=str(head),
            )
        async with self._hub.subscribe(session_id, session.create_time_ns, pool) as watcher:
            # Looked up once subscribed: a delete that this lookup does not see yet ends
            # the watch (WatchHub.deleted) instead of leaving it waiting on a log that is gone;
            # one made again since the first lookup is another log.
            if (await self.get(session_id)).create_time_ns != session.create_time_ns:
                raise session_not_found(session_id)
            created = session.create_time_ns
            if subscribed is not None:
                await subscribed(created)
            self._telemetry.watchers_changed(1)
            # Closed here and by the caller that made it: closing twice changes nothing.
            part = self.watch_bytes.holding(lambda: None) if holding is None else holding
            try:
                last = after_seq
                if announce:
                    now = await self.get(session_id)
                    if now.create_time_ns != created:
                        raise session_not_found(session_id)  # the head of another log
                    yield Resync(now.head_seq)
                # Catch up in pages; live updates queue up meanwhile.
                async with contextlib.aclosing(
                    self._pages(part, session_id, created, last)
                ) as read:
                    async for event in read:
                        last = event.seq
                        yield event
                while True:
                    update = await watcher.queue.get()
                    if isinstance(update, Closed):
                        # As an idle compile stream ends: the clients' watches reconnect
                        # on it and resume after the last event they got (a clean end
                        # tells them that nothing more will come).
                        raise CtxccError(
                            Reason.SHUTTING_DOWN,
                            "the daemon is shutting down: watch again after the last seq",
                        )
                    if isinstance(update, Deleted):
                        raise session_not_found(session_id)
                    if isinstance(update, Resync):
                        last = max(last, update.head_seq)
                    if isinstance(update, Event):
                        if update.seq <= last:
                            continue  # already sent from the backlog (or a gap's read)
                        # An earlier append can be published after a later one (its
                        # thread handed its result back later): the log holds the gap.
                        gap = self._pages(part, session_id, created, last, update.seq - 1)
                        async with contextlib.aclosing(gap) as read:
                            async for event in read:
                                last = event.seq
                                yield event
                        last = update.seq
                    yield update
            finally:
                part.close()
                self._telemetry.watchers_changed(-1)
