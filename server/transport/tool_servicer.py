"""ctxcc.v1.ToolService: the registry, tool_search and history_read_tool_result."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import grpc

from ctxcc.v1 import tool_pb2
from ctxcc.v1 import tool_service_pb2 as pb
from ctxcc.v1 import tool_service_pb2_grpc as pb_grpc
from server.adapters.protowire import tagged
from server.domain.errors import invalid
from server.domain.tools import ToolSpec, ToolVisibility
from server.service.tools import ToolUseCases
from server.transport.errors import unary
from server.transport.paging import too_large
from server.transport.wire import Encoded

Ctx = grpc.aio.ServicerContext[Any, Any]


def tool_in(i: int, t: tool_pb2.ToolDefinition) -> ToolSpec:
    visibility = t.visibility or tool_pb2.TOOL_VISIBILITY_DIRECT
    if visibility not in {int(v) for v in ToolVisibility}:
        raise invalid(f"tools[{i}].visibility", f"unknown visibility {t.visibility}")
    return ToolSpec(
        name=t.name,
        description=t.description,
        input_schema_json=t.input_schema_json,
        visibility=ToolVisibility(visibility),
        search_keywords=tuple(t.search_keywords),
    )


def tool_out(s: ToolSpec) -> tool_pb2.ToolDefinition:
    return tool_pb2.ToolDefinition(
        name=s.name,
        description=s.description,
        input_schema_json=s.input_schema_json,
        visibility=tool_pb2.ToolVisibility.ValueType(int(s.visibility)),
        search_keywords=list(s.search_keywords),
    )


# Definitions a request or answer holds above which its conversion runs off the event
# loop: a definition may hold a 256 KiB schema, and 200 of them (~50 MB) took the loop
# ~50-130 ms to read from the request and ~150-300 ms to size and encode as a listing.
ON_LOOP_TOOLS = 16


def specs_in(tools: Sequence[tool_pb2.ToolDefinition]) -> tuple[ToolSpec, ...]:
    return tuple(tool_in(i, t) for i, t in enumerate(tools))


# What an answer over the message limit tells the caller to do, by what it holds.
_HINTS = {
    "the tool registry": "register fewer or smaller definitions",
    "the tools found": "ask for fewer (max_results)",
}


def tools_answer(specs: Sequence[ToolSpec], limit: int, what: str) -> bytes:
    """The encoding of a ListToolsResponse or SearchToolsResponse of `specs` (both are
    `repeated ToolDefinition tools = 1`): the same bytes as the message's, made a
    definition at a time. One SerializeToString of 200 definitions of 250 KB schemas
    held the GIL ~80-170 ms (and ByteSize, which upb computes by encoding, as long again),
    on the event loop, stalling every session. Refused like `paging.check_fits` when over
    the message limit."""
    records = [tagged(1, tool_out(s).SerializeToString()) for s in specs]
    size = sum(map(len, records))
    if size > limit:
        raise too_large(size, limit, what, _HINTS[what])
    # bytes.join lets the GIL go while it copies a large result.
    return b"".join(records)


class ToolServicer(pb_grpc.ToolServiceServicer):
    def __init__(self, tools: ToolUseCases, max_message_bytes: int = 64 << 20) -> None:
        self._t = tools
        self._max_message = max_message_bytes

    @unary
    async def RegisterTools(
        self, request: pb.RegisterToolsRequest, context: Ctx
    ) -> pb.RegisterToolsResponse:
        tools = request.tools
        if len(tools) > ON_LOOP_TOOLS:
            specs = await asyncio.to_thread(specs_in, tools)
        else:
            specs = specs_in(tools)
        count = await self._t.register(request.session_id, specs, request.replace_all)
        return pb.RegisterToolsResponse(registered=count)

    @unary
    async def ListTools(
        self, request: pb.ListToolsRequest, context: Ctx
    ) -> pb.ListToolsResponse | Encoded:
        listed = await self._t.list_tools(request.session_id)
        return await self._answer(listed, "the tool registry")

    @unary
    async def SearchTools(
        self, request: pb.SearchToolsRequest, context: Ctx
    ) -> pb.SearchToolsResponse | Encoded:
        found = await self._t.search(request.session_id, request.query, request.max_results)
        return await self._answer(found, "the tools found")

    async def _answer(self, specs: list[ToolSpec], what: str) -> Encoded:
        if len(specs) > ON_LOOP_TOOLS:
            data = await asyncio.to_thread(tools_answer, specs, self._max_message, what)
        else:
            data = tools_answer(specs, self._max_message, what)
        return Encoded(data)

    @unary
    async def ReadToolResult(
        self, request: pb.ReadToolResultRequest, context: Ctx
    ) -> pb.ReadToolResultResponse:
        sid, call = request.session_id, request.call_id
        match request.WhichOneof("read"):
            case "bytes":
                r = request.bytes
                got = await self._t.read_bytes(sid, call, r.offset, r.limit)
            case "search":
                q = request.search
                matches = await self._t.search_result(
                    sid, call, q.pattern, q.regex, q.context_lines, q.max_matches
                )
                return pb.ReadToolResultResponse(
                    matches=[tool_pb2.ToolResultMatch(line=m.line, text=m.text) for m in matches]
                )
            case _:  # lines, and the default when no mode is given
                lines = request.lines
                got = await self._t.read_lines(sid, call, lines.offset, lines.limit)
        return pb.ReadToolResultResponse(
            slice=tool_pb2.ToolResultSlice(
                text=got.text, offset=got.offset, total=got.total, has_more=got.has_more
            )
        )
