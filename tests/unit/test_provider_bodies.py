"""Defects of provider bodies that the real APIs reject or that silently lose work:
output caps, call ids, result order, malformed arguments, the opening turn and the
prompt-cache signal. Each test asserts what the provider's documentation requires."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import Any

from server.compiler.budget import ModelLimits
from server.compiler.compile import CompileInputs, compile_view, section_digests
from server.compiler.provider_rules import OPENER
from server.compiler.render import RenderFormat, render
from server.compiler.render_anthropic import call_id_of, tool_use_id
from server.compiler.view import CompiledView, OutputCapSource, SectionKind
from server.domain.model import (
    AssistantMessage,
    ContentPart,
    Event,
    Role,
    Route,
    Session,
    ToolCall,
    ToolResult,
    UserMessage,
)
from server.domain.records import RouteState
from server.domain.tools import ToolSpec, ToolVisibility
from tests.unit.test_system_prompt import WordCounter

ANTHROPIC_ID = re.compile(r"^[a-zA-Z0-9_-]+$")
READ = ToolSpec("read", "Read a file", '{"type": "object", "properties": {}}')
LIMITS = ModelLimits(context_window=200_000, max_output_tokens=64_000)


def user(text: str) -> UserMessage:
    return UserMessage((ContentPart(text=text),))


def compiled(*payloads: Any, **kw: Any) -> CompiledView:
    events = tuple(Event(i + 1, f"e{i + 1}", 0, p) for i, p in enumerate(payloads))
    kw.setdefault("tools", (READ,))
    inputs = CompileInputs("s:1", Session("s", 0, 0), events, len(events), Route(model="m"), **kw)
    return compile_view(inputs, WordCounter())


def bodies(v: CompiledView) -> dict[RenderFormat, dict[str, Any]]:
    return {fmt: json.loads(render(v, fmt)) for fmt in RenderFormat}


def caps(v: CompiledView) -> list[int]:
    b = bodies(v)
    return [
        b[RenderFormat.OPENAI_CHAT]["max_completion_tokens"],
        b[RenderFormat.OPENAI_RESPONSES]["max_output_tokens"],
        b[RenderFormat.ANTHROPIC_MESSAGES]["max_tokens"],
        b[RenderFormat.GEMINI]["generationConfig"]["maxOutputTokens"],
    ]


def after_short_reply() -> RouteState:
    return RouteState("r", 10_000, "c0", last_output_tokens=40, update_time_ns=0)


def test_a_short_reply_does_not_shrink_the_output_cap() -> None:
    v = compiled(user("hi"), limits=LIMITS, route_state=after_short_reply())
    assert v.budget.output_reserve == 1_024  # local budgeting (R-BUD-2) is unchanged
    assert caps(v) == [64_000] * 4
    assert v.budget.output_cap_source is OutputCapSource.MODEL_MAX


def test_the_callers_cap_wins_and_a_cap_is_lowered_only_to_fit_the_window() -> None:
    v = compiled(user("hi"), limits=LIMITS, requested_max_output=4_000)
    assert caps(v) == [4_000] * 4 and v.budget.output_cap_source is OutputCapSource.CALLER
    long = user("word " * 30_000)
    small = ModelLimits(context_window=40_000, max_output_tokens=32_000)
    fitted = compiled(long, limits=small)
    est = fitted.budget.estimated_input_tokens
    # A margin for the estimate's error: 5% of it, at least 256 tokens (fitted to the last
    # token, an estimate one token low is refused by the provider).
    margin = max(256, est // 20)
    assert est > 8_000 and caps(fitted) == [40_000 - est - margin] * 4
    assert fitted.budget.output_cap_source is OutputCapSource.FITTED_TO_WINDOW
    assert any("output cap lowered from 32000" in n for n in fitted.notes)
    # A compile recorded before rendering 7 is rebuilt fitted to the last token.
    then = compiled(long, limits=small, rendering=6)
    assert caps(then) == [40_000 - est] * 4
    # Within the margin of fitting, the cap is fitted too.
    near = compiled(
        long, limits=ModelLimits(context_window=est + 32_000 + 10, max_output_tokens=32_000)
    )
    assert near.budget.output_cap_source is OutputCapSource.FITTED_TO_WINDOW
    assert caps(near) == [32_010 - margin] * 4
    unknown = compiled(user("hi"))
    assert caps(unknown) == [16_384] * 4
    assert unknown.budget.output_cap_source is OutputCapSource.DEFAULT


def test_a_cap_that_cannot_fit_is_noted_as_such_from_rendering_13() -> None:
    """An estimate over the window (a history that long, an image whose header claims
    60,000 x 60,000 pixels) leaves the cap at its floor, 1,024: the note said the input
    and the output then fit the window, and a caller's cap of 500 was "lowered from 500
    to 500" as FITTED_TO_WINDOW. Compiles recorded before rendering 13 keep those notes."""
    over = user("word " * 30_000)
    small = ModelLimits(context_window=20_000, max_output_tokens=32_000)
    v = compiled(over, limits=small)
    est = v.budget.estimated_input_tokens
    assert est > 20_000 and caps(v) == [1_024] * 4
    assert v.budget.output_cap_source is OutputCapSource.FITTED_TO_WINDOW
    (note,) = [n for n in v.notes if "output cap" in n]
    assert note == (
        f"output cap lowered from 32000 (model_max) to 1024, the least it is lowered to: the "
        f"estimated input ({est}) leaves 0 tokens of the 20000-token window after the "
        "estimate's margin; the provider's count decides"
    )
    kept = compiled(over, limits=small, requested_max_output=500)
    assert caps(kept) == [500] * 4 and kept.budget.output_cap_source is OutputCapSource.CALLER
    assert any(
        n.startswith("output cap 500 (caller) kept: the estimated input") for n in kept.notes
    )
    then = compiled(over, limits=small, requested_max_output=500, rendering=12)
    assert caps(then) == [500] * 4
    assert then.budget.output_cap_source is OutputCapSource.FITTED_TO_WINDOW
    assert any("output cap lowered from 500 (caller) to 500 so the" in n for n in then.notes)


def test_anthropic_ids_are_valid_unique_stable_and_reversible() -> None:
    log = (
        user("go"),
        AssistantMessage((), (ToolCall("call_0", "read", '{"path": "a"}'),)),
        ToolResult("call_0", "read", text="A"),
        AssistantMessage((), (ToolCall("call_0", "read", '{"path": "b"}'),)),  # id reused
        ToolResult("call_0", "read", text="B"),
        AssistantMessage((), (ToolCall("tool.use:7/x", "read", '{"path": "c"}'),)),
        ToolResult("tool.use:7/x", "read", text="C"),
    )
    first = bodies(compiled(*log))[RenderFormat.ANTHROPIC_MESSAGES]
    again = bodies(compiled(*log))[RenderFormat.ANTHROPIC_MESSAGES]
    blocks = [b for m in first["messages"] for b in m["content"]]
    uses = [b["id"] for b in blocks if b["type"] == "tool_use"]
    results = [b["tool_use_id"] for b in blocks if b["type"] == "tool_result"]
    assert all(ANTHROPIC_ID.match(i) for i in uses) and len(set(uses)) == 3
    assert results == uses and uses[0] == "call_0"  # valid ids pass unchanged
    assert first == again
    view_ids = [c.call_id for m in compiled(*log).messages for c in m.tool_calls]
    assert [call_id_of(i) for i in uses] == view_ids
    for raw in ("", "cx_", "cx_41", "a-b_c", "é~ ", "toolu_01ABC"):
        assert ANTHROPIC_ID.match(tool_use_id(raw)) and call_id_of(tool_use_id(raw)) == raw


def test_a_recreated_call_keeps_its_arguments() -> None:
    # The user interrupts before the result lands: the call's pair is closed with a
    # synthetic result, then the late result gets its call back.
    v = compiled(
        user("go"),
        AssistantMessage((), (ToolCall("c1", "read", '{"path": "a.py"}'),)),
        user("wait"),
        ToolResult("c1", "read", text="late"),
    )
    recreated = [c for m in v.messages for c in m.tool_calls][-1]
    assert recreated.call_id != "c1" and json.loads(recreated.arguments_json) == {"path": "a.py"}
    anthropic = bodies(v)[RenderFormat.ANTHROPIC_MESSAGES]
    uses = [b for m in anthropic["messages"] for b in m["content"] if b["type"] == "tool_use"]
    assert [u["input"] for u in uses] == [{"path": "a.py"}, {"path": "a.py"}]


def test_gemini_responses_follow_the_order_of_their_calls() -> None:
    v = compiled(
        user("go"),
        AssistantMessage(
            (), (ToolCall("a", "read", '{"path": "1"}'), ToolCall("b", "read", '{"path": "2"}'))
        ),
        ToolResult("b", "read", text="second"),
        ToolResult("a", "read", text="first"),
    )
    contents = bodies(v)[RenderFormat.GEMINI]["contents"]
    calls = [p["functionCall"] for p in contents[1]["parts"]]
    responses = [p["functionResponse"] for p in contents[2]["parts"]]
    # Matched by order: no ids, which Vertex AI refuses ('Unknown name "id"').
    assert [c["args"]["path"] for c in calls] == ["1", "2"]
    assert [r["response"] for r in responses] == [{"output": "first"}, {"output": "second"}]
    assert not any("id" in p for p in (*calls, *responses))
    # As rendering 6 sent them, with ids.
    old = json.loads(render(replace(v, rendering=6), RenderFormat.GEMINI, {}))["contents"]
    assert [p["functionCall"]["id"] for p in old[1]["parts"]] == ["a", "b"]
    assert [p["functionResponse"]["id"] for p in old[2]["parts"]] == ["a", "b"]


def test_malformed_arguments_are_sent_one_way_in_every_format_with_a_note() -> None:
    v = compiled(
        user("go"),
        AssistantMessage((), (ToolCall("c1", "read", "{not json"), ToolCall("c2", "read", "[1]"))),
        ToolResult("c1", "read", text="x"),
        ToolResult("c2", "read", text="y"),
    )
    wanted = [{"invalid_arguments": "{not json"}, {"invalid_arguments": "[1]"}]
    b = bodies(v)
    chat = b[RenderFormat.OPENAI_CHAT]["messages"][-3]["tool_calls"]
    assert [json.loads(c["function"]["arguments"]) for c in chat] == wanted
    responses = [i for i in b[RenderFormat.OPENAI_RESPONSES]["input"] if "arguments" in i]
    assert [json.loads(i["arguments"]) for i in responses] == wanted
    anthropic = b[RenderFormat.ANTHROPIC_MESSAGES]["messages"][1]["content"]
    assert [u["input"] for u in anthropic] == wanted
    gemini = b[RenderFormat.GEMINI]["contents"][1]["parts"]
    assert [p["functionCall"]["args"] for p in gemini] == wanted
    assert sum("arguments are not a JSON object" in n for n in v.notes) == 2


def test_a_log_that_starts_with_the_assistant_opens_with_a_user_turn_everywhere() -> None:
    v = compiled(AssistantMessage((ContentPart(text="Welcome back."),)), user("thanks"))
    assert v.messages[0].role is Role.USER and v.messages[0].synthetic
    b = bodies(v)
    chat = b[RenderFormat.OPENAI_CHAT]["messages"]
    assert [m["role"] for m in chat[1:3]] == ["user", "assistant"] and chat[1]["content"] == OPENER
    assert b[RenderFormat.OPENAI_RESPONSES]["input"][0]["role"] == "user"
    assert b[RenderFormat.ANTHROPIC_MESSAGES]["messages"][0]["role"] == "user"
    assert [c["role"] for c in b[RenderFormat.GEMINI]["contents"]] == ["user", "model", "user"]


def test_activating_a_deferred_tool_changes_the_cache_signal() -> None:
    grep = ToolSpec("grep", "Search files", "{}", visibility=ToolVisibility.DEFERRED)
    log = (user("find TODOs"),)
    before = compiled(*log, tools=(READ, grep))
    after = compiled(
        *log,
        tools=(READ, grep),
        activated_tools=("grep",),
        previous_sections=section_digests(before.system_sections, before.tools),
    )
    assert [t.spec.name for t in after.tools] != [t.spec.name for t in before.tools]
    assert after.prefix_digest != before.prefix_digest
    assert after.changed_sections == (SectionKind.TOOLS,)
    same = compiled(
        *log,
        tools=(READ, grep),
        previous_sections=section_digests(before.system_sections, before.tools),
    )
    assert same.prefix_digest == before.prefix_digest and same.changed_sections == ()


def test_arguments_nested_at_the_readers_limit_are_judged_like_the_reader() -> None:
    from server.compiler.provider_rules import _arguments_object
    from server.compiler.textscan import MAX_JSON_DEPTH, parse_json

    for depth in range(MAX_JSON_DEPTH - 3, MAX_JSON_DEPTH + 3):
        for leaf in ("1", "[]", '"x"'):
            text = '{"a":' * depth + leaf + "}" * depth
            ok, value = parse_json(text)
            kept = _arguments_object(text) is None
            assert kept == (ok and isinstance(value, dict)), (depth, leaf)


def test_an_assistant_step_with_nothing_to_show_leaves_no_empty_message() -> None:
    # Reasoning only (not kept): nothing model-visible. An empty assistant message is
    # refused by OpenAI Chat ("content" or "tool_calls" required).
    v = compiled(user("think"), AssistantMessage((), (), reasoning="hmm"), user("and?"))
    assert all(m.parts or m.tool_calls or m.role is Role.TOOL for m in v.messages)
    chat = bodies(v)[RenderFormat.OPENAI_CHAT]["messages"]
    assert all(m.get("content") or m.get("tool_calls") for m in chat)
