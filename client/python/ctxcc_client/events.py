"""Builders for the events an agent appends."""

from __future__ import annotations

from ctxcc.v1 import common_pb2, event_pb2


def user(text: str) -> event_pb2.Event:
    ev = event_pb2.Event()
    ev.user_message.parts.add(text=text)
    return ev


def assistant(
    text: str = "", tool_calls: list[tuple[str, str, str]] | None = None, reasoning: str = ""
) -> event_pb2.Event:
    """tool_calls: (call_id, name, arguments_json) triples."""
    ev = event_pb2.Event()
    if text:
        ev.assistant_message.parts.add(text=text)
    for call_id, name, args in tool_calls or []:
        ev.assistant_message.tool_calls.add(call_id=call_id, name=name, arguments_json=args)
    ev.assistant_message.reasoning = reasoning
    return ev


def tool_result(
    call_id: str, text: str, tool_name: str = "", is_error: bool = False
) -> event_pb2.Event:
    ev = event_pb2.Event()
    ev.tool_result.call_id = call_id
    ev.tool_result.tool_name = tool_name
    ev.tool_result.text = text
    ev.tool_result.is_error = is_error
    return ev


def user_with(text: str, *attachments: common_pb2.ArtifactRef) -> event_pb2.Event:
    """A user message with uploaded artifacts (e.g. images) after its text."""
    ev = user(text)
    for ref in attachments:
        ev.user_message.parts.add(attachment=ref)
    return ev
