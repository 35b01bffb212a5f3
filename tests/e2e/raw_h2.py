"""One gRPC call over a bare HTTP/2 connection, with header bytes no gRPC library sends:
grpc-python and grpc-go refuse non-ASCII metadata values on the client, but the daemon
serves any HTTP/2 peer that reaches its port. Only what these tests need: one call per
connection, headers sent as HPACK literals, a response whose headers grpc core writes as
literal names (a response coded otherwise fails the test loudly). Values grpc core
Huffman-codes (`grpc-status-details-bin`) are not decoded: only their presence is kept."""

from __future__ import annotations

import socket
import struct

_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_DATA, _HEADERS, _RST_STREAM, _SETTINGS, _GOAWAY = 0, 1, 3, 4, 7
_END_STREAM, _END_HEADERS, _ACK = 1, 4, 1


def _int(value: int, prefix: int) -> bytes:
    top = (1 << prefix) - 1
    if value < top:
        return bytes([value])
    out = [top]
    value -= top
    while value >= 128:
        out.append((value & 127) | 128)
        value >>= 7
    return bytes([*out, value])


def _read_int(data: bytes, i: int, prefix: int) -> tuple[int, int]:
    top = (1 << prefix) - 1
    value, i = data[i] & top, i + 1
    if value < top:
        return value, i
    shift = 0
    while True:
        b, i = data[i], i + 1
        value += (b & 127) << shift
        shift += 7
        if not b & 128:
            return value, i


def _read_string(data: bytes, i: int) -> tuple[bytes | None, int]:
    """A string and where it ends; None for a Huffman-coded one."""
    coded = bool(data[i] & 0x80)
    size, i = _read_int(data, i, 7)
    return (None if coded else data[i : i + size]), i + size


def _headers(block: bytes) -> dict[bytes, bytes | None]:
    """The literal headers of a block whose names are literal too (indexed ones, such as
    `:status 200`, are skipped); a Huffman-coded value is None."""
    out: dict[bytes, bytes | None] = {}
    i = 0
    while i < len(block):
        first = block[i]
        if first & 0x80:  # indexed field
            _, i = _read_int(block, i, 7)
            continue
        prefix = 6 if first & 0x40 else 5 if first & 0x20 else 4
        if prefix == 5:  # dynamic table size update
            _, i = _read_int(block, i, 5)
            continue
        index, i = _read_int(block, i, prefix)
        if index:
            raise AssertionError("an indexed header name: this helper reads literals only")
        name, i = _read_string(block, i)
        if name is None:
            raise AssertionError("a Huffman-coded header name: this helper reads literals only")
        out[name], i = _read_string(block, i)
    return out


def _frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return (
        struct.pack(">I", len(payload))[1:]
        + bytes([kind, flags])
        + struct.pack(">I", stream)
        + payload
    )


def call(
    address: str, method: str, message: bytes, metadata: list[tuple[bytes, bytes]]
) -> dict[bytes, bytes | None]:
    """The trailers (or trailers-only headers) of `method` called at `address` (host:port)
    with `message` and the raw `metadata`."""
    host, port = address.rsplit(":", 1)
    headers = [
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", method.encode()),
        (b":authority", address.encode()),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
        *metadata,
    ]
    block = b"".join(b"\x00" + _int(len(k), 7) + k + _int(len(v), 7) + v for k, v in headers)
    body = b"\x00" + struct.pack(">I", len(message)) + message
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(
            _PREFACE
            + _frame(_SETTINGS, 0, 0, b"")
            + _frame(_HEADERS, _END_HEADERS, 1, block)
            + _frame(_DATA, _END_STREAM, 1, body)
        )
        buf = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                raise AssertionError("the connection closed before the call's trailers")
            buf += chunk
            while len(buf) >= 9 and len(buf) >= 9 + int.from_bytes(buf[:3], "big"):
                size, kind, flags = int.from_bytes(buf[:3], "big"), buf[3], buf[4]
                payload, buf = buf[9 : 9 + size], buf[9 + size :]
                if kind == _SETTINGS and not flags & _ACK:
                    sock.sendall(_frame(_SETTINGS, _ACK, 0, b""))
                if kind in (_RST_STREAM, _GOAWAY):
                    raise AssertionError(f"the call was reset (frame type {kind})")
                if kind == _HEADERS and flags & _END_STREAM:
                    return _headers(payload)
