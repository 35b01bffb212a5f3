"""Anthropic Messages bodies, shaped as the official SDK's `MessageCreateParamsNonStreaming`.

- Roles alternate strictly and the first turn is a user turn (the projection opens a
  view that would start otherwise); neighbours of one role merge, tool results travel
  in user turns, ahead of any text.
- Cache breakpoints (two of the four allowed): the last tool and the stable system
  block; the volatile environment follows in a block of its own. The view's
  `prefix_digest` covers both, so it changes whenever either cached prefix does.
- `tool_use.id` must match `^[a-zA-Z0-9_-]+$`: view call ids are mapped by
  `tool_use_id`, deterministically (same log, same ids, so prompt caches keep hitting)
  and reversibly (`call_id_of`). Call names as every API takes them (`call_name`).
- A tool result with no text (empty or whitespace) has no `content`: the API refuses an
  empty one ("content field is empty"), and a failed call's result must have some
  ("content cannot be empty if is_error is true"): EMPTY_ERROR says so.
- Whitespace-only text is dropped (the API refuses such blocks); a body that would then
  open with the assistant, or hold no message at all, opens with the view's own opener
  text, as the view does.
- A body ending with an assistant turn (a prefill) has no trailing whitespace at its
  end: the API refuses "final assistant content cannot end with trailing whitespace";
  nor does it end with a turn of thinking blocks alone (a reply whose only text was
  whitespace), from rendering 15: "The final block in an assistant message cannot be
  `thinking`". The end is the turn's as sent, its thinking blocks moved to its front
  (from rendering 16: a later message's thinking last before that left the text's
  whitespace in place).
- The current turn's assistant messages lead with the thinking blocks logged with them
  (`view.thinking`, domain/thinking.py), and an assistant turn merged from several
  messages starts with all of theirs: with thinking on, the API refuses a tool loop
  whose assistant turn does not start with its thinking.
"""

from __future__ import annotations

from collections.abc import Mapping

from server.compiler import renderings
from server.compiler.provider_rules import OPENER
from server.compiler.render_common import (
    ANTHROPIC_IMAGES,
    JSON,
    accepted_images,
    args_object,
    call_name,
    image_note,
    inline_image,
    output_cap,
    schema,
    stable_and_volatile,
    text_of,
)
from server.compiler.turn_thinking import of_kind
from server.compiler.view import CompiledView
from server.domain.model import Role
from server.domain.thinking import KIND, thinking_blocks

_THINKING = frozenset({"thinking", "redacted_thinking"})

_ALNUM = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
_ALLOWED = _ALNUM | {"_", "-"}
# Ids that are already valid pass unchanged, unless they start with this prefix: those,
# and all others, are spelled as the prefix, their alphanumerics, and `-hh` per other byte.
ENCODED_PREFIX = "cx_"
EMPTY_ERROR = "(the tool failed with no output)"


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


def opened_turns(turns: list[tuple[str, list[JSON]]], opener: JSON) -> list[tuple[str, list[JSON]]]:
    """Turns that open with the user's: a view opens so (provider_rules.opened), but a
    user message whose only text a format cannot send (whitespace for Anthropic) leaves
    the assistant first, which the APIs refuse."""
    if not turns or turns[0][0] == "user":
        return turns
    return [("user", [opener]), *turns]


def _without_trailing_whitespace(
    merged: list[tuple[str, list[JSON]]], past_thinking: bool = False
) -> None:
    """With `past_thinking`, the block that ends the turn once its thinking blocks are
    moved to its front (as a view with thinking sends them): the last other one."""
    blocks = merged[-1][1]
    last = len(blocks) - 1
    if past_thinking:
        others = [i for i, b in enumerate(blocks) if b["type"] not in _THINKING]
        last = others[-1] if others else last
    if blocks[last]["type"] != "text":
        return
    # The block holds non-whitespace text (_text_block), so it stays non-empty.
    blocks[last] = {**blocks[last], "text": blocks[last]["text"].rstrip()}


def _final_assistant_turn(merged: list[tuple[str, list[JSON]]], rendering: int) -> None:
    """A final assistant turn (a prefill) as the API takes it: without trailing
    whitespace, and, from rendering 15, left out when it holds thinking blocks alone ("The
    final block in an assistant message cannot be `thinking`": a reply whose text was
    whitespace, dropped, leaves only its thinking, which no prefill carries; the user's
    turn before it ends the body)."""
    blocks = merged[-1][1]
    if rendering >= renderings.TRAILING_THINKING and all(b["type"] in _THINKING for b in blocks):
        merged.pop()
    else:
        _without_trailing_whitespace(
            merged, past_thinking=rendering >= renderings.FINAL_TEXT_PAST_THINKING
        )


def _thinking_of(view: CompiledView, first_seq: int, last_seq: int) -> list[JSON]:
    """The logged thinking blocks of the events an assistant message holds, in order."""
    out: list[JSON] = []
    for blocks in of_kind(view.thinking, KIND, first_seq, last_seq):
        out += thinking_blocks(blocks) or ()
    return out


def anthropic_messages(view: CompiledView, data: Mapping[str, bytes]) -> JSON:
    images = accepted_images(view, ANTHROPIC_IMAGES)
    flat = view.rendering >= renderings.FLAT_SCHEMAS
    turns: list[tuple[str, list[JSON]]] = []
    for m in view.messages:
        if m.role is Role.TOOL:
            block: JSON = {"type": "tool_result", "tool_use_id": tool_use_id(m.tool_call_id)}
            text = text_of(m, view.rendering)
            if text.strip():
                block["content"] = text
            elif m.is_error:
                block["content"] = EMPTY_ERROR
            block["is_error"] = m.is_error
            turns.append(("user", [block]))
        elif m.role is Role.ASSISTANT:
            blocks = _thinking_of(view, m.first_seq, m.last_seq) if view.thinking else []
            blocks += _text_block(text_of(m, view.rendering))
            blocks += [
                {
                    "type": "tool_use",
                    "id": tool_use_id(c.call_id),
                    "name": call_name(c.name),
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
                elif (img := inline_image(p, data, images)) is not None:
                    blocks.append(
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": img[0], "data": img[1]},
                        }
                    )
                else:
                    blocks.append({"type": "text", "text": image_note(p, images)})
            turns.append(("user", blocks))
    merged = opened_turns(merge_turns(turns), {"type": "text", "text": OPENER})
    if not merged and (view.messages or view.rendering >= renderings.EMPTY_VIEWS):
        # Every message was whitespace-only text, or there is none yet: a body needs one.
        merged = [("user", [{"type": "text", "text": OPENER}])]
    if merged and merged[-1][0] == "assistant":
        _final_assistant_turn(merged, view.rendering)
    for role, blocks in merged:
        if role == "user":
            # Tool results lead their user turn; text (a next user message) follows.
            blocks.sort(key=lambda b: b["type"] != "tool_result")
        elif view.thinking:
            blocks.sort(key=lambda b: b["type"] not in _THINKING)
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
                "input_schema": schema(
                    t.spec.input_schema_json,
                    flat=flat,
                    top_ref=view.rendering >= renderings.TOP_LEVEL_REFS,
                    ref_objects=view.rendering >= renderings.REF_OBJECTS,
                ),
            }
            for t in view.tools
        ]
        tools[-1]["cache_control"] = {"type": "ephemeral"}
        body["tools"] = tools
    return body
