"""A registration or listing of many tool definitions is converted off the event loop:
200 definitions of 250 KB schemas (~50 MB) held the loop ~50-130 ms to read from the
request and ~150-300 ms to size and encode as a listing, stalling every session."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from ctxcc.v1 import tool_pb2
from ctxcc.v1 import tool_service_pb2 as tpb
from server.domain.tools import ToolSpec
from server.transport import tool_servicer
from server.transport.tool_servicer import ON_LOOP_TOOLS, ToolServicer
from server.transport.wire import Encoded


class _Tools:
    def __init__(self, specs: list[ToolSpec]) -> None:
        self.specs = specs
        self.registered: tuple[ToolSpec, ...] = ()

    async def register(self, sid: str, specs: tuple[ToolSpec, ...], replace_all: bool) -> int:
        self.registered = specs
        return len(specs)

    async def list_tools(self, sid: str) -> list[ToolSpec]:
        return self.specs

    async def search(self, sid: str, query: str, most: int) -> list[ToolSpec]:
        return self.specs


def _specs(n: int) -> list[ToolSpec]:
    return [ToolSpec(name=f"t{i}", description="d", input_schema_json="{}") for i in range(n)]


@pytest.mark.parametrize("n", [ON_LOOP_TOOLS, ON_LOOP_TOOLS + 1, 200])
def test_many_definitions_are_converted_off_the_loop(
    n: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: dict[str, list[threading.Thread]] = {"in": [], "out": []}
    specs_in, tools_answer = tool_servicer.specs_in, tool_servicer.tools_answer

    def spy_in(tools: Any) -> tuple[ToolSpec, ...]:
        threads["in"].append(threading.current_thread())
        return specs_in(tools)

    def spy_out(specs: Any, limit: int, what: str) -> bytes:
        threads["out"].append(threading.current_thread())
        return tools_answer(specs, limit, what)

    monkeypatch.setattr(tool_servicer, "specs_in", spy_in)
    monkeypatch.setattr(tool_servicer, "tools_answer", spy_out)
    uses = _Tools(_specs(n))
    servicer = ToolServicer(uses)  # type: ignore[arg-type]
    request = tpb.RegisterToolsRequest(
        session_id="s",
        tools=[tool_pb2.ToolDefinition(name=s.name, input_schema_json="{}") for s in uses.specs],
    )

    async def calls() -> tuple[threading.Thread, Any, Any, Any]:
        got = await servicer.RegisterTools(request, None)  # type: ignore[arg-type]
        listed = await servicer.ListTools(tpb.ListToolsRequest(session_id="s"), None)  # type: ignore[arg-type]
        found = await servicer.SearchTools(tpb.SearchToolsRequest(session_id="s"), None)  # type: ignore[arg-type]
        return threading.current_thread(), got, listed, found

    loop_thread, got, listed, found = asyncio.run(calls())
    assert got.registered == n and [s.name for s in uses.registered] == [s.name for s in uses.specs]
    assert type(listed) is Encoded and type(found) is Encoded
    assert tpb.ListToolsResponse.FromString(listed.data).tools[-1].name == f"t{n - 1}"
    on_loop = n <= ON_LOOP_TOOLS
    assert [t is loop_thread for t in threads["in"]] == [on_loop]
    assert [t is loop_thread for t in threads["out"]] == [on_loop, on_loop]
