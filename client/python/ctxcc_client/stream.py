"""The long-lived CompileStream: one step in, one view out, in order; views larger than
the stream's chunk size arrive as ViewChunks and are reassembled and verified here."""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import event_pb2, view_pb2
from ctxcc_client.errors import CtxccError


class ViewAssembler:
    """Collects the chunks of one view; `add` returns the view once it is complete."""

    def __init__(self) -> None:
        self._parts: dict[int, bytes] = {}

    def add(self, chunk: cpb.ViewChunk) -> view_pb2.CompiledView | None:
        self._parts[chunk.index] = chunk.data
        if len(self._parts) < chunk.count:
            return None
        data = b"".join(self._parts[i] for i in range(chunk.count))
        self._parts.clear()
        if hashlib.sha256(data).hexdigest() != chunk.sha256:
            raise ValueError(f"view {chunk.compile_id} arrived damaged (sha256 mismatch)")
        return view_pb2.CompiledView.FromString(data)


class CompileStream:
    """`await stream.step(...)` sends one step and returns its view (or raises)."""

    def __init__(self, stub: Any) -> None:
        self._stub = stub
        self._queue: asyncio.Queue[cpb.CompileStreamRequest | None] = asyncio.Queue()
        self._call: Any = None
        self._responses: AsyncIterator[cpb.CompileStreamResponse] | None = None
        self._lock = asyncio.Lock()

    async def _requests(self) -> AsyncIterator[cpb.CompileStreamRequest]:
        while (item := await self._queue.get()) is not None:
            yield item

    def _open(self) -> None:
        if self._call is None:
            self._call = self._stub.CompileStream(self._requests())
            self._responses = self._call.__aiter__()

    async def step(
        self,
        compile_request: cpb.CompileRequest,
        events: list[event_pb2.Event] | None = None,
        request_id: str = "",
    ) -> tuple[view_pb2.CompiledView, cpb.AppendResult | None]:
        async with self._lock:  # one step at a time keeps answers in order
            self._open()
            step_id = uuid.uuid4().hex
            await self._queue.put(
                cpb.CompileStreamRequest(
                    step=cpb.StepRequest(
                        step_id=step_id,
                        events=events or [],
                        compile=compile_request,
                        request_id=request_id or (uuid.uuid4().hex if events else ""),
                    )
                )
            )
            assembler = ViewAssembler()
            append = None
            assert self._responses is not None
            while True:
                resp = await self._responses.__anext__()
                if resp.HasField("append"):
                    append = resp.append
                kind = resp.WhichOneof("response")
                if kind == "error":
                    raise CtxccError_from_step(resp.error)
                if kind == "view":
                    return resp.view, append
                if kind == "chunk":
                    view = assembler.add(resp.chunk)
                    if view is not None:
                        return view, append

    async def close(self) -> None:
        if self._call is not None:
            await self._queue.put(None)
            self._call.cancel()
            self._call = None


def CtxccError_from_step(err: cpb.StepError) -> CtxccError:
    import grpc

    code = next((c for c in grpc.StatusCode if c.value[0] == err.code), grpc.StatusCode.UNKNOWN)
    return CtxccError(code, err.reason, err.message, {})
