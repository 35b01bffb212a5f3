"""What every provider API requires of a conversation, applied to the view itself so
that all formats send the same content and the estimate covers it.

- No message is empty: a step with nothing model-visible (reasoning only, not kept)
  leaves no message, which OpenAI Chat would refuse.
- The first turn is the user's: a view that would start with an assistant message
  opens with OPENER, the only text the compiler adds to a conversation on its own.
- A call's arguments are a JSON object. Text that is not one (truncated or malformed
  model output, or nested past textscan's depth limit) is sent, in every format, as
  {"invalid_arguments": "<the text>"}: valid for every API, and the model still sees
  what it wrote. The view says so in a note.
"""

from __future__ import annotations

import json

from server.compiler.textscan import MAX_JSON_DEPTH, loads_strict, parse_json
from server.compiler.view import Authority, ViewMessage, ViewPart
from server.domain.model import Role
from server.domain.replacing import replaced

OPENER = "(conversation continues)"
INVALID_ARGUMENTS_KEY = "invalid_arguments"


def _arguments_object(arguments_json: str) -> str | None:
    """None when the text is a JSON object (or empty: no arguments), else the object
    that carries it."""
    if not arguments_json:
        return None
    # JSON's own whitespace only: str.strip() also takes a form feed or an ideographic
    # space, which no JSON parser (nor the renderers, which read the text as it is) skips.
    text = arguments_json.strip(" \t\n\r")
    if not (text.startswith("{") and text.endswith("}")):
        ok, value = False, None
    elif text.count("{") + text.count("[") < MAX_JSON_DEPTH:
        # Too few brackets to nest past the limit: a plain parse decides (the hot path,
        # several times cheaper than the depth-checking reader).
        try:
            ok, value = True, loads_strict(text)
        except (ValueError, RecursionError):
            ok, value = False, None
    else:
        ok, value = parse_json(text)
    if ok and isinstance(value, dict):
        return None
    return json.dumps({INVALID_ARGUMENTS_KEY: arguments_json}, ensure_ascii=False)


def well_formed_calls(messages: list[ViewMessage], notes: list[str]) -> list[ViewMessage]:
    """Arguments that are not a JSON object (truncated or malformed model output) are
    sent, in every format, as {"invalid_arguments": "<the text>"}: valid for every API,
    and the model still sees what it wrote."""
    out = []
    for m in messages:
        fixed = [(c, _arguments_object(c.arguments_json)) for c in m.tool_calls]
        if all(f is None for _, f in fixed):
            out.append(m)
            continue
        calls = []
        for c, f in fixed:
            if f is None:
                calls.append(c)
                continue
            notes.append(
                f"call {c.call_id} ({c.name}): arguments are not a JSON object; "
                f'sent as {{"{INVALID_ARGUMENTS_KEY}": <the text>}}'
            )
            calls.append(replaced(c, arguments_json=f))
        out.append(replaced(m, tool_calls=tuple(calls)))
    return out


def non_empty(messages: list[ViewMessage]) -> list[ViewMessage]:
    return [m for m in messages if m.parts or m.tool_calls or m.role is Role.TOOL]


def opened(messages: list[ViewMessage]) -> list[ViewMessage]:
    if not messages or messages[0].role in (Role.USER, Role.SYSTEM):
        return messages
    opener = ViewMessage(
        Role.USER,
        (ViewPart(text=OPENER, authority=Authority.OPERATOR),),
        messages[0].layer,
        0,
        synthetic=True,
    )
    return [opener, *messages]
