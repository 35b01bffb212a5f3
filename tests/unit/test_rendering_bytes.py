"""A view's renderings encoded from their bodies' pieces (convert_view.renderings_bytes):
the bytes protobuf's deterministic encoding writes, with no body encoded in one call."""

from __future__ import annotations

import json

import pytest

from ctxcc.v1 import view_pb2
from server.compiler.render import RenderFormat
from server.transport import convert_view
from server.transport.convert_view import body_pieces, renderings_bytes, renderings_out


def _protobuf(renderings: list[tuple[RenderFormat, str, int]]) -> bytes:
    out = view_pb2.CompiledView(renderings=renderings_out(renderings))
    return out.SerializeToString(deterministic=True)


BODIES = [
    "",
    "{}",
    json.dumps({"messages": [{"role": "user", "content": "héllo wörld ✓ 😀 中文"}] * 40}),
    json.dumps([{"content": f"line {i}: x\n"} for i in range(3_000)], ensure_ascii=False),
    "é" * 1_000 + "😀" * 999 + "a",
]


@pytest.mark.parametrize("piece", [1, 7, 64, 1 << 18])
def test_the_pieces_encode_as_protobuf_does(piece: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(convert_view, "BODY_PIECE_CHARS", piece)
    formats = list(RenderFormat)
    for i, body in enumerate(BODIES):
        for tokens in (0, 1, 127, 128, 300_000, 0xFFFFFFFF):
            one = [(formats[i % len(formats)], body, tokens)]
            assert renderings_bytes(one) == _protobuf(one)
    every = [(f, b, 1_000 + n) for n, (f, b) in enumerate(zip(formats * 2, BODIES, strict=False))]
    assert renderings_bytes(every) == _protobuf(every)
    assert renderings_bytes([]) == b""


def test_a_count_outside_uint32_fails_as_protobuf_does() -> None:
    fmt = next(iter(RenderFormat))
    with pytest.raises(ValueError):
        _protobuf([(fmt, "{}", 1 << 32)])
    with pytest.raises(ValueError):
        renderings_bytes([(fmt, "{}", 1 << 32)])


def test_a_long_body_is_encoded_in_pieces_of_at_most_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Instrumented: every encode call is of at most BODY_PIECE_CHARS characters."""
    monkeypatch.setattr(convert_view, "BODY_PIECE_CHARS", 1_000)
    body = json.dumps([{"content": f"é{i}"} for i in range(5_000)], ensure_ascii=False)
    pieces = body_pieces(body)
    assert len(pieces) == -(-len(body) // 1_000)
    assert all(len(p.decode()) <= 1_000 for p in pieces)
    assert b"".join(pieces) == body.encode()
    fmt = next(iter(RenderFormat))
    assert renderings_bytes([(fmt, body, 5)]) == _protobuf([(fmt, body, 5)])
