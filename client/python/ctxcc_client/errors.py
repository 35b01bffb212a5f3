"""Errors keyed by the daemon's `google.rpc.ErrorInfo.reason`, never by message text."""

from __future__ import annotations

from typing import Any

import grpc
from google.rpc import error_details_pb2, status_pb2

from ctxcc.v1 import compile_service_pb2 as cpb


class CtxccError(Exception):
    """A failed call: gRPC code, stable reason (e.g. "SEQUENCE_MISMATCH"), metadata."""

    def __init__(
        self,
        code: grpc.StatusCode,
        reason: str,
        message: str,
        metadata: dict[str, str],
        *,
        usage_refused: bool = False,
    ) -> None:
        # Without an ErrorInfo the reason is the code's name: said once, not twice.
        said = code.name if reason == code.name else f"{code.name} {reason}"
        super().__init__(f"{said}: {message}")
        self.code = code
        self.reason = reason
        self.message = message
        self.metadata = metadata
        # A stream step failed because the usage report it carried was refused: nothing
        # of the step was done (no append, no compile).
        self.usage_refused = usage_refused


# What grpc.aio reports, in place of the call's status, when it could not write a request
# to a call the daemon had already ended (a stream or upload turned away SHUTTING_DOWN as
# it arrived, while its first message was being sent): the daemon's answer is lost.
_LOST_WRITE = "Internal error from Core"


def lost_write(err: grpc.RpcError) -> bool:
    """True for grpc.aio's own INTERNAL for a request it could not send: the call was
    over before it was written (the daemon ended it), so nothing of it was done; send it
    again on a new call, as after UNAVAILABLE."""
    call: Any = err
    return bool(call.code() == grpc.StatusCode.INTERNAL and call.details() == _LOST_WRITE)


# What grpc itself says of a call this process cancelled (grpc.aio raises
# asyncio.CancelledError for those instead, but the blocking stubs and a collected call
# report a status).
_LOCAL_CANCEL = ("Locally cancelled by application!", "Cancelled upon garbage collection!")


def cancelled_by_daemon(err: grpc.RpcError) -> bool:
    """True for a bare CANCELLED (no ErrorInfo) that this process did not cause: gRPC's
    own stop in a daemon shutting down cancels the calls that reach it while it stops
    (a client retrying every 50-250 ms sends some into that window, after the daemon's
    drain). The daemon itself never answers CANCELLED, so the call is retried as after
    UNAVAILABLE: when it is safe to repeat (a read, or a request id that makes a repeat a
    replay), never otherwise."""
    call: Any = err
    return bool(
        call.code() == grpc.StatusCode.CANCELLED
        and call.details() not in _LOCAL_CANCEL
        and _error_info(call) is None
    )


def _error_info(call: Any) -> error_details_pb2.ErrorInfo | None:
    for key, value in call.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            status = status_pb2.Status.FromString(value)
            for detail in status.details:
                info = error_details_pb2.ErrorInfo()
                if detail.Unpack(info):
                    return info
    return None


def from_rpc_error(err: grpc.RpcError) -> CtxccError:
    call: Any = err
    if lost_write(err):
        return CtxccError(
            grpc.StatusCode.UNAVAILABLE,
            "UNAVAILABLE",
            "the call ended before its request was sent",
            {},
        )
    if cancelled_by_daemon(err):
        # Whether it ran is unknown, as when a connection drops: UNAVAILABLE says that.
        return CtxccError(
            grpc.StatusCode.UNAVAILABLE,
            "UNAVAILABLE",
            "the daemon cancelled the call as it stopped: reconnect and resend",
            {},
        )
    info = _error_info(call)
    reason, metadata = (info.reason, dict(info.metadata)) if info is not None else ("", {})
    return CtxccError(call.code(), reason or call.code().name, call.details() or "", metadata)


def from_step_error(err: cpb.StepError) -> CtxccError:
    """A step's in-band error (the stream stays open) as the same typed error."""
    code = next((c for c in grpc.StatusCode if c.value[0] == err.code), grpc.StatusCode.UNKNOWN)
    metadata = dict(err.metadata)  # empty from a daemon before StepError.metadata
    return CtxccError(code, err.reason, err.message, metadata, usage_refused=err.usage_refused)


# The daemon's quotas on what calls in progress hold at once (README "Memory of requests",
# --max-calls-in-progress): it refuses a call under them before doing any of it, and the
# refusal ends when other calls end, so the same call sent again later is safe and can pass.
# Every other quota (a session's bytes, max_message_bytes, compile_cpu_budget_ms, watchers)
# says the same call would fail again: it fails at once.
TRANSIENT_QUOTAS = frozenset(
    {
        "request_bytes_in_memory",
        "calls_in_progress",
        "upload_bytes_in_memory",
        "download_bytes_in_memory",
        "watch_bytes_in_memory",
    }
)


def transient_quota(code: grpc.StatusCode, reason: str, metadata: dict[str, str]) -> bool:
    """RESOURCE_EXHAUSTED/QUOTA_EXCEEDED under one of TRANSIENT_QUOTAS: nothing of the call
    was done, and it is retried as after UNAVAILABLE, a delete included."""
    return (
        code == grpc.StatusCode.RESOURCE_EXHAUSTED
        and reason == "QUOTA_EXCEEDED"
        and metadata.get("quota", "") in TRANSIENT_QUOTAS
    )


def refused_for_now(err: grpc.RpcError) -> bool:
    """transient_quota of a call's status."""
    call: Any = err
    if call.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
        return False
    info = _error_info(call)
    return info is not None and transient_quota(call.code(), info.reason, dict(info.metadata))


def stream_ended() -> CtxccError:
    """The daemon closed a stream without a status: it went away, reconnect and resend."""
    return CtxccError(grpc.StatusCode.UNAVAILABLE, "UNAVAILABLE", "the stream ended", {})
