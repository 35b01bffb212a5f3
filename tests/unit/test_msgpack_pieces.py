"""A compile's tools part is hashed and stored in pieces of at most one tool each, as the
same bytes one encoding call made (so digests and stored records are unchanged)."""

from __future__ import annotations

import dataclasses
import hashlib

import msgspec
import pytest

from ctxcc.storage.v1 import records_pb2
from server.adapters import msgpack_pieces
from server.domain.tools import ToolSpec
from server.service.basis import ToolsPart, digest_of
from storage.codec import decode_value, encode_value
from storage.schema import SCHEMA_VERSION

_whole = msgspec.msgpack.Encoder()


def _part(n: int, schema_bytes: int = 2_000) -> ToolsPart:
    return ToolsPart(
        tools=tuple(
            ToolSpec(
                name=f"tool_{i}",
                description=f"tool {i} \u00e9",
                input_schema_json='{"type":"object","description":"%s"}' % ("x" * schema_bytes),
                search_keywords=("k",) * (i % 3),
            )
            for i in range(n)
        )
    )


@pytest.mark.parametrize("n", [0, 1, 16, 17, 200, 70_000])
def test_digest_and_record_are_those_of_one_encoding(n: int) -> None:
    part = _part(n, 10)
    whole = _whole.encode(part)
    assert digest_of(part) == hashlib.sha256(whole).hexdigest()[:32]
    record = records_pb2.Record(schema_version=SCHEMA_VERSION, type="ToolsPart", body=whole)
    assert encode_value(part) == record.SerializeToString()
    assert decode_value(encode_value(part), ToolsPart) == part


def test_a_registry_is_encoded_a_tool_a_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """200 tools of 50 KB schemas: no encoding call makes more than one tool's bytes,
    for the digest a compile names the part by and for the record it stores."""
    part = _part(200, 50_000)
    made: list[int] = []

    class Spy:
        def encode(self, value: object) -> bytes:
            out = _whole.encode(value)
            made.append(len(out))
            return out

    monkeypatch.setattr(msgpack_pieces, "_encoder", Spy())
    digest_of(part)
    encode_value(part)
    assert len(made) == 2 * 201
    assert max(made) < 60_000


@pytest.mark.parametrize("n", [0, 1, 17, 200])
def test_a_tool_listing_is_the_message_encoding(n: int) -> None:
    """ListTools and SearchTools answers made a definition at a time are the bytes the
    response message encodes to; over the message limit they are refused as listings."""
    from ctxcc.v1 import tool_service_pb2 as tpb
    from server.domain.errors import CtxccError
    from server.domain.tools import ToolVisibility
    from server.transport.tool_servicer import tool_out, tools_answer

    specs = [
        ToolSpec(
            name=t.name,
            description=t.description,
            input_schema_json=t.input_schema_json,
            visibility=ToolVisibility(1 + i % 2),
            search_keywords=t.search_keywords,
        )
        for i, t in enumerate(_part(n, 300).tools)
    ]
    data = tools_answer(specs, 64 << 20, "the tool registry")
    listing = tpb.ListToolsResponse(tools=[tool_out(s) for s in specs])
    assert data == listing.SerializeToString()
    assert data == tpb.SearchToolsResponse(tools=[tool_out(s) for s in specs]).SerializeToString()
    if n:
        with pytest.raises(CtxccError) as err:
            tools_answer(specs, len(data) - 1, "the tool registry")
        assert f"the tool registry is {listing.ByteSize()} bytes" in err.value.message


def test_only_values_that_opt_in_are_encoded_in_pieces() -> None:
    """A value of many small members (a table's chunk) encodes faster in one call."""

    @dataclasses.dataclass(frozen=True, slots=True)
    class Many:
        items: tuple[int, ...]

    assert msgpack_pieces.msgpack_pieces(Many(tuple(range(100)))) == [
        _whole.encode(Many(tuple(range(100))))
    ]
    assert len(msgpack_pieces.msgpack_pieces(_part(100, 10))) == 101
