"""Anthropic thinking blocks and Gemini thought signatures logged as an assistant
message's native state: sent back in the current turn's provider body (blocks at the head
of their assistant turn, signatures on their function calls), on their own route only,
counted in the estimate, and never in a rebuild of a compile recorded before the version
that brought them."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import server.compiler.turn_thinking as thinking_module
from server.compiler.compile import CompileInputs, compile_incremental, compile_view
from server.compiler.projection_memo import ActiveTurn, active_turn, loop_start
from server.compiler.render import RENDERING, RenderFormat, render
from server.compiler.turn_thinking import of_kind, sent_thinking, thinking_tokens
from server.compiler.view import CompiledView, Layer, ViewMessage
from server.domain.grown import Grown, grown
from server.domain.model import (
    AssistantMessage,
    ContentPart,
    Event,
    NativeState,
    Role,
    Route,
    Session,
    ToolCall,
    ToolResult,
    TurnCancelled,
    TurnCompleted,
    TurnStarted,
    UserMessage,
    starts_turn,
)
from server.domain.thinking import (
    GEMINI_KIND,
    KIND,
    OPENAI_KIND,
    reasoning_items,
    thinking_blocks,
    thought_signatures,
)
from server.domain.tools import ToolSpec
from tests.conformance.sdk_fuzz import rule_errors
from tests.conformance.sdk_types import errors_for
from tests.unit.test_system_prompt import WordCounter

ROUTE = Route(protocol="anthropic-messages", model="claude-sonnet-4")
SCHEMA = '{"type": "object", "properties": {"path": {"type": "string"}}}'
THOUGHT_A = [{"type": "thinking", "thinking": "Read a.py first.", "signature": "EqQBCkgIAR"}]
THOUGHT_B = [
    {"type": "thinking", "thinking": "Now b.py.", "signature": "EpoBCkgIAh"},
    {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix"},
]


def state(blocks: list[dict[str, str]], route: Route = ROUTE) -> NativeState:
    return NativeState(route.route_id, KIND, json.dumps(blocks).encode())


def call(cid: str, path: str) -> ToolCall:
    return ToolCall(cid, "read", json.dumps({"path": path}))


def user(text: str) -> UserMessage:
    return UserMessage((ContentPart(text=text),))


def compiled(*payloads: Any, rendering: int | None = None, route: Route = ROUTE) -> CompiledView:
    events = tuple(Event(i + 1, f"e{i + 1}", 0, p) for i, p in enumerate(payloads))
    inputs = CompileInputs(
        "s:1",
        Session("s", 0, 0),
        events,
        len(events),
        route,
        tools=(ToolSpec("read", "Read a file", SCHEMA),),
    )
    if rendering is not None:
        inputs = replace(inputs, rendering=rendering)
    return compile_view(inputs, WordCounter())


def anthropic(view: CompiledView) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(render(view, RenderFormat.ANTHROPIC_MESSAGES, {}))
    assert errors_for("anthropic_messages", body) == []  # the official SDK's type takes it
    return body


def assistant_turns(body: dict[str, Any]) -> list[list[dict[str, Any]]]:
    return [m["content"] for m in body["messages"] if m["role"] == "assistant"]


def native_tokens(view: CompiledView) -> int:
    return next(row.tokens for row in view.layers if row.layer is Layer.NATIVE_STATE)


TOOL_LOOP = (
    user("fix the bug"),
    AssistantMessage((), (call("c1", "a.py"),), "", state(THOUGHT_A)),
    ToolResult("c1", "read", text="print(1)"),
    AssistantMessage((ContentPart(text="and b"),), (call("c2", "b.py"),), "", state(THOUGHT_B)),
    ToolResult("c2", "read", text="print(2)"),
)


def test_each_assistant_turn_of_the_tool_loop_starts_with_its_own_blocks() -> None:
    view = compiled(*TOOL_LOOP)
    first, second = assistant_turns(anthropic(view))
    assert first == [
        *THOUGHT_A,
        {"type": "tool_use", "id": "c1", "name": "read", "input": {"path": "a.py"}},
    ]
    assert second[:2] == THOUGHT_B and [b["type"] for b in second[2:]] == ["text", "tool_use"]
    # Counted as the native state they are, each block set once.
    assert view.thinking == ((2, KIND, state(THOUGHT_A).data), (4, KIND, state(THOUGHT_B).data))
    assert native_tokens(view) == thinking_tokens(view.thinking) > 0
    # No other format carries them, and the view's messages do not.
    for fmt in (RenderFormat.OPENAI_CHAT, RenderFormat.OPENAI_RESPONSES, RenderFormat.GEMINI):
        assert "Read a.py first." not in render(view, fmt, {})
    assert all("Read a.py first." not in p.text for m in view.messages for p in m.parts if p.text)


def test_a_turn_merged_from_several_messages_starts_with_the_blocks() -> None:
    """A whitespace-only user message (which the API refuses, so the body leaves it out)
    between two assistant messages makes them one assistant turn: it must open with the
    second one's thinking although that message comes second."""
    view = compiled(
        user("fix it"),
        AssistantMessage((ContentPart(text="Looking."),), ()),
        user("  "),
        AssistantMessage((), (call("c1", "a.py"),), "", state(THOUGHT_A)),
        ToolResult("c1", "read", text="x"),
    )
    assert [m.role.name for m in view.messages] == [
        "USER",
        "ASSISTANT",
        "USER",
        "ASSISTANT",
        "TOOL",
    ]
    (turn,) = assistant_turns(anthropic(view))
    assert [b["type"] for b in turn] == ["thinking", "text", "tool_use"]


def test_earlier_turns_other_routes_and_unseen_messages_replay_nothing() -> None:
    other = Route(protocol="anthropic-messages", model="claude-haiku-4-5")
    # A finished turn's blocks: the API strips them, the view does not send them.
    earlier = compiled(
        *TOOL_LOOP, AssistantMessage((ContentPart(text="Fixed."),), ()), user("thanks")
    )
    assert earlier.thinking == () and native_tokens(earlier) == 0
    # After a switch to another model the blocks' signatures are not its own (R-ROUTE-2).
    switched = compiled(*TOOL_LOOP, route=other)
    assert switched.thinking == ()
    assert all(b["type"] != "thinking" for t in assistant_turns(anthropic(switched)) for b in t)
    # A message with reasoning only is not in the view: its blocks lead nothing.
    unseen = compiled(user("hi"), AssistantMessage((), (), "thought", state(THOUGHT_A)))
    assert unseen.thinking == () and native_tokens(unseen) == 0


def test_a_compile_recorded_before_is_rebuilt_without_them() -> None:
    """Rendering 1 (compiles recorded before this version) replayed nothing and counted
    the latest message's state alone: its rebuild does the same, byte for byte."""
    now, then = compiled(*TOOL_LOOP), compiled(*TOOL_LOOP, rendering=1)
    assert then.thinking == ()
    assert all(b["type"] != "thinking" for t in assistant_turns(anthropic(then)) for b in t)
    assert native_tokens(then) == thinking_tokens(((4, KIND, state(THOUGHT_B).data),))
    assert native_tokens(now) > native_tokens(then)


@pytest.mark.parametrize(
    "data",
    [
        b"not json",
        b"[]",
        b'{"type": "thinking"}',
        b'[{"type": "thinking", "thinking": "x"}]',
        b'[{"type": "thinking", "thinking": "x", "signature": 7}]',
        b'[{"type": "text", "text": "x"}]',
        b'[{"type": "redacted_thinking"}]',
        b"[1]",
        b"\xff",
    ],
)
def test_only_arrays_of_thinking_blocks_are_blocks(data: bytes) -> None:
    assert thinking_blocks(data) is None


def test_blocks_keep_only_what_the_api_takes() -> None:
    logged = [{**THOUGHT_A[0], "citations": None}, {"type": "redacted_thinking", "data": "Zm9v"}]
    assert thinking_blocks(json.dumps(logged).encode()) == (
        THOUGHT_A[0],
        {"type": "redacted_thinking", "data": "Zm9v"},
    )


GEMINI = Route(protocol="gemini", model="gemini-3-pro-preview")
SIG_1, SIG_2 = "CiQBVKhc7s1gn0g=", "EjQKMgFUqFzu9w=="


def signed(signatures: dict[str, str], route: Route = GEMINI) -> NativeState:
    return NativeState(route.route_id, GEMINI_KIND, json.dumps(signatures).encode())


def gemini_body(view: CompiledView) -> dict[str, Any]:
    """The Gemini body, each functionCall given the view's call id back (the body sends
    none, Vertex AI refuses them; its calls are the view's, in order) to name it here."""
    body: dict[str, Any] = json.loads(render(view, RenderFormat.GEMINI, {}))
    assert errors_for("gemini", body) == []  # google-genai's own types take it
    calls = [p["functionCall"] for c in body["contents"] for p in c["parts"] if "functionCall" in p]
    ids = [c.call_id for m in view.messages for c in m.tool_calls]
    assert len(calls) == len(ids)
    # Bodies rendered before version 7 carried the ids themselves.
    assert [c.get("id") for c in calls] == ([None] * len(ids) if view.rendering >= 7 else ids)
    for call, call_id in zip(calls, ids, strict=True):
        call["id"] = call_id
    return body


def calls_signed(body: dict[str, Any]) -> list[tuple[str, str | None]]:
    return [
        (p["functionCall"]["id"], p.get("thoughtSignature"))
        for c in body["contents"]
        for p in c["parts"]
        if "functionCall" in p
    ]


GEMINI_LOOP = (
    user("fix the bug"),
    # Parallel calls: Gemini signs the first of a step only.
    AssistantMessage((), (call("c1", "a.py"), call("c2", "b.py")), "", signed({"c1": SIG_1})),
    ToolResult("c1", "read", text="print(1)"),
    ToolResult("c2", "read", text="print(2)"),
    AssistantMessage((), (call("c3", "c.py"),), "", signed({"c3": SIG_2})),
    ToolResult("c3", "read", text="print(3)"),
)


def test_gemini_calls_of_the_turn_carry_their_thought_signatures() -> None:
    view = compiled(*GEMINI_LOOP, route=GEMINI)
    assert calls_signed(gemini_body(view)) == [("c1", SIG_1), ("c2", None), ("c3", SIG_2)]
    assert native_tokens(view) == thinking_tokens(view.thinking) > 0
    # Not in the other formats (their routes never hold such state), nor at rendering 2.
    assert SIG_1 not in render(view, RenderFormat.ANTHROPIC_MESSAGES, {})
    then = compiled(*GEMINI_LOOP, route=GEMINI, rendering=2)
    assert [s for _, s in calls_signed(gemini_body(then))] == [None, None, None]
    # Another model's signatures (a switch) are not sent; on Gemini 3 the first call of
    # each step then carries the stand-in instead (below).
    other = compiled(*GEMINI_LOOP, route=Route(protocol="gemini", model="gemini-2.5-flash"))
    assert [s for _, s in calls_signed(gemini_body(other))] == [None, None, None]
    switched = compiled(*GEMINI_LOOP, route=Route(protocol="gemini", model="gemini-3-flash"))
    assert calls_signed(gemini_body(switched)) == [("c1", SKIP), ("c2", None), ("c3", SKIP)]
    done = compiled(
        *GEMINI_LOOP, AssistantMessage((ContentPart(text="Done."),), ()), user("ok"), route=GEMINI
    )
    assert done.thinking == ()


SKIP = "skip_thought_signature_validator"


def test_gemini_3_steps_without_a_signature_carry_the_stand_in() -> None:
    """Calls Gemini 3 did not sign (made before a switch, logged without their state, or
    injected) would have the turn refused; the first call of each such step of the
    current turn carries Google's stand-in. Real signatures stay; earlier turns, older
    models and compiles rendered before version 4 get none."""
    loop = (
        user("earlier"),
        AssistantMessage((), (call("c0", "z.py"),)),
        ToolResult("c0", "read", text="0"),
        AssistantMessage((ContentPart(text="Done."),), ()),
        user("fix the bug"),
        AssistantMessage((), (call("c1", "a.py"), call("c2", "b.py"))),  # unsigned, parallel
        ToolResult("c1", "read", text="1"),
        ToolResult("c2", "read", text="2"),
        user("also check d.py"),  # typed while the tools ran: the turn goes on
        AssistantMessage((), (call("c3", "c.py"),), "", signed({"c3": SIG_2})),
        ToolResult("c3", "read", text="3"),
        AssistantMessage((ContentPart(text="Checking d."),), (call("c4", "d.py"),)),
        ToolResult("c4", "read", text="4"),
    )
    view = compiled(*loop, route=GEMINI)
    assert [s for _, s in calls_signed(gemini_body(view))] == [None, SKIP, None, SIG_2, SKIP]
    # On another route c3's signature is not sent (R-ROUTE-2): its step gets the stand-in.
    for model in ("gemini-3-flash", "models/gemini-3.1-pro", "gemini-4-flash"):
        other = compiled(*loop, route=Route(protocol="gemini", model=model))
        assert [s for _, s in calls_signed(gemini_body(other))] == [None, SKIP, None, SKIP, SKIP]
    for model in ("gemini-2.5-pro", "gemini-exp-1206", "models/gemini-1.5-flash", "gemini-30x"):
        older = compiled(*loop, route=Route(protocol="gemini", model=model))
        assert [s for _, s in calls_signed(gemini_body(older))] == [None] * 5
    rendered_3 = compiled(*loop, route=GEMINI, rendering=3)
    assert [s for _, s in calls_signed(gemini_body(rendered_3))] == [None] * 3 + [SIG_2, None]
    # A finished turn leaves no step to stand in for.
    done = compiled(
        *loop, AssistantMessage((ContentPart(text="ok"),), ()), user("next"), route=GEMINI
    )
    assert SKIP not in render(done, RenderFormat.GEMINI, {})


@pytest.mark.parametrize(
    "data",
    [b"{}", b"[]", b'{"c1": 7}', b'{"c1": ""}', b'{"": "CiQ="}', b'{"c1": "not base64!"}', b"x"],
)
def test_only_objects_of_base64_signatures_are_signatures(data: bytes) -> None:
    assert thought_signatures(data) is None
    assert thought_signatures(b'{"c1": "CiQBVKhc"}') == {"c1": "CiQBVKhc"}


def test_a_user_message_typed_during_the_tools_does_not_end_the_loop() -> None:
    """It goes in the tool results' user turn (they lead it), so for the API the loop
    goes on: the blocks of the assistant message before it are still wanted, and those
    of a cancelled loop too; an answer without a call, then a user message, ends it."""
    interjected = compiled(*TOOL_LOOP[:3], user("also check b.py"), *TOOL_LOOP[3:])
    first, second = assistant_turns(anthropic(interjected))
    assert first[:1] == THOUGHT_A and second[:2] == THOUGHT_B
    after_cancel = compiled(*TOOL_LOOP[:3], TurnCancelled("t", False), user("stop, do b.py"))
    assert assistant_turns(anthropic(after_cancel))[0][:1] == THOUGHT_A
    marker = compiled(
        *TOOL_LOOP[:3], TurnStarted("t2"), AssistantMessage((ContentPart(text="ok"),), ())
    )
    assert assistant_turns(anthropic(marker))[0][:1] == THOUGHT_A
    ended = compiled(
        *TOOL_LOOP[:3], AssistantMessage((ContentPart(text="Done."),), ()), user("next")
    )
    assert ended.thinking == ()


CALL = AssistantMessage((), (call("c1", "x"),))
RESULT = ToolResult("c1", "r", text="x")


@pytest.mark.parametrize(
    ("payloads", "start"),
    [
        ((user("a"),), 0),
        (
            (
                user("a"),
                AssistantMessage((), (call("c1", "x"),)),
                ToolResult("c1", "r", text="x"),
                user("b"),
            ),
            0,
        ),
        ((AssistantMessage((), (call("c1", "x"),)), ToolResult("c1", "r", text="x"), user("b")), 0),
        ((user("a"), AssistantMessage((ContentPart(text="done"),), ()), user("b")), 2),
        ((user("a"), RESULT, TurnCompleted(), TurnStarted("u")), 0),
        # An interrupted tool: its call has no result, the view gives it one, which the
        # user message's turn leads; cancelled or not.
        ((user("a"), CALL, user("b")), 0),
        ((user("a"), CALL, TurnCancelled("t", False), user("b")), 0),
        ((user("a"), ToolCall("c1", "r", "{}"), user("b")), 0),
        ((user("a"), AssistantMessage((ContentPart(text="done"),), ()), CALL, user("b")), 0),
    ],
)
def test_where_the_loop_starts(payloads: tuple[Any, ...], start: int) -> None:
    events = [Event(i + 1, f"e{i + 1}", 0, p) for i, p in enumerate(payloads)]
    last = max(i for i, e in enumerate(events) if starts_turn(e.payload))
    assert loop_start(events, last) == start
    # Rendering versions before 5 saw only a logged result go on.
    went_on = isinstance(events[last - 1].payload, (ToolResult, TurnCompleted, TurnStarted))
    assert loop_start(events, last, unanswered=False) == (start if went_on else last)


def test_an_interrupted_tool_keeps_its_loop_and_its_state() -> None:
    """The user stops a running tool and types: the call has no result, the view gives it
    a synthetic one, and the bodies put that result first in the new user message's turn;
    for the API the loop goes on, and the interrupted call's assistant turn must still
    open with its blocks (Anthropic) and carry its signature (Gemini)."""
    for cancel in ((TurnCancelled("t", False),), ()):
        interrupted = (*TOOL_LOOP[:2], *cancel, user("stop, look at b.py instead"))
        view = compiled(*interrupted)
        (first,) = assistant_turns(anthropic(view))
        assert first[:1] == THOUGHT_A, cancel
        assert compiled(*interrupted, rendering=4).thinking == ()
    gemini = (GEMINI_LOOP[0], GEMINI_LOOP[1], user("stop"))
    body = gemini_body(compiled(*gemini, route=GEMINI))
    assert calls_signed(body) == [("c1", SIG_1), ("c2", None)]
    # Rendered as version 4 did: no state, so Gemini 3 got the stand-in instead.
    then = gemini_body(compiled(*gemini, route=GEMINI, rendering=4))
    assert calls_signed(then) == [("c1", SKIP), ("c2", None)]


def test_a_log_that_opens_mid_turn_keeps_its_loop_and_its_state() -> None:
    """After a checkpoint that covered the turn's start (compaction in a tool loop), the
    log the view is made from has no turn start: the turn, and its loop, began before
    it, and the state of the assistant messages after the checkpoint is still wanted."""
    after_checkpoint = TOOL_LOOP[2:]  # the result of c1, then the second step
    view = compiled(*after_checkpoint)
    assert [seq for seq, _, _ in view.thinking] == [2]
    assert assistant_turns(anthropic(view))[-1][:2] == THOUGHT_B
    assert compiled(*after_checkpoint, rendering=4).thinking == ()


def test_a_reused_call_id_gets_the_signature_logged_under_it() -> None:
    """An agent that numbers calls per response logs "c0" twice; the view shows the
    second as "c0~2", and its signature, logged under "c0", goes on it."""
    loop = (
        user("weather in Paris, then Tokyo"),
        AssistantMessage((), (call("c0", "paris"),), "", signed({"c0": SIG_1})),
        ToolResult("c0", "read", text="sunny"),
        AssistantMessage((), (call("c0", "tokyo"),), "", signed({"c0": SIG_2})),
        ToolResult("c0", "read", text="rain"),
    )
    assert calls_signed(gemini_body(compiled(*loop, route=GEMINI))) == [
        ("c0", SIG_1),
        ("c0~2", SIG_2),
    ]
    then = compiled(*loop, route=GEMINI, rendering=4)
    assert calls_signed(gemini_body(then)) == [("c0", SIG_1), ("c0~2", SKIP)]
    # Two calls of one response under one id: the state names the first only.
    twice = (
        user("x"),
        AssistantMessage((), (call("c0", "a"), call("c0", "b")), "", signed({"c0": SIG_1})),
        ToolResult("c0", "read", text="1"),
    )
    signed_calls = calls_signed(gemini_body(compiled(*twice, route=GEMINI)))
    assert [s for _, s in signed_calls] == [SIG_1, None]


def test_the_loop_carried_from_step_to_step_is_the_loop_found_from_scratch() -> None:
    """Each step continues from the previous compile's memo: where the loop begins and
    which of its messages carry state are carried, not walked again; they must be what a
    compile from scratch finds, across turns that end and user messages that do not end
    the loop (one after a loop that began in a later turn than the log's first)."""
    steps: list[list[Any]] = [
        [user("a"), AssistantMessage((ContentPart(text="done"),), ())],
        [user("b")],
        [AssistantMessage((), (call("c1", "a.py"),), "", state(THOUGHT_A))],
        [ToolResult("c1", "read", text="x")],
        [user("typed while it ran")],
        [AssistantMessage((), (call("c2", "b.py"),), "", state(THOUGHT_B))],
        [ToolResult("c2", "read", text="y"), user("and again")],
        # A step that logs a signed call, its result and a typed message at once.
        [
            AssistantMessage((), (call("c3", "c.py"),), "", state(THOUGHT_A)),
            ToolResult("c3", "read", text="z"),
            user("one more"),
        ],
        [AssistantMessage((ContentPart(text="Fixed."),), ()), user("next")],
        # An interrupted call, then the user: the loop goes on across it.
        [AssistantMessage((), (call("c4", "d.py"),), "", state(THOUGHT_B))],
        [TurnCancelled("t", False), user("stop")],
        [AssistantMessage((), (call("c5", "e.py"),), "", state(THOUGHT_A))],
    ]
    sent = stepped(steps)
    # The loop that began at "b" goes on across the typed messages.
    assert sent[5] == sent[6] == [4, 7] and sent[7] == [4, 7, 10] and sent[8] == []
    assert sent[-1] == [15, 18]


def stepped(steps: list[list[Any]]) -> list[list[int]]:
    """Compiles the log as it grows by each step, each from the previous compile's memo:
    every view, and the current turn carried, must be what a compile from scratch finds.
    The seqs of the messages whose thinking state each view sends back."""
    log: list[Event] = []
    memo = None
    out = []
    for n, new in enumerate(steps):
        log += [Event(len(log) + i + 1, f"e{len(log) + i + 1}", 0, p) for i, p in enumerate(new)]
        inputs = CompileInputs("s:1", Session("s", 0, 0), tuple(log), len(log), ROUTE)
        assert active_turn(inputs.events, memo) == active_turn(inputs.events), n
        view, memo, _ = compile_incremental(inputs, WordCounter(), memo)
        assert view == compile_view(inputs, WordCounter()), n
        out.append([seq for seq, _, _ in view.thinking])
    return out


def test_a_log_without_a_turn_start_carried_from_step_to_step() -> None:
    """A log after a checkpoint that covered its turn's start, compiled step by step:
    the loop from its first event, carried from memo to memo, is the one found from
    scratch, until a user message that holds no result starts a new one."""
    steps: list[list[Any]] = [
        [ToolResult("c1", "read", text="x")],
        [AssistantMessage((), (call("c2", "b.py"),), "", state(THOUGHT_B))],
        [ToolResult("c2", "read", text="y")],
        [AssistantMessage((), (call("c3", "c.py"),), "", state(THOUGHT_A))],
        [ToolResult("c3", "read", text="z"), user("typed")],
        [AssistantMessage((ContentPart(text="Fixed."),), ()), user("next")],
    ]
    assert stepped(steps) == [[], [2], [2], [2, 4], [2, 4], []]


RESPONSES = Route(protocol="openai-responses", model="o4-mini")


def reasoned(rid: str, summary: str, route: Route = RESPONSES, **extra: Any) -> NativeState:
    """Reasoning items as a Responses output returns them (with their raw text, status)."""
    item = {
        "type": "reasoning",
        "id": rid,
        "summary": [{"type": "summary_text", "text": summary}] if summary else [],
        "content": [{"type": "reasoning_text", "text": "raw"}],
        "encrypted_content": f"gAAAA{rid}",
        "status": "completed",
        **extra,
    }
    return NativeState(route.route_id, OPENAI_KIND, json.dumps([item]).encode())


def responses_body(view: CompiledView) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(render(view, RenderFormat.OPENAI_RESPONSES, {}))
    assert errors_for("openai_responses", body) == []  # the official SDK's type takes it
    return body


REASONING_LOOP = (
    user("fix the bug"),
    AssistantMessage((), (call("c1", "a.py"),), "", reasoned("rs_1", "Read a.py first.")),
    ToolResult("c1", "read", text="print(1)"),
    AssistantMessage((ContentPart(text="and b"),), (call("c2", "b.py"),), "", reasoned("rs_2", "")),
    ToolResult("c2", "read", text="print(2)"),
)


def test_responses_calls_of_the_loop_follow_their_reasoning_items() -> None:
    """Each assistant message of the loop goes back led by its reasoning items, with what a
    stateless request (store: false) needs of them: id, summary and encrypted content."""
    view = compiled(*REASONING_LOOP, route=RESPONSES)
    body = responses_body(view)
    assert body["store"] is False
    kinds = [
        (i["type"], i.get("encrypted_content") or i.get("call_id") or i.get("role"))
        for i in body["input"]
    ]
    assert kinds == [
        ("message", "user"),
        ("reasoning", "gAAAArs_1"),
        ("function_call", "c1"),
        ("function_call_output", "c1"),
        ("reasoning", "gAAAArs_2"),
        ("message", "assistant"),
        ("function_call", "c2"),
        ("function_call_output", "c2"),
    ]
    # With its id and seal, as the SDK's type has it; not its raw text or status.
    assert body["input"][1] == {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [{"type": "summary_text", "text": "Read a.py first."}],
        "encrypted_content": "gAAAArs_1",
    }
    assert native_tokens(view) == thinking_tokens(view.thinking) > 0
    # Chat has no place for them; another model's items are not its own (R-ROUTE-2).
    chat = render(view, RenderFormat.OPENAI_CHAT, {})
    assert "rs_1" not in chat and "gAAAA" not in chat
    other = Route(protocol="openai-responses", model="gpt-5")
    switched = responses_body(compiled(*REASONING_LOOP, route=other))
    assert all(i["type"] != "reasoning" for i in switched["input"])
    # A finished turn's items are not sent back (the API drops them anyway).
    done = compiled(
        *REASONING_LOOP,
        AssistantMessage((ContentPart(text="Fixed."),), ()),
        user("thanks"),
        route=RESPONSES,
    )
    assert all(i["type"] != "reasoning" for i in responses_body(done)["input"])


def test_a_compile_recorded_before_reasoning_items_is_rebuilt_without_them() -> None:
    """Rendering 7 sent none (the kind was opaque state): its rebuild sends none."""
    then = compiled(*REASONING_LOOP, route=RESPONSES, rendering=7)
    assert then.thinking == ()
    assert all(i["type"] != "reasoning" for i in responses_body(then)["input"])


@pytest.mark.parametrize(
    "data",
    [
        b"[]",
        b"{}",
        b'[{"type": "reasoning", "id": "rs_1", "summary": []}]',  # no encrypted content
        b'[{"type": "reasoning", "id": 7, "summary": [], "encrypted_content": "x"}]',
        b'[{"type": "reasoning", "id": "rs_1", "encrypted_content": "x"}]',  # no summary
        b'[{"type": "reasoning", "id": "rs_1", "summary": [{"text": "x"}], '
        b'"encrypted_content": "x"}]',
        b'[{"type": "message", "id": "rs_1", "summary": [], "encrypted_content": "x"}]',
        b'[{"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": null}]',
        b"\xff",
    ],
)
def test_only_arrays_of_sealed_reasoning_items_are_reasoning_items(data: bytes) -> None:
    assert reasoning_items(data) is None


def test_an_item_logged_without_its_id_goes_without() -> None:
    sealed = b'[{"type": "reasoning", "summary": [], "encrypted_content": "x"}]'
    assert reasoning_items(sealed) == (
        {"type": "reasoning", "summary": [], "encrypted_content": "x"},
    )


def several(*rids: str) -> NativeState:
    """Several reasoning items logged with one message, in the response's order."""
    items = [json.loads(reasoned(r, r).data)[0] for r in rids]
    return NativeState(RESPONSES.route_id, OPENAI_KIND, json.dumps(items).encode())


def test_only_the_item_right_before_the_message_goes_and_only_where_it_is_known() -> None:
    """The API refuses a reasoning item not right before the item that followed it: of
    several logged with one message only the last goes (the ones before it were followed
    by reasoning); a message merged from two responses' events sends none (which of its
    text and calls followed which item is not known); a response that held reasoning only
    (cut at its output cap) sends none, also when merged with the next."""
    lead = [
        (i["id"], i["type"])
        for i in responses_body(
            compiled(
                user("go"),
                AssistantMessage((), (call("c1", "a.py"),), "", several("rs_a", "rs_b")),
                ToolResult("c1", "read", text="1"),
                route=RESPONSES,
            )
        )["input"]
        if i["type"] == "reasoning"
    ]
    assert lead == [("rs_b", "reasoning")]
    merged = compiled(
        user("go"),
        AssistantMessage((ContentPart(text="first"),), (), "", reasoned("rs_1", "x")),
        AssistantMessage((), (call("c1", "a.py"),), "", reasoned("rs_2", "y")),
        ToolResult("c1", "read", text="1"),
        route=RESPONSES,
    )
    assert [m.role for m in merged.messages].count(Role.ASSISTANT) == 1  # one message
    assert all(i["type"] != "reasoning" for i in responses_body(merged)["input"])
    cut = compiled(
        user("go"),
        AssistantMessage((), (), "", reasoned("rs_0", "cut")),
        AssistantMessage((), (call("c1", "a.py"),), "", reasoned("rs_1", "y")),
        ToolResult("c1", "read", text="1"),
        route=RESPONSES,
    )
    sent = [i["id"] for i in responses_body(cut)["input"] if i["type"] == "reasoning"]
    assert sent == ["rs_1"]


def test_state_of_a_message_the_model_sees_nothing_of_goes_nowhere() -> None:
    """A response cut while Claude thought (only its blocks) merges into the next assistant
    turn: from rendering 8 its blocks are not sent with the next response's, as for every
    kind of state; a compile recorded at 7 is rebuilt with them, as it was."""
    cut = [{"type": "thinking", "thinking": "cut short", "signature": "EqCUT"}]
    payloads = (
        user("fix the bug"),
        AssistantMessage((), (), "", state(cut)),
        AssistantMessage((), (call("c1", "a.py"),), "", state(THOUGHT_A)),
        ToolResult("c1", "read", text="print(1)"),
    )
    now, then = compiled(*payloads), compiled(*payloads, rendering=7)
    assert [t[:1] for t in assistant_turns(anthropic(now))] == [THOUGHT_A]
    assert [t[:2] for t in assistant_turns(anthropic(then))] == [cut + THOUGHT_A]


_SPAN = st.tuples(st.integers(1, 40), st.integers(0, 6))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.booleans(), st.booleans()), min_size=1, max_size=40),
    st.lists(st.tuples(_SPAN, st.booleans()), max_size=30),
)
def test_the_state_sent_is_that_of_messages_the_view_holds(
    logged: list[tuple[bool, bool]], shown: list[tuple[tuple[int, int], bool]]
) -> None:
    """Whatever spans of events the view's assistant messages hold (in any order,
    overlapping, some synthetic), the state sent is exactly that of the loop's assistant
    messages, valid and on the route, that some non-synthetic span holds: the plain
    definition, checked message by message against every span; and what a body puts with
    each message is the state its span holds."""
    events, messages = _loop_events(logged), _shown(shown)
    found = sent_thinking(events, active_turn(events), ROUTE.route_id, messages, RENDERING)
    sent = found.thinking if found is not None else ()
    expected = tuple(
        (e.seq, KIND, e.payload.native_state.data)
        for e in events[1:]
        if isinstance(e.payload, AssistantMessage)
        and e.payload.native_state is not None
        and e.payload.native_state.route_id == ROUTE.route_id
        and thinking_blocks(e.payload.native_state.data) is not None
        and any(m.first_seq <= e.seq <= m.last_seq for m in messages if not m.synthetic)
    )
    assert sent == expected
    for m in messages:  # what a body puts with each message: found by bisection
        held = [d for seq, _, d in sent if m.first_seq <= seq <= m.last_seq]
        assert of_kind(sent, KIND, m.first_seq, m.last_seq) == held
        assert of_kind(sent, GEMINI_KIND, m.first_seq, m.last_seq) == []


def _loop_events(logged: list[tuple[bool, bool]]) -> list[Event]:
    """A user message, then an assistant message with Claude thinking state per entry:
    (valid, on ROUTE)."""
    other = Route(protocol="anthropic-messages", model="claude-opus-4")
    events = [Event(1, "e1", 0, user("go"))]
    for valid, ours in logged:
        s = state(THOUGHT_A, ROUTE if ours else other)
        s = s if valid else replace(s, data=b'[{"type": "thinking"}]')
        seq = len(events) + 1
        events.append(Event(seq, f"e{seq}", 0, AssistantMessage((), (call("c", "a"),), "", s)))
    return events


def _shown(spans: list[tuple[tuple[int, int], bool]]) -> list[ViewMessage]:
    return [
        ViewMessage(Role.ASSISTANT, (), Layer.WORKING_SET, 1, first_seq=a, last_seq=a + n)
        if not synthetic
        else ViewMessage(Role.ASSISTANT, (), Layer.WORKING_SET, 1, synthetic=True)
        for (a, n), synthetic in spans
    ]


def _went_on(old: ActiveTurn, events: list[Event]) -> ActiveTurn:
    """The turn of `events` as a compile carrying `old` finds it (active_turn's memo)."""
    return replace(
        old, stated=grown(old.stated).extended(active_turn(events).stated[len(old.stated) :])
    )


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.booleans(), st.booleans()), min_size=1, max_size=30),
    st.integers(0, 30),
    st.lists(st.tuples(_SPAN, st.booleans()), max_size=20),
    st.lists(st.tuples(_SPAN, st.booleans()), max_size=10),
)
def test_thinking_carried_from_the_step_before_is_what_a_walk_finds(
    logged: list[tuple[bool, bool]],
    seen: int,
    shown_before: list[tuple[tuple[int, int], bool]],
    shown_after: list[tuple[tuple[int, int], bool]],
) -> None:
    """A step that goes on from the previous compile's thinking state (its messages and
    states extended) sends what matching every state against the whole view sends,
    whatever the new messages hold: reaching back among the old states, or ending before
    the loop."""
    events = _loop_events(logged)
    k = min(seen, len(events) - 1) + 1
    then = active_turn(events[:k])
    before_messages = Grown(_shown(shown_before))
    messages = before_messages.extended(_shown(shown_after))
    now = _went_on(then, events)
    before = sent_thinking(events[:k], then, ROUTE.route_id, before_messages, RENDERING)
    carried = sent_thinking(events, now, ROUTE.route_id, messages, RENDERING, before)
    walked = sent_thinking(events, now, ROUTE.route_id, tuple(messages), RENDERING)
    assert (carried is None) == (walked is None)
    if carried is not None and walked is not None:
        assert carried.thinking == walked.thinking
        assert carried.tokens == walked.tokens == thinking_tokens(walked.thinking)
        assert carried.reach == walked.reach


def test_a_step_of_a_long_loop_matches_only_its_new_state(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Carried from step to step, a loop's thinking state is matched against the view
    once: a step looks at its own new message and state, not the loop's 40 before."""
    events = _loop_events([(True, True)] * 41)
    messages: Grown[ViewMessage] = Grown()
    turn, sent = active_turn(events[:1]), None
    looked_at: list[int] = []
    real = thinking_module._sent

    def counting(stated: Any, *rest: Any) -> Any:
        stated = tuple(stated)
        looked_at.append(len(stated))
        return real(stated, *rest)

    monkeypatch.setattr(thinking_module, "_sent", counting)
    for n in range(2, len(events) + 1):
        turn = _went_on(turn, events[:n])
        messages = messages.extended(_shown([((n, 0), False)]))
        sent = sent_thinking(events[:n], turn, ROUTE.route_id, messages, RENDERING, sent)
    assert sent is not None and [s for s, _, _ in sent.thinking] == list(range(2, 43))
    assert looked_at[1:] == [1] * 40  # the first step found its one state by the walk


def test_a_long_loop_stepped_from_memo_to_memo_sends_what_scratch_sends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Thirty steps of a Claude loop (a call and its result appended at each), each
    compiled from the previous compile's memo (its thinking state carried), with a user
    message typed while the tools ran, a message with text only and one whose state is
    another route's: every view is the view a compile from scratch makes, and the steps
    went on from the memo's state. (A step compiled with its call still open forks the
    view's messages at the next: that step matches every state again.)"""
    carried: list[bool] = []
    real = thinking_module._went_on

    def counting(*args: Any) -> Any:
        found = real(*args)
        carried.append(found is not None)
        return found

    monkeypatch.setattr(thinking_module, "_went_on", counting)
    other = Route(protocol="anthropic-messages", model="claude-opus-4")
    steps: list[list[Any]] = [[user("fix it")]]
    for i in range(30):
        thought = state(THOUGHT_B if i % 3 else THOUGHT_A, other if i == 11 else ROUTE)
        called = AssistantMessage((), (call(f"c{i}", f"{i}.py"),), "", thought)
        steps.append([called, ToolResult(f"c{i}", "read", text=f"line {i}")])
        if i == 7:
            steps.append([user("also check the tests")])
        if i == 19:
            steps.append([AssistantMessage((ContentPart(text="halfway"),), ())])
    sent = stepped(steps)
    assert len(sent[-1]) == 29  # every call's blocks but the other route's
    assert carried.count(True) >= 28, carried


def test_a_final_reply_of_thinking_and_whitespace_is_left_out_from_rendering_15() -> None:
    """The loop's last reply is thinking and whitespace-only text, which Anthropic bodies
    drop: the final turn held its thinking alone, refused by the API ("The final block in
    an assistant message cannot be `thinking`"). From rendering 15 the turn is left out;
    a compile recorded before is rebuilt with it."""
    loop = (*TOOL_LOOP, AssistantMessage((ContentPart(text=" \n"),), (), "", state(THOUGHT_A)))
    now, then = anthropic(compiled(*loop)), anthropic(compiled(*loop, rendering=14))
    assert [m["role"] for m in now["messages"]][-2:] == ["assistant", "user"]
    assert now["messages"] == then["messages"][:-1]
    assert then["messages"][-1] == {"role": "assistant", "content": THOUGHT_A}


def test_a_final_turn_merged_past_a_later_thinking_ends_without_whitespace() -> None:
    """The loop's last two replies: text ending in whitespace, then thinking and
    whitespace-only text. Merged into one turn, the later thinking was its last block
    until the thinking was moved to the front, so the text's whitespace was left and
    ended the body (refused: "final assistant content cannot end with trailing
    whitespace"). From rendering 16 the text sent last is stripped; a compile recorded
    before is rebuilt as it was."""
    loop = (
        *TOOL_LOOP,
        AssistantMessage((ContentPart(text="Done.  \n"),), (), "", state(THOUGHT_A)),
        AssistantMessage((ContentPart(text=" \n"),), (), "", state(THOUGHT_B)),
    )
    now, then = anthropic(compiled(*loop)), anthropic(compiled(*loop, rendering=15))
    assert now["messages"][-1] == {
        "role": "assistant",
        "content": [*THOUGHT_A, *THOUGHT_B, {"type": "text", "text": "Done."}],
    }
    assert rule_errors("anthropic_messages", now) == []
    assert then["messages"][-1]["content"][-1] == {"type": "text", "text": "Done.  \n"}
    assert rule_errors("anthropic_messages", then) == [
        "final assistant content ends with whitespace"
    ]
