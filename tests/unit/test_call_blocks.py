"""The call block a checkpoint's boundary splits (checkpoints.split_block, answered_after):
what the loader reads back so that a result right after the boundary finds its call as
logged (projection 13). Held to pairing itself: the calls split_block finds open at a
boundary are exactly those pairing has open there, and a view that starts at the block
restores no call for a result of one of them."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from server.compiler.checkpoints import CallBlock, answered_after, split_block
from server.compiler.pairing import PairState, _Pass, pair_tool_messages
from server.compiler.projection import _merge_calls, _message
from server.compiler.provider_rules import non_empty
from server.domain.model import (
    ArtifactRef,
    AssistantMessage,
    Attachment,
    ContentPart,
    Event,
    NativeState,
    Payload,
    Role,
    ToolCall,
    ToolResult,
    TurnCancelled,
    TurnCompleted,
    TurnStarted,
    UserMessage,
)


def _log(*payloads: Payload) -> list[Event]:
    return [Event(i, f"e{i}", i, p) for i, p in enumerate(payloads, 1)]


def _said(text: str = "", *calls: str) -> AssistantMessage:
    parts = (ContentPart(text=text),) if text else ()
    return AssistantMessage(parts, tuple(ToolCall(c, "read", f'{{"path": "{c}"}}') for c in calls))


USER = UserMessage((ContentPart(text="go"),))
PICTURE = Attachment(ArtifactRef("art", "image/png", 10, "0" * 64, 1, 1))


def test_a_boundary_after_one_of_two_parallel_results_splits_their_block() -> None:
    log = _log(USER, _said("reading both", "a", "b"), ToolResult("a", "read", "1"))
    assert split_block(log, whole=True) == (True, CallBlock(2, frozenset({"b"})))
    # Read from the middle, the block's start is in view: decided all the same.
    assert split_block(log[1:], whole=False) == (True, CallBlock(2, frozenset({"b"})))
    # Only the results: where the block starts is not known yet.
    assert split_block(log[2:], whole=False) == (False, None)
    # Nor is it when the calls come alone: they join an assistant message before them.
    alone = _log(USER, _said("", "a", "b"), ToolResult("a", "read", "1"))
    assert split_block(alone[1:], whole=False) == (False, None)
    assert split_block(alone, whole=True) == (True, CallBlock(2, frozenset({"b"})))


def test_calls_logged_on_their_own_join_the_message_before_them() -> None:
    log = _log(USER, _said("reading"), ToolCall("a", "read", "{}"), ToolCall("b", "read", "{}"))
    assert split_block(log, whole=True) == (True, CallBlock(2, frozenset({"a", "b"})))
    # After a user message they make a block of their own, from the first of them.
    alone = _log(USER, ToolCall("a", "read", "{}"), ToolCall("b", "read", "{}"))
    assert split_block(alone, whole=True) == (True, CallBlock(2, frozenset({"a", "b"})))
    # A call logged after a result begins its block there.
    after = _log(USER, _said("", "a"), ToolResult("a", "read", "1"), ToolCall("b", "read", "{}"))
    assert split_block(after, whole=True) == (True, CallBlock(4, frozenset({"b"})))


def test_no_block_is_split_when_every_call_is_answered_or_a_user_spoke() -> None:
    answered = _log(USER, _said("", "a"), ToolResult("a", "read", "1"), TurnCompleted())
    assert split_block(answered, whole=True) == (True, None)
    assert split_block(_log(_said("", "a"), USER), whole=True) == (True, None)
    assert split_block(_log(_said("no calls")), whole=True) == (True, None)


def test_attachments_markers_and_reasoning_alone_stay_inside_a_block() -> None:
    thought = AssistantMessage(native_state=NativeState("r", "anthropic.thinking", b"[]"))
    log = _log(USER, _said("", "a", "b"), PICTURE, TurnCancelled(), thought, TurnStarted())
    assert split_block(log, whole=True) == (True, CallBlock(2, frozenset({"a", "b"})))


def test_the_block_is_shown_only_when_a_result_of_it_comes_first() -> None:
    block = CallBlock(2, frozenset({"b"}))
    assert answered_after(_log(ToolResult("b", "read", "2")), block) == (True, 1)
    # A result restored for another call, an attachment or a marker first: still decided
    # by what comes after them.
    later = _log(
        ToolResult("z", "read", ""), PICTURE, TurnStarted(), TurnCompleted(), ToolResult("b")
    )
    assert answered_after(later, block) == (True, 5)
    # Another message first closes the calls: the view after the boundary is as it was.
    assert answered_after(_log(USER, ToolResult("b", "read")), block) == (True, None)
    assert answered_after(_log(_said("", "c")), block) == (True, None)
    # Nothing that tells yet: asked again when the log has grown.
    assert answered_after(_log(TurnCompleted()), block) == (False, None)
    assert answered_after([], block) == (False, None)


# Random logs of a tool-using agent; every call id is used once.
steps = st.lists(
    st.sampled_from(["user", "say", "calls", "call", "result", "picture", "marker", "turn"]),
    min_size=1,
    max_size=24,
)


def _random_log(kinds: Sequence[str], data: st.DataObject) -> list[Event]:
    payloads: list[Payload] = []
    made: list[str] = []
    for kind in kinds:
        if kind == "user":
            payloads.append(USER)
        elif kind == "say":
            payloads.append(_said("thinking aloud"))
        elif kind in ("calls", "call"):
            n = data.draw(st.integers(1, 3)) if kind == "calls" else 1
            ids = [f"c{len(made) + i}" for i in range(n)]
            made += ids
            payloads.append(_said("", *ids) if kind == "calls" else ToolCall(ids[0], "read", "{}"))
        elif kind == "result" and made:
            payloads.append(ToolResult(data.draw(st.sampled_from(made)), "read", "ok"))
        elif kind == "picture":
            payloads.append(PICTURE)
        elif kind == "marker":
            payloads.append(TurnCompleted())
        elif kind == "turn":
            payloads.append(TurnStarted())
    return _log(*payloads)


def _paired(events: Sequence[Event], *, final: bool = False) -> tuple[frozenset[str], list[str]]:
    """The calls pairing has open after `events` (as the projection pairs them, from
    projection 8), and its notes; `final` closes them."""
    raw = [m for e in events if (m := _message(e, False)) is not None]
    notes: list[str] = []
    pictures = frozenset(e.seq for e in events if isinstance(e.payload, Attachment))
    if final:
        pair_tool_messages(non_empty(_merge_calls(raw)), notes, deferred=pictures)
        return frozenset(), notes
    # pair_tool_messages' own loop: a run that is not final may not end with an image
    # waiting for results, which says nothing of the calls open.
    run = _Pass(notes, PairState(), True)
    for m in non_empty(_merge_calls(raw)):
        if m.role is Role.TOOL:
            run.result(m)
        elif run.open_calls and m.first_seq in pictures:
            run.waiting.append(m)
        else:
            run.message(m)
    return frozenset(orig for orig, _ in run.open_calls), notes


@settings(max_examples=400, deadline=None)
@given(steps, st.data())
def test_the_open_calls_found_are_those_pairing_has_open(
    kinds: list[str], data: st.DataObject
) -> None:
    events = _random_log(kinds, data)
    for n in range(1, len(events) + 1):
        covered = events[:n]
        decided, block = split_block(covered, whole=True)
        assert decided
        open_now, _ = _paired(covered)
        assert (block.open_ids if block else frozenset()) == open_now
        if block is None:
            continue
        # Read from the block's start, a result of an open call right after the boundary
        # finds its call in view (it is not restored from the result alone).
        shown = [e for e in events[:n] if e.seq >= block.start]
        answered = sorted(block.open_ids)[0]
        answer = Event(n + 1, "r", 0, ToolResult(answered, "read", "ok"))
        assert answered_after([answer], block) == (True, n + 1)
        _, notes = _paired([*shown, answer], final=True)
        assert f"restored a call for result {answered}: its call is not in the view" not in notes
        # Started after the boundary instead, the view restored it from its result alone.
        _, before = _paired([answer], final=True)
        assert f"restored a call for result {answered}: its call is not in the view" in before
