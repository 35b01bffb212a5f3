"""Incremental compilation: a view compiled from the previous compile's memo is the view
compiled from scratch, byte for byte, over random histories."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server.compiler import incremental
from server.compiler.budget import BudgetConfig, ModelLimits
from server.compiler.compile import CompileInputs, active_texts, compile_incremental, compile_view
from server.compiler.projection import PROJECTION, ImagePolicy, artifact_ids
from server.compiler.projection_memo import ProjectionMemo, active_turn
from server.compiler.render import RenderFormat
from server.compiler.textscan import paths_in
from server.compiler.view import CompiledView, Layer
from server.domain.model import (
    ArtifactRef,
    AssistantMessage,
    Attachment,
    BlobRef,
    BrowserElement,
    BrowserSelection,
    ContentPart,
    Event,
    ImportedMessage,
    NativeState,
    Payload,
    Role,
    Route,
    Session,
    ToolCall,
    ToolResult,
    TurnCancelled,
    TurnStarted,
    UserMessage,
    starts_turn,
)
from server.domain.records import Checkpoint, CheckpointKind, RouteState
from server.domain.thinking import GEMINI_KIND as SIGNATURES
from server.domain.thinking import KIND as THINKING
from server.domain.tools import ToolSpec, ToolVisibility
from server.service.compile_types import CompileResult
from server.transport.convert_view import _message_out, result_out, view_out
from server.transport.view_bytes import LentRecords, view_bytes
from tests.unit.test_system_prompt import WordCounter

C = WordCounter()
THOUGHT = b'[{"type": "thinking", "thinking": "check a.py", "signature": "c2ln"}]'
ROUTES = (
    Route(model="claude-sonnet-4"),
    Route(connection="b", model="gpt-4o"),
    # An OpenAI route with more tools than it takes (128): views cap them (tool_cap.py).
    Route(connection="c", protocol="openai-chat", model="gpt-4o"),
)
SESSION = Session("s", 1, 1)
IMAGE = ArtifactRef("img1", "image/png", 100, "ab", 10, 10)
# An image only imported messages carry.
IMPORTED_IMAGE = ArtifactRef("img2", "image/png", 80, "cd", 8, 8)
TOOLS = (
    ToolSpec("shell", "Run a command", '{"type":"object"}', ToolVisibility.DIRECT),
    ToolSpec("grep", "Search files", '{"type":"object"}', ToolVisibility.DEFERRED),
)
MANY_TOOLS = TOOLS + tuple(
    ToolSpec(f"mcp_t{i:03d}", "An MCP tool", '{"type":"object"}') for i in range(130)
)

words = st.sampled_from(["fix", "the", "bug", "in", "a.py", "", "ok"])
texts = st.lists(words, min_size=1, max_size=4).map(" ".join)
call_ids = st.sampled_from(["c1", "c2", "c3"])
arguments = st.sampled_from(
    ['{"path": "a.py"}', "{bad", "", '{"q": "grep"}', '{"query": "grep mcp_t129"}']
)
calls = st.builds(ToolCall, call_ids, st.sampled_from(["shell", "tool_search"]), arguments)
text_parts = texts.map(lambda t: ContentPart(text=t))
parts = st.one_of(text_parts, text_parts, text_parts, st.just(ContentPart(attachment=IMAGE)))
payloads: st.SearchStrategy[Payload] = st.one_of(
    st.lists(parts, max_size=2).map(lambda ps: UserMessage(tuple(ps))),
    st.lists(text_parts, min_size=1, max_size=2).map(lambda ps: UserMessage(tuple(ps))),
    st.builds(
        AssistantMessage,
        st.lists(parts, max_size=1).map(tuple),
        st.lists(calls, max_size=2).map(tuple),
        st.sampled_from(["", "thinking"]),
        st.sampled_from(
            [
                None,
                NativeState(ROUTES[0].route_id, "k", b"x"),
                NativeState("other", "k", b"y"),
                # Anthropic thinking blocks, replayed in their turn on their route.
                NativeState(ROUTES[0].route_id, THINKING, THOUGHT),
                NativeState(ROUTES[1].route_id, THINKING, THOUGHT),
                NativeState(ROUTES[0].route_id, SIGNATURES, b'{"c1": "CiQB"}'),
            ]
        ),
    ),
    calls,
    st.builds(
        ToolResult,
        call_ids,
        st.just("shell"),
        st.sampled_from(["done", "x" * 2100, None]),
        st.just(None),
        st.booleans(),
    ),
    st.builds(TurnCancelled, st.just(""), st.booleans()),
    st.just(Attachment(IMAGE)),
    st.just(BrowserSelection(BrowserElement("https://example.com", "#a", "p", "a.py"))),
    st.just(TurnStarted("t")),
    st.builds(
        ImportedMessage,
        st.just("elsewhere"),
        st.integers(1, 9),
        # Any role a client may import (a tool one is a result with no call id).
        st.sampled_from([Role.USER, Role.ASSISTANT, Role.TOOL, Role.SYSTEM]),
        st.lists(
            st.one_of(text_parts, st.just(ContentPart(attachment=IMPORTED_IMAGE))),
            min_size=1,
            max_size=2,
        ).map(tuple),
    ),
)


def _fix(p: Payload) -> Payload:
    # A result without text stands for one stored as a blob.
    if isinstance(p, ToolResult) and p.text is None:
        return ToolResult(p.call_id, p.tool_name, None, BlobRef("ff", 5000, "head"), p.is_error)
    return p


@dataclass(frozen=True)
class Step:
    new: list[Payload]
    route: int
    checkpoint: str  # "", "summary" or "builtin"
    covers: float
    restart: bool
    activate: bool
    # Usage is reported for this step's view: it is the next step's baseline.
    report: bool
    # A context window (0: unknown); the small ones put views over budget, which then
    # carry a compaction request (taken from the memo while its inputs hold).
    window: int = 0
    # projection.PROJECTION the compile projects with (0: a rebuild of a compile an
    # earlier daemon recorded, which sent no image of assistant or imported messages).
    projection: int = PROJECTION


steps = st.builds(
    Step,
    st.lists(payloads, max_size=6),
    st.integers(0, 2),
    st.sampled_from(["", "", "summary", "builtin"]),
    st.floats(0, 1),
    st.integers(0, 5).map(lambda n: n == 0),
    st.booleans(),
    st.booleans(),
    st.sampled_from([0, 0, 40, 60, 90, 140]),
    st.sampled_from([PROJECTION, PROJECTION, PROJECTION, 0]),
)
# Reserves small enough for the windows above to leave an input budget.
SMALL = BudgetConfig(first_reserve_max=8, dynamic_reserve_min=4, dynamic_reserve_max=8)


def inputs_for(
    log: list[Event], step: Step, n: int, route_state: RouteState | None = None
) -> CompileInputs:
    """What the loader hands the core: the log after a summary checkpoint (with the
    covered current user) or all of it."""
    ck = None
    events = tuple(log)
    current = None
    if step.checkpoint and log:
        through = max(1, int(step.covers * len(log)))
        kind = (
            CheckpointKind.BUILTIN if step.checkpoint == "builtin" else CheckpointKind.MODEL_SUMMARY
        )
        ck = Checkpoint(f"k{through}{kind}", "s", through, "so far", None, True, "", kind, 0)
        if kind is CheckpointKind.MODEL_SUMMARY:
            events = tuple(log[through:])
            if not any(starts_turn(e.payload) for e in events):
                current = next((e for e in reversed(log[:through]) if starts_turn(e.payload)), None)
    return CompileInputs(
        compile_id=f"s:{n}",
        session=SESSION,
        events=events,
        event_boundary=len(log),
        route=ROUTES[step.route],
        tools=MANY_TOOLS if ROUTES[step.route].protocol else TOOLS,
        activated_tools=("grep", "mcp_t128") if step.activate else (),
        checkpoint=ck,
        current_user=current,
        images=ImagePolicy(existing=(("img1", 100), ("img2", 80)), max_images=1),
        projection=step.projection,
        route_state=route_state,
        limits=ModelLimits(context_window=step.window),
        budget_config=SMALL if step.window else BudgetConfig(),
    )


def reported(view: CompiledView) -> RouteState:
    """The route state a usage report for `view` leaves (its baseline for the next step)."""
    b = view.basis
    assert b is not None
    return RouteState(
        route_id=view.route.route_id,
        baseline_input_tokens=view.budget.estimated_input_tokens + 7,
        baseline_compile_id=view.compile_id,
        last_output_tokens=10,
        update_time_ns=0,
        message_count=b.message_count,
        messages_digest=b.messages_digest,
        fixed_tokens=b.fixed_tokens,
        message_digests=b.message_digests,
        message_tokens=b.message_tokens,
    )


def wire(view: CompiledView) -> bytes:
    """The view as sent: messages from their cached encoded records."""
    return view_out(view).SerializeToString(deterministic=True)


def wire_object_by_object(view: CompiledView) -> bytes:
    """The same view with a protobuf object built for every message."""
    out = view_out(view)
    del out.messages[:]
    out.messages.extend(_message_out(m) for m in view.messages)
    return out.SerializeToString(deterministic=True)


def memo_is_what_scratch_finds(memo: ProjectionMemo | None) -> None:
    """What a memo carries over from the memo before (the artifacts its events name, where
    the working set starts, the current turn) is what a walk over all of it finds."""
    if memo is None:
        return
    assert memo.artifact_ids == tuple(dict.fromkeys(artifact_ids(memo.events)))
    # Every image its events show, whatever message holds it (R-IMG-1).
    shown = {
        ref.artifact_id
        for e in memo.events
        for ref in (
            [e.payload.ref]
            if isinstance(e.payload, Attachment)
            else [c.attachment for c in getattr(e.payload, "parts", ()) if c.attachment]
        )
    }
    assert set(memo.artifact_ids) == shown
    assert memo.turn == active_turn(memo.events)
    # The daemon looks for the images to inline only after the memo's messages.
    assert not any(p.attachment for m in memo.messages for p in m.parts)
    first_ws = (i for i, m in enumerate(memo.messages) if m.layer is Layer.WORKING_SET)
    assert memo.ws_index == next(first_ws, len(memo.messages))


def paths_are_what_scratch_finds(memo: ProjectionMemo | None, inputs: CompileInputs) -> None:
    """The path union a memo carries to the next step is the scan of every active text
    (the view alone does not show it: no rule here has globs)."""
    if memo is None:
        return
    assert memo.paths is not None
    texts, _ = active_texts(inputs, active_turn(inputs.events))
    expected: dict[str, None] = {}
    for text in texts:
        expected.update(dict.fromkeys(paths_in(text).paths))
    assert memo.paths.union.found.paths == tuple(expected)
    assert memo.paths.union.count == len(texts)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(steps, min_size=1, max_size=8))
def test_incremental_views_are_byte_identical_to_from_scratch(script: list[Step]) -> None:
    log: list[Event] = []
    memos: dict[int, ProjectionMemo | None] = {}
    baselines: dict[int, RouteState] = {}
    # What a stream's last view of each route lends the next one's encoding.
    lent: dict[int, LentRecords] = {}
    for n, step in enumerate(script):
        for p in step.new:
            log.append(Event(len(log) + 1, f"e{len(log) + 1}", n, _fix(p)))
        if step.restart:
            memos.clear()  # a daemon restart: memos live in memory only
        inputs = inputs_for(log, step, n, baselines.get(step.route))
        # The turn continued from the memo is the turn found in all the events.
        assert active_turn(inputs.events, memos.get(step.route)) == active_turn(inputs.events)
        view, memos[step.route], _ = compile_incremental(inputs, C, memos.get(step.route))
        memo_is_what_scratch_finds(memos[step.route])
        paths_are_what_scratch_finds(memos[step.route], inputs)
        scratch = compile_view(inputs, C)
        assert view.messages == scratch.messages
        assert view.notes == scratch.notes
        assert view == scratch
        assert wire(view) == wire(scratch) == wire_object_by_object(scratch)
        # What Compile and CompileStream send: the head parts and cached records joined,
        # alone and with the records, sections, notes and compaction of the route's last
        # view lent (as a stream lends them).
        assert view_bytes(CompileResult(view)).whole() == wire(scratch)
        parts = view_bytes(CompileResult(view), lent.get(step.route, LentRecords()))
        assert parts.whole() == wire(scratch) and parts.size == len(wire(scratch))
        lent[step.route] = LentRecords(view.messages, parts.messages, view, parts)
        rendered = CompileResult(view, renderings=((RenderFormat.OPENAI_CHAT, "{}", 7),))
        expected = result_out(rendered).SerializeToString(deterministic=True)
        assert view_bytes(rendered).whole() == expected
        if step.report:
            baselines[step.route] = reported(view)


def test_a_step_continues_from_the_memo_and_the_cut_follows_the_turns() -> None:
    said = AssistantMessage((ContentPart(text="reading"),), (ToolCall("c1", "shell", "{}"),))
    turn: list[Payload] = [
        UserMessage((ContentPart(text="fix it"),)),
        said,
        ToolResult("c1", "shell", "ok"),
    ]
    log = [Event(i + 1, f"e{i + 1}", 0, p) for i, p in enumerate(turn * 3)]
    step = Step([], 0, "", 0, False, False, False)
    view, memo, reused = compile_incremental(inputs_for(log, step, 0), C, None)
    # All of it: the log ends with the result of the only call made, so nothing that can
    # follow reaches back into it.
    assert not reused and memo is not None and memo.cut == 9
    assert memo.ws_index == 6  # the third turn is the working set
    log.append(Event(10, "e10", 0, UserMessage((ContentPart(text="next"),))))
    later, memo2, reused = compile_incremental(inputs_for(log, step, 1), C, memo)
    assert reused and memo2 is not None and memo2.cut == 10
    assert all(a is b for a, b in zip(later.messages[:6], view.messages[:6], strict=True))
    assert [m.layer.name for m in later.messages[6:]] == ["HISTORY"] * 3 + ["WORKING_SET"]
    assert later.messages[6] is memo2.messages[6]  # the memo's own objects, not copies


def test_a_memo_from_another_checkpoint_is_not_used() -> None:
    turn: list[Payload] = [UserMessage((ContentPart(text="go"),)), ToolCall("c1", "shell", "{}")]
    log = [Event(i + 1, f"e{i + 1}", 0, p) for i, p in enumerate(turn * 3)]
    _, memo, _ = compile_incremental(
        inputs_for(log, Step([], 0, "", 0, False, False, False), 0), C, None
    )
    with_ck = inputs_for(log, Step([], 0, "builtin", 0.5, False, False, False), 1)
    view, _, reused = compile_incremental(with_ck, C, memo)
    assert not reused
    assert view == compile_view(with_ck, C)


def test_a_result_while_calls_are_open_is_no_place_to_cut() -> None:
    # The result for c3 has no open call while c1 and c2 are open: its call is folded
    # back into the assistant message before it, so the memo must stop before that one.
    turn: list[Payload] = [
        UserMessage((ContentPart(text="go"),)),
        AssistantMessage((), (ToolCall("c1", "shell", "{}"), ToolCall("c2", "shell", "{}"))),
        ToolResult("c3", "shell", "late"),
    ]
    log = [Event(i + 1, f"e{i + 1}", 0, p) for i, p in enumerate(turn)]
    inputs = inputs_for(log, Step([], 0, "", 0, False, False, False), 0)
    view, memo, _ = compile_incremental(inputs, C, None)
    assert memo is not None and memo.cut == 1
    assert view == compile_view(inputs, C)
    assert [c.call_id for c in view.messages[1].tool_calls] == ["c1", "c2", "c3"]


def test_inline_images_are_encoded_as_a_protobuf_object_per_message_would_be() -> None:
    """A view with image bytes inline (a unary Compile of any size and a stream step send
    the joined records) is the view converted message by message, bytes included."""
    turn: list[Payload] = [
        UserMessage((ContentPart(text="look"), ContentPart(attachment=IMAGE))),
        AssistantMessage((ContentPart(text="a cat"),), ()),
        UserMessage((ContentPart(text="and this"),)),
    ]
    log = [Event(i + 1, f"e{i + 1}", 0, p) for i, p in enumerate(turn)]
    inputs = inputs_for(log, Step([], 0, "", 0, False, False, False), 0)
    view, _, _ = compile_incremental(inputs, C, None)
    assert any(p.attachment for m in view.messages for p in m.parts)
    result = CompileResult(view, (("img1", b"\x89PNG-bytes"),))
    expected = result_out(result).SerializeToString(deterministic=True)
    assert b"\x89PNG-bytes" in expected
    assert view_bytes(result).whole() == expected


def test_a_step_in_a_turn_of_tool_calls_projects_only_its_own_events(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each step of an agent's tool loop appends a call and its result. The log then ends
    clean (no call open, nothing after it can reach back), so the memo takes all of it:
    the next step projects its own two events in one segment, not the previous step's
    call and result again; the view is the scratch one."""
    log = [Event(1, "e1", 0, UserMessage((ContentPart(text="fix it"),)))]
    step = Step([], 0, "", 0, False, False, False)
    memo = None
    segments: list[int] = []
    real = incremental._segment

    def counted(*args: Any, **kwargs: Any) -> Any:
        segments.append(len(args[1]))
        return real(*args, **kwargs)

    monkeypatch.setattr(incremental, "_segment", counted)
    for k in range(2, 12, 2):
        call = ToolCall(f"c{k}", "shell", "{}")
        log.append(Event(k, f"e{k}", 0, AssistantMessage((ContentPart(text="run"),), (call,))))
        log.append(Event(k + 1, f"e{k + 1}", 0, ToolResult(f"c{k}", "shell", "ok")))
        inputs = inputs_for(log, step, k)
        segments.clear()
        view, memo, reused = compile_incremental(inputs, C, memo)
        if k > 2:
            assert reused and segments == [2], segments
        assert memo is not None and memo.cut == len(log)
        assert view == compile_view(inputs, C)


def test_a_tail_that_may_still_be_reached_back_into_is_cut_as_before() -> None:
    """The end of the log is no place to cut when a call is still open there (a result of
    one of two parallel calls) or when it is an assistant message (a call-only message
    next would join it): the memo stops at the clean cut, and the next step's view is
    still the scratch one."""
    user = UserMessage((ContentPart(text="go"),))
    both = AssistantMessage((), (ToolCall("c1", "shell", "{}"), ToolCall("c2", "shell", "{}")))
    step = Step([], 0, "", 0, False, False, False)
    cases: list[tuple[list[Payload], Payload, int]] = [
        # c2 is open after c1's result: the cut stays before the parallel calls.
        ([user, both, ToolResult("c1", "shell", "one")], ToolResult("c2", "shell", "two"), 1),
        # Text last: the next call-only message merges into it.
        (
            [user, AssistantMessage((ContentPart(text="thinking aloud"),), ())],
            ToolCall("c3", "shell", "{}"),
            1,
        ),
    ]
    for first, nxt, cut in cases:
        log = [Event(i + 1, f"e{i + 1}", 0, p) for i, p in enumerate(first)]
        _, memo, _ = compile_incremental(inputs_for(log, step, 0), C, None)
        assert memo is not None and memo.cut == cut, (first, memo and memo.cut)
        log.append(Event(len(log) + 1, f"e{len(log) + 1}", 0, nxt))
        inputs = inputs_for(log, step, 1)
        view, _, reused = compile_incremental(inputs, C, memo)
        assert reused and view == compile_view(inputs, C)


def test_a_message_imported_with_the_tool_role_is_a_result_to_the_cut() -> None:
    """A message imported with the tool role is projected as a result with no call id:
    pairing restores a call for it, folded into the assistant message whose calls are
    open. So it is no place to cut while a call is open (like a result of a call never
    made): the memo stops before that assistant message, and both compiles are the
    scratch one."""
    imported = ImportedMessage("elsewhere", 1, Role.TOOL, (ContentPart(text="x"),))
    turn: list[Payload] = [
        UserMessage((ContentPart(text="go"),)),
        AssistantMessage((ContentPart(text="run"),), (ToolCall("c1", "shell", "{}"),)),
        imported,
    ]
    log = [Event(i + 1, f"e{i + 1}", 0, p) for i, p in enumerate(turn)]
    step = Step([], 0, "", 0, False, False, False)
    inputs = inputs_for(log, step, 0)
    view, memo, _ = compile_incremental(inputs, C, None)
    assert view == compile_view(inputs, C)
    assert [c.call_id for c in view.messages[1].tool_calls] == ["c1", ""]
    assert memo is not None and memo.cut == 1
    log.append(Event(4, "e4", 0, UserMessage((ContentPart(text="more"),))))
    inputs = inputs_for(log, step, 1)
    later, _, reused = compile_incremental(inputs, C, memo)
    assert reused and later == compile_view(inputs, C)
