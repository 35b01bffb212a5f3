"""Requests and results the clients build the same way, asyncio or blocking."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import grpc

from ctxcc.v1 import artifact_service_pb2 as apb
from ctxcc.v1 import common_pb2, event_pb2
from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_service_pb2 as spb
from ctxcc_client.retry import OPTIONS, AsyncService, SyncService, new_request_id

CHUNK = 1 << 20


def compile_request(
    session_id: str, model: str, route: common_pb2.Route | None, fields: dict[str, Any]
) -> cpb.CompileRequest:
    return cpb.CompileRequest(
        session_id=session_id,
        route=route if route is not None else common_pb2.Route(model=model),
        **fields,
    )


def append_request(
    session_id: str, events: list[event_pb2.Event], request_id: str, expected: int | None
) -> spb.AppendEventsRequest:
    # The id is fixed here, before the first attempt: every retry resends it.
    req = spb.AppendEventsRequest(
        session_id=session_id, events=events, request_id=request_id or new_request_id()
    )
    if expected is not None:
        req.expected_last_seq = expected
    return req


def usage_request(
    compile_id: str, route: common_pb2.Route | None, **counts: int
) -> cpb.ReportUsageRequest:
    return cpb.ReportUsageRequest(compile_id=compile_id, route=route, **counts)


def upload_requests(header: apb.ArtifactHeader, data: bytes) -> Iterator[apb.UploadArtifactRequest]:
    yield apb.UploadArtifactRequest(header=header)
    for start in range(0, len(data), CHUNK):
        yield apb.UploadArtifactRequest(data=data[start : start + CHUNK])


def upload_header(
    session_id: str, data: bytes, mime_type: str, width: int, height: int, request_id: str
) -> apb.ArtifactHeader:
    # The id is fixed here, before the first attempt: a retry is answered with the artifact
    # the first attempt stored.
    return apb.ArtifactHeader(
        session_id=session_id,
        mime_type=mime_type,
        size_bytes=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        width=width,
        height=height,
        request_id=request_id or new_request_id(),
    )


class Download:
    """Collects a DownloadArtifact stream and checks the bytes against the ref's sha256."""

    def __init__(self) -> None:
        self.ref = common_pb2.ArtifactRef()
        self.parts: list[bytes] = []

    def add(self, msg: apb.DownloadArtifactResponse) -> None:
        if msg.HasField("artifact"):
            self.ref = msg.artifact
        else:
            self.parts.append(msg.data)

    def result(self) -> tuple[common_pb2.ArtifactRef, bytes]:
        data = b"".join(self.parts)
        if hashlib.sha256(data).hexdigest() != self.ref.sha256:
            raise ValueError(f"artifact {self.ref.artifact_id} arrived damaged")
        return self.ref, data


def async_service(stub: Any, channel: grpc.aio.Channel, seconds: float) -> Any:
    return AsyncService(stub(channel), seconds)


def sync_service(stub: Any, channel: grpc.Channel, seconds: float) -> Any:
    return SyncService(stub(channel), seconds)


def channel_options(extra: list[tuple[str, Any]] | None) -> list[tuple[str, Any]]:
    return [*OPTIONS, *(extra or [])]
