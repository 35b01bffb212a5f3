"""Anthropic Messages bodies, shaped as the official SDK's `MessageCreateParamsNonStreaming`.

- Roles alternate strictly and the first turn is a user turn (the projection opens a
  view that would start otherwise); neighbours of one role merge, tool results travel
  in user turns, ahead of any text.
- Cache breakpoints (two of the four allowed): the last tool and the stable system
  block; the volatile environment follows in a block of its own. The view's
  `prefix_digest` covers both, so it changes whenever either cached prefix does.
- `tool_use.id` must match `^[a-zA-Z0-9_-]+$`: view call ids are mapped by
  `tool_use_id`, deterministically (same log, same ids, so prompt caches keep hitting)
  and reversibly (`call_id_of`).
"""

from __future__ import annotations

from collections.abc import Mapping

from server.compiler.render0.common import (
    JSON,
    args_object,
    image_note,
    inline_image,
    output_cap,
    schema,
    stable_and_volatile,
    text_of,
)
from server.compiler.view import CompiledView
from server.domain.model import Role

_ALNUM = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
_ALLOWED = _ALNUM | {"_", "-"}
# Ids that are already valid pass unchanged, unless they start with this prefix: those,
# and all others, are spelled as the prefix, their alphanumerics, and `-hh` per other byte.
ENCODED_PREFIX = "cx_"


def tool_use_id(call_id: str) -> str:
    if call_id and set(call_id) <= _ALLOWED and not call_id.startswith(ENCODED_PREFIX):
        return call_id
    out = [ENCODED_PREFIX]
    for byte in call_id.encode():
        ch = chr(byte)
        out.append(ch if ch in _ALNUM else f"-{byte:02x}")
    return "".join(out)


def call_id_of(tool_use_id_: str) -> str:
    """The view's call id behind a `tool_use.id` (inverse of tool_use_id)."""
    if not tool_use_id_.startswith(ENCODED_PREFIX):
        return tool_use_id_
    raw = bytearray()
    s, i = tool_use_id_[len(ENCODED_PREFIX) :], 0
    while i < len(s):
        if s[i] == "-":
            raw.append(int(s[i + 1 : i + 3], 16))
            i += 3
        else:
            raw.append(ord(s[i]))
            i += 1
    return raw.decode()


def merge_turns(turns: list[tuple[str, list[JSON]]]) -> list[tuple[str, list[JSON]]]:
    merged: list[tuple[str, list[JSON]]] = []
    for role, blocks in turns:
        if merged and merged[-1][0] == role:
            merged[-1][1].extend(blocks)
        elif blocks:
            merged.append((role, list(blocks)))
    return merged


def _text_block(text: str) -> list[JSON]:
    # The API refuses empty or whitespace-only text blocks.
    return [{"type": "text", "text": text}] if text.strip() else []


def anthropic_messages(view: CompiledView, data: Mapping[str, bytes]) -> JSON:
    turns: list[tuple[str, list[JSON]]] = []
    for m in view.messages:
        if m.role is Role.TOOL:
            block: JSON = {
                "type": "tool_result",
                "tool_use_id": tool_use_id(m.tool_call_id),
                "content": text_of(m),
                "is_error": m.is_error,
            }
            turns.append(("user", [block]))
        elif m.role is Role.ASSISTANT:
            blocks = _text_block(text_of(m))
            blocks += [
                {
                    "type": "tool_use",
                    "id": tool_use_id(c.call_id),
                    "name": c.name,
                    "input": args_object(c.arguments_json),
                }
                for c in m.tool_calls
            ]
            turns.append(("assistant", blocks))
        else:
            blocks = []
            for p in m.parts:
                if p.text is not None:
                    blocks += _text_block(p.text)
                elif (img := inline_image(p, data)) is not None:
                    blocks.append(
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": img[0], "data": img[1]},
                        }
                    )
                else:
                    blocks.append({"type": "text", "text": image_note(p)})
            turns.append(("user", blocks))
    merged = merge_turns(turns)
    for role, blocks in merged:
        if role == "user":
            # Tool results lead their user turn; text (a next user message) follows.
            blocks.sort(key=lambda b: b["type"] != "tool_result")
    body: JSON = {
        "model": view.route.model,
        "max_tokens": output_cap(view),
        "messages": [{"role": r, "content": b} for r, b in merged],
    }
    stable, volatile = stable_and_volatile(view)
    system: list[JSON] = []
    if stable:
        system.append({"type": "text", "text": stable, "cache_control": {"type": "ephemeral"}})
    if volatile:
        system.append({"type": "text", "text": volatile})
    if system:
        body["system"] = system
    if view.tools:
        tools = [
            {
                "name": t.spec.name,
                "description": t.spec.description,
                "input_schema": schema(t.spec.input_schema_json),
            }
            for t in view.tools
        ]
        tools[-1]["cache_control"] = {"type": "ephemeral"}
        body["tools"] = tools
    return body
