"""ListTools and SearchTools answers encoded a definition at a time, through a daemon on
RocksDB: they parse into the messages built whole from the definitions registered, on
either side of the 16 definitions past which they are made off the event loop, and an
answer over --max-message-bytes is refused QUOTA_EXCEEDED (quota=max_message_bytes)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from ctxcc.v1 import session_pb2, tool_pb2
from ctxcc.v1 import session_service_pb2 as spb
from ctxcc.v1 import tool_service_pb2 as tpb
from server.app import Daemon
from tests.conftest import Stubs, make_config, stubs_for
from tests.helpers import error_info

SID = "tools"
MiB = 1 << 20


@contextlib.asynccontextmanager
async def _session(short_tmp: Path, **flags: str) -> AsyncIterator[Stubs]:
    """A daemon of `flags` on RocksDB in `short_tmp` with session SID, and its stubs."""
    d = Daemon(make_config(short_tmp, **flags))
    await d.start()
    api = stubs_for(f"unix:{d.endpoints.unix}")
    try:
        await api.sessions.CreateSession(
            spb.CreateSessionRequest(session=session_pb2.Session(session_id=SID))
        )
        yield api
    finally:
        await api.channel.close()
        await d.stop()


def _tool(i: int, schema: int, deferred: bool) -> tool_pb2.ToolDefinition:
    return tool_pb2.ToolDefinition(
        name=f"t{i:03d}",
        description=f"finds the \u00e9t\u00e9 widget {i} \U0001f600",
        input_schema_json='{"type":"object","description":"%s"}' % ("\u00fc" * schema),
        visibility=(
            tool_pb2.TOOL_VISIBILITY_DEFERRED if deferred else tool_pb2.TOOL_VISIBILITY_DIRECT
        ),
        search_keywords=["widget", f"k{i}"] if i % 2 else [],
    )


@pytest.mark.parametrize("count", [16, 17, 40])
async def test_answers_parse_into_the_messages_built_whole(short_tmp: Path, count: int) -> None:
    # Two-byte characters: ~20 KB a definition, 40 of them ~0.8 MB (under 1 MiB).
    tools = [_tool(i, 10_000, deferred=i % 2 == 1) for i in range(count)]
    async with _session(short_tmp, max_message_bytes=str(MiB)) as api:
        await api.tools.RegisterTools(tpb.RegisterToolsRequest(session_id=SID, tools=tools))
        listed = await api.tools.ListTools(tpb.ListToolsRequest(session_id=SID))
        assert listed == tpb.ListToolsResponse(tools=sorted(tools, key=lambda t: t.name))
        found = await api.tools.SearchTools(
            tpb.SearchToolsRequest(session_id=SID, query="widget", max_results=100)
        )
        deferred = [t for t in tools if t.visibility == tool_pb2.TOOL_VISIBILITY_DEFERRED]
        assert sorted(found.tools, key=lambda t: t.name) == deferred


async def test_answers_over_the_message_limit_are_refused(short_tmp: Path) -> None:
    """60 definitions of ~24 KB (registered in batches under the limit): the listing, and
    a search finding 50 of them (its most), are over 1.2 MB, past a 1 MiB
    --max-message-bytes."""
    async with _session(short_tmp, max_message_bytes=str(MiB)) as api:
        for start in (0, 20, 40):
            batch = [_tool(i, 12_000, deferred=True) for i in range(start, start + 20)]
            await api.tools.RegisterTools(tpb.RegisterToolsRequest(session_id=SID, tools=batch))
        for call, hint in (
            (
                api.tools.ListTools(tpb.ListToolsRequest(session_id=SID)),
                "register fewer or smaller definitions",
            ),
            (
                api.tools.SearchTools(
                    tpb.SearchToolsRequest(session_id=SID, query="widget", max_results=100)
                ),
                "ask for fewer (max_results)",
            ),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await call
            info = error_info(refused.value)
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert info.reason == "QUOTA_EXCEEDED"
            assert info.metadata["quota"] == "max_message_bytes"
            assert info.metadata["limit"] == str(MiB)
            assert (refused.value.details() or "").endswith(hint)
        # Still served under it: a search of a few.
        few = await api.tools.SearchTools(
            tpb.SearchToolsRequest(session_id=SID, query="k3", max_results=3)
        )
        assert 0 < len(few.tools) <= 3


@pytest.mark.parametrize("count", [16, 17])
async def test_a_bad_definition_is_refused_on_either_side_of_16(
    short_tmp: Path, count: int
) -> None:
    """Read on the event loop or off it, a definition of an unknown visibility is refused
    INVALID_ARGUMENT naming it, and nothing is registered."""
    tools = [_tool(i, 10, deferred=False) for i in range(count)]
    tools[-1].visibility = 7  # type: ignore[assignment]
    async with _session(short_tmp) as api:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await api.tools.RegisterTools(tpb.RegisterToolsRequest(session_id=SID, tools=tools))
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error_info(refused.value).reason == "INVALID_FIELD"
        assert error_info(refused.value).metadata["field"] == f"tools[{count - 1}].visibility"
        listed = await api.tools.ListTools(tpb.ListToolsRequest(session_id=SID))
        assert list(listed.tools) == []
