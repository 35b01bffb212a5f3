"""Writes tests/fixtures/client-views/view{1,2,3}.binpb: three successive views of one
session, as a daemon compiled them, in their deterministic serialization (the bytes a
ViewDelta's view_sha256 is the digest of). The Go and TypeScript clients' delta tests build
deltas between them by hand, and check their chained digests against chain_sha256.txt
(each view's ViewDelta.chain_sha256 as the daemon's code computes it). Between the views,
messages are appended, a memory entry changes, a rule in direct effect adds a section, a
tool is registered, an inline image arrives and every render format is asked for.

Usage: a daemon running, then `python scripts/gen_view_fixtures.py TARGET`."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from ctxcc_client import AsyncClient, assistant, tool_result, user, user_with

from ctxcc.v1 import common_pb2, source_pb2, tool_pb2, view_pb2
from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import source_service_pb2 as srcpb
from ctxcc.v1 import tool_service_pb2 as tpb
from server.transport import view_digest
from server.transport.convert_view import tagged

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "client-views"
ROUTE = common_pb2.Route(connection="fixture", protocol="fake", endpoint="local", model="gpt-4o")
PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c489"
    "0000000d49444154789c63f8cfc0f01f00050001ff89993d1d0000000049454e44ae426082"
)
SCHEMA = '{"type":"object","properties":{"path":{"type":"string"}}}'


def tool(name: str, description: str) -> tool_pb2.ToolDefinition:
    return tool_pb2.ToolDefinition(
        name=name,
        description=description,
        input_schema_json=SCHEMA,
        visibility=tool_pb2.TOOL_VISIBILITY_DIRECT,
    )


async def memory(ctx: AsyncClient, sid: str, text: str) -> None:
    entry = source_pb2.MemoryEntry(
        memory_id="m1", scope=common_pb2.SCOPE_SESSION, scope_id=sid, text=text
    )
    await ctx.sources.PutMemory(srcpb.PutMemoryRequest(memory=entry))


async def run(target: str) -> list[view_pb2.CompiledView]:
    async with AsyncClient(target) as ctx:
        sid = (await ctx.create_session()).session_id
        await memory(ctx, sid, "The repo uses tabs.")
        tools = [tool("read_file", "Reads a file.")]
        await ctx.tools.RegisterTools(tpb.RegisterToolsRequest(session_id=sid, tools=tools))
        stream = ctx.stream()
        req = cpb.CompileRequest(session_id=sid, route=ROUTE)
        try:
            v1, _ = await stream.step(req, [user("Read README.md and fix the build.")])
            await memory(ctx, sid, "The repo uses tabs. Builds run with make.")
            tools = [tool("write_file", "Writes a file.")]
            await ctx.tools.RegisterTools(tpb.RegisterToolsRequest(session_id=sid, tools=tools))
            call = assistant(tool_calls=[("c1", "read_file", '{"path":"README.md"}')])
            v2, _ = await stream.step(req, [call, tool_result("c1", "# demo\nmake build\n")])
            rule = source_pb2.Rule(
                rule_id="r1",
                scope=common_pb2.SCOPE_SESSION,
                scope_id=sid,
                name="style",
                description="code style",
                text="Prefer small functions.",
                activation=source_pb2.RULE_ACTIVATION_ALWAYS,
            )
            await ctx.sources.PutRule(srcpb.PutRuleRequest(rule=rule))
            ref = await ctx.upload_artifact(sid, PNG, "image/png", width=1, height=1)
            every = cpb.CompileRequest(
                session_id=sid,
                route=ROUTE,
                image_mode=cpb.IMAGE_MODE_INLINE,
                render_formats=[
                    view_pb2.RENDER_FORMAT_OPENAI_CHAT,
                    view_pb2.RENDER_FORMAT_OPENAI_RESPONSES,
                    view_pb2.RENDER_FORMAT_ANTHROPIC_MESSAGES,
                    view_pb2.RENDER_FORMAT_GEMINI,
                ],
            )
            events = [assistant("The build needs a Makefile."), user_with("And this?", ref)]
            v3, _ = await stream.step(every, events)
        finally:
            await stream.close()
    return [v1, v2, v3]


def chain_sha256(view: view_pb2.CompiledView) -> str:
    """The view's chained digest as the daemon computes it (server/transport/view_digest.py)."""
    rest = view_pb2.CompiledView()
    rest.CopyFrom(view)
    rest.ClearField("messages")
    records = [tagged(10, m.SerializeToString(deterministic=True)) for m in view.messages]
    values = view_digest.chain(view_digest.CHAIN_START, records)
    return view_digest.chain_digest(rest.SerializeToString(deterministic=True), values)


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    lines = []
    for i, view in enumerate(asyncio.run(run(sys.argv[1])), 1):
        (OUT / f"view{i}.binpb").write_bytes(view.SerializeToString(deterministic=True))
        lines.append(f"view{i} {chain_sha256(view)}\n")
    (OUT / "chain_sha256.txt").write_text("".join(lines))


if __name__ == "__main__":
    main()
