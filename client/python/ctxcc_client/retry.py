"""Retries on UNAVAILABLE (and on the daemon's transient quotas, see
errors.TRANSIENT_QUOTAS), bounded by time rather than attempts: a daemon that is down for a
few seconds (a restart, a rollout) is waited out, and the channel options below make the
client find it again within about a second of it coming back.

Only calls that are safe to repeat are retried. Appends and checkpoints are made safe by
their request id, which is fixed *before* the first attempt and reused by every retry, so a
repeat is answered as a replay and never stored twice. CreateSession is made safe by its
session id, chosen here before the first attempt when the caller gives none: a retry that
finds the session already there (SESSION_ALREADY_EXISTS) reads it back, and returns it as
created when its creation fields are the request's, since it is then the session an earlier
attempt stored before its answer was lost. Deletes are not retried: a repeat of a delete that
went through finds nothing, and nothing tells that apart from a delete of nothing, but for
a transient quota's refusal (see `retried`): the daemon did none of it."""

from __future__ import annotations

import asyncio
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, TypeVar

import grpc

from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_pb2
from ctxcc.v1 import session_service_pb2 as spb
from ctxcc_client.errors import (
    CtxccError,
    cancelled_by_daemon,
    from_rpc_error,
    lost_write,
    refused_for_now,
)

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

# Unary RPCs that a blind repeat would change: a second delete finds nothing where the first
# found something, and the caller cannot tell which one its answer came from. Every other
# unary RPC is a read, an upsert by a client-chosen id, carries a request id, or is
# CreateSession (see create_session_async).
NOT_RETRIED = frozenset({"DeleteSession", "DeleteMemory", "DeleteRule", "DeleteSkill"})

# The daemon's own session ids: "s-" and 24 hex digits (server/adapters/system.py).
SESSION_PREFIX = "s-"
SESSION_ALREADY_EXISTS = "SESSION_ALREADY_EXISTS"
# What a CreateSession sets of a session; the daemon fills in the rest.
CREATION_FIELDS = ("workspace_id", "project_id", "project_root", "working_directory")


def new_request_id() -> str:
    return uuid.uuid4().hex


def new_session_id() -> str:
    """A session id of the daemon's shape, chosen by the client so that every attempt of
    one CreateSession names the same session."""
    return SESSION_PREFIX + secrets.token_hex(12)


def with_session_id(request: spb.CreateSessionRequest) -> spb.CreateSessionRequest:
    """A CreateSession without a session id gets one here, once, before any attempt."""
    if request.session.session_id:
        return request
    copy = spb.CreateSessionRequest()
    copy.CopyFrom(request)
    copy.session.session_id = new_session_id()
    return copy


def same_creation(stored: session_pb2.Session, asked: session_pb2.Session) -> bool:
    """Whether `stored` is what creating `asked` stores: the same creation fields."""
    return all(getattr(stored, f) == getattr(asked, f) for f in CREATION_FIELDS) and dict(
        stored.labels
    ) == dict(asked.labels)


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


def per_attempt(kw: dict[str, Any]) -> tuple[float | None, Callable[[], dict[str, Any]]]:
    """The deadline a caller's `timeout=` sets for a whole call (None: none) and the keyword
    arguments of each attempt. gRPC applies a timeout to one attempt: passed as it is, every
    retry would get it whole, and an unavailable daemon would be waited out for the full
    retry budget whatever the caller asked. Each attempt gets what is left of it instead."""
    timeout = kw.get("timeout")
    if timeout is None:
        return None, lambda: kw
    deadline = time.monotonic() + timeout
    return deadline, lambda: {**kw, "timeout": max(0.0, deadline - time.monotonic())}


def _within(deadline: float | None, pause: float, err: grpc.RpcError) -> float:
    """`pause`, cut to the caller's deadline; DEADLINE_EXCEEDED once it has passed (the
    status gRPC gives a call whose deadline passes, with the last attempt's error)."""
    if deadline is None:
        return pause
    left = deadline - time.monotonic()
    if left <= 0:
        raise CtxccError(
            grpc.StatusCode.DEADLINE_EXCEEDED,
            "DEADLINE_EXCEEDED",
            f"the call's deadline passed while it was retried: {from_rpc_error(err)}",
            {},
        )
    return min(pause, left)


def retryable(err: grpc.RpcError) -> bool:
    """Whether a call safe to repeat is tried again (see retried for any call)."""
    return (
        bool(err.code() == grpc.StatusCode.UNAVAILABLE)
        or lost_write(err)
        or cancelled_by_daemon(err)
        or refused_for_now(err)
    )


def retried(err: grpc.RpcError, idempotent: bool) -> bool:
    """A call safe to repeat on what `retryable` accepts; any call, a delete included, on a
    transient quota's refusal, since the daemon did none of it."""
    return (idempotent and retryable(err)) or refused_for_now(err)


async def retry_async(
    fn: Callable[[], Awaitable[T]],
    idempotent: bool,
    seconds: float,
    deadline: float | None = None,
) -> T:
    backoff = Backoff(seconds)
    while True:
        try:
            return await fn()
        except grpc.aio.AioRpcError as err:
            pause = backoff.next_pause() if retried(err, idempotent) else None
            if pause is None:
                raise from_rpc_error(err) from None
            await asyncio.sleep(_within(deadline, pause, err))


async def create_session_async(
    create: Callable[[spb.CreateSessionRequest], Awaitable[spb.CreateSessionResponse]],
    get: Callable[[spb.GetSessionRequest], Awaitable[spb.GetSessionResponse]],
    request: spb.CreateSessionRequest,
    seconds: float,
    deadline: float | None = None,
) -> spb.CreateSessionResponse:
    """CreateSession, retried like any safe call under one session id fixed before the
    first attempt. SESSION_ALREADY_EXISTS for a retry may be an earlier attempt's session,
    stored before its answer was lost: it is read and returned when its creation fields are
    the request's. The first attempt refused so is a real conflict, raised as it is."""
    req = with_session_id(request)
    attempts = 0

    async def once() -> spb.CreateSessionResponse:
        nonlocal attempts
        attempts += 1
        return await create(req)

    try:
        return await retry_async(once, True, seconds, deadline)
    except CtxccError as err:
        if attempts < 2 or err.reason != SESSION_ALREADY_EXISTS:
            raise
        get_req = spb.GetSessionRequest(session_id=req.session.session_id)
        try:
            stored = (await retry_async(lambda: get(get_req), True, seconds, deadline)).session
        except CtxccError:
            raise err from None
        if not same_creation(stored, req.session):
            raise
        return spb.CreateSessionResponse(session=stored)


def create_session_sync(
    create: Callable[[spb.CreateSessionRequest], spb.CreateSessionResponse],
    get: Callable[[spb.GetSessionRequest], spb.GetSessionResponse],
    request: spb.CreateSessionRequest,
    seconds: float,
    deadline: float | None = None,
) -> spb.CreateSessionResponse:
    """The blocking twin of create_session_async."""
    req = with_session_id(request)
    attempts = 0

    def once() -> spb.CreateSessionResponse:
        nonlocal attempts
        attempts += 1
        return create(req)

    try:
        return retry_sync(once, True, seconds, deadline)
    except CtxccError as err:
        if attempts < 2 or err.reason != SESSION_ALREADY_EXISTS:
            raise
        get_req = spb.GetSessionRequest(session_id=req.session.session_id)
        try:
            stored = retry_sync(lambda: get(get_req), True, seconds, deadline).session
        except CtxccError:
            raise err from None
        if not same_creation(stored, req.session):
            raise
        return spb.CreateSessionResponse(session=stored)


def retry_sync(
    fn: Callable[[], T], idempotent: bool, seconds: float, deadline: float | None = None
) -> T:
    backoff = Backoff(seconds)
    while True:
        try:
            return fn()
        except grpc.RpcError as err:
            pause = backoff.next_pause() if retried(err, idempotent) else None
            if pause is None:
                raise from_rpc_error(err) from None
            time.sleep(_within(deadline, pause, err))


class AsyncService:
    """A generated grpc.aio stub whose unary calls retry (see NOT_RETRIED) and whose
    errors arrive as CtxccError; typed as the stub it wraps (see AsyncClient)."""

    def __init__(self, stub: Any, seconds: float) -> None:
        self._stub = stub
        self._seconds = seconds

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._stub, name)
        seconds = self._seconds
        if name == "CreateSession":
            get = self._stub.GetSession

            async def create(request: Any, **kw: Any) -> Any:
                deadline, attempt = per_attempt(kw)
                return await create_session_async(
                    lambda r: method(r, **attempt()),
                    lambda r: get(r, **attempt()),
                    request,
                    seconds,
                    deadline,
                )

            return create
        if isinstance(method, grpc.aio.UnaryUnaryMultiCallable):
            idempotent = name not in NOT_RETRIED

            async def unary(request: Any, **kw: Any) -> Any:
                req = with_request_id(request)
                deadline, attempt = per_attempt(kw)
                return await retry_async(
                    lambda: method(req, **attempt()), idempotent, seconds, deadline
                )

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
        if name == "CreateSession":
            get = self._stub.GetSession

            def create(request: Any, **kw: Any) -> Any:
                deadline, attempt = per_attempt(kw)
                return create_session_sync(
                    lambda r: method(r, **attempt()),
                    lambda r: get(r, **attempt()),
                    request,
                    seconds,
                    deadline,
                )

            return create
        if isinstance(method, grpc.UnaryUnaryMultiCallable):
            idempotent = name not in NOT_RETRIED

            def unary(request: Any, **kw: Any) -> Any:
                req = with_request_id(request)
                deadline, attempt = per_attempt(kw)
                return retry_sync(lambda: method(req, **attempt()), idempotent, seconds, deadline)

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
