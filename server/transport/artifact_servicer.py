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

Ctx = grpc.aio.ServicerContext[Any, Any]
DOWNLOAD_CHUNK = 256 << 10


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

    @unary
    async def UploadArtifact(
        self, request: AsyncIterator[pb.UploadArtifactRequest], context: Ctx
    ) -> pb.UploadArtifactResponse:
        header: ArtifactHeader | None = None
        chunks: list[bytes] = []
        received = 0
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
                self._a.check_header(header)
            elif kind == "data":
                received += len(msg.data)
                # Stop reading as soon as the declared size or the limit is passed:
                # memory stays bounded whatever the client sends.
                if received > min(header.size_bytes, self._a.max_bytes):
                    if received > self._a.max_bytes:
                        raise self._a.too_large(received)
                    raise invalid("data", "more data than the header's size_bytes")
                chunks.append(msg.data)
            else:
                raise invalid("header", "only the first upload message may carry a header")
        if header is None:
            raise invalid("header", "the upload stream was empty")
        record = await self._a.put(header, b"".join(chunks))
        return pb.UploadArtifactResponse(artifact=ref_out(record))

    @streaming
    async def DownloadArtifact(
        self, request: pb.DownloadArtifactRequest, context: Ctx
    ) -> AsyncIterator[pb.DownloadArtifactResponse]:
        record, data = await self._a.get(request.session_id, request.artifact_id)
        yield pb.DownloadArtifactResponse(artifact=ref_out(record))
        for offset in range(0, len(data), DOWNLOAD_CHUNK):
            yield pb.DownloadArtifactResponse(data=data[offset : offset + DOWNLOAD_CHUNK])
