"""ctxcc.v1.CompileService over the compile, usage and checkpoint use cases: the unary
handlers (Compile, ReportUsage, the checkpoints) and CompileStream's read loop, which ends
an idle stream at shutdown. A stream's steps are answered by compile_stream.py."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc

from ctxcc.v1 import checkpoint_pb2
from ctxcc.v1 import compile_service_pb2 as pb
from ctxcc.v1 import compile_service_pb2_grpc as pb_grpc
from server.domain.errors import CtxccError, Reason, invalid
from server.service.checkpoints import CheckpointUseCases
from server.service.compile_types import CompileResult
from server.service.compiling import CompileUseCases
from server.service.sessions import SessionUseCases
from server.transport.compile_stream import (
    Hold,
    StreamReads,
    StreamState,
    StreamSteps,
    held,
    report_usage,
)
from server.transport.convert_misc import checkpoint_in, checkpoint_out
from server.transport.drain import Drain
from server.transport.errors import ErrorObserver, streaming, unary
from server.transport.lent import LentBySession
from server.transport.options_memo import OptionsMemo
from server.transport.paging import decode_position, encode_token, page_bytes, token_created
from server.transport.view_bytes import LentRecords, ViewBytes, view_bytes
from server.transport.view_size import ON_LOOP_CHARS, size_hint, view_chars
from server.transport.wire import Encoded

Ctx = grpc.aio.ServicerContext[Any, Any]


class CompileServicer(pb_grpc.CompileServiceServicer):
    def __init__(
        self,
        compiles: CompileUseCases,
        sessions: SessionUseCases,
        checkpoints: CheckpointUseCases,
        chunk_bytes: int = 1 << 20,
        drain: Drain | None = None,
        max_message_bytes: int = 64 << 20,
        hold: Hold = contextlib.nullcontext,
        errors: ErrorObserver | None = None,
    ) -> None:
        """`hold`: entered around the encoding of a large view off the event loop (the
        daemon's holds full garbage collections off meanwhile: gc_pauses.py). `errors`:
        told the reason of each CompileStream step answered with a StepError."""
        self._c = compiles
        self._s = sessions
        self._k = checkpoints
        self._drain = drain or Drain()
        self._max_message = max_message_bytes
        self._hold = hold
        self._options = OptionsMemo()
        self._steps = StreamSteps(compiles, sessions, chunk_bytes, self._options, hold, errors)
        self._lent = LentBySession()

    @property
    def stream_view_bytes(self) -> int:
        """Bytes of the last views the open streams keep (see stream_views.py)."""
        return self._steps.kept.held

    @unary
    async def Compile(
        self, request: pb.CompileRequest, context: Ctx
    ) -> pb.CompileResponse | Encoded:
        result = await self._c.compile(self._options.options(request))
        plain = not result.attachments and not result.renderings
        repeated = self._lent.repeated(result.view) if plain else None
        if repeated is not None:  # the session's last answer under the new compile id
            return Encoded(repeated)
        # CompileResponse is the view as its field 1: sent as the bytes the view's cached
        # records make, without a protobuf object per message; the records of the
        # messages the session's last view shared are lent by that view.
        last = self._lent.get(result.view.session_id)
        if size_hint(result) < ON_LOOP_CHARS:
            view = view_bytes(result, last)
            data = kept = view.whole(1)
        else:
            # Encoding (and sizing) a multi-MiB view is CPU work: off the event loop, and
            # so is a repeat's copy of it (its answer is not kept).
            view, data = await asyncio.to_thread(
                held, self._hold, self._large_response, result, last
            )
            kept = b""
        if not request.rebuild_compile_id and not request.as_of_seq:
            self._lent.keep(result, view, kept if plain else b"")
        return Encoded(data)

    def _large_response(self, result: CompileResult, last: LentRecords) -> tuple[ViewBytes, bytes]:
        # grpc would refuse to send an oversized view with a bare RESOURCE_EXHAUSTED;
        # say why instead. Characters never outnumber encoded bytes, so a view whose
        # text alone is over the limit is refused before it is encoded (counted only
        # when the estimate is near: it walks every message).
        if size_hint(result) > self._max_message // 16:
            chars = view_chars(result)
            if chars > self._max_message:
                raise self._too_large(chars)
        view = view_bytes(result, last)
        data = view.whole(1)
        if len(data) > self._max_message:
            raise self._too_large(len(data))
        return view, data

    def _too_large(self, size: int) -> CtxccError:
        return CtxccError(
            Reason.QUOTA_EXCEEDED,
            f"the view is over {size} bytes, more than the {self._max_message}-byte message "
            "limit; compile over CompileStream (sent in chunks) or compact the session",
            quota="max_message_bytes",
            limit=str(self._max_message),
        )

    @streaming
    async def CompileStream(
        self, request: AsyncIterator[pb.CompileStreamRequest], context: Ctx
    ) -> AsyncIterator[pb.CompileStreamResponse | Encoded]:
        # Agents hold this stream open between steps: at shutdown an idle stream is ended
        # at once (UNAVAILABLE, SHUTTING_DOWN) and a step in progress is answered first.
        closed = asyncio.ensure_future(self._drain.closed())
        stream, reads = StreamState(), StreamReads(request, closed)
        try:
            while (msg := await reads.next()) is not None:
                with self._drain.busy():
                    for part in await self._steps.answer(msg, stream):
                        yield part
                # Not held while the stream waits for its next step: the request budget
                # counts a step's bytes until it is answered (a step may carry MBs).
                del msg
        finally:
            closed.cancel()
            self._steps.kept.closed(stream)

    @unary
    async def ReportUsage(
        self, request: pb.ReportUsageRequest, context: Ctx
    ) -> pb.ReportUsageResponse:
        return await report_usage(self._c, request, None)

    @unary
    async def CreateCheckpoint(
        self, request: pb.CreateCheckpointRequest, context: Ctx
    ) -> pb.CreateCheckpointResponse:
        mode = request.covered_digest_mode
        if mode not in pb.CoveredDigestMode.values():
            raise invalid("covered_digest_mode", f"unknown covered_digest_mode {mode}")
        stored = await self._k.create(
            checkpoint_in(request.checkpoint),
            request.request_id,
            require_digest=mode == pb.COVERED_DIGEST_MODE_VERIFY,
        )
        return pb.CreateCheckpointResponse(
            checkpoint=checkpoint_out(stored),
            digest_computed=not request.checkpoint.covered_digest,
        )

    @unary
    async def ListCheckpoints(
        self, request: pb.ListCheckpointsRequest, context: Ctx
    ) -> pb.ListCheckpointsResponse:
        # A token holds how many older checkpoints are left to list: checkpoints are
        # added at the newest end (and go only with their session), so counting from
        # the oldest end keeps a position where checkpoints made between two pages
        # would shift an index from the newest one back onto checkpoints already
        # listed. "v" keeps an index token of an earlier daemon from being misread.
        query = {"s": request.session_id, "v": 2}
        left = decode_position(request.page_token, query)
        size = self._s.page_size(request.page_size)
        # Cut by size too, as ListEvents: a summary may take 1 MiB, a page 1,000 of them.
        most = page_bytes(self._max_message)
        # A next page is of the session the first was of.
        found, after, created = await self._k.page_for(
            request.session_id, token_created(request.page_token), left, size, most
        )
        page: list[checkpoint_pb2.Checkpoint] = []
        total = 0
        for c in found:
            msg = checkpoint_out(c)
            total += msg.ByteSize()
            if page and total > most:
                break
            page.append(msg)
        left = after + len(found) - len(page)
        return pb.ListCheckpointsResponse(
            checkpoints=page,
            next_page_token=encode_token(left, query, created) if left > 0 else "",
        )
