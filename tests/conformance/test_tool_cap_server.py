"""A real agent's tool set plus MCP servers' tools, over OpenAI's 128-tool limit, through
a real daemon and the Python client: the OpenAI bodies carry at most 128 tools and go
through the `openai` SDK (sdk_fuzz.check), the rest are found by the model's
tool_search (served with SearchTools) and offered from the next step, and an Anthropic
route, which states no limit, carries them all."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request
from pathlib import Path
from typing import Any

from ctxcc_client import AsyncClient

from ctxcc.v1 import common_pb2, tool_pb2, view_pb2
from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import tool_service_pb2 as tpb
from server.app import Daemon
from tests.conformance import agent_tools, sdk_fuzz
from tests.conformance.corpus import FORMATS
from tests.conftest import make_config
from tests.helpers import assistant, tool_result, user

OPENAI = common_pb2.Route(connection="t", protocol="openai-chat", endpoint="api", model="gpt-4o")
ANTHROPIC = common_pb2.Route(
    connection="t", protocol="anthropic-messages", endpoint="api", model="claude-sonnet-4"
)
SERVERS = ("github", "jira", "slack", "postgres", "browser")
OPS = ("list", "get", "create", "update", "delete", "search", "comment", "close", "merge", "sync")


def mcp_tools() -> list[tool_pb2.ToolDefinition]:
    """150 tools as MCP servers name them (`mcp__<server>__<tool>`)."""
    out = []
    for server in SERVERS:
        for i in range(30):
            op = OPS[i % len(OPS)]
            schema = {
                "type": "object",
                "properties": {"id": {"type": "string"}, "body": {"type": "string"}},
                "required": ["id"],
            }
            out.append(
                tool_pb2.ToolDefinition(
                    name=f"mcp__{server}__{op}_item_{i:02d}",
                    description=f"{op.capitalize()} item kind {i} on the {server} server.",
                    input_schema_json=json.dumps(schema),
                )
            )
    return out


def agent_set() -> list[tool_pb2.ToolDefinition]:
    real = agent_tools.claude_code_shaped() + agent_tools.openhands()
    return [
        tool_pb2.ToolDefinition(
            name=t["name"], description=t["description"], input_schema_json=json.dumps(t["schema"])
        )
        for t in real
    ]


async def compiled(
    ctx: AsyncClient, sid: str, route: common_pb2.Route
) -> tuple[view_pb2.CompiledView, dict[str, dict[str, Any]]]:
    req = cpb.CompileRequest(session_id=sid, route=route, render_formats=list(FORMATS.values()))
    view = (await ctx.compiles.Compile(req)).view
    bodies = {}
    for r in view.renderings:
        fmt = next(k for k, v in FORMATS.items() if v == r.format)
        bodies[fmt] = json.loads(r.body_json)
    return view, bodies


def tool_count(fmt: str, body: dict[str, Any]) -> int:
    if fmt == "gemini":
        return sum(len(t.get("functionDeclarations", [])) for t in body.get("tools", []))
    return len(body.get("tools", []))


async def test_a_real_agent_with_mcp_tools_over_openais_limit(short_tmp: Path) -> None:
    daemon = Daemon(make_config(short_tmp / "data"))
    await daemon.start()
    try:
        async with AsyncClient(f"unix:{daemon.endpoints.unix}") as ctx:
            sid = (await ctx.create_session("agent")).session_id
            registry = agent_set() + mcp_tools()
            assert len(registry) > 150
            await ctx.tools.RegisterTools(tpb.RegisterToolsRequest(session_id=sid, tools=registry))
            await ctx.append(sid, [user("File a jira item for the failing build.")])

            view, bodies = await compiled(ctx, sid, OPENAI)
            offered = [t.definition.name for t in view.tools]
            assert len(offered) == 128 and offered[-1] == "tool_search"
            # Name order: the Claude Code-shaped tools (capitals) sort first, all offered.
            assert {t.name for t in agent_set() if t.name[0].isupper()} <= set(offered)
            left_out = sorted({t.name for t in registry} - set(offered))
            assert len(left_out) == len(registry) - 127
            assert any(f"{len(left_out)} of the {len(registry)} direct" in n for n in view.notes)
            for fmt in ("openai_chat", "openai_responses"):
                assert tool_count(fmt, bodies[fmt]) == 128, fmt
            problems = sdk_fuzz.check(sdk_fuzz.Outcome(sid, bodies, []))
            assert not problems, "\n".join(problems)
            # OpenAI refuses a function description over 1,024 characters; the Claude
            # Code-shaped shell tool's is ~9,000: cut to fit, and said so.
            long = {t.name: t.description for t in registry if len(t.description) > 1_024}
            assert long, "the real tool sets carry descriptions over OpenAI's limit"
            for fmt in ("openai_chat", "openai_responses"):
                fns = [t.get("function", t) for t in bodies[fmt]["tools"]]
                assert max(len(f["description"]) for f in fns) <= 1_024, fmt
            assert any("are cut to 1024 characters" in n for n in view.notes), view.notes

            # The model asks for one of the tools left out; the agent serves the built-in
            # call with SearchTools and appends the call and its result.
            wanted = left_out[-1]
            query = wanted.replace("mcp__", "").replace("__", " ")
            found = await ctx.tools.SearchTools(tpb.SearchToolsRequest(session_id=sid, query=query))
            found_names = [t.name for t in found.tools]
            assert found_names[0] == wanted, found_names
            await ctx.append(
                sid,
                [
                    assistant("", ("ts1", "tool_search", json.dumps({"query": query}))),
                    tool_result("ts1", json.dumps(found_names), "tool_search"),
                ],
            )
            after, after_bodies = await compiled(ctx, sid, OPENAI)
            by_name = {t.definition.name: t for t in after.tools}
            assert wanted in by_name and len(after.tools) == 128
            assert by_name[wanted].origin == view_pb2.TOOL_ORIGIN_ACTIVATED
            for fmt in ("openai_chat", "openai_responses"):
                assert tool_count(fmt, after_bodies[fmt]) == 128, fmt
                sent = json.dumps(after_bodies[fmt])
                assert f'"{wanted}"' in sent, fmt
            problems = sdk_fuzz.check(sdk_fuzz.Outcome(sid, after_bodies, []))
            assert not problems, "\n".join(problems)

            # Both views' left-out tools are counted, as many in each: the activated tools
            # took the slots of direct ones after the prefix.
            url = f"http://{daemon.endpoints.metrics}/metrics"
            scrape = await asyncio.to_thread(
                lambda: urllib.request.urlopen(url, timeout=30).read().decode()
            )
            counted = re.findall(r"^ctxcc_tools_deferred_by_cap_total (\S+)$", scrape, re.M)
            assert [float(v) for v in counted] == [2.0 * len(left_out)], counted

            # Recorded: rebuilt from its id, the same tools and notes.
            again = (
                await ctx.compiles.Compile(
                    cpb.CompileRequest(session_id=sid, rebuild_compile_id=after.compile_id)
                )
            ).view
            assert [t.definition.name for t in again.tools] == list(by_name)
            assert list(again.notes) == list(after.notes)

            # Every tool the OpenAI view left out (OpenHands' lower-case ones among them)
            # is what a search by its name finds (SearchTools searches as the session's latest
            # compile, for OpenAI, offered them).
            for name in left_out:
                hit = await ctx.tools.SearchTools(
                    tpb.SearchToolsRequest(session_id=sid, query=name, max_results=1)
                )
                assert [t.name for t in hit.tools] == [name]

            # Anthropic states no limit: the whole registry, no tool_search.
            anth, anth_bodies = await compiled(ctx, sid, ANTHROPIC)
            names = [t.definition.name for t in anth.tools]
            assert sorted(names) == sorted(t.name for t in registry)
            assert not any("tool_search in this view" in n for n in anth.notes)
            assert tool_count("anthropic_messages", anth_bodies["anthropic_messages"]) == len(
                registry
            )
            # And every description whole.
            whole = {
                t["name"]: t["description"] for t in anth_bodies["anthropic_messages"]["tools"]
            }
            assert all(whole[name] == text for name, text in long.items())
    finally:
        await daemon.stop()
