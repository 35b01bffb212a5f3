"""Retries on UNAVAILABLE, bounded by time rather than attempts: a daemon that is down for a
few seconds (a restart, a rollout) is waited out, and the channel options below make the
client find it again within about a second of it coming back.

Only calls that are safe to repeat are retried. Appends and checkpoints are made safe by
their request id, which is fixed *before* the first attempt and reused by every retry, so a
repeat is answered as a replay and never stored twice."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, TypeVar

import grpc

from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_service_pb2 as spb
from ctxcc_client.errors import from_rpc_error, lost_write

T = TypeVar("T")

RETRY_SECONDS = 30.0
MAX_PAUSE = 0.25
OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.keepalive_time_ms", 30_000),
    # grpc's default reconnect backoff grows to 120 s; a sidecar restarts in about a second.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 500),
]

# Unary RPCs that a blind repeat would change: a second create finds the first, a second
# delete finds nothing. Every other unary RPC is a read, an upsert by a client-chosen id,
# or carries a request id.
NOT_RETRIED = frozenset(
    {"CreateSession", "DeleteSession", "DeleteMemory", "DeleteRule", "DeleteSkill"}
)


def new_request_id() -> str:
    return uuid.uuid4().hex


def with_request_id(request: Any) -> Any:
    """An append or checkpoint without a request id gets one here, once, before any attempt."""
    if isinstance(request, spb.AppendEventsRequest | cpb.CreateCheckpointRequest) and not (
        request.request_id
    ):
        copy: Any = type(request)()
        copy.CopyFrom(request)
        copy.request_id = new_request_id()
        return copy
    return request


class Backoff:
    """Pauses of 50 ms doubling to 250 ms until `seconds` have passed since the first try."""

    def __init__(self, seconds: float) -> None:
        self._deadline = time.monotonic() + seconds
        self._pause = 0.05

    def next_pause(self) -> float | None:
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            return None
        pause = min(self._pause, remaining)
        self._pause = min(self._pause * 2, MAX_PAUSE)
        return pause


def retryable(err: grpc.RpcError) -> bool:
    return bool(err.code() == grpc.StatusCode.UNAVAILABLE) or lost_write(err)


async def retry_async(fn: Callable[[], Awaitable[T]], idempotent: bool, seconds: float) -> T:
    backoff = Backoff(seconds)
    while True:
        try:
            return await fn()
        except grpc.aio.AioRpcError as err:
            pause = backoff.next_pause() if idempotent and retryable(err) else None
            if pause is None:
                raise from_rpc_error(err) from None
            await asyncio.sleep(pause)


def retry_sync(fn: Callable[[], T], idempotent: bool, seconds: float) -> T:
    backoff = Backoff(seconds)
    while True:
        try:
            return fn()
        except grpc.RpcError as err:
            pause = backoff.next_pause() if idempotent and retryable(err) else None
            if pause is None:
                raise from_rpc_error(err) from None
            time.sleep(pause)


class AsyncService:
    """A generated grpc.aio stub whose unary calls retry (see NOT_RETRIED) and whose
    errors arrive as CtxccError; typed as the stub it wraps (see AsyncClient)."""

    def __init__(self, stub: Any, seconds: float) -> None:
        self._stub = stub
        self._seconds = seconds

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._stub, name)
        seconds = self._seconds
        if isinstance(method, grpc.aio.UnaryUnaryMultiCallable):
            idempotent = name not in NOT_RETRIED

            async def unary(request: Any, **kw: Any) -> Any:
                req = with_request_id(request)
                return await retry_async(lambda: method(req, **kw), idempotent, seconds)

            return unary
        if isinstance(method, grpc.aio.UnaryStreamMultiCallable):

            async def server_stream(request: Any, **kw: Any) -> AsyncIterator[Any]:
                try:
                    async for item in method(request, **kw):
                        yield item
                except grpc.aio.AioRpcError as err:
                    raise from_rpc_error(err) from None

            return server_stream
        if isinstance(method, grpc.aio.StreamUnaryMultiCallable):

            async def client_stream(requests: Any, **kw: Any) -> Any:
                try:
                    return await method(requests, **kw)
                except grpc.aio.AioRpcError as err:
                    raise from_rpc_error(err) from None

            return client_stream
        return method  # CompileStream: use AsyncClient.stream()


class SyncService:
    """The blocking twin of AsyncService."""

    def __init__(self, stub: Any, seconds: float) -> None:
        self._stub = stub
        self._seconds = seconds

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._stub, name)
        seconds = self._seconds
        if isinstance(method, grpc.UnaryUnaryMultiCallable):
            idempotent = name not in NOT_RETRIED

            def unary(request: Any, **kw: Any) -> Any:
                req = with_request_id(request)
                return retry_sync(lambda: method(req, **kw), idempotent, seconds)

            return unary
        if isinstance(method, grpc.UnaryStreamMultiCallable):

            def server_stream(request: Any, **kw: Any) -> Iterator[Any]:
                try:
                    yield from method(request, **kw)
                except grpc.RpcError as err:
                    raise from_rpc_error(err) from None

            return server_stream
        if isinstance(method, grpc.StreamUnaryMultiCallable):

            def client_stream(requests: Any, **kw: Any) -> Any:
                try:
                    return method(requests, **kw)
                except grpc.RpcError as err:
                    raise from_rpc_error(err) from None

            return client_stream
        return method
