"""The one table from domain reasons to gRPC codes, and the guard every RPC runs in.

Errors leave as `google.rpc.Status` with one `google.rpc.ErrorInfo` (domain
"ctxcc.dev", reason = the ErrorReason name without prefix). Unknown exceptions become
INTERNAL with a correlation id; the traceback stays in the daemon's log.
"""

from __future__ import annotations

import functools
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol, TypeVar

import grpc
from google.protobuf import any_pb2
from google.protobuf.message import DecodeError
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from server.domain.errors import CtxccError, Reason

log = logging.getLogger("ctxcc.transport")

DOMAIN = "ctxcc.dev"
_DETAILS_KEY = "grpc-status-details-bin"


class ErrorObserver(Protocol):
    """Where every error ctxcc answers is reported once, by its ErrorInfo reason: a
    call's status (the interceptor) or a CompileStream step's StepError (the stream)."""

    def error_answered(self, reason: str) -> None: ...


class Unobserved:
    """An ErrorObserver that keeps nothing: handlers built without a daemon (benchmarks,
    unit tests)."""

    def error_answered(self, reason: str) -> None:
        pass


CODES: dict[Reason, grpc.StatusCode] = {
    Reason.INVALID_FIELD: grpc.StatusCode.INVALID_ARGUMENT,
    Reason.FIELD_TOO_LARGE: grpc.StatusCode.INVALID_ARGUMENT,
    Reason.SESSION_NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    Reason.SESSION_ALREADY_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    Reason.SEQUENCE_MISMATCH: grpc.StatusCode.FAILED_PRECONDITION,
    Reason.REQUEST_ID_REUSED: grpc.StatusCode.FAILED_PRECONDITION,
    Reason.EVENT_ID_CONFLICT: grpc.StatusCode.ALREADY_EXISTS,
    Reason.TOO_MANY_EVENTS: grpc.StatusCode.INVALID_ARGUMENT,
    Reason.QUOTA_EXCEEDED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Reason.ARTIFACT_NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    Reason.ARTIFACT_CHECKSUM_MISMATCH: grpc.StatusCode.INVALID_ARGUMENT,
    Reason.ARTIFACT_TOO_LARGE: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Reason.COMPILE_NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    Reason.ROUTE_MISMATCH: grpc.StatusCode.FAILED_PRECONDITION,
    Reason.CHECKPOINT_NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    Reason.CHECKPOINT_INVALID: grpc.StatusCode.FAILED_PRECONDITION,
    Reason.TOOL_RESULT_NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    Reason.SOURCE_NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    Reason.INVALID_PAGE_TOKEN: grpc.StatusCode.INVALID_ARGUMENT,
    Reason.INVALID_PATTERN: grpc.StatusCode.INVALID_ARGUMENT,
    Reason.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
    Reason.SHUTTING_DOWN: grpc.StatusCode.UNAVAILABLE,
    Reason.STORAGE_FAILURE: grpc.StatusCode.UNAVAILABLE,
    Reason.INTERNAL: grpc.StatusCode.INTERNAL,
    Reason.PATH_OUTSIDE_ROOT: grpc.StatusCode.INVALID_ARGUMENT,
    Reason.SEQ_OUT_OF_RANGE: grpc.StatusCode.OUT_OF_RANGE,
    Reason.RECORD_CORRUPT: grpc.StatusCode.DATA_LOSS,
    Reason.USAGE_INVALID: grpc.StatusCode.INVALID_ARGUMENT,
    Reason.DISK_FULL: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Reason.METHOD_NOT_FOUND: grpc.StatusCode.UNIMPLEMENTED,
}


# Error details travel in trailing metadata, which clients cap (16 KiB by default):
# messages and metadata values that quote client input are cut to fit.
MAX_MESSAGE = 1_000
MAX_METADATA_VALUE = 200


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def logged(err: CtxccError) -> None:
    """The store's failures go to the daemon's log with RocksDB's words (`detail`), which
    the client never sees: how an operator paged for them finds the damaged table."""
    if err.reason in (Reason.RECORD_CORRUPT, Reason.STORAGE_FAILURE):
        log.error("%s: %s", err.reason.value, getattr(err, "detail", err.message))


def status_for(err: CtxccError) -> grpc.Status:
    logged(err)
    message, metadata = shown(err)
    info = error_details_pb2.ErrorInfo(reason=err.reason.value, domain=DOMAIN, metadata=metadata)
    detail = any_pb2.Any()
    detail.Pack(info)
    code = CODES[err.reason]
    status = status_pb2.Status(code=code.value[0], message=message, details=[detail])
    return rpc_status.to_status(status)


def shown(err: CtxccError) -> tuple[str, dict[str, str]]:
    """The message and metadata of `err` as an answer carries them (a unary call's status
    or a stream step's StepError): cut to their limits."""
    metadata = {k: _cut(v, MAX_METADATA_VALUE) for k, v in err.metadata.items()}
    return _cut(err.message, MAX_MESSAGE), metadata


def answered_reason(trailing_metadata: Any) -> str | None:
    """The ErrorInfo reason of the status a call ended with, read back from its trailing
    metadata (where `abort_with_status` puts the `google.rpc.Status`); None for a status
    without one of ours (gRPC's own: a cancel, a deadline, a handler failed unguarded)."""
    for key, value in trailing_metadata or ():
        if key != _DETAILS_KEY or not isinstance(value, bytes):
            continue
        try:
            status = status_pb2.Status.FromString(value)
        except DecodeError:  # not ours: counted by its code alone
            return None
        for detail in status.details:
            info = error_details_pb2.ErrorInfo()
            if detail.Unpack(info) and info.domain == DOMAIN:
                return str(info.reason)
    return None


def internal_error(exc: BaseException) -> CtxccError:
    incident = secrets.token_hex(6)
    log.error("internal error %s", incident, exc_info=exc)
    return CtxccError(Reason.INTERNAL, f"internal error (incident {incident})", incident=incident)


S = TypeVar("S")
Req = TypeVar("Req")
Resp = TypeVar("Resp")


def unary(
    fn: Callable[[S, Req, grpc.aio.ServicerContext[Req, Resp]], Awaitable[Resp]],
) -> Callable[[S, Req, grpc.aio.ServicerContext[Req, Resp]], Awaitable[Resp]]:
    """Runs a unary (or stream-request) handler under the error table."""

    @functools.wraps(fn)
    async def wrapper(self: S, request: Req, context: grpc.aio.ServicerContext[Req, Resp]) -> Resp:
        try:
            return await fn(self, request, context)
        except CtxccError as err:
            await context.abort_with_status(status_for(err))
            raise  # abort_with_status raises; this keeps type checkers honest
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await context.abort_with_status(status_for(internal_error(exc)))
            raise

    return wrapper


def streaming(
    fn: Callable[[S, Req, grpc.aio.ServicerContext[Req, Resp]], AsyncIterator[Resp]],
) -> Callable[[S, Req, grpc.aio.ServicerContext[Req, Resp]], AsyncIterator[Resp]]:
    """The same guard for handlers that stream responses."""

    @functools.wraps(fn)
    async def wrapper(
        self: S,
        request: Req,
        context: grpc.aio.ServicerContext[Req, Resp],
    ) -> AsyncIterator[Resp]:
        try:
            async for item in fn(self, request, context):
                yield item
        except CtxccError as err:
            await context.abort_with_status(status_for(err))
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await context.abort_with_status(status_for(internal_error(exc)))

    return wrapper
