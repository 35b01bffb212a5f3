"""The provider-native state a view sends is the latest assistant message's, on its own
route (R-ROUTE-2): a step continuing a memo looks for a later assistant message only
among its new events and otherwise takes the memo's (ProjectionMemo.last_assistant).
Each view equals the one compiled from scratch."""

from __future__ import annotations

from dataclasses import replace

from server.compiler.compile import CompileInputs, compile_incremental, compile_view
from server.compiler.projection_memo import ProjectionMemo
from server.domain.model import (
    AssistantMessage,
    ContentPart,
    Event,
    NativeState,
    Payload,
    Route,
    Session,
    ToolCall,
    ToolResult,
    UserMessage,
)
from tests.unit.test_system_prompt import WordCounter

ROUTE = Route(model="gpt-4o")
OTHER = Route(connection="b", model="gpt-4o")


def _said(text: str, route: Route, calls: tuple[ToolCall, ...] = ()) -> AssistantMessage:
    state = NativeState(route.route_id, "opaque", text.encode())
    return AssistantMessage((ContentPart(text=text),), calls, "", state)


def test_native_state_follows_the_latest_assistant_message_across_steps() -> None:
    steps: list[list[Payload]] = [
        [UserMessage((ContentPart(text="start"),)), _said("one", ROUTE)],
        [UserMessage((ContentPart(text="no assistant message in this step"),))],
        [ToolResult("c0", "read", "orphan result")],  # still the memo's: "one"
        [_said("two", OTHER, (ToolCall("c1", "read", "{}"),))],  # another route: none
        [ToolResult("c1", "read", "done")],  # the memo's latest is "two": still none
        [_said("three", ROUTE)],
        [UserMessage((ContentPart(text="and again"),))],
    ]
    expected = [b"one", b"one", b"one", None, None, b"three", b"three"]
    counter = WordCounter()
    events: list[Event] = []
    inputs = CompileInputs("c", Session("s", 1, 1), (), 0, ROUTE)
    memo: ProjectionMemo | None = None
    for i, payloads in enumerate(steps):
        for p in payloads:
            events.append(Event(len(events) + 1, f"e{len(events) + 1}", 1, p))
        inputs = replace(inputs, events=tuple(events), event_boundary=len(events))
        view, memo, reused = compile_incremental(inputs, counter, memo)
        assert reused or i == 0
        assert view == replace(compile_view(inputs, counter), compile_id=view.compile_id), i
        state = view.provider_state
        assert (state.data if state is not None else None) == expected[i], i
