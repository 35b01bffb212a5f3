"""Domain errors. Each carries a stable reason; transport maps reasons to gRPC codes.

The reason names equal the proto `ErrorReason` value names without their prefix, and
are what clients branch on. Messages are for people and must not carry internals.
"""

from __future__ import annotations

import enum


class Reason(enum.Enum):
    INVALID_FIELD = "INVALID_FIELD"
    FIELD_TOO_LARGE = "FIELD_TOO_LARGE"
    SESSION_NOT_FOUND = "SESSION_NOT_FOUND"
    SESSION_ALREADY_EXISTS = "SESSION_ALREADY_EXISTS"
    SEQUENCE_MISMATCH = "SEQUENCE_MISMATCH"
    REQUEST_ID_REUSED = "REQUEST_ID_REUSED"
    EVENT_ID_CONFLICT = "EVENT_ID_CONFLICT"
    TOO_MANY_EVENTS = "TOO_MANY_EVENTS"
    QUOTA_EXCEEDED = "QUOTA_EXCEEDED"
    ARTIFACT_NOT_FOUND = "ARTIFACT_NOT_FOUND"
    ARTIFACT_CHECKSUM_MISMATCH = "ARTIFACT_CHECKSUM_MISMATCH"
    ARTIFACT_TOO_LARGE = "ARTIFACT_TOO_LARGE"
    COMPILE_NOT_FOUND = "COMPILE_NOT_FOUND"
    ROUTE_MISMATCH = "ROUTE_MISMATCH"
    CHECKPOINT_NOT_FOUND = "CHECKPOINT_NOT_FOUND"
    CHECKPOINT_INVALID = "CHECKPOINT_INVALID"
    TOOL_RESULT_NOT_FOUND = "TOOL_RESULT_NOT_FOUND"
    SOURCE_NOT_FOUND = "SOURCE_NOT_FOUND"
    INVALID_PAGE_TOKEN = "INVALID_PAGE_TOKEN"
    INVALID_PATTERN = "INVALID_PATTERN"
    UNAUTHENTICATED = "UNAUTHENTICATED"
    SHUTTING_DOWN = "SHUTTING_DOWN"
    STORAGE_FAILURE = "STORAGE_FAILURE"
    INTERNAL = "INTERNAL"
    PATH_OUTSIDE_ROOT = "PATH_OUTSIDE_ROOT"
    SEQ_OUT_OF_RANGE = "SEQ_OUT_OF_RANGE"
    RECORD_CORRUPT = "RECORD_CORRUPT"
    USAGE_INVALID = "USAGE_INVALID"
    DISK_FULL = "DISK_FULL"
    METHOD_NOT_FOUND = "METHOD_NOT_FOUND"


class CtxccError(Exception):
    """A failure with a stable reason and safe-to-show message and metadata."""

    def __init__(self, reason: Reason, message: str, **metadata: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.metadata = dict(metadata)


def invalid(field: str, message: str) -> CtxccError:
    return CtxccError(Reason.INVALID_FIELD, message, field=field)


def too_large(field: str, size: int, limit: int) -> CtxccError:
    return CtxccError(
        Reason.FIELD_TOO_LARGE,
        f"{field} is {size} bytes, over the limit of {limit}",
        field=field,
        limit=str(limit),
    )


def session_not_found(session_id: str) -> CtxccError:
    return CtxccError(
        Reason.SESSION_NOT_FOUND, f"session {session_id!r} does not exist", session_id=session_id
    )
