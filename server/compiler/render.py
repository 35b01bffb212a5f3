"""Provider request bodies from a compiled view: OpenAI Chat Completions, OpenAI
Responses, Anthropic Messages and Gemini generateContent.

Rules this module keeps:
- the body carries exactly the view: same system text, messages, tools and images;
- provider cache hints sit at the end of the stable prefix: Anthropic `cache_control`
  on the last tool and on the stable system block (the volatile environment follows in
  a block of its own); OpenAI `prompt_cache_key` from the prefix digest;
- provider rules are met without changing content: Anthropic and Gemini need strictly
  alternating roles, so neighbours of one role merge, and tool results travel in user
  turns; OpenAI wants tool results right after the calling message (the view's pairing
  invariant guarantees it).
"""

from __future__ import annotations

import base64
import enum
import json
from collections.abc import Mapping
from typing import Any

from server.compiler.textscan import parse_json
from server.compiler.view import CompiledView, ViewMessage, ViewPart
from server.domain.model import Role

JSON = dict[str, Any]
# Anthropic requires the first message to be a user turn; when a view starts otherwise
# (a checkpoint summary aside, rare) this is the only text a renderer adds.
OPENER = "(conversation continues)"


class RenderFormat(enum.IntEnum):
    OPENAI_CHAT = 1
    OPENAI_RESPONSES = 2
    ANTHROPIC_MESSAGES = 3
    GEMINI = 4


def _args(arguments_json: str) -> JSON:
    ok, value = parse_json(arguments_json or "{}")
    if not ok:
        return {}
    return value if isinstance(value, dict) else {"value": value}


def _schema(text: str) -> JSON:
    ok, value = parse_json(text or "{}")
    return (
        value if ok and isinstance(value, dict) and value else {"type": "object", "properties": {}}
    )


def _text(m: ViewMessage) -> str:
    return "\n".join(p.text for p in m.parts if p.text is not None)


def _b64(part: ViewPart, data: Mapping[str, bytes]) -> tuple[str, str] | None:
    ref = part.attachment
    if ref is None or ref.artifact_id not in data:
        return None
    return ref.mime_type, base64.b64encode(data[ref.artifact_id]).decode()


def _image_note(part: ViewPart) -> str:
    ref = part.attachment
    assert ref is not None
    return f"[image {ref.artifact_id} ({ref.mime_type}) sent by reference only]"


def _stable_and_volatile(view: CompiledView) -> tuple[str, str]:
    stable = "\n\n".join(s.text for s in view.system_sections if s.stable)
    volatile = "\n\n".join(s.text for s in view.system_sections if not s.stable)
    return stable, volatile


def _cache_key(view: CompiledView) -> str:
    return f"ctxcc-{view.prefix_digest[:32]}"


# -- OpenAI Chat Completions ---------------------------------------------------------


def openai_chat(view: CompiledView, data: Mapping[str, bytes]) -> JSON:
    messages: list[JSON] = []
    if view.system_prompt:
        messages.append({"role": "system", "content": view.system_prompt})
    for m in view.messages:
        if m.role is Role.TOOL:
            messages.append({"role": "tool", "tool_call_id": m.tool_call_id, "content": _text(m)})
            continue
        if m.role is Role.ASSISTANT:
            msg: JSON = {"role": "assistant", "content": _text(m) or None}
            if m.tool_calls:
                msg["tool_calls"] = [
                    {
                        "id": c.call_id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": c.arguments_json or "{}"},
                    }
                    for c in m.tool_calls
                ]
            messages.append(msg)
            continue
        role = "system" if m.role is Role.SYSTEM else "user"
        parts: list[JSON] = []
        for p in m.parts:
            if p.text is not None:
                parts.append({"type": "text", "text": p.text})
            elif (img := _b64(p, data)) is not None and role == "user":
                parts.append(
                    {"type": "image_url", "image_url": {"url": f"data:{img[0]};base64,{img[1]}"}}
                )
            else:
                parts.append({"type": "text", "text": _image_note(p)})
        only_text = all(p["type"] == "text" for p in parts)
        content: Any = "\n".join(p["text"] for p in parts) if only_text else parts
        messages.append({"role": role, "content": content})
    body: JSON = {
        "model": view.route.model,
        "messages": messages,
        "max_completion_tokens": view.budget.output_reserve,
        "prompt_cache_key": _cache_key(view),
    }
    if view.tools:
        body["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": t.spec.name,
                    "description": t.spec.description,
                    "parameters": _schema(t.spec.input_schema_json),
                },
            }
            for t in view.tools
        ]
    return body


# -- OpenAI Responses ------------------------------------------------------------------


def openai_responses(view: CompiledView, data: Mapping[str, bytes]) -> JSON:
    items: list[JSON] = []
    for m in view.messages:
        if m.role is Role.TOOL:
            items.append(
                {"type": "function_call_output", "call_id": m.tool_call_id, "output": _text(m)}
            )
            continue
        if m.role is Role.ASSISTANT:
            if _text(m):
                items.append(
                    {
                        "type": "message",
                        "role": "assistant",
                        "content": [{"type": "output_text", "text": _text(m)}],
                    }
                )
            items += [
                {
                    "type": "function_call",
                    "call_id": c.call_id,
                    "name": c.name,
                    "arguments": c.arguments_json or "{}",
                }
                for c in m.tool_calls
            ]
            continue
        content: list[JSON] = []
        for p in m.parts:
            if p.text is not None:
                content.append({"type": "input_text", "text": p.text})
            elif (img := _b64(p, data)) is not None:
                content.append(
                    {"type": "input_image", "image_url": f"data:{img[0]};base64,{img[1]}"}
                )
            else:
                content.append({"type": "input_text", "text": _image_note(p)})
        role = "developer" if m.role is Role.SYSTEM else "user"
        items.append({"type": "message", "role": role, "content": content})
    body: JSON = {
        "model": view.route.model,
        "input": items,
        "max_output_tokens": view.budget.output_reserve,
        "prompt_cache_key": _cache_key(view),
        "store": False,
    }
    if view.system_prompt:
        body["instructions"] = view.system_prompt
    if view.tools:
        body["tools"] = [
            {
                "type": "function",
                "name": t.spec.name,
                "description": t.spec.description,
                "parameters": _schema(t.spec.input_schema_json),
            }
            for t in view.tools
        ]
    return body


# -- Anthropic Messages ----------------------------------------------------------------


def _merge_turns(turns: list[tuple[str, list[JSON]]]) -> list[tuple[str, list[JSON]]]:
    merged: list[tuple[str, list[JSON]]] = []
    for role, blocks in turns:
        if merged and merged[-1][0] == role:
            merged[-1][1].extend(blocks)
        elif blocks:
            merged.append((role, list(blocks)))
    return merged


def anthropic_messages(view: CompiledView, data: Mapping[str, bytes]) -> JSON:
    turns: list[tuple[str, list[JSON]]] = []
    for m in view.messages:
        if m.role is Role.TOOL:
            turns.append(
                (
                    "user",
                    [
                        {
                            "type": "tool_result",
                            "tool_use_id": m.tool_call_id,
                            "content": _text(m),
                            "is_error": m.is_error,
                        }
                    ],
                )
            )
        elif m.role is Role.ASSISTANT:
            blocks: list[JSON] = [{"type": "text", "text": _text(m)}] if _text(m) else []
            blocks += [
                {
                    "type": "tool_use",
                    "id": c.call_id,
                    "name": c.name,
                    "input": _args(c.arguments_json),
                }
                for c in m.tool_calls
            ]
            turns.append(("assistant", blocks))
        else:
            blocks = []
            for p in m.parts:
                if p.text is not None:
                    blocks.append({"type": "text", "text": p.text})
                elif (img := _b64(p, data)) is not None:
                    blocks.append(
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": img[0], "data": img[1]},
                        }
                    )
                else:
                    blocks.append({"type": "text", "text": _image_note(p)})
            turns.append(("user", blocks))
    merged = _merge_turns(turns)
    if not merged or merged[0][0] != "user":
        merged.insert(0, ("user", [{"type": "text", "text": OPENER}]))
    body: JSON = {
        "model": view.route.model,
        "max_tokens": view.budget.output_reserve,
        "messages": [{"role": r, "content": b} for r, b in merged],
    }
    stable, volatile = _stable_and_volatile(view)
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
                "input_schema": _schema(t.spec.input_schema_json),
            }
            for t in view.tools
        ]
        tools[-1]["cache_control"] = {"type": "ephemeral"}
        body["tools"] = tools
    return body


# -- Gemini generateContent ---------------------------------------------------------


def gemini(view: CompiledView, data: Mapping[str, bytes]) -> JSON:
    names = {c.call_id: c.name for m in view.messages for c in m.tool_calls}
    turns: list[tuple[str, list[JSON]]] = []
    for m in view.messages:
        if m.role is Role.TOOL:
            turns.append(
                (
                    "user",
                    [
                        {
                            "functionResponse": {
                                "name": names.get(m.tool_call_id, m.tool_name or "tool"),
                                "response": {"content": _text(m), "is_error": m.is_error},
                            }
                        }
                    ],
                )
            )
        elif m.role is Role.ASSISTANT:
            parts: list[JSON] = [{"text": _text(m)}] if _text(m) else []
            parts += [
                {"functionCall": {"name": c.name, "args": _args(c.arguments_json)}}
                for c in m.tool_calls
            ]
            turns.append(("model", parts))
        else:
            parts = []
            for p in m.parts:
                if p.text is not None:
                    parts.append({"text": p.text})
                elif (img := _b64(p, data)) is not None:
                    parts.append({"inlineData": {"mimeType": img[0], "data": img[1]}})
                else:
                    parts.append({"text": _image_note(p)})
            turns.append(("user", parts))
    body: JSON = {
        "contents": [{"role": r, "parts": p} for r, p in _merge_turns(turns)],
        "generationConfig": {"maxOutputTokens": view.budget.output_reserve},
    }
    if view.system_prompt:
        body["systemInstruction"] = {"parts": [{"text": view.system_prompt}]}
    if view.tools:
        body["tools"] = [
            {
                "functionDeclarations": [
                    {
                        "name": t.spec.name,
                        "description": t.spec.description,
                        "parameters": _schema(t.spec.input_schema_json),
                    }
                    for t in view.tools
                ]
            }
        ]
    return body


RENDERERS = {
    RenderFormat.OPENAI_CHAT: openai_chat,
    RenderFormat.OPENAI_RESPONSES: openai_responses,
    RenderFormat.ANTHROPIC_MESSAGES: anthropic_messages,
    RenderFormat.GEMINI: gemini,
}


def render(
    view: CompiledView, fmt: RenderFormat, data: Mapping[str, bytes] | None = None
) -> tuple[str, str]:
    """The body as compact JSON text, and any text the renderer added to the view's
    content (so the estimate can cover exactly what is sent)."""
    body = RENDERERS[fmt](view, data or {})
    added = ""
    if fmt is RenderFormat.ANTHROPIC_MESSAGES:
        first = body["messages"][0]["content"][0]
        added = OPENER if first.get("text") == OPENER else ""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")), added
