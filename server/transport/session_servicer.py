"""ctxcc.v1.SessionService over the session use cases."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any

import grpc

from ctxcc.v1 import event_pb2
from ctxcc.v1 import session_service_pb2 as pb
from ctxcc.v1 import session_service_pb2_grpc as pb_grpc
from server.domain.errors import invalid
from server.domain.model import Event, EventKind
from server.domain.records import Checkpoint
from server.service.sessions import SessionUseCases
from server.service.watch import CompileNotice, Update
from server.transport.convert_events import (
    event_out,
    events_in,
    session_in,
    session_out,
    timestamp,
)
from server.transport.convert_misc import checkpoint_out
from server.transport.errors import status_for, streaming, unary
from server.transport.paging import (
    decode_position,
    decode_token,
    encode_token,
    page_bytes,
    token_created,
)
from server.transport.wire import MAX_KINDS, Encoded

Ctx = grpc.aio.ServicerContext[Any, Any]

# WatchSession's response header: the create time (ns since the epoch, decimal) of the
# session the watch follows, sent once the watch is subscribed.
SESSION_CREATE_TIME_KEY = "ctxcc-session-create-time-ns"


# What an entry holds besides its encoded bytes: the Event it keeps alive (its payload,
# parts and texts as Python objects: ~640 bytes for a one-word user message, ~1 KB for an
# assistant message with a call, whose encodings are 54 and 77 bytes), the key and tuple.
ENTRY_BYTES = 1024
# Entries kept at most, whatever their size: an event of many small parts holds more than
# ENTRY_BYTES. One missing only costs a watcher an encoding of its own.
MOST_ENTRIES = 16_384


class WatchedBytes:
    """The encoded WatchSessionResponse of each event the watch hub publishes, made once
    for all of its session's watchers: the hub hands every watcher the same Event, and
    each converted and encoded it on the event loop (64 watchers and a 60 MB append held
    the loop ~6 s). The latest events, by identity (an entry keeps its event alive, so
    its id cannot be reused meanwhile), up to `most_bytes` counting each entry's
    ENTRY_BYTES, and MOST_ENTRIES of them. Counted by their encodings alone, 16 MiB of
    one-word messages were ~310,000 entries holding ~200 MB."""

    def __init__(self, most_bytes: int = 16 << 20, most_entries: int = MOST_ENTRIES) -> None:
        self._kept: OrderedDict[int, tuple[Event, Encoded]] = OrderedDict()
        self._bytes = 0
        self._most = most_bytes
        self._most_entries = most_entries

    def of(self, event: Event) -> Encoded:
        found = self._kept.get(id(event))
        if found is not None and found[0] is event:
            self._kept.move_to_end(id(event))
            return found[1]
        encoded = Encoded(pb.WatchSessionResponse(event=event_out(event)).SerializeToString())
        self._drop(id(event))
        self._kept[id(event)] = (event, encoded)
        self._bytes += len(encoded.data) + ENTRY_BYTES
        while len(self._kept) > 1 and (
            self._bytes > self._most or len(self._kept) > self._most_entries
        ):
            self._drop(next(iter(self._kept)))
        return encoded

    def _drop(self, key: int) -> None:
        gone = self._kept.pop(key, None)
        if gone is not None:
            self._bytes -= len(gone[1].data) + ENTRY_BYTES


class SessionServicer(pb_grpc.SessionServiceServicer):
    def __init__(self, sessions: SessionUseCases, max_message_bytes: int = 64 << 20) -> None:
        self._s = sessions
        self._page_bytes = page_bytes(max_message_bytes)
        self._watched = WatchedBytes()
        # Ends of stalled watches in progress (see _end): kept until done.
        self._ending: set[asyncio.Task[None]] = set()

    @unary
    async def CreateSession(
        self, request: pb.CreateSessionRequest, context: Ctx
    ) -> pb.CreateSessionResponse:
        session = await self._s.create(session_in(request.session))
        return pb.CreateSessionResponse(session=session_out(session))

    @unary
    async def GetSession(
        self, request: pb.GetSessionRequest, context: Ctx
    ) -> pb.GetSessionResponse:
        found = await self._s.get(request.session_id)
        session = session_out(found)
        _active(session, (await self._s.active_times([found]))[0])
        compile_id = await self._s.recorded_compile(request.session_id, request.compile_at_seq)
        return pb.GetSessionResponse(session=session, compile_id=compile_id)

    @unary
    async def ListSessions(
        self, request: pb.ListSessionsRequest, context: Ctx
    ) -> pb.ListSessionsResponse:
        query = {"project_id": request.project_id}
        after = decode_token(request.page_token, query)
        size = self._s.page_size(request.page_size)
        found, resume = await self._s.list_sessions(str(after or ""), size + 1, request.project_id)
        # Pages end by size as well as by count, so a default 4 MiB client can read them.
        page: list[Any] = []
        total = 0
        for s, active in zip(found[:size], await self._s.active_times(found[:size]), strict=True):
            msg = session_out(s)
            _active(msg, active)
            total += msg.ByteSize()
            if page and total > self._page_bytes:
                break
            page.append(msg)
        if len(page) < len(found):
            token = encode_token(found[len(page) - 1].session_id, query)
        else:  # every match is in the page: go on after the last session examined, if any
            token = encode_token(resume, query) if resume else ""
        return pb.ListSessionsResponse(sessions=page, next_page_token=token)

    @unary
    async def DeleteSession(
        self, request: pb.DeleteSessionRequest, context: Ctx
    ) -> pb.DeleteSessionResponse:
        result = await self._s.delete(request.session_id)
        return pb.DeleteSessionResponse(
            deleted_events=result.deleted_events, deleted_blobs=result.deleted_blobs
        )

    @unary
    async def AppendEvents(
        self, request: pb.AppendEventsRequest, context: Ctx
    ) -> pb.AppendEventsResponse:
        expected = request.expected_last_seq if request.HasField("expected_last_seq") else None
        events = list(request.events)
        result = await self._s.append_converted(
            request.session_id,
            len(events),
            lambda: events_in(events),
            request.request_id,
            expected,
        )
        return pb.AppendEventsResponse(
            first_seq=result.first_seq,
            last_seq=result.last_seq,
            event_ids=list(result.event_ids),
            replayed=result.replayed,
        )

    @unary
    async def ListEvents(
        self, request: pb.ListEventsRequest, context: Ctx
    ) -> pb.ListEventsResponse:
        if len(request.kinds) > MAX_KINDS:  # also refused on the wire, before decoding
            raise invalid("kinds", f"kinds lists at most {MAX_KINDS} event kinds")
        known = {int(e) for e in EventKind}
        unknown = set(request.kinds) - known
        if unknown:
            raise invalid("kinds", f"unknown event kind {min(unknown)}")
        kinds = {EventKind(k) for k in set(request.kinds)}
        query = {"s": request.session_id, "a": request.after_seq, "k": sorted(kinds)}
        token = decode_position(request.page_token, query)
        after = token if token is not None else request.after_seq
        size = self._s.page_size(request.page_size)
        # Read up to the page's room as stored (and one event more): the page is cut by
        # its size on the wire below. A next page is of the session the first was of.
        found, created = await self._s.list_events(
            request.session_id,
            after,
            size,
            frozenset(kinds),
            self._page_bytes,
            token_created(request.page_token),
        )
        page: list[event_pb2.Event] = []
        total = 0
        for e in found.events:
            msg = event_out(e)
            total += msg.ByteSize()
            if page and total > self._page_bytes:
                break
            page.append(msg)
        more = found.more or len(page) < len(found.events)
        next_token = encode_token(page[-1].seq, query, created) if more else ""
        return pb.ListEventsResponse(events=page, next_page_token=next_token)

    @streaming
    async def WatchSession(
        self, request: pb.WatchSessionRequest, context: Ctx
    ) -> AsyncIterator[pb.WatchSessionResponse | Encoded]:
        async def subscribed(created_ns: int) -> None:
            # Headers sent at once (not with the first update, which may never come): the
            # incarnation the watch follows, for the clients' reconnects (README, Watchers).
            await context.send_initial_metadata(((SESSION_CREATE_TIME_KEY, str(created_ns)),))

        budget = self._s.watch_bytes
        holding = budget.holding(functools.partial(self._end, context, asyncio.current_task()))
        try:
            watch = self._s.watch(
                request.session_id, request.after_seq, subscribed=subscribed, holding=holding
            )
            async for update in watch:
                out = _response(update, self._watched)
                # Held until gRPC has taken it (the yield returns): by a client that stops
                # reading, for as long as its call lives. Twice: ours, and gRPC's copy.
                size = 2 * (len(out.data) if isinstance(out, Encoded) else out.ByteSize())
                holding.sending(size)
                try:
                    yield out
                finally:
                    holding.sent(size)
        finally:
            holding.close()

    def _end(self, context: Ctx, task: asyncio.Task[Any] | None) -> None:
        """Ends a watch stalled over the watches' bytes in memory (WatchBytes): its handler
        is stuck in gRPC's send, where nothing it raises is seen. The status goes first,
        queued after what the client was already sent (a client that reads again gets
        every event of it, then QUOTA_EXCEEDED; one that goes away ends it); then the
        handler is cancelled, and lets go of its page. A cancel alone left the client
        waiting forever; the status's send completes only once the client reads (or
        goes), so its task is not waited for, only kept."""
        loop = asyncio.get_running_loop()
        ending = loop.create_task(self._abort(context))
        self._ending.add(ending)
        ending.add_done_callback(self._ending.discard)
        if task is not None:
            # After the abort's first step, which hands gRPC the status.
            loop.call_soon(task.cancel)

    async def _abort(self, context: Ctx) -> None:
        err = self._s.watch_bytes.stalled_error()
        with contextlib.suppress(Exception):  # AbortError, or the call ended meanwhile
            await context.abort_with_status(status_for(err))


def _response(update: Update, watched: WatchedBytes) -> pb.WatchSessionResponse | Encoded:
    match update:
        case Event():
            return watched.of(update)
        case Checkpoint():
            return pb.WatchSessionResponse(checkpoint=checkpoint_out(update))
        case CompileNotice():
            return pb.WatchSessionResponse(
                compile=pb.CompileNotice(
                    compile_id=update.compile_id,
                    event_boundary=update.event_boundary,
                    estimated_input_tokens=update.estimated_input_tokens,
                )
            )
    return pb.WatchSessionResponse(resync=pb.Resync(head_seq=update.head_seq))


def _active(msg: Any, active_ns: int) -> None:
    if active_ns:
        msg.active_time.CopyFrom(timestamp(active_ns))
