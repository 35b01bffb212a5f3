"""Writes tests/fixtures/client-views/view{1,2,3}.binpb: three successive views of one
session, as a daemon compiled them, in their deterministic serialization (the bytes a
ViewDelta's view_sha256 is the digest of). The Go and TypeScript clients' delta tests build
deltas between them by hand, and check their chained digests against chain_sha256.txt
(each view's ViewDelta.chain_sha256 as the daemon's code computes it). Between the views,
messages are appended, a memory entry changes, a rule in direct effect adds a section, a
tool is registered, an inline image arrives and every render format is asked for.

It also writes view4.binpb and view5.binpb, made from view3 without a daemon (view3
recommending a compaction with a long prompt, then one more message under the same
request), view6.binpb (view3 whose route model's framing is -0.0, what rounding a tiny
negative fit gives: proto3 writes it, only +0.0 is left out) and apart_sha256.txt: the
digest with the compaction apart of views 1-6; view6's chained digest joins
chain_sha256.txt.

Usage: a daemon running, then `python scripts/gen_view_fixtures.py TARGET`; or
`python scripts/gen_view_fixtures.py --apart` for views 4-5 and apart_sha256.txt alone."""

from __future__ import annotations

import asyncio
import hashlib
import math
import sys
from pathlib import Path

from ctxcc_client import AsyncClient, assistant, tool_result, user, user_with

from ctxcc.v1 import common_pb2, event_pb2, source_pb2, tool_pb2, view_pb2
from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import source_service_pb2 as srcpb
from ctxcc.v1 import tool_service_pb2 as tpb
from server.adapters.protowire import tagged
from server.transport import view_digest

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


def apart_sha256(view: view_pb2.CompiledView) -> str:
    """The view's digest with the compaction apart as the daemon computes it."""
    rest = view_pb2.CompiledView()
    rest.CopyFrom(view)
    rest.ClearField("messages")
    rest.ClearField("compaction")
    records = [tagged(10, m.SerializeToString(deterministic=True)) for m in view.messages]
    values = view_digest.chain(view_digest.CHAIN_START, records)
    request = tagged(19, view.compaction.SerializeToString(deterministic=True))
    q = hashlib.sha256(view_digest.record_value(request)).digest()
    rest_sha = hashlib.sha256(rest.SerializeToString(deterministic=True)).digest()
    return view_digest.apart_digest_of(
        rest_sha, values, q if view.HasField("compaction") else bytes(32)
    )


def over_budget(view3: view_pb2.CompiledView) -> list[view_pb2.CompiledView]:
    """view4 and view5, made from view3 here (no daemon): view4 is view3 recommending a
    compaction with a long prompt, view5 is view4 with one more message and the same
    request (what a delta keeps with compaction_kept)."""
    view4 = view_pb2.CompiledView()
    view4.CopyFrom(view3)
    view4.compile_id += "-4"
    view4.decision = view_pb2.DECISION_COMPACT_RECOMMENDED
    view4.compaction.from_seq = 1
    view4.compaction.through_seq = 2
    view4.compaction.prompt = "Summarise the conversation below.\n" + "--- user\nline\n" * 2000
    view4.compaction.covered_digest = "ab" * 32
    view5 = view_pb2.CompiledView()
    view5.CopyFrom(view4)
    view5.compile_id = view3.compile_id + "-5"
    view5.messages.add(role=event_pb2.MESSAGE_ROLE_ASSISTANT).parts.add(text="Done.")
    return [view4, view5]


def negative_zero(view3: view_pb2.CompiledView) -> view_pb2.CompiledView:
    """view6: view3 whose route model learned a framing of -0.0 (round(-0.0004, 3)) and
    a ratio of 1.0, made here (no daemon)."""
    view6 = view_pb2.CompiledView()
    view6.CopyFrom(view3)
    view6.compile_id = view3.compile_id + "-6"
    view6.budget.route_model.ratio = 1.0
    view6.budget.route_model.framing_tokens = round(-0.0004, 3)
    assert math.copysign(1.0, view6.budget.route_model.framing_tokens) == -1.0
    return view6


def write_apart(views: list[view_pb2.CompiledView]) -> None:
    """view4.binpb, view5.binpb, view6.binpb and apart_sha256.txt from views 1-3, and
    view6's line of chain_sha256.txt."""
    views = views[:3] + over_budget(views[2]) + [negative_zero(views[2])]
    for i, view in enumerate(views[3:], 4):
        (OUT / f"view{i}.binpb").write_bytes(view.SerializeToString(deterministic=True))
    lines = [f"view{i} {apart_sha256(view)}\n" for i, view in enumerate(views, 1)]
    (OUT / "apart_sha256.txt").write_text("".join(lines))
    chains = OUT / "chain_sha256.txt"
    kept = [ln for ln in chains.read_text().splitlines(True) if not ln.startswith("view6 ")]
    chains.write_text("".join(kept) + f"view6 {chain_sha256(views[5])}\n")


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    if sys.argv[1:] == ["--apart"]:  # views 4-5 and their digests from the views kept
        views = [
            view_pb2.CompiledView.FromString((OUT / f"view{i}.binpb").read_bytes())
            for i in (1, 2, 3)
        ]
        write_apart(views)
        return
    lines = []
    views = asyncio.run(run(sys.argv[1]))
    for i, view in enumerate(views, 1):
        (OUT / f"view{i}.binpb").write_bytes(view.SerializeToString(deterministic=True))
        lines.append(f"view{i} {chain_sha256(view)}\n")
    (OUT / "chain_sha256.txt").write_text("".join(lines))
    write_apart(views)


if __name__ == "__main__":
    main()
