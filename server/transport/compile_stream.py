"""The CompileStream step path: what one stream remembers between steps, and how a step
is answered (its usage report, its append, its compile, or a resume's kept view) and
encoded (a ViewDelta against a view the stream sent, whole, or in chunks).

Kept apart from compile_servicer.py, which holds the unary handlers and the stream's
read loop (its shutdown and drain), because a step's path is its own: errors are
reported in-band so the stream stays open, and its state lives as long as the stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from ctxcc.v1 import compile_service_pb2 as pb
from server.adapters.protowire import tagged, varint
from server.domain.errors import CtxccError, Reason, invalid
from server.service.compile_types import CompileResult, Prior
from server.service.compiling import CompileUseCases
from server.service.sessions import SessionUseCases, Written
from server.transport.convert_events import events_in
from server.transport.convert_misc import usage_in, usage_out
from server.transport.convert_view import compile_options_in
from server.transport.drain import shutting_down
from server.transport.errors import (
    CODES,
    ErrorObserver,
    Unobserved,
    internal_error,
    logged,
    shown,
)
from server.transport.options_memo import OptionsMemo
from server.transport.recent_views import KeptView, RecentViews
from server.transport.stream_views import StreamViews
from server.transport.view_bytes import LentRecords, ViewBytes, view_bytes
from server.transport.view_delta import chained_delta_record, delta_record
from server.transport.view_size import ON_LOOP_CHARS, size_hint, unshared_hint
from server.transport.wire import Encoded, RefusedMessage

T = TypeVar("T")
# Entered around CPU work made off the event loop outside the compute pool (a large
# view's encoding); the composition root passes the daemon's hold on full garbage
# collections (server/adapters/gc_pauses.py).
Hold = Callable[[], contextlib.AbstractContextManager[object]]


def held(hold: Hold, fn: Callable[..., T], *args: object) -> T:
    """Blocking: `fn(*args)` inside `hold`."""
    with hold():
        return fn(*args)


# A stream's answer to one request: responses, or their bytes already encoded.
Answer = list[pb.CompileStreamResponse | Encoded]

# Failures of a step's usage report that say nothing about the report itself.
_PASSING = frozenset(
    {Reason.DISK_FULL, Reason.STORAGE_FAILURE, Reason.SHUTTING_DOWN, Reason.INTERNAL}
)
# How many of the views a stream sent may serve as the base of a delta: the client names
# the last one it applied, so a few cover a step it is still checking.
_DELTA_BASES = 4


@dataclass
class StreamState:
    """What one CompileStream remembers between its steps."""

    # The compile ids of the last views this stream sent: the bases a step may name for
    # a delta. Another stream's view is no base here: its client may not hold it.
    sent: deque[str] = field(default_factory=lambda: deque(maxlen=_DELTA_BASES))
    # The last view's messages and records, lent to the next view's encoding.
    last: LentRecords = LentRecords()
    # The chain values of the views in `sent` that went as chained deltas (the base's
    # value at the kept count starts the next view's chained digest).
    chains: dict[str, Sequence[bytes]] = field(default_factory=dict)
    # The compile id of the last view this stream sent ("" when it was a rebuild, which
    # is never resent; None before any): the only view a resume on a stream that sent
    # views may get again. Its client asks for a view whole after a delta failed its
    # digest, quoting the delta's compile id; a damaged or replayed delta may quote an
    # older view, compiled for another request or before sources changed.
    last_sent: str | None = None


@dataclass(frozen=True, slots=True)
class DeltaAsk:
    """What a step asked of a delta answer: the chained digest (continued from the base's
    chain values when the stream kept them), and whether the client keeps its base's
    compaction request (ViewDelta.compaction_kept)."""

    chained: bool
    base_chain: Sequence[bytes] | None
    keep_compaction: bool
    # The chained digest with the compaction request hashed apart.
    compaction_apart: bool = False


class StreamSteps:
    """Answers the steps and resumes of CompileStream, one at a time per stream (the
    servicer's read loop awaits each answer before reading the next message)."""

    def __init__(
        self,
        compiles: CompileUseCases,
        sessions: SessionUseCases,
        chunk_bytes: int,
        options: OptionsMemo,
        hold: Hold = contextlib.nullcontext,
        errors: ErrorObserver | None = None,
    ) -> None:
        """`errors`: told the reason of each step answered with a StepError (the stream
        stays open, so no call status ever counts it)."""
        self._c = compiles
        self._s = sessions
        self._chunk = chunk_bytes
        self._hold = hold
        self._errors = errors or Unobserved()
        # An agent sends the same compile request at every step: converted once.
        self._options = options
        # Views sent on any stream, by compile id: a delta's base, a resume's answer.
        self._recent = RecentViews()
        # Each open stream's last view, bounded together.
        self.kept = StreamViews()

    async def answer(
        self, msg: pb.CompileStreamRequest | RefusedMessage, stream: StreamState
    ) -> Answer:
        out, source, base_id = await self._step(msg, stream)
        if source is None:  # the step failed: `out` carries its error
            return self._failed(out)
        base = self._base(base_id, stream)
        # A chained digest continues from the base's chain values (None: hashed once).
        digest = msg.step.delta_digest if isinstance(msg, pb.CompileStreamRequest) else 0
        apart = digest == pb.DELTA_DIGEST_MESSAGE_CHAIN_COMPACTION_APART
        chained = apart or digest == pb.DELTA_DIGEST_MESSAGE_CHAIN
        keep_compaction = isinstance(msg, pb.CompileStreamRequest) and msg.step.keep_compaction
        ask = DeltaAsk(chained, stream.chains.get(base_id), keep_compaction, apart)
        size = source.size if isinstance(source, ViewBytes) else size_hint(source)
        # A chained delta against the stream's last view encodes and hashes little more
        # than what is new (the records of the messages both share are lent): on the loop
        # whatever the size of its history.
        small = (
            chained
            and base is not None
            and base.view is stream.last.parts
            and (isinstance(source, ViewBytes) or unshared_hint(source) < ON_LOOP_CHARS)
        )
        work = functools.partial(self._encode, out, source, base, stream.last, ask)
        try:
            # Encoding, hashing and parsing a multi-MiB view is CPU work: off the loop.
            view, stream.last, (answer, values) = (
                await asyncio.to_thread(held, self._hold, work)
                if size >= ON_LOOP_CHARS and not small
                else work()
            )
        except Exception as exc:
            out.error.CopyFrom(step_error(internal_error(exc)))
            return self._failed(out)
        self.kept.kept(stream)
        if _rebuilt(msg) and not isinstance(source, ViewBytes):
            # A rebuild is sent under its compile's id, but with another image mode or
            # other renderings it is another view: never a delta base nor a resume's
            # answer, and the view this stream sent under that id before is no base any
            # more either (its client now holds this one).
            stream.sent = deque((c for c in stream.sent if c != view.compile_id), _DELTA_BASES)
            stream.chains.pop(view.compile_id, None)
            stream.last_sent = ""
            return answer
        stream.sent.append(view.compile_id)
        stream.last_sent = view.compile_id
        stream.chains = {k: v for k, v in stream.chains.items() if k in stream.sent}
        if values is not None:
            stream.chains[view.compile_id] = values
        self._recent.keep(view.session_id, view)
        return answer

    def _failed(self, out: pb.CompileStreamResponse) -> Answer:
        """A step's answer with its error, counted here: the one place each failed step's
        answer leaves (`_step` and the encoding only fill `out.error`)."""
        if out.HasField("error"):
            self._errors.error_answered(out.error.reason)
        return [out]

    def _base(self, base_id: str, stream: StreamState) -> KeptView | None:
        """The view `base_id` names when this stream sent it: from the recent views, or
        the stream's own last view, which it holds anyway (its records are lent to the
        next view). A view over a quarter of the recent views' bytes is not kept there
        (one huge view must not push every other session's base out), so without this
        every step of a session whose view outgrew that was answered whole."""
        if not base_id or base_id not in stream.sent:
            return None
        kept = self._recent.get(base_id)
        parts = stream.last.parts
        if kept is None and parts is not None and parts.compile_id == base_id:
            kept = KeptView(parts.session_id, parts)
        return kept

    def _encode(
        self,
        out: pb.CompileStreamResponse,
        source: CompileResult | ViewBytes,
        base: KeptView | None,
        last: LentRecords,
        ask: DeltaAsk,
    ) -> tuple[ViewBytes, LentRecords, tuple[Answer, Sequence[bytes] | None]]:
        """The view's parts, what the stream lends the next view's encoding, the answer
        (with the view's chain values when it went as a chained delta)."""
        if isinstance(source, ViewBytes):  # a kept view, resent
            return source, last, self._reply(out, source, base, ask)
        view = view_bytes(source, last)
        # Records with inline attachment bytes are this compile's only: not lent.
        lent = (
            LentRecords(source.view.messages, view.messages, source.view, view)
            if not source.attachments
            else LentRecords()
        )
        return view, lent, self._reply(out, view, base, ask)

    def _reply(
        self,
        out: pb.CompileStreamResponse,
        view: ViewBytes,
        base: KeptView | None,
        ask: DeltaAsk,
    ) -> tuple[Answer, Sequence[bytes] | None]:
        """The view as a ViewDelta against `base` when that is smaller (and fits in one
        message), else whole, in chunks when it is over the chunk size."""
        # A base of another life of the session (deleted and made again under its id)
        # would be diffed against a conversation that is gone: the view goes whole.
        if (
            base is not None
            and base.session_id == view.session_id
            and base.view.created_ns == view.created_ns
        ):
            values = None
            if ask.chained:
                found = chained_delta_record(
                    base.view, view, ask.base_chain, ask.keep_compaction, ask.compaction_apart
                )
                delta, values = found if found is not None else (None, None)
            else:
                delta = delta_record(base.view, view, ask.keep_compaction)
            if delta is not None and len(delta) < min(view.size, self._chunk):
                return [_encoded(out, 6, delta)], values
        whole = view.whole()
        if len(whole) <= self._chunk:
            return [_encoded(out, 2, whole)], None
        return self._chunked(out, view.compile_id, whole), None

    def _chunked(self, out: pb.CompileStreamResponse, compile_id: str, data: bytes) -> Answer:
        """A view over the chunk size goes as ordered ViewChunks of its encoding, each
        small enough for any client's default message limit (4 MiB)."""
        digest = hashlib.sha256(data).hexdigest()
        count = (len(data) + self._chunk - 1) // self._chunk
        chunks: Answer = []
        for i in range(count):
            part = pb.CompileStreamResponse(step_id=out.step_id)
            part.chunk.CopyFrom(
                pb.ViewChunk(
                    compile_id=compile_id,
                    index=i,
                    count=count,
                    data=data[i * self._chunk : (i + 1) * self._chunk],
                    sha256=digest,
                )
            )
            if i == 0 and out.HasField("append"):
                part.append.CopyFrom(out.append)
            if i == 0 and out.HasField("usage"):
                part.usage.CopyFrom(out.usage)
            chunks.append(part)
        return chunks

    async def _step(
        self, msg: pb.CompileStreamRequest | RefusedMessage, stream: StreamState
    ) -> tuple[pb.CompileStreamResponse, CompileResult | ViewBytes | None, str]:
        """One step: the answer so far (step id, append result, or the step's error, which
        is reported in-band so the stream stays open), the compile's result or the kept
        view a resume resends, and the delta base the step named."""
        if isinstance(msg, RefusedMessage):  # over a cap, seen on the wire: never decoded
            error = pb.CompileStreamResponse(step_id=msg.ident, error=step_error(msg.error))
            return error, None, ""
        out = pb.CompileStreamResponse()
        try:
            match msg.WhichOneof("request"):
                case "step":
                    step = msg.step
                    out.step_id = step.step_id
                    # Refused for what it asks: before anything of the step is done.
                    opts = self._options.checked(step.compile)
                    if opts.rebuild_compile_id:
                        # Its session is the compile id's: a compile that is not there
                        # (never made, or its session deleted and maybe made again) or
                        # cannot be rebuilt would fail after the step's report and append
                        # were written, into a conversation the client never stepped.
                        await self._c.check_rebuildable(opts.rebuild_compile_id)
                    if step.HasField("usage") and not await self._step_usage(
                        step.usage, opts.session_id, out
                    ):
                        return out, None, ""
                    # The append goes with the compile, in one hop off the event loop.
                    prior = self._append(step, opts.session_id, out) if step.events else None
                    result = await self._c.compile(opts, prior)
                    base_id = step.delta_base_compile_id
                case "resume":
                    # Echoed like a step's id (empty when the client sent none, as
                    # before the field existed): a client tells this resume's answer from
                    # an earlier resume's delivered late or twice.
                    out.step_id = msg.resume.step_id
                    session_id = msg.resume.compile.session_id
                    quoted = msg.resume.compile_id
                    kept = (
                        await self._unchanged(quoted, session_id)
                        if stream.last_sent is None or stream.last_sent == quoted
                        else None
                    )
                    if kept is not None:
                        return out, kept, ""
                    result = await self._c.compile(compile_options_in(msg.resume.compile))
                    base_id = ""
                case _:
                    raise invalid("request", "a stream message needs a step or a resume")
            return out, result, base_id
        except CtxccError as err:
            out.error.CopyFrom(step_error(err))
        except Exception as exc:
            out.error.CopyFrom(step_error(internal_error(exc)))
        return out, None, ""

    def _append(self, step: pb.StepRequest, sid: str, out: pb.CompileStreamResponse) -> Prior:
        """The step's append (checked now) to session `sid` (the compile's, which a
        rebuild's compile id names), to be written before its compile, and its result
        put in `out` once written (also when the compile then fails)."""
        expected = step.expected_last_seq if step.HasField("expected_last_seq") else None
        events = step.events
        # The events are converted and checked off the event loop, with the write (a
        # 32 MiB tool result's text is copied there, not on the event loop); a refusal
        # there fails the append, so the step.
        write = self._s.writer(
            sid, len(events), lambda: events_in(list(events)), step.request_id, expected
        )

        def landed(written: Written) -> None:
            appended = self._s.landed(sid, written)
            # Set in place: the field is present once any of its fields is set.
            result = out.append
            result.first_seq = appended.first_seq
            result.last_seq = appended.last_seq
            result.replayed = appended.replayed

        return Prior(write, landed, step.ByteSize())

    async def _unchanged(self, compile_id: str, session_id: str) -> ViewBytes | None:
        """The kept view of `compile_id` if nothing was appended to its session since."""
        kept = self._recent.get(compile_id)
        if kept is None or kept.session_id != session_id:
            return None
        session = await self._s.get(session_id)
        # The session may have been deleted and made again under its id, as long: its
        # view is then of a conversation that is gone (a dry run's or time travel's view
        # has no record whose absence would tell).
        if session.create_time_ns != kept.view.created_ns:
            return None
        if session.head_seq != kept.view.event_boundary:
            return None
        return None if await self._c.gone(compile_id) else kept.view

    async def _step_usage(
        self, usage: pb.ReportUsageRequest, session_id: str, out: pb.CompileStreamResponse
    ) -> bool:
        """Records the usage report a step carries, before its append and compile, so the
        compile uses it as its baseline. False (with `out.error` set) when it was refused:
        then nothing else of the step is done. `session_id` is the step's compile's (the
        one its rebuild_compile_id names, when it names one)."""
        try:
            out.usage.CopyFrom(await report_usage(self._c, usage, session_id))
        except CtxccError as err:
            out.error.CopyFrom(step_error(err))
            # Only a report that can never be recorded is refused; after a passing
            # failure the same report may be resent with the step.
            out.error.usage_refused = err.reason not in _PASSING
            return False
        return True


async def report_usage(
    compiles: CompileUseCases, request: pb.ReportUsageRequest, session_id: str | None
) -> pb.ReportUsageResponse:
    """One usage report, unary or on a step: the same use case, the same answer."""
    usage, route = usage_in(request)
    result = await compiles.report_usage(request.compile_id, route, usage, session_id)
    return usage_out(result)


class StreamReads:
    """A stream's next messages: None when the client ends the stream, SHUTTING_DOWN when
    the daemon stops while the stream waits for one.

    The read is awaited by the stream's own task, which shutdown cancels only while it
    waits there (a read in a task of its own, raced against shutdown, costs a task, a
    wake-up and two callbacks at every step); one callback on `closed` for the stream."""

    def __init__(
        self, requests: AsyncIterator[pb.CompileStreamRequest], closed: asyncio.Future[None]
    ) -> None:
        self._requests = requests
        self._closed = closed
        self._reading: asyncio.Task[object] | None = None
        self._stopped = False
        closed.add_done_callback(self._stop)

    def _stop(self, closed: asyncio.Future[None]) -> None:
        # Runs on the loop between steps of the task: it is either waiting for a message
        # (cancelled here) or answering one (that step is answered, and the next read
        # sees `closed`). A read whose message arrived and the task not yet resumed
        # loses it to the cancel, as any cancelled read does: its client resends it.
        if self._reading is not None and not closed.cancelled():
            self._stopped = True
            self._reading.cancel()

    async def next(self) -> pb.CompileStreamRequest | None:
        if self._closed.done():
            raise shutting_down()
        task = self._reading = asyncio.current_task()
        try:
            return await anext(self._requests, None)
        except asyncio.CancelledError:
            # Only shutdown's cancel of the read becomes SHUTTING_DOWN; the call's own
            # cancel (its client gone), also when both came, stays a cancel.
            if self._stopped and task is not None and task.uncancel() == 0:
                raise shutting_down() from None
            raise
        finally:
            self._reading = None


def _rebuilt(msg: pb.CompileStreamRequest | RefusedMessage) -> bool:
    """Whether the message asks for a rebuild of an earlier compile."""
    if isinstance(msg, RefusedMessage):
        return False
    kind = msg.WhichOneof("request")
    if kind == "step":
        return bool(msg.step.compile.rebuild_compile_id)
    return kind == "resume" and bool(msg.resume.compile.rebuild_compile_id)


def _encoded(out: pb.CompileStreamResponse, field: int, payload: bytes) -> Encoded:
    """`out` (step id, append and usage results) with an encoded view (2) or ViewDelta
    (6): sent as these bytes, without decoding the payload into a protobuf object first."""
    step_id = tagged(1, out.step_id.encode()) if out.step_id else b""
    append = tagged(5, out.append.SerializeToString()) if out.HasField("append") else b""
    usage = tagged(7, out.usage.SerializeToString()) if out.HasField("usage") else b""
    # Joined once: a payload can be as long as the history (a view, a compaction prompt).
    key = varint((field << 3) | 2) + varint(len(payload))
    return Encoded(b"".join((step_id, key, payload, append, usage)))


def step_error(err: CtxccError) -> pb.StepError:
    """A step's failure, reported in the step's response: the stream stays open. Its
    message and metadata as a unary call's status would carry them (cut the same way), and
    logged as its status would be."""
    logged(err)
    message, metadata = shown(err)
    code = CODES[err.reason].value[0]
    return pb.StepError(code=code, reason=err.reason.value, message=message, metadata=metadata)
