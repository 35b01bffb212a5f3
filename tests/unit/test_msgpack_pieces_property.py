"""Properties of the tools part encoded in pieces (msgpack_pieces.py), over random
registries: the pieces joined are msgspec's one-call encoding, the digest is that of the
one-call bytes, the stored Record is the single-call Record's bytes and decodes back, and
a tool listing encoded a definition at a time parses into the message built whole."""

from __future__ import annotations

import hashlib

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxcc.storage.v1 import records_pb2
from ctxcc.v1 import tool_service_pb2 as pb
from server.adapters.msgpack_pieces import PIECES_FROM, msgpack_pieces
from server.domain.errors import CtxccError, Reason
from server.domain.tools import ToolSpec, ToolVisibility
from server.service.basis import SettingsPart, ToolsPart, digest_of
from server.transport.tool_servicer import tool_out, tools_answer
from storage.codec import decode_value, encode_value
from storage.schema import SCHEMA_VERSION

_one_call = msgspec.msgpack.Encoder()

# Any unicode but lone surrogates (which a str cannot carry to UTF-8, here or in protobuf).
_text = st.text(st.characters(exclude_categories=["Cs"]), max_size=40)
_schemas = st.one_of(
    st.just(""),
    st.just("{}"),
    _text,
    st.integers(0, 70_000).map(lambda n: '{"d":"' + "\u00e9" * n + '"}'),
)
_tools = st.builds(
    ToolSpec,
    name=_text,
    description=_text,
    input_schema_json=_schemas,
    visibility=st.sampled_from(list(ToolVisibility)),
    search_keywords=st.lists(_text, max_size=4).map(tuple),
)
# Counts around the boundary at which a part is encoded in pieces, and well past it.
_counts = st.one_of(
    st.integers(0, 3),
    st.integers(PIECES_FROM - 1, PIECES_FROM + 2),
    st.integers(PIECES_FROM + 3, 300),
)
_parts = _counts.flatmap(
    lambda n: st.lists(_tools, min_size=n, max_size=n).map(lambda ts: ToolsPart(tuple(ts)))
)
_fast = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@_fast
@given(_parts)
def test_pieces_joined_are_the_one_call_encoding(part: ToolsPart) -> None:
    whole = _one_call.encode(part)
    pieces = msgpack_pieces(part)
    assert b"".join(pieces) == whole
    assert len(pieces) == (1 + len(part.tools) if len(part.tools) > PIECES_FROM else 1)
    assert digest_of(part) == hashlib.sha256(whole).hexdigest()[:32]


@_fast
@given(_parts)
def test_a_record_is_the_single_call_record_and_decodes_back(part: ToolsPart) -> None:
    whole = _one_call.encode(part)
    single = records_pb2.Record(schema_version=SCHEMA_VERSION, type="ToolsPart", body=whole)
    encoded = encode_value(part)
    assert encoded == single.SerializeToString()
    assert decode_value(encoded, ToolsPart) == part
    parsed = records_pb2.Record.FromString(encoded)
    assert (parsed.schema_version, parsed.type, parsed.body) == (
        SCHEMA_VERSION,
        "ToolsPart",
        whole,
    )


@_fast
@given(_parts, st.integers(0, 1 << 22))
def test_a_listing_in_pieces_parses_into_the_message_built_whole(
    part: ToolsPart, limit: int
) -> None:
    whole = pb.ListToolsResponse(tools=[tool_out(t) for t in part.tools])
    try:
        data = tools_answer(part.tools, limit, "the tool registry")
    except CtxccError as exc:
        assert whole.ByteSize() > limit, exc
        assert exc.reason is Reason.QUOTA_EXCEEDED
        return
    assert whole.ByteSize() <= limit
    assert data == whole.SerializeToString()
    assert pb.SearchToolsResponse.FromString(data).tools == whole.tools


def test_values_that_do_not_opt_in_are_one_piece() -> None:
    settings_part = SettingsPart("kernel", None, 1, 1)  # type: ignore[arg-type]
    assert msgpack_pieces(settings_part) == [_one_call.encode(settings_part)]
