"""Shared test helpers: error reasons from real gRPC errors, message builders."""

from __future__ import annotations

import asyncio
import hashlib
import struct
import urllib.request
import zlib
from typing import Any

import grpc
from google.rpc import error_details_pb2, status_pb2
from prometheus_client.parser import text_string_to_metric_families

from ctxcc.v1 import artifact_service_pb2 as apb
from ctxcc.v1 import common_pb2, compile_service_pb2, event_pb2, session_service_pb2


def error_info(err: grpc.RpcError) -> error_details_pb2.ErrorInfo:
    """The ErrorInfo of a failed call; fails the test if there is none."""
    trailing: Any = err.trailing_metadata() if hasattr(err, "trailing_metadata") else None
    for key, value in trailing or ():
        if key == "grpc-status-details-bin":
            status = status_pb2.Status.FromString(value)
            for detail in status.details:
                info = error_details_pb2.ErrorInfo()
                if detail.Unpack(info):
                    return info
    raise AssertionError(f"no ErrorInfo on error {err!r}")


def varint(n: int) -> bytes:
    """`n` as protobuf's base-128 varint: for messages encoded by hand."""
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def padded_watch(channel: grpc.Channel, session_id: str, pad: int) -> Any:
    """A WatchSession (its response iterator) whose request carries `pad` bytes in a field
    no version of it has: parsed and kept as an unknown field for as long as the watch
    lives, so those bytes stay held of the daemon's request budget until it is cancelled."""
    head = session_service_pb2.WatchSessionRequest(session_id=session_id).SerializeToString()
    watch = channel.unary_stream(
        "/ctxcc.v1.SessionService/WatchSession",
        request_serializer=lambda b: b,
        response_deserializer=session_service_pb2.WatchSessionResponse.FromString,
    )
    return watch(head + varint(99 << 3 | 2) + varint(pad) + b"p" * pad)


def user(text: str, event_id: str = "") -> event_pb2.Event:
    ev = event_pb2.Event(event_id=event_id)
    ev.user_message.parts.add(text=text)
    return ev


def assistant(text: str, *calls: tuple[str, str, str], reasoning: str = "") -> event_pb2.Event:
    ev = event_pb2.Event()
    if text:
        ev.assistant_message.parts.add(text=text)
    for call_id, name, args in calls:
        ev.assistant_message.tool_calls.add(call_id=call_id, name=name, arguments_json=args)
    ev.assistant_message.reasoning = reasoning
    return ev


def tool_result(call_id: str, text: str, name: str = "shell") -> event_pb2.Event:
    ev = event_pb2.Event()
    ev.tool_result.call_id = call_id
    ev.tool_result.tool_name = name
    ev.tool_result.text = text
    return ev


ROUTE = common_pb2.Route(
    connection="default", protocol="anthropic-messages", endpoint="api", model="claude-sonnet-4"
)


def compile_request(session_id: str, **kw: object) -> compile_service_pb2.CompileRequest:
    return compile_service_pb2.CompileRequest(session_id=session_id, route=ROUTE, **kw)  # type: ignore[arg-type]


def usage_counts(metrics_address: str) -> tuple[float, float]:
    """(usage reports recorded, unary ReportUsage calls) from a daemon's /metrics."""
    url = f"http://{metrics_address}/metrics"
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    reports = unary = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "ctxcc_usage_reports_total":
                reports += s.value
            if s.name == "ctxcc_rpc_duration_seconds_count" and s.labels.get("method") == (
                "CompileService/ReportUsage"
            ):
                unary += s.value
    return reports, unary


def png_bytes(width: int, height: int) -> bytes:
    """A complete, valid PNG (greyscale, 8 bits) of the size given."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body) & 0xFFFFFFFF
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    rows = (b"\x00" + b"\x80" * width) * height
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def gif_bytes(width: int, height: int) -> bytes:
    """A complete, valid GIF89a of the size given, every pixel black (6 bits a pixel:
    keep it small)."""
    header = b"GIF89a" + struct.pack("<HHBBB", width, height, 0x80, 0, 0) + b"\x00" * 6
    image = b"\x2c" + struct.pack("<HHHHB", 0, 0, width, height, 0)
    # LZW with minimum code size 2: each pixel is a clear code (4) and then colour 0, so
    # codes stay 3 bits; the end-of-information code (5) closes the stream.
    codes = [4, 0] * (width * height) + [5]
    bits = sum(c << (3 * i) for i, c in enumerate(codes))
    data = bits.to_bytes((3 * len(codes) + 7) // 8, "little")
    blocks = b"".join(
        bytes([len(data[i : i + 255])]) + data[i : i + 255] for i in range(0, len(data), 255)
    )
    return header + image + b"\x02" + blocks + b"\x00\x3b"


def jpeg_bytes(width: int, height: int) -> bytes:
    """A JPEG's segments up to its frame header (SOI, APP0, a baseline SOF naming the
    size) and EOI: what the daemon reads of one, and its magic bytes."""
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
    frame = b"\xff\xc0" + struct.pack(">HBHHB", 11, 8, height, width, 1) + b"\x01\x11\x00"
    return b"\xff\xd8" + app0 + frame + b"\xff\xd9"


def webp_bytes(width: int, height: int) -> bytes:
    """A lossy WebP's RIFF header and VP8 frame header naming the size."""
    body = b"\x00\x00\x00\x9d\x01\x2a" + struct.pack("<HH", width, height) + b"\0" * 10
    payload = b"WEBPVP8 " + struct.pack("<I", len(body)) + body
    return b"RIFF" + struct.pack("<I", len(payload)) + payload


def png_upload(
    sid: str, data: bytes, side: int = 32, mime_type: str = "image/png"
) -> list[apb.UploadArtifactRequest]:
    """The messages of an UploadArtifact call storing `data` as a `side`x`side` PNG in
    session `sid` (a stream of them: sync and async stubs both take the list)."""
    header = apb.ArtifactHeader(
        session_id=sid,
        mime_type=mime_type,
        size_bytes=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        width=side,
        height=side,
    )
    return [apb.UploadArtifactRequest(header=header), apb.UploadArtifactRequest(data=data)]


def leading_reasoning(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the helpers log of a response's reasoning: the item right before its first
    message or call, when it carries encrypted content."""
    last = None
    for item in output:
        if item["type"] in ("message", "function_call"):
            break
        if item["type"] == "reasoning":
            last = item
    return [last] if last is not None and last.get("encrypted_content") else []


async def next_user_event(updates: Any) -> tuple[int, str]:
    """(seq, text) of the next event a WatchSession iterator delivers (a user message),
    past any other update; waits at most 30 s."""
    while True:
        msg = await asyncio.wait_for(updates.__anext__(), 30)
        if msg.HasField("event"):
            return msg.event.seq, msg.event.user_message.parts[0].text
