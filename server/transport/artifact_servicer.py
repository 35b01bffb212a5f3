"""ctxcc.v1.ArtifactService: chunked, verified uploads and downloads."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc

from ctxcc.v1 import artifact_service_pb2 as pb
from ctxcc.v1 import artifact_service_pb2_grpc as pb_grpc
from ctxcc.v1 import common_pb2
from server.domain.errors import invalid
from server.domain.records import ArtifactRecord
from server.service.artifacts import ArtifactHeader, ArtifactUseCases
from server.transport.errors import streaming, unary
from server.transport.held import HeldBytes

Ctx = grpc.aio.ServicerContext[Any, Any]
DOWNLOAD_CHUNK = 256 << 10
# Bytes that uploads in progress may hold in memory together, in artifacts of the
# largest size: an upload is buffered whole until its sha256 is checked, and a client
# that never ends its stream would otherwise hold what it sent for as long as it likes.
# Downloads in progress get as much again: a download's bytes stay in memory until its
# call ends, since gRPC keeps what a reader has not taken yet (30 unread downloads of
# 19 MiB held ~625 MB).
MEMORY_IN_ARTIFACTS = 8


def ref_out(r: ArtifactRecord) -> common_pb2.ArtifactRef:
    return common_pb2.ArtifactRef(
        artifact_id=r.artifact_id,
        mime_type=r.mime_type,
        size_bytes=r.size_bytes,
        width=r.width,
        height=r.height,
        sha256=r.sha256,
    )


class ArtifactServicer(pb_grpc.ArtifactServiceServicer):
    def __init__(self, artifacts: ArtifactUseCases) -> None:
        self._a = artifacts
        self._held = HeldBytes(MEMORY_IN_ARTIFACTS * artifacts.max_bytes)
        self._sending = HeldBytes(
            MEMORY_IN_ARTIFACTS * artifacts.max_bytes, "downloads", "download"
        )

    @unary
    async def UploadArtifact(
        self, request: AsyncIterator[pb.UploadArtifactRequest], context: Ctx
    ) -> pb.UploadArtifactResponse:
        header: ArtifactHeader | None = None
        life = 0  # the create time of the session the upload began in
        chunks: list[bytes] = []
        received = 0
        try:
            async for msg in request:
                kind = msg.WhichOneof("chunk")
                if header is None:
                    if kind != "header":
                        raise invalid("header", "the first upload message must carry the header")
                    h = msg.header
                    header = ArtifactHeader(
                        h.session_id,
                        h.mime_type,
                        h.size_bytes,
                        h.sha256,
                        h.width,
                        h.height,
                        h.request_id,
                    )
                    life = await self._a.begin(header)
                elif kind == "data":
                    # Stop reading as soon as the declared size or the limit is passed:
                    # memory stays bounded whatever the client sends.
                    if received + len(msg.data) > min(header.size_bytes, self._a.max_bytes):
                        if received + len(msg.data) > self._a.max_bytes:
                            raise self._a.too_large(received + len(msg.data))
                        raise invalid("data", "more data than the header's size_bytes")
                    self._held.take(len(msg.data))
                    received += len(msg.data)
                    chunks.append(msg.data)
                else:
                    raise invalid("header", "only the first upload message may carry a header")
            if header is None:
                raise invalid("header", "the upload stream was empty")
            record = await self._a.put(header, b"".join(chunks), life)
        finally:
            self._held.give(received)
        return pb.UploadArtifactResponse(artifact=ref_out(record))

    @streaming
    async def DownloadArtifact(
        self, request: pb.DownloadArtifactRequest, context: Ctx
    ) -> AsyncIterator[pb.DownloadArtifactResponse]:
        record = await self._a.record(request.session_id, request.artifact_id)
        # Taken from the recorded size (an upload's size and sha256 are checked, and its
        # blob is addressed by the sha256): a refused download reads nothing.
        size = record.size_bytes
        self._sending.take(size)
        # Given back when the call ends, not when its last chunk is handed to gRPC, which
        # keeps what the reader has not taken yet until then.
        # (grpc-stubs types the callback as a class of its own, no function matches it.)
        context.add_done_callback(lambda _: self._sending.give(size))  # type: ignore[arg-type]
        data = await self._a.data(record)
        yield pb.DownloadArtifactResponse(artifact=ref_out(record))
        for offset in range(0, len(data), DOWNLOAD_CHUNK):
            yield pb.DownloadArtifactResponse(data=data[offset : offset + DOWNLOAD_CHUNK])
