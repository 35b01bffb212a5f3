"""The long-lived CompileStream: one step in, one view out, in order; views larger than
the stream's chunk size arrive as ViewChunks and are reassembled and verified here.

When the daemon goes away (a restart, SIGTERM ending idle streams with UNAVAILABLE, a
dropped connection) the stream reopens itself and resends the step that was in flight with
the same request id, so its append is replayed, never stored twice.

With deltas (the default) each step names the last view applied on this stream, and the
daemon may answer with only what changed against it (a ViewDelta); the view is rebuilt
here and checked against the digest the daemon sent, and on a mismatch asked for again
whole (a ResumeRequest quoting its compile id); after three mismatches in a row the
stream asks for whole views only. The digest asked for is the chained one
(DELTA_DIGEST_MESSAGE_CHAIN: only the new messages and the view without messages are
hashed); `chained_digest=False` asks for the whole view's sha256. Callers always get a
whole CompiledView, never one the stream changes later. A reopened stream starts without a
base, so its first answer is whole.

Every answer is matched to what is in flight by its step_id: the step's own, or the fresh
one each ResumeRequest carries (the daemon echoes it on every message of the resume's
answer). One for a step or resume already answered (e.g. a response a proxy delivered
twice, the rest of a step that failed or was cancelled, the answer to an earlier resume
arriving late) is skipped and counted in `stats.stale`, never handed out; any other ends
the stream, and the step is resent on a new one with its request id, as after UNAVAILABLE.
A daemon that predates the resume's step_id answers it with an empty one: an empty id is
taken for the resume's answer only until the stream's daemon has echoed a resume's id (so
on such a daemon a resume's answer delivered twice cannot be told from the next one's).

`report_usage` queues the provider's usage of a view and the next step carries it: the
daemon records it before that step's append and compile, so a step is one round trip
instead of a step and a unary ReportUsage. A report with no step to ride on (the stream is
closed, or a second report is queued first) goes by the unary ReportUsage."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc

from ctxcc.v1 import common_pb2, event_pb2, view_pb2
from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc_client import build
from ctxcc_client.deltas import DeltaMismatch, HeldView
from ctxcc_client.errors import (
    CtxccError,
    from_rpc_error,
    from_step_error,
    stream_ended,
    transient_quota,
)
from ctxcc_client.retry import RETRY_SECONDS, Backoff, new_request_id

MAX_CHUNKS = 1 << 16
# Deltas that fail their digest in a row before a stream asks for whole views only.
MAX_MISMATCHES = 3


class ViewAssembler:
    """Collects the chunks of one view; `add` returns the view once it is complete."""

    def __init__(self) -> None:
        self._parts: dict[int, bytes] = {}
        self._count = 0

    def add(self, chunk: cpb.ViewChunk) -> view_pb2.CompiledView | None:
        count = self._count or chunk.count
        # A chunk that does not fit its view fails the step instead of leaving it waiting
        # for chunks that never come (65,536 x 1 MiB is beyond any view the daemon sends).
        if not 0 < chunk.count <= MAX_CHUNKS or chunk.count != count or chunk.index >= count:
            self._parts.clear()
            self._count = 0
            raise ValueError(
                f"view {chunk.compile_id}: chunk {chunk.index} of {chunk.count} does not "
                f"fit a view of {count} chunks"
            )
        self._count = count
        self._parts[chunk.index] = chunk.data
        if len(self._parts) < count:
            return None
        data = b"".join(self._parts[i] for i in range(count))
        self._parts.clear()
        self._count = 0
        if hashlib.sha256(data).hexdigest() != chunk.sha256:
            raise ValueError(f"view {chunk.compile_id} arrived damaged (sha256 mismatch)")
        return view_pb2.CompiledView.FromString(data)


def _matches(answer: str, awaited: str, *, bare: bool) -> bool | None:
    """Whether an answer whose step_id is `answer` is the one awaited: the one under id
    `awaited` (a step's, also in its chunks and its StepError, or the ResumeRequest's the
    step made after a delta that did not check), or with `bare` one with no id (a resume's
    answer from a daemon that does not echo its id). False for an answer to a step or
    resume already answered: ids are this stream's counter, so a smaller number (the step
    itself while its resume is awaited, an earlier resume's answer delivered late). None for
    anything else, an empty id when not `bare` too: nothing tells which resume it answers."""
    if answer == awaited or (bare and not answer):
        return True
    earlier = answer.isascii() and answer.isdigit() and answer[0] != "0"
    return False if earlier and int(answer) < int(awaited) else None


def _unmatched(answer: str, awaited: str, resuming: bool) -> CtxccError:
    """An answer that matches nothing the stream sent: UNAVAILABLE, so the step is sent
    again on a new stream, as after a dropped connection."""
    what = f"resume {awaited}" if resuming else f"step {awaited}"
    return CtxccError(
        grpc.StatusCode.UNAVAILABLE,
        "UNAVAILABLE",
        f"the stream answered {what} with an answer for step {answer!r}: reopened",
        {},
    )


def _events_key(events: list[event_pb2.Event]) -> bytes:
    return hashlib.sha256(
        b"".join(e.SerializeToString(deterministic=True) for e in events)
    ).digest()


@dataclass
class StreamStats:
    """What a CompileStream received: answers by kind, and their encoded bytes."""

    whole_views: int = 0
    deltas: int = 0
    # Deltas that failed their digest check and were fetched again whole.
    resumed: int = 0
    bytes_received: int = 0
    # Answers skipped because they answer a step or resume already answered: a response
    # delivered twice, the rest of a step that failed or was cancelled, an earlier resume's
    # answer arriving late. Never handed out.
    stale: int = 0


Report = Callable[[cpb.ReportUsageRequest], Awaitable[cpb.ReportUsageResponse]]


class CompileStream:
    """`await stream.step(...)` sends one step and returns its view (or raises CtxccError).
    `deltas=False` asks for whole views only; `chained_digest=False` has deltas checked
    by the whole view's sha256 (view_sha256). `report`: the unary ReportUsage a report
    with no step to ride on is sent by (default: the stub's, without retries)."""

    def __init__(
        self,
        stub: Any,
        retry_seconds: float = RETRY_SECONDS,
        *,
        deltas: bool = True,
        chained_digest: bool = True,
        report: Report | None = None,
    ) -> None:
        self._stub = stub
        self._retry_seconds = retry_seconds
        self._deltas = deltas
        self._digest = (
            cpb.DELTA_DIGEST_MESSAGE_CHAIN_COMPACTION_APART
            if chained_digest
            else cpb.DELTA_DIGEST_UNSPECIFIED
        )
        # Deltas that failed in a row; at MAX_MISMATCHES the stream stops asking for them.
        self._mismatch_run = 0
        self._report = report
        # The usage report the next step carries.
        self._usage: cpb.ReportUsageRequest | None = None
        # The daemon's answer to the report the last step carried (None: it carried none).
        self.last_usage: cpb.ReportUsageResponse | None = None
        # The last view applied on the open stream: the base the next step names.
        self._held: HeldView | None = None
        self.stats = StreamStats()
        self._queue: asyncio.Queue[cpb.CompileStreamRequest | None] | None = None
        self._call: Any = None
        self._responses: AsyncIterator[cpb.CompileStreamResponse] | None = None
        self._lock = asyncio.Lock()
        # The ids of steps and resumes: one counter, so an earlier one's is a smaller number.
        self._counter = 0
        # Whether the open stream's daemon echoed a resume's step_id: until it has, an answer
        # with none is taken for the resume's (a daemon that predates the field). Per stream:
        # a reopened one may reach another daemon. On a daemon that echoes, no answer on the
        # stream has an empty id, so one cannot be an earlier resume's.
        self._echoes = False
        # The request id of a step that failed, by its events: calling `step` again with the
        # same events (the natural "try again") reuses it instead of appending them twice.
        self._unfinished: tuple[bytes, str] | None = None
        # Calls of `close`, and the event the one to come sets: a step called before a close
        # fails instead of opening a call after it (one pausing before a retry wakes).
        self._closes = 0
        self._closing = asyncio.Event()

    @staticmethod
    async def _requests(
        queue: asyncio.Queue[cpb.CompileStreamRequest | None],
    ) -> AsyncIterator[cpb.CompileStreamRequest]:
        while (item := await queue.get()) is not None:
            yield item

    def _open(self) -> tuple[asyncio.Queue[cpb.CompileStreamRequest | None], Any]:
        if self._call is None or self._queue is None or self._responses is None:
            self._queue = asyncio.Queue()
            self._call = self._stub.CompileStream(self._requests(self._queue))
            self._responses = self._call.__aiter__()
        return self._queue, self._responses

    def _drop(self) -> None:
        """Forget a broken call; the next attempt opens a new one."""
        if self._queue is not None:
            self._queue.put_nowait(None)
        if self._call is not None:
            self._call.cancel()
        self._call = self._queue = self._responses = None
        self._held = None  # a new stream holds no view of ours
        self._echoes = False

    def _request_id(self, events: list[event_pb2.Event], given: str) -> str:
        if given or not events:
            return given
        key = _events_key(events)
        if self._unfinished is not None and self._unfinished[0] == key:
            return self._unfinished[1]
        return new_request_id()

    async def report_usage(
        self,
        compile_id: str,
        *,
        input_tokens: int,
        output_tokens: int,
        cached_input_tokens: int = 0,
        reasoning_tokens: int = 0,
        route: common_pb2.Route | None = None,
    ) -> cpb.ReportUsageResponse | None:
        """Queues the provider's usage of the view `compile_id`: the next `step` carries
        it, and the daemon records it before that step's append and compile (the step's
        view is estimated from it; its answer is then `last_usage`). If a report for
        another compile is still queued, that one is sent now by the unary ReportUsage
        and its answer returned; otherwise nothing is sent and None is returned. A step
        whose report is refused raises CtxccError with `usage_refused` set, having appended
        nothing: the report is dropped, so calling `step` again goes without it. While a
        step is running this waits for it: that step puts its own report back if the daemon
        did not record it, and that report is then the earlier one, sent now."""
        usage = build.usage_request(
            compile_id,
            route,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            cached_input_tokens=cached_input_tokens,
            reasoning_tokens=reasoning_tokens,
        )
        async with self._lock:
            earlier, self._usage = self._usage, usage
        if earlier is None or earlier.compile_id == compile_id:
            return None
        return await self._unary(earlier)

    async def flush_usage(self) -> cpb.ReportUsageResponse | None:
        """Sends the queued usage report now by the unary ReportUsage (None: none queued);
        for a view after which no step follows. `close` does it too."""
        usage, self._usage = self._usage, None
        return None if usage is None else await self._unary(usage)

    async def _unary(self, usage: cpb.ReportUsageRequest) -> cpb.ReportUsageResponse:
        if self._report is not None:
            return await self._report(usage)
        try:
            resp: cpb.ReportUsageResponse = await self._stub.ReportUsage(usage)
        except grpc.aio.AioRpcError as err:
            raise from_rpc_error(err) from None
        return resp

    async def step(
        self,
        compile_request: cpb.CompileRequest,
        events: list[event_pb2.Event] | None = None,
        request_id: str = "",
        expected_last_seq: int | None = None,
    ) -> tuple[view_pb2.CompiledView, cpb.AppendResult | None]:
        """Append `events` (if any) and compile, in one round trip. The request id is
        fixed here, before the first attempt, and every retry resends it."""
        events = list(events or [])
        closes = self._closes
        async with self._lock:  # one step at a time keeps answers in order
            self._counter += 1
            step = cpb.StepRequest(
                step_id=str(self._counter),
                events=events,
                compile=compile_request,
                request_id=self._request_id(events, request_id),
            )
            if expected_last_seq is not None:
                step.expected_last_seq = expected_last_seq
            usage, self._usage = self._usage, None
            if usage is not None:
                step.usage.CopyFrom(usage)
            self.last_usage = None
            msg = cpb.CompileStreamRequest(step=step)
            backoff = Backoff(self._retry_seconds)
            while True:
                try:
                    if self._closes != closes:  # closed while it waited or paused
                        raise _stream_closed()
                    result = await self._attempt(msg)
                    self._unfinished = None
                    return result
                except CtxccError as err:
                    # A transient quota's refusal did none of the step: in-band the stream
                    # stays open and the step goes again on it; as the call's status
                    # (calls_in_progress) the call was dropped and the step goes on a new one.
                    again = err.code == grpc.StatusCode.UNAVAILABLE or transient_quota(
                        err.code, err.reason, err.metadata
                    )
                    pause = backoff.next_pause() if again else None
                    if pause is None:
                        self._failed(events, step.request_id, usage, err.usage_refused)
                        raise
                    await self._pause(pause)
                except ValueError as err:  # a view that arrived damaged or malformed
                    self._failed(events, step.request_id, usage, False)
                    raise CtxccError(
                        grpc.StatusCode.DATA_LOSS, "VIEW_DAMAGED", str(err), {}
                    ) from err
                except BaseException:
                    # Cancelled (a caller's timeout, `close` from another task) or any other
                    # failure: the step may have been appended all the same.
                    self._failed(events, step.request_id, usage, False)
                    raise

    def _failed(
        self,
        events: list[event_pb2.Event],
        request_id: str,
        usage: cpb.ReportUsageRequest | None,
        refused: bool,
    ) -> None:
        """What a failed step leaves for the next. Whatever the failure, its events may
        have been appended before it (a compile over its CPU budget fails after the
        append; a cancelled wait does not stop the daemon), and reusing an id that
        appended nothing appends them as new: the same events sent again reuse it. A
        report the daemon neither recorded nor refused rides on the next step (or goes by
        the unary call at close)."""
        if events:
            self._unfinished = (_events_key(events), request_id)
        recorded = self.last_usage is not None or refused
        if usage is not None and not recorded and self._usage is None:
            self._usage = usage

    async def _attempt(
        self, msg: cpb.CompileStreamRequest
    ) -> tuple[view_pb2.CompiledView, cpb.AppendResult | None]:
        queue, responses = self._open()
        held = self._held
        msg.step.delta_base_compile_id = held.view.compile_id if held is not None else ""
        msg.step.delta_digest = self._digest if held is not None else cpb.DELTA_DIGEST_UNSPECIFIED
        msg.step.keep_compaction = held is not None
        await queue.put(msg)
        if held is not None and held.own:
            # Once the request is handed to gRPC (the task that writes it runs first), the
            # view the answer's delta will be applied to is copied for the caller while the
            # daemon works, instead of after its answer.
            await asyncio.sleep(0)
            held.prepare()
        assembler = ViewAssembler()
        append = None
        resumed = False
        awaited = msg.step.step_id
        while True:
            resp = await self._next(responses, awaited, resuming=resumed)
            if resp.HasField("append"):
                append = resp.append
            if resp.HasField("usage"):
                self.last_usage = resp.usage
            kind = resp.WhichOneof("response")
            if kind == "error":
                raise from_step_error(resp.error)
            view = None
            if kind == "view":
                view = resp.view
            elif kind == "chunk":
                view = assembler.add(resp.chunk)
            elif kind == "delta":
                self.stats.deltas += 1
                applied = self._apply(held, resp.delta, last_try=resumed)
                if applied is not None:
                    return applied, append
                # Not usable: ask for the view whole; the answer comes on this stream, under
                # the resume's own id (the lock is held: the counter is this step's).
                resumed = True
                self.stats.resumed += 1
                self._counter += 1
                awaited = str(self._counter)
                resume = cpb.ResumeRequest(
                    compile_id=resp.delta.head.compile_id,
                    compile=msg.step.compile,
                    step_id=awaited,
                )
                await queue.put(cpb.CompileStreamRequest(resume=resume))
            if view is not None:
                self.stats.whole_views += 1
                chained = self._digest != cpb.DELTA_DIGEST_UNSPECIFIED
                apart = self._digest == cpb.DELTA_DIGEST_MESSAGE_CHAIN_COMPACTION_APART
                self._held = HeldView.of(view, chained, apart=apart) if self._deltas else None
                return view, append

    async def _next(
        self, responses: AsyncIterator[cpb.CompileStreamResponse], awaited: str, *, resuming: bool
    ) -> cpb.CompileStreamResponse:
        """The next answer under id `awaited` (a step's, or its resume's when `resuming`),
        skipping the answers to steps and resumes already answered. CtxccError when the
        stream fails or ends, and UNAVAILABLE when it answers something this stream never
        sent (either way the stream is dropped)."""
        while True:
            try:
                resp = await responses.__anext__()
            except grpc.aio.AioRpcError as err:
                self._drop()
                raise from_rpc_error(err) from None
            except StopAsyncIteration:
                self._drop()
                raise stream_ended() from None
            except asyncio.CancelledError:
                if _cancelled_by_caller(responses is self._responses):
                    raise  # the caller's own (a timeout, a cancelled task): it stays one
                # The call was cancelled under the step: another task closed the stream.
                raise _stream_closed() from None
            self.stats.bytes_received += resp.ByteSize()
            ours = _matches(resp.step_id, awaited, bare=resuming and not self._echoes)
            if ours:
                self._echoes = self._echoes or (resuming and resp.step_id == awaited)
                return resp
            if ours is None:
                # Nothing this stream sent is answered so: end it; the step is resent on
                # a new one with its request id (the daemon replays the append).
                self._drop()
                raise _unmatched(resp.step_id, awaited, resuming)
            self.stats.stale += 1

    def _apply(
        self, held: HeldView | None, delta: cpb.ViewDelta, *, last_try: bool
    ) -> view_pb2.CompiledView | None:
        """The view `delta` rebuilds to, or None when it does not check (then the stream
        holds no base until a whole view comes; DeltaMismatch on the `last_try`)."""
        try:
            if held is None:
                raise DeltaMismatch("a delta without a base")
            self._held = held.apply(delta)
            self._mismatch_run = 0
            return self._held.view
        except DeltaMismatch:
            self._held = None
            if last_try:
                raise
        self._mismatch_run += 1
        if self._mismatch_run >= MAX_MISMATCHES:
            self._deltas = False
        return None

    async def _pause(self, seconds: float) -> None:
        """Waits before a retry; `close` ends the wait."""
        waiter = asyncio.ensure_future(self._closing.wait())
        try:
            await asyncio.wait({waiter}, timeout=seconds)
        finally:
            waiter.cancel()

    async def close(self) -> None:
        """Ends the stream; a usage report still queued is sent by the unary ReportUsage
        (its error, if any, is raised), the report of a step this close ended included. A
        step called before the close and still running or waiting fails (one pausing
        before a retry with CtxccError CANCELLED/STREAM_CLOSED) instead of opening a call
        after it; the stream is usable again by the steps called after."""
        self._closes += 1
        self._closing.set()
        self._closing = asyncio.Event()
        self._drop()
        async with self._lock:  # the step ended puts back a report the daemon did not answer
            pass
        await self.flush_usage()


def _cancelled_by_caller(call_kept: bool) -> bool:
    """Whether the CancelledError a step got while it waited is its caller's (a timeout,
    its task cancelled) rather than its call's, cancelled under it by `close` from another
    task. Task.cancelling() tells from Python 3.11 on; Python 3.10 (which this client
    supports) has none, and there a call that `close` did not drop (`call_kept`) says it."""
    cancelling = getattr(asyncio.current_task(), "cancelling", None)
    return bool(cancelling()) if cancelling is not None else call_kept


def _stream_closed() -> CtxccError:
    return CtxccError(
        grpc.StatusCode.CANCELLED,
        "STREAM_CLOSED",
        "the stream was closed while the step waited for its answer",
        {},
    )
