"""Thinking state a provider needs back during a tool loop, through a real daemon.

An agent with Claude's extended thinking on: each response is
the SDK's own `Message` (thinking, text and tool_use blocks), logged with the Python
client's `assistant_from_anthropic`; the Anthropic body of every step of the tool loop
is taken by the SDK's request type and leads each of the turn's assistant messages with
the blocks the model gave it, unchanged, as the API requires; after the user's next
message, or on another model, no block is sent. A rebuild gives the same body.

An agent on Gemini 3: each response is google-genai's own `GenerateContentResponse`,
logged with `assistant_from_gemini`; the signed calls of the turn carry their thought
signatures in the Gemini body, which google-genai's types take.

An agent on an OpenAI reasoning model over the Responses API: each response is the openai
SDK's own `Response`, logged with `assistant_from_openai_responses`; the Responses body
leads the loop's calls with their reasoning items, which the SDK's request type takes."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import anthropic.types as at
import grpc
import openai.types.responses as ot
import pytest
from ctxcc_client import (
    ANTHROPIC_THINKING,
    GEMINI_THOUGHT_SIGNATURES,
    OPENAI_REASONING,
    AsyncClient,
    CtxccError,
    assistant,
    assistant_from_anthropic,
    assistant_from_gemini,
    assistant_from_openai_responses,
    tool_result,
    user,
)
from google.genai import types as gt

from ctxcc.v1 import checkpoint_pb2, common_pb2, event_pb2, view_pb2
from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_service_pb2 as spb
from server.app import Daemon
from tests.conformance.sdk_types import errors_for
from tests.helpers import leading_reasoning

ROUTE = common_pb2.Route(
    connection="t", protocol="anthropic-messages", endpoint="api", model="claude-sonnet-4"
)
OTHER = common_pb2.Route(
    connection="t", protocol="anthropic-messages", endpoint="api", model="claude-haiku-4-5"
)
ANTHROPIC = view_pb2.RENDER_FORMAT_ANTHROPIC_MESSAGES


def response(n: int, *blocks: dict[str, Any]) -> at.Message:
    """A Messages API response as the SDK parses it."""
    return at.Message.model_validate(
        {
            "id": f"msg_{n}",
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-4",
            "content": list(blocks),
            "stop_reason": "tool_use",
            "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 5},
        }
    )


def thinking(text: str, signature: str) -> dict[str, Any]:
    return {"type": "thinking", "thinking": text, "signature": signature}


def tool_use(cid: str, path: str) -> dict[str, Any]:
    return {"type": "tool_use", "id": cid, "name": "read", "input": {"path": path}}


async def body(ctx: AsyncClient, sid: str, route: common_pb2.Route) -> tuple[Any, dict[str, Any]]:
    req = cpb.CompileRequest(session_id=sid, route=route, render_formats=[ANTHROPIC])
    view = (await ctx.compiles.Compile(req)).view
    (rendering,) = view.renderings
    parsed: dict[str, Any] = json.loads(rendering.body_json)
    assert errors_for("anthropic_messages", parsed) == []
    return view, parsed


def leading(parsed: dict[str, Any]) -> list[list[dict[str, Any]]]:
    """The thinking blocks each assistant turn of a body starts with."""
    out = []
    for m in parsed["messages"]:
        if m["role"] == "assistant":
            n = next(
                (
                    i
                    for i, b in enumerate(m["content"])
                    if b["type"] not in {"thinking", "redacted_thinking"}
                ),
                len(m["content"]),
            )
            out.append(m["content"][:n])
    return out


async def test_a_tool_loop_with_thinking_sends_each_turns_blocks_back(daemon: Daemon) -> None:
    first = response(1, thinking("a.py holds the parser.", "EqQBsig1"), tool_use("toolu_1", "a.py"))
    second = response(
        2,
        thinking("The bug is in b.py.", "EpoBsig2"),
        {"type": "redacted_thinking", "data": "EmwKAhgB"},
        {"type": "text", "text": "Now b.py."},
        tool_use("toolu_2", "b.py"),
    )
    async with AsyncClient(str(daemon.endpoints.tcp)) as ctx:
        sid = (await ctx.create_session()).session_id
        await ctx.append(sid, [user("fix the parser bug")])
        view, _ = await body(ctx, sid, ROUTE)
        for answer, cid, text in (
            (first, "toolu_1", "def parse(): ..."),
            (second, "toolu_2", "x = 1"),
        ):
            logged = assistant_from_anthropic(answer, view.route_id)
            assert logged.assistant_message.native_state.kind == ANTHROPIC_THINKING
            assert not logged.assistant_message.reasoning  # R-MISC-2: no text copy
            await ctx.append(sid, [logged, tool_result(cid, text, "read")])
            view, parsed = await body(ctx, sid, ROUTE)
        sent = (
            [b.model_dump() for b in first.content[:1]],
            [b.model_dump() for b in second.content[:2]],
        )
        assert leading(parsed) == [sent[0], sent[1]]
        # Counted as the native state they are (the view's layer of that name).
        native = next(la for la in view.layers if la.layer == view_pb2.LAYER_NATIVE_STATE)
        assert native.tokens > 0 and native.items == 2
        # A rebuild of that compile renders the same body.
        rebuilt = await ctx.compiles.Compile(
            cpb.CompileRequest(
                session_id=sid, rebuild_compile_id=view.compile_id, render_formats=[ANTHROPIC]
            )
        )
        assert rebuilt.view.renderings[0].body_json == view.renderings[0].body_json
        # On another model the signatures are not its own: nothing is sent.
        _, other = await body(ctx, sid, OTHER)
        assert leading(other) == [[], []]
        # The user typed while the tool ran: the body puts the message in the results'
        # user turn, so for the API the tool loop goes on and still wants the blocks.
        await ctx.append(sid, [user("also check the tests")])
        _, typed = await body(ctx, sid, ROUTE)
        assert leading(typed) == [sent[0], sent[1]]
        # Claude answers without a call: the loop is over, and so is the next request's
        # need for its blocks (the API strips them anyway).
        await ctx.append(sid, [assistant("Fixed in b.py."), user("thanks, now run the tests")])
        _, later = await body(ctx, sid, ROUTE)
        assert leading(later) == [[], [], []]


async def test_an_interrupted_tool_and_a_checkpoint_in_the_loop_keep_its_blocks(
    daemon: Daemon,
) -> None:
    """Two ways a loop goes on that the body must still honour: the user stops a running
    tool and types (the call gets a synthetic result, which leads the user's turn), and
    a checkpoint that covered the loop's start (a compaction in the middle of a loop):
    the assistant messages the view still holds lead with their blocks."""
    first = response(1, thinking("a.py first.", "EqQBsig1"), tool_use("toolu_1", "a.py"))
    second = response(2, thinking("Now b.py.", "EpoBsig2"), tool_use("toolu_2", "b.py"))
    third = response(3, thinking("Then c.py.", "EpoBsig3"), tool_use("toolu_3", "c.py"))
    blocks = [[b.model_dump() for b in r.content[:1]] for r in (first, second, third)]
    async with AsyncClient(str(daemon.endpoints.tcp)) as ctx:
        sid = (await ctx.create_session()).session_id
        await ctx.append(sid, [user("fix the parser bug")])
        view, _ = await body(ctx, sid, ROUTE)
        # Interrupted: no result logged for toolu_1, a cancel, then the user's message.
        cancelled = event_pb2.Event()
        cancelled.turn_cancelled.reason = "user pressed stop"
        await ctx.append(
            sid,
            [assistant_from_anthropic(first, view.route_id), cancelled, user("look at b.py")],
        )
        _, interrupted = await body(ctx, sid, ROUTE)
        assert leading(interrupted) == [blocks[0]]
        results = [b for b in interrupted["messages"][-1]["content"] if b["type"] == "tool_result"]
        assert [r["tool_use_id"] for r in results] == ["toolu_1"]  # the synthetic one
        await ctx.append(
            sid,
            [
                assistant_from_anthropic(second, view.route_id),
                tool_result("toolu_2", "def parse(): ...", "read"),
                assistant_from_anthropic(third, view.route_id),
            ],
        )
        head = (
            await ctx.sessions.GetSession(spb.GetSessionRequest(session_id=sid))
        ).session.head_seq
        # A checkpoint through the result of toolu_2: the loop's start is summarized.
        await ctx.compiles.CreateCheckpoint(
            cpb.CreateCheckpointRequest(
                checkpoint=checkpoint_pb2.Checkpoint(
                    session_id=sid,
                    covers_through_seq=head - 1,
                    summary="Looked at a.py and b.py: the parser is in c.py.",
                    source_route=ROUTE,
                ),
                covered_digest_mode=cpb.COVERED_DIGEST_MODE_COMPUTE,
            )
        )
        await ctx.append(sid, [tool_result("toolu_3", "x = 1", "read")])
        view, compacted = await body(ctx, sid, ROUTE)
        assert view.checkpoint_id
        assert leading(compacted) == [blocks[2]]


FORMATS = {
    view_pb2.RENDER_FORMAT_OPENAI_CHAT: "openai_chat",
    view_pb2.RENDER_FORMAT_OPENAI_RESPONSES: "openai_responses",
    ANTHROPIC: "anthropic_messages",
    view_pb2.RENDER_FORMAT_GEMINI: "gemini",
}


def _sent_arguments(kind: str, parsed: dict[str, Any]) -> dict[str, Any]:
    """Each call id (or, in a Gemini body, which has none, each function name with its
    position) of a body with its arguments as sent."""
    out: dict[str, Any] = {}
    if kind == "openai_chat":
        for m in parsed["messages"]:
            for c in m.get("tool_calls") or ():
                out[c["id"]] = json.loads(c["function"]["arguments"])
    elif kind == "openai_responses":
        for item in parsed["input"]:
            if item.get("type") == "function_call":
                out[item["call_id"]] = json.loads(item["arguments"])
    elif kind == "anthropic_messages":
        for m in parsed["messages"]:
            for b in m["content"] if isinstance(m["content"], list) else ():
                if b["type"] == "tool_use":
                    out[b["id"]] = b["input"]
    else:
        calls = [
            p["functionCall"] for c in parsed["contents"] for p in c["parts"] if "functionCall" in p
        ]
        out = {f"{c['name']}#{i}": c.get("args", {}) for i, c in enumerate(calls)}
    return out


async def test_a_checkpoint_between_a_call_and_its_result_keeps_the_call_as_logged(
    daemon: Daemon,
) -> None:
    """An agent's checkpoint ends after Claude's two parallel calls and the result of the
    first, before the result of the second: the body of every format shows the calls
    with the arguments they were logged with, the Anthropic one after the thinking block
    of their turn (extended thinking refuses a tool_use without it); the SDKs' request
    types take every body, a rebuild gives the same bytes, and as of the checkpoint's
    end (before the result) the view is the summary alone."""
    first = response(
        1,
        thinking("Both files may hold the parser.", "EqQBsig1"),
        tool_use("toolu_1", "a.py"),
        tool_use("toolu_2", "b.py"),
    )
    async with AsyncClient(str(daemon.endpoints.tcp)) as ctx:
        sid = (await ctx.create_session()).session_id
        await ctx.append(sid, [user("fix the parser bug")])
        view, _ = await body(ctx, sid, ROUTE)
        await ctx.append(
            sid,
            [
                assistant_from_anthropic(first, view.route_id),
                tool_result("toolu_1", "def parse(): ...", "read"),
            ],
        )
        head = await _checkpoint_at_head(ctx, sid, "Reading a.py and b.py for the parser.", ROUTE)
        await ctx.append(sid, [tool_result("toolu_2", "x = 1", "read")])
        req = cpb.CompileRequest(session_id=sid, route=ROUTE, render_formats=list(FORMATS))
        view = (await ctx.compiles.Compile(req)).view
        assert view.checkpoint_id
        assert not [n for n in view.notes if n.startswith("restored a call")]
        assert len(view.renderings) == len(FORMATS)
        logged = {"toolu_1": {"path": "a.py"}, "toolu_2": {"path": "b.py"}}
        for rendering in view.renderings:
            kind = FORMATS[rendering.format]
            parsed = json.loads(rendering.body_json)
            assert errors_for(kind, parsed) == [], kind
            sent = _sent_arguments(kind, parsed)
            if kind == "gemini":
                assert sorted(sent.values(), key=str) == sorted(logged.values(), key=str)
            else:
                assert sent == logged, kind
            if kind == "anthropic_messages":
                turns = [m for m in parsed["messages"] if m["role"] == "assistant"]
                assert len(turns) == 1
                assert turns[0]["content"][0] == first.content[0].model_dump()
                assert [b["type"] for b in turns[0]["content"]] == [
                    "thinking",
                    "tool_use",
                    "tool_use",
                ]
                results = [
                    b["tool_use_id"]
                    for m in parsed["messages"]
                    if m["role"] == "user" and isinstance(m["content"], list)
                    for b in m["content"]
                    if b["type"] == "tool_result"
                ]
                assert results == ["toolu_1", "toolu_2"]
        rebuilt = await ctx.compiles.Compile(
            cpb.CompileRequest(
                session_id=sid, rebuild_compile_id=view.compile_id, render_formats=list(FORMATS)
            )
        )
        assert [r.body_json for r in rebuilt.view.renderings] == [
            r.body_json for r in view.renderings
        ]
        # As of the checkpoint's end, no result follows it: the summary and the request.
        before = (
            await ctx.compiles.Compile(
                cpb.CompileRequest(
                    session_id=sid, route=ROUTE, as_of_seq=head, render_formats=[ANTHROPIC]
                )
            )
        ).view
        parsed = json.loads(before.renderings[0].body_json)
        assert errors_for("anthropic_messages", parsed) == []
        assert _sent_arguments("anthropic_messages", parsed) == {}


async def _state_refused(
    ctx: AsyncClient, kind: str, data: bytes, says: str = ""
) -> tuple[str, Any]:
    """A new session, and an assistant message with this native state refused by its
    AppendEvents (INVALID_FIELD on the state's data, its message naming `says`, nothing
    written): the session's id and the event."""
    sid = (await ctx.create_session()).session_id
    ev = assistant("hi")
    ev.assistant_message.native_state.kind = kind
    ev.assistant_message.native_state.data = data
    with pytest.raises(CtxccError) as exc:
        await ctx.sessions.AppendEvents(spb.AppendEventsRequest(session_id=sid, events=[ev]))
    assert exc.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert exc.value.reason == "INVALID_FIELD"
    assert exc.value.metadata["field"] == "events[0].assistant_message.native_state.data"
    assert says in str(exc.value)
    got = await ctx.sessions.GetSession(spb.GetSessionRequest(session_id=sid))
    assert got.session.head_seq == 0
    return sid, ev


@pytest.mark.parametrize(
    "data",
    [
        b'[{"type": "thinking", "thinking": "x"}]',
        b'[{"type": "thinking", "thinking": "x", "signature": null}]',
        # A signature or redacted data the response lacked, written as "" (one client did,
        # where the others wrote null or nothing): the API refuses it back.
        b'[{"type": "thinking", "thinking": "x", "signature": ""}]',
        b'[{"type": "redacted_thinking", "data": ""}]',
    ],
)
async def test_a_thinking_state_that_holds_no_blocks_is_refused(
    daemon: Daemon, data: bytes
) -> None:
    """Sent on, a malformed block would fail every request of its turn at the provider."""
    async with AsyncClient(str(daemon.endpoints.tcp)) as ctx:
        sid, ev = await _state_refused(ctx, ANTHROPIC_THINKING, data)
        # An empty thinking text with its signature is a block the API returns (and takes).
        ev.assistant_message.native_state.data = (
            b'[{"type": "thinking", "thinking": "", "signature": "EqQB"}]'
        )
        await ctx.sessions.AppendEvents(spb.AppendEventsRequest(session_id=sid, events=[ev]))


@pytest.mark.parametrize(
    ("kind", "data"),
    [
        (ANTHROPIC_THINKING, b"[" * 5_000),
        (GEMINI_THOUGHT_SIGNATURES, b'{"a":' * 5_000),
        (OPENAI_REASONING, b"[" * 5_000),
    ],
)
async def test_a_native_state_nested_past_the_interpreters_limit_is_refused(
    daemon: Daemon, kind: str, data: bytes
) -> None:
    """JSON nested deeper than Python's recursion limit is malformed state like any
    other: INVALID_FIELD on that field and nothing written, not an INTERNAL."""
    async with AsyncClient(str(daemon.endpoints.tcp)) as ctx:
        await _state_refused(ctx, kind, data)


GEMINI_ROUTE = common_pb2.Route(
    connection="t", protocol="gemini", endpoint="api", model="gemini-3-pro-preview"
)


def gemini_response(*parts: dict[str, Any]) -> gt.GenerateContentResponse:
    """A generateContent response as google-genai parses it."""
    return gt.GenerateContentResponse.model_validate(
        {"candidates": [{"content": {"role": "model", "parts": list(parts)}}]}
    )


async def test_a_gemini_tool_loop_sends_each_calls_thought_signature_back(
    daemon: Daemon,
) -> None:
    first = gemini_response(
        {"text": "Planning the fix.", "thought": True},
        {
            "function_call": {"id": "fc1", "name": "read", "args": {"path": "a.py"}},
            "thought_signature": b"\x0a\x24\x01sig-one",
        },
        {"function_call": {"id": "fc2", "name": "read", "args": {"path": "b.py"}}},
    )
    # No ids from the API: the helper makes them, the agent logs the results under them.
    second = gemini_response(
        {"text": "Now c.py."},
        {
            "function_call": {"name": "read", "args": {"path": "c.py"}},
            "thought_signature": b"\x12\x34sig-two",
        },
    )
    async with AsyncClient(str(daemon.endpoints.tcp)) as ctx:
        sid, req, view = await _gemini_session(ctx)
        for answer in (first, second):
            logged = assistant_from_gemini(answer, view.route_id)
            assert logged.assistant_message.native_state.kind == GEMINI_THOUGHT_SIGNATURES
            calls = logged.assistant_message.tool_calls
            assert all(c.call_id for c in calls)
            assert "Planning" not in str(logged)  # the thought summary stays out
            await ctx.append(sid, [logged, *(tool_result(c.call_id, "ok", "read") for c in calls)])
            view = (await ctx.compiles.Compile(req)).view
        body = json.loads(view.renderings[0].body_json)
        assert errors_for("gemini", body) == []
        parts = [p for c in body["contents"] for p in c["parts"] if "functionCall" in p]
        # As google-genai sends a signature: the base64 of the bytes the response held.
        sent = [gt.Part.model_validate(p).thought_signature for p in parts]
        assert sent == [b"\x0a\x24\x01sig-one", None, b"\x12\x34sig-two"]
        # A user message typed while the tools ran joins their results: the turn goes on.
        await ctx.append(sid, [user("also check the tests")])
        typed = json.loads((await ctx.compiles.Compile(req)).view.renderings[0].body_json)
        signed = [p.get("thoughtSignature") for c in typed["contents"] for p in c["parts"]]
        assert [s for s in signed if s] == [
            base64.b64encode(b"\x0a\x24\x01sig-one").decode(),
            base64.b64encode(b"\x12\x34sig-two").decode(),
        ]
        # The model's answer without a call ends it: nothing is sent back after it.
        await ctx.append(sid, [assistant("Fixed."), user("thanks")])
        later = json.loads((await ctx.compiles.Compile(req)).view.renderings[0].body_json)
        assert all("thoughtSignature" not in p for c in later["contents"] for p in c["parts"])


async def test_a_checkpoint_between_gemini_calls_and_a_result_keeps_the_signed_call(
    daemon: Daemon,
) -> None:
    """Gemini 3 refuses a step whose first call lacks its thought signature: a checkpoint
    that ends after the result of the first of two parallel calls, before the second's,
    leaves the first call in the body with its arguments and signature."""
    first = gemini_response(
        {
            "function_call": {"id": "fc1", "name": "read", "args": {"path": "a.py"}},
            "thought_signature": b"\x0a\x24\x01sig-one",
        },
        {"function_call": {"id": "fc2", "name": "read", "args": {"path": "b.py"}}},
    )
    async with AsyncClient(str(daemon.endpoints.tcp)) as ctx:
        sid, req, view = await _gemini_session(ctx)
        await ctx.append(
            sid,
            [assistant_from_gemini(first, view.route_id), tool_result("fc1", "ok", "read")],
        )
        await _checkpoint_at_head(ctx, sid, "Reading a.py and b.py.", GEMINI_ROUTE)
        await ctx.append(sid, [tool_result("fc2", "x = 1", "read")])
        view = (await ctx.compiles.Compile(req)).view
        assert view.checkpoint_id
        body = json.loads(view.renderings[0].body_json)
        assert errors_for("gemini", body) == []
        parts = [
            gt.Part.model_validate(p)
            for c in body["contents"]
            for p in c["parts"]
            if "functionCall" in p
        ]
        assert [(p.function_call.args if p.function_call else None) for p in parts] == [
            {"path": "a.py"},
            {"path": "b.py"},
        ]
        assert [p.thought_signature for p in parts] == [b"\x0a\x24\x01sig-one", None]


RESPONSES_ROUTE = common_pb2.Route(
    connection="t", protocol="openai-responses", endpoint="api", model="o4-mini"
)


def responses_response(n: int, *output: dict[str, Any]) -> ot.Response:
    """A Responses API response as the openai SDK parses it."""
    return ot.Response.model_validate(
        {
            "id": f"resp_{n}",
            "object": "response",
            "created_at": 1_700_000_000,
            "model": "o4-mini",
            "output": list(output),
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
        }
    )


def reasoning_item(rid: str, summary: str, sealed: str | None) -> dict[str, Any]:
    return {
        "type": "reasoning",
        "id": rid,
        "summary": [{"type": "summary_text", "text": summary}],
        "content": [{"type": "reasoning_text", "text": f"raw {rid}"}],
        "encrypted_content": sealed,
        "status": "completed",
    }


def function_call(cid: str, path: str) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": f"fc_{cid}",
        "call_id": cid,
        "name": "read",
        "arguments": json.dumps({"path": path}),
        "status": "completed",
    }


async def test_a_responses_tool_loop_sends_its_reasoning_items_back(daemon: Daemon) -> None:
    """An agent on a reasoning model over the Responses API: each response (the SDK's own
    `Response`) logged with `assistant_from_openai_responses`; the Responses body of the
    loop's next step, which the SDK's request type takes, leads each response's message and
    calls with the reasoning item right before them in the response, with its id and its
    seal as a stateless request needs them; not an unsealed one before it, not one after
    the message (an event keeps no order between its text and calls), not in the next
    turn and not on another model."""
    first = responses_response(
        1, reasoning_item("rs_1", "Look at a.py.", "gAAAAseal1"), function_call("call_1", "a.py")
    )
    second = responses_response(
        2,
        reasoning_item("rs_3", "Stored only.", None),  # from a stored response: no seal
        reasoning_item("rs_2", "Then b.py.", "gAAAAseal2"),
        {
            "type": "message",
            "id": "msg_2",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Now b.py.", "annotations": []}],
        },
        reasoning_item("rs_4", "After the preamble.", "gAAAAseal4"),
        function_call("call_2", "b.py"),
    )
    responses = view_pb2.RENDER_FORMAT_OPENAI_RESPONSES
    async with AsyncClient(str(daemon.endpoints.tcp)) as ctx:
        sid = (await ctx.create_session()).session_id
        await ctx.append(sid, [user("fix the parser bug")])
        req = cpb.CompileRequest(session_id=sid, route=RESPONSES_ROUTE, render_formats=[responses])
        view = (await ctx.compiles.Compile(req)).view
        # A response cut at its output cap while the model reasoned: only its reasoning.
        # Logged as it came (not refused as an empty message), it is sent nowhere.
        cut = responses_response(0, reasoning_item("rs_0", "Cut short.", "gAAAAseal0"))
        await ctx.append(sid, [assistant_from_openai_responses(cut, view.route_id)])
        for answer, cid in ((first, "call_1"), (second, "call_2")):
            logged = assistant_from_openai_responses(answer, view.route_id)
            assert logged.assistant_message.native_state.kind == OPENAI_REASONING
            assert "raw rs_" not in str(logged)  # R-MISC-2: no raw reasoning text
            assert [c.call_id for c in logged.assistant_message.tool_calls] == [cid]
            await ctx.append(sid, [logged, tool_result(cid, "ok", "read")])
            view = (await ctx.compiles.Compile(req)).view
        body = json.loads(view.renderings[0].body_json)
        assert errors_for("openai_responses", body) == []
        assert body["store"] is False
        items = [(i["type"], i.get("encrypted_content") or i.get("call_id")) for i in body["input"]]
        assert items == [
            ("message", None),
            ("reasoning", "gAAAAseal1"),
            ("function_call", "call_1"),
            ("function_call_output", "call_1"),
            ("reasoning", "gAAAAseal2"),
            ("message", None),
            ("function_call", "call_2"),
            ("function_call_output", "call_2"),
        ]
        # The reasoning item keeps its id (the SDK's type wants it, Azure AI Foundry too);
        # the other items carry none (nothing is stored), as before.
        assert [i.get("id") for i in body["input"]] == [None, "rs_1", None, None, "rs_2"] + [
            None
        ] * 3
        assert body["input"][4]["summary"] == [{"type": "summary_text", "text": "Then b.py."}]
        native = next(la for la in view.layers if la.layer == view_pb2.LAYER_NATIVE_STATE)
        assert native.tokens > 0 and native.items == 2
        # Another model's compile sends none: the items are not its own (R-ROUTE-2).
        other = cpb.CompileRequest(
            session_id=sid,
            route=common_pb2.Route(
                connection="t", protocol="openai-responses", endpoint="api", model="gpt-5"
            ),
            render_formats=[responses],
        )
        switched = json.loads((await ctx.compiles.Compile(other)).view.renderings[0].body_json)
        assert all(i["type"] != "reasoning" for i in switched["input"])
        # The model's answer ends the loop: the next turn sends none back.
        await ctx.append(sid, [assistant("Fixed."), user("thanks")])
        later = json.loads((await ctx.compiles.Compile(req)).view.renderings[0].body_json)
        assert all(i["type"] != "reasoning" for i in later["input"])


@pytest.mark.parametrize(
    "data",
    [
        b'[{"type": "reasoning", "id": "rs_1", "summary": []}]',  # no encrypted content
        b'[{"type": "reasoning", "id": "rs_1", "summary": "x", "encrypted_content": "e"}]',
        b"[]",
    ],
)
async def test_reasoning_items_a_stateless_request_cannot_send_are_refused(
    daemon: Daemon, data: bytes
) -> None:
    async with AsyncClient(str(daemon.endpoints.tcp)) as ctx:
        await _state_refused(ctx, OPENAI_REASONING, data, says="encrypted_content")


OPENAI_RESPONSE = (
    Path(__file__).parents[1] / "fixtures" / "client-thinking" / "openai-response.json"
)


def test_the_logged_responses_output_says_what_it_said() -> None:
    """tests/fixtures/client-thinking/openai-response.json (also the Go and TypeScript
    clients' fixture), as the SDK's `Response` and as its JSON: the message's output_text
    parts as one text part, the function calls as the calls (arguments as the model wrote
    them), and the reasoning item right before the message as the native state, without
    its raw text or status; the unsealed one before it, the one after the first call and
    the web search call are left out. The expectations are read from the fixture itself."""
    raw = json.loads(OPENAI_RESPONSE.read_text(encoding="utf-8"))
    out = raw["output"]
    for response in (ot.Response.model_validate(raw), raw):
        m = assistant_from_openai_responses(response, "r1").assistant_message
        texts = [p["text"] for i in out if i["type"] == "message" for p in i["content"]]
        assert [p.text for p in m.parts] == ["".join(texts)]
        calls = [i for i in out if i["type"] == "function_call"]
        assert [(c.call_id, c.name, c.arguments_json) for c in m.tool_calls] == [
            (c["call_id"], c["name"], c["arguments"]) for c in calls
        ]
        assert (m.native_state.route_id, m.native_state.kind) == ("r1", OPENAI_REASONING)
        assert json.loads(m.native_state.data) == [
            {k: i[k] for k in ("type", "id", "summary", "encrypted_content")}
            for i in leading_reasoning(out)
        ]
        assert not m.reasoning
    # The item right before the message has no seal: no native state (the one before it
    # is not sent in its place); null fields are "", not "None".
    plain = assistant_from_openai_responses({"output": [out[1], out[0], out[3]]}, "r1")
    assert not plain.assistant_message.HasField("native_state")
    nulls = {"type": "function_call", "call_id": None, "name": None, "arguments": None}
    call = assistant_from_openai_responses({"output": [nulls]}, "r1").assistant_message
    assert [(c.call_id, c.name, c.arguments_json) for c in call.tool_calls] == [("", "", "{}")]
    empty = assistant_from_openai_responses({"output": []}, "r1")
    assert empty.HasField("assistant_message") and empty.assistant_message.ByteSize() == 0


async def _checkpoint_at_head(
    ctx: AsyncClient, sid: str, summary: str, route: common_pb2.Route
) -> int:
    """A model-written checkpoint through the session's head (returned), its digest
    computed."""
    head = (await ctx.sessions.GetSession(spb.GetSessionRequest(session_id=sid))).session.head_seq
    await ctx.compiles.CreateCheckpoint(
        cpb.CreateCheckpointRequest(
            checkpoint=checkpoint_pb2.Checkpoint(
                session_id=sid, covers_through_seq=head, summary=summary, source_route=route
            ),
            covered_digest_mode=cpb.COVERED_DIGEST_MODE_COMPUTE,
        )
    )
    return int(head)


async def _gemini_session(
    ctx: AsyncClient,
) -> tuple[str, cpb.CompileRequest, view_pb2.CompiledView]:
    """A new session with the user's request, compiled on the Gemini route with its body:
    the session id, the request, the first view."""
    sid = (await ctx.create_session()).session_id
    await ctx.append(sid, [user("fix the parser bug")])
    req = cpb.CompileRequest(
        session_id=sid, route=GEMINI_ROUTE, render_formats=[view_pb2.RENDER_FORMAT_GEMINI]
    )
    return sid, req, (await ctx.compiles.Compile(req)).view
