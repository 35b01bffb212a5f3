"""The scripted agent of the interop suite, the same script as the Go and TypeScript ones:
sources, tool registration, steps on a CompileStream (user message; a tool call and its
result; an image), deferred-tool search, a tool-result read, artifact upload/download,
every render format, a usage report, a checkpoint, a watch, time travel, and the session
RPCs; then an Anthropic response with thinking blocks (the file CTXCC_ANTHROPIC_RESPONSE)
a Gemini response with a signed call (the file CTXCC_GEMINI_RESPONSE) and an OpenAI
Responses response with reasoning items (the file CTXCC_OPENAI_RESPONSE), each logged with
the client's helper and compiled into its provider's body. Prints one line, `RESULT {json}`,
that the suite compares across languages and checks against the daemon.
Usage: CTXCC_TARGET=... CTXCC_ANTHROPIC_RESPONSE=... CTXCC_GEMINI_RESPONSE=...
CTXCC_OPENAI_RESPONSE=... python agent.py"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from ctxcc_client import (
    AsyncClient,
    CtxccError,
    assistant,
    assistant_from_anthropic,
    assistant_from_gemini,
    assistant_from_openai_responses,
    tool_result,
    user,
    user_with,
)

from ctxcc.v1 import (
    checkpoint_pb2,
    common_pb2,
    source_pb2,
    tool_pb2,
    view_pb2,
)
from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_service_pb2 as spb
from ctxcc.v1 import source_service_pb2 as srcpb
from ctxcc.v1 import tool_service_pb2 as tpb

ROUTE = common_pb2.Route(connection="interop", protocol="fake", endpoint="local", model="gpt-4o")
PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c489"
    "0000000d49444154789c63f8cfc0f01f00050001ff89993d1d0000000049454e44ae426082"
)
TOOL_OUTPUT = "\n".join(f"line {i}" for i in range(1, 41))
CLAUDE = common_pb2.Route(
    connection="interop", protocol="anthropic-messages", endpoint="api", model="claude-sonnet-4-5"
)
GEMINI = common_pb2.Route(
    connection="interop", protocol="gemini", endpoint="api", model="gemini-3-pro-preview"
)
OPENAI = common_pb2.Route(
    connection="interop", protocol="openai-responses", endpoint="api", model="o4-mini"
)
FORMATS = [
    view_pb2.RENDER_FORMAT_OPENAI_CHAT,
    view_pb2.RENDER_FORMAT_OPENAI_RESPONSES,
    view_pb2.RENDER_FORMAT_ANTHROPIC_MESSAGES,
    view_pb2.RENDER_FORMAT_GEMINI,
]


async def source_counts(ctx: AsyncClient, sid: str) -> list[int]:
    scope = common_pb2.SCOPE_SESSION
    memories = await ctx.sources.ListMemory(srcpb.ListMemoryRequest(scope=scope, scope_id=sid))
    rules = await ctx.sources.ListRules(srcpb.ListRulesRequest(scope=scope, scope_id=sid))
    skills = await ctx.sources.ListSkills(srcpb.ListSkillsRequest(scope=scope, scope_id=sid))
    return [len(memories.memories), len(rules.rules), len(skills.skills)]


async def sources(ctx: AsyncClient, sid: str, out: dict[str, Any]) -> None:
    scope = common_pb2.SCOPE_SESSION
    await ctx.sources.PutMemory(
        srcpb.PutMemoryRequest(
            memory=source_pb2.MemoryEntry(
                memory_id="m1", scope=scope, scope_id=sid, text="The repo uses tabs."
            )
        )
    )
    await ctx.sources.PutRule(
        srcpb.PutRuleRequest(
            rule=source_pb2.Rule(
                rule_id="r1",
                scope=scope,
                scope_id=sid,
                name="style",
                description="code style",
                text="Prefer small functions.",
                activation=source_pb2.RULE_ACTIVATION_ON_DEMAND,
            )
        )
    )
    await ctx.sources.PutSkill(
        srcpb.PutSkillRequest(
            skill=source_pb2.Skill(
                skill_id="k1",
                scope=scope,
                scope_id=sid,
                name="deploy",
                description="Deploys the service.",
                load_hint="skills/deploy/SKILL.md",
                enabled=True,
            )
        )
    )
    out["rule_text"] = (
        await ctx.sources.LoadRule(srcpb.LoadRuleRequest(session_id=sid, name="style"))
    ).rule.text
    out["sources"] = await source_counts(ctx, sid)


async def drop_sources(ctx: AsyncClient, sid: str, out: dict[str, Any]) -> None:
    scope = common_pb2.SCOPE_SESSION
    await ctx.sources.DeleteMemory(
        srcpb.DeleteMemoryRequest(scope=scope, scope_id=sid, memory_id="m1")
    )
    await ctx.sources.DeleteRule(srcpb.DeleteRuleRequest(scope=scope, scope_id=sid, rule_id="r1"))
    await ctx.sources.DeleteSkill(
        srcpb.DeleteSkillRequest(scope=scope, scope_id=sid, skill_id="k1")
    )
    out["sources_after_delete"] = await source_counts(ctx, sid)


async def tools(ctx: AsyncClient, sid: str, out: dict[str, Any]) -> None:
    schema = '{"type":"object","properties":{"path":{"type":"string"}}}'
    registered = await ctx.tools.RegisterTools(
        tpb.RegisterToolsRequest(
            session_id=sid,
            tools=[
                tool_pb2.ToolDefinition(
                    name="read_file",
                    description="Reads a file.",
                    input_schema_json=schema,
                    visibility=tool_pb2.TOOL_VISIBILITY_DIRECT,
                ),
                tool_pb2.ToolDefinition(
                    name="deploy_service",
                    description="Deploys the service to production.",
                    input_schema_json='{"type":"object"}',
                    visibility=tool_pb2.TOOL_VISIBILITY_DEFERRED,
                    search_keywords=["deploy", "release"],
                ),
            ],
        )
    )
    out["registered"] = registered.registered
    listed = await ctx.tools.ListTools(tpb.ListToolsRequest(session_id=sid))
    out["listed_tools"] = sorted(t.name for t in listed.tools)


async def session_rpcs(ctx: AsyncClient, sid: str, out: dict[str, Any]) -> None:
    other = await ctx.create_session()
    await ctx.append(other.session_id, [user("throwaway")])
    listed_sessions = await ctx.sessions.ListSessions(spb.ListSessionsRequest(page_size=100))
    out["listed_session"] = sid in [s.session_id for s in listed_sessions.sessions]
    deleted = await ctx.sessions.DeleteSession(
        spb.DeleteSessionRequest(session_id=other.session_id)
    )
    out["deleted_events"] = deleted.deleted_events


async def logged_body(
    ctx: AsyncClient,
    route: common_pb2.Route,
    fmt: view_pb2.RenderFormat.ValueType,
    log: Any,
) -> tuple[str, dict[str, Any]]:
    """A session with a user message, then the assistant event `log(view.route_id)` builds
    from a provider response and an "ok" result for each of its calls: the session id and
    the body of `fmt` compiled on `route` after them."""
    sid = (await ctx.create_session()).session_id
    req = cpb.CompileRequest(session_id=sid, route=route, render_formats=[fmt])
    await ctx.append(sid, [user("Fix the parser bug.")])
    view = (await ctx.compiles.Compile(req)).view
    logged = log(view.route_id)
    calls = logged.assistant_message.tool_calls
    await ctx.append(sid, [logged, *(tool_result(c.call_id, "ok", c.name) for c in calls)])
    return sid, json.loads((await ctx.compiles.Compile(req)).view.renderings[0].body_json)


async def thinking_session(ctx: AsyncClient, response: Any, out: dict[str, Any]) -> None:
    """Logs an Anthropic response with thinking blocks and its tools' results; records the
    block types of the Anthropic body's assistant turn and whether it starts with the
    response's thinking blocks, unchanged."""
    sid, body = await logged_body(
        ctx,
        CLAUDE,
        view_pb2.RENDER_FORMAT_ANTHROPIC_MESSAGES,
        lambda route_id: assistant_from_anthropic(response, route_id),
    )
    out["thinking_session_id"] = sid
    turn = next(m for m in body["messages"] if m["role"] == "assistant")
    sent = [b for b in response["content"] if b["type"] in {"thinking", "redacted_thinking"}]
    out["thinking"] = [[b["type"] for b in turn["content"]], turn["content"][: len(sent)] == sent]


async def gemini_session(ctx: AsyncClient, response: Any, out: dict[str, Any]) -> None:
    """Logs a Gemini response with parallel calls, the first signed, and its tools' results
    under the event's call ids; records the Gemini body's functionCall parts: each call's
    name and thoughtSignature (None when it has none)."""
    sid, body = await logged_body(
        ctx,
        GEMINI,
        view_pb2.RENDER_FORMAT_GEMINI,
        lambda route_id: assistant_from_gemini(response, route_id),
    )
    out["gemini_session_id"] = sid
    parts = [p for c in body["contents"] for p in c["parts"] if "functionCall" in p]
    out["gemini"] = [[p["functionCall"]["name"], p.get("thoughtSignature")] for p in parts]


async def openai_session(ctx: AsyncClient, response: Any, out: dict[str, Any]) -> None:
    """Logs an OpenAI Responses response with reasoning items and its tools' results;
    records the item types of the Responses body's input and whether its reasoning items
    are the one right before its message (id, summary, encrypted content)."""
    sid, body = await logged_body(
        ctx,
        OPENAI,
        view_pb2.RENDER_FORMAT_OPENAI_RESPONSES,
        lambda route_id: assistant_from_openai_responses(response, route_id),
    )
    out["openai_session_id"] = sid
    keys = ("type", "id", "summary", "encrypted_content")
    leading = None  # the last reasoning item before the first message or call
    for i in response["output"]:
        if i["type"] in ("message", "function_call"):
            break
        leading = i if i["type"] == "reasoning" else leading
    sealed = [{k: leading[k] for k in keys}] if leading and leading["encrypted_content"] else []
    sent = [i for i in body["input"] if i["type"] == "reasoning"]
    out["reasoning"] = [[i["type"] for i in body["input"]], sent == sealed]


async def run(target: str, response: Any, gemini: Any, openai: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    async with AsyncClient(target) as ctx:
        session = await ctx.create_session()
        sid = out["session_id"] = session.session_id
        await sources(ctx, sid, out)
        await tools(ctx, sid, out)
        stream = ctx.stream()
        try:
            compile_req = cpb.CompileRequest(session_id=sid, route=ROUTE)
            view, _ = await stream.step(compile_req, [user("Read README.md, then deploy.")])
            out["view1_tools"] = sorted(t.definition.name for t in view.tools)
            found = await ctx.tools.SearchTools(
                tpb.SearchToolsRequest(session_id=sid, query="deploy", max_results=5)
            )
            out["search"] = [t.name for t in found.tools]
            call = assistant(tool_calls=[("c1", "read_file", '{"path":"README.md"}')])
            view2, _ = await stream.step(
                compile_req, [call, tool_result("c1", TOOL_OUTPUT, "read_file")]
            )
            # Its usage rides on the next step.
            estimate2 = view2.budget.estimated_input_tokens
            await stream.report_usage(
                view2.compile_id, input_tokens=estimate2 + 10, output_tokens=20, route=ROUTE
            )
            read = await ctx.tools.ReadToolResult(
                tpb.ReadToolResultRequest(
                    session_id=sid, call_id="c1", lines=tpb.LineRange(offset=10, limit=3)
                )
            )
            out["slice"] = read.slice.text
            ref = await ctx.upload_artifact(sid, PNG, "image/png", width=1, height=1)
            back_ref, back = await ctx.download_artifact(sid, ref.artifact_id)
            out["artifact"] = [ref.sha256, back == PNG, back_ref.mime_type]
            every = cpb.CompileRequest(session_id=sid, route=ROUTE, render_formats=FORMATS)
            view, appended = await stream.step(every, [user_with("What is in this image?", ref)])
            out["render_formats"] = sorted(r.format for r in view.renderings)
            out["step3_append"] = [appended.first_seq, appended.last_seq] if appended else []
            out["view3_boundary"] = view.event_boundary
            carried = stream.last_usage
            assert carried is not None
            out["carried_usage"] = [
                carried.estimated_input_tokens == estimate2,
                carried.error_tokens,
                carried.replayed,
            ]
            out["step3_baseline"] = view.budget.baseline_tokens == estimate2 + 10
            estimate = view.budget.estimated_input_tokens
            usage = await ctx.report_usage(
                view.compile_id, input_tokens=estimate + 10, output_tokens=20, route=ROUTE
            )
            out["usage_estimate_matches"] = usage.estimated_input_tokens == estimate
            await stream.report_usage(f"{sid}:no-such-compile", input_tokens=5, output_tokens=1)
            try:
                await stream.step(compile_req, [user("never appended")])
            except CtxccError as err:
                out["refused"] = [err.reason, err.usage_refused]
            view4, _ = await stream.step(compile_req, [])
            out["after_refusal"] = [view4.event_boundary, stream.last_usage is not None]
            await stream.report_usage(view4.compile_id, input_tokens=estimate, output_tokens=20)
            await stream.close()  # sends the report queued last by the unary ReportUsage
            again = await ctx.report_usage(view4.compile_id, input_tokens=1, output_tokens=1)
            out["flushed_at_close"] = again.replayed
        finally:
            await stream.close()
        made = await ctx.compiles.CreateCheckpoint(
            cpb.CreateCheckpointRequest(
                checkpoint=checkpoint_pb2.Checkpoint(
                    session_id=sid,
                    covers_through_seq=3,
                    summary="Read README.md with read_file.",
                    kind=checkpoint_pb2.CHECKPOINT_KIND_MODEL_SUMMARY,
                    source_route=ROUTE,
                ),
            )
        )
        listed = await ctx.compiles.ListCheckpoints(cpb.ListCheckpointsRequest(session_id=sid))
        out["checkpoint"] = [made.checkpoint.covers_through_seq, len(listed.checkpoints)]
        async for update in ctx.watch(sid, after_seq=3):
            out["watch_first"] = [update.WhichOneof("update"), update.event.seq]
            break
        past = await ctx.compile(sid, route=ROUTE, as_of_seq=1)
        out["time_travel"] = [past.event_boundary, len(past.messages)]
        events = await ctx.sessions.ListEvents(spb.ListEventsRequest(session_id=sid))
        out["events"] = [e.WhichOneof("payload") for e in events.events]
        out["head_seq"] = (await ctx.get_session(sid)).head_seq
        # Text UTF-8 cannot carry (a lone surrogate): refused before anything is sent.
        try:
            await ctx.append(sid, [user("bad \ud800 text")])
            refused = False
        except (CtxccError, UnicodeError, ValueError):
            refused = True
        out["lone_surrogate"] = [refused, (await ctx.get_session(sid)).head_seq == 4]
        await session_rpcs(ctx, sid, out)
        await drop_sources(ctx, sid, out)
        await thinking_session(ctx, response, out)
        await gemini_session(ctx, gemini, out)
        await openai_session(ctx, openai, out)
        try:
            await ctx.get_session("no-such-session")
        except CtxccError as err:
            out["missing_reason"] = err.reason
    return out


if __name__ == "__main__":
    # The Anthropic, Gemini and OpenAI responses the agent logs (tests/fixtures/client-thinking).
    response = json.loads(Path(os.environ["CTXCC_ANTHROPIC_RESPONSE"]).read_text("utf-8"))
    gemini = json.loads(Path(os.environ["CTXCC_GEMINI_RESPONSE"]).read_text("utf-8"))
    openai = json.loads(Path(os.environ["CTXCC_OPENAI_RESPONSE"]).read_text("utf-8"))
    target = os.environ.get("CTXCC_TARGET", "127.0.0.1:50551")
    result = asyncio.run(run(target, response, gemini, openai))
    print("RESULT " + json.dumps(result, sort_keys=True))
    sys.exit(0)
