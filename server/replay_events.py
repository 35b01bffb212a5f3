"""Trace messages as ctxcc events, for `ctxcc replay`.

Traces flatten tool calls and results into text with markers — `[tool_use name=X id=Y]`
or `[tool_call name=X id=Y]` followed by the arguments' JSON in an assistant message,
`[tool_result id=Y name=X]` (`is_error=true` after the id for a failed call) followed by
the result in a user or tool message. The
replay turns them back into what an agent appends: assistant messages with their tool
calls, and tool results, so that the daemon counts them as it counts real traffic
(tool-call arguments as the provider sees them, results with their own framing).
Text a marker does not explain stays a message of its own. A result over the daemon's
default blob threshold stays text too: as a tool result the daemon would store it and
show the model a preview, while the trace's provider read it whole.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ctxcc.v1 import common_pb2, event_pb2, tool_pb2

_CALL = re.compile(r"\[tool_(?:use|call) name=(\S+) id=(\S+)\]\n")
_RESULT = re.compile(r"\[tool_result id=([^\s\]]+)(?: name=([^\s\]]+))?( is_error=true)?\]\n?")
# The daemon's default --blob-threshold-bytes.
INLINE_RESULT_BYTES = 16 << 10


def _text_event(role: Any, text: str) -> event_pb2.Event:
    ev = event_pb2.Event()
    if role == "assistant":
        ev.assistant_message.parts.add(text=text)
    elif role == "system":
        ev.imported_message.origin_session_id = "trace"
        ev.imported_message.role = event_pb2.MESSAGE_ROLE_SYSTEM
        ev.imported_message.parts.add(text=text)
    else:
        ev.user_message.parts.add(text=text)
    return ev


def _assistant(text: str) -> list[event_pb2.Event]:
    ev = event_pb2.Event()
    msg = ev.assistant_message
    pos = 0
    decoder = json.JSONDecoder()
    for m in _CALL.finditer(text):
        if m.start() < pos:
            continue  # inside the arguments of the previous call
        try:
            args, end = decoder.raw_decode(text, m.end())
        except ValueError:
            continue  # not followed by JSON: leave the marker as text
        if not isinstance(args, dict):
            continue
        if before := text[pos : m.start()].strip():
            msg.parts.add(text=before)
        msg.tool_calls.append(
            common_pb2.ToolCall(
                call_id=m.group(2), name=m.group(1), arguments_json=json.dumps(args)
            )
        )
        pos = end
    if rest := text[pos:].strip():
        msg.parts.add(text=rest)
    return [ev] if msg.parts or msg.tool_calls else []


def _results(role: Any, text: str) -> list[event_pb2.Event]:
    marks = list(_RESULT.finditer(text))
    if not marks:
        return [_text_event(role, text)]
    if any(len(r.encode()) > INLINE_RESULT_BYTES for r in _split(text, marks)):
        return [_text_event(role, text)]
    out = []
    if before := text[: marks[0].start()].strip():
        out.append(_text_event(role, before))
    for m, result in zip(marks, _split(text, marks), strict=True):
        ev = event_pb2.Event()
        ev.tool_result.call_id = m.group(1)
        ev.tool_result.tool_name = m.group(2) or ""
        ev.tool_result.text = result
        ev.tool_result.is_error = m.group(3) is not None
        out.append(ev)
    return out


def _split(text: str, marks: list[re.Match[str]]) -> list[str]:
    """Each marker's result: the text up to the next marker."""
    ends = [m.start() for m in marks[1:]] + [len(text)]
    return [text[m.end() : end].rstrip("\n") for m, end in zip(marks, ends, strict=True)]


def events_of(message: dict[str, Any]) -> list[event_pb2.Event]:
    text = message.get("content") or ""
    if not isinstance(text, str):
        text = json.dumps(text)
    if not text:
        return []
    role = message.get("role")
    if role == "assistant":
        return _assistant(text)
    if role == "system":
        return [_text_event(role, text)]
    return _results(role, text)


def tools_of(raw: Any) -> list[tool_pb2.ToolDefinition]:
    out = []
    for t in raw or []:
        fn = t.get("function", t) if isinstance(t, dict) else {}
        name = fn.get("name")
        if not isinstance(name, str):
            continue
        schema = fn.get("parameters", fn.get("input_schema", {}))
        out.append(
            tool_pb2.ToolDefinition(
                name=name,
                description=str(fn.get("description", "")),
                input_schema_json=json.dumps(schema),
            )
        )
    return out
