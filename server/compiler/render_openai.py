"""OpenAI Chat Completions and Responses bodies, shaped as the official SDKs' request
params (`CompletionCreateParamsNonStreaming`, `ResponseCreateParamsNonStreaming`).

- Call names as every API takes them (`render_common.call_name`).
- Chat refuses a `tool_calls[].id` over 40 characters (`string_above_max_length`): a
  longer id (a Responses `fc_...` item id is 53) is sent as its first 27 characters,
  `_` and 12 hex digits of its sha256, the same in the call and its result.
- An assistant message with neither text nor calls (a step whose only text was empty)
  is left out of Chat, which refuses one; Responses sends no item for it anyway.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from server.compiler.render_common import (
    FLAT_SINCE,
    JSON,
    OPENAI_IMAGES,
    args_text,
    cache_key,
    call_name,
    image_note,
    inline_image,
    output_cap,
    schema,
    text_of,
)
from server.compiler.view import CompiledView
from server.domain.model import Role

MAX_CHAT_CALL_ID = 40


def chat_call_id(call_id: str) -> str:
    if len(call_id) <= MAX_CHAT_CALL_ID:
        return call_id
    return f"{call_id[:27]}_{hashlib.sha256(call_id.encode()).hexdigest()[:12]}"


def openai_chat(view: CompiledView, data: Mapping[str, bytes]) -> JSON:
    messages: list[JSON] = []
    if view.system_prompt:
        messages.append({"role": "system", "content": view.system_prompt})
    for m in view.messages:
        if m.role is Role.TOOL:
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": chat_call_id(m.tool_call_id),
                    "content": text_of(m),
                }
            )
            continue
        if m.role is Role.ASSISTANT:
            if not text_of(m) and not m.tool_calls:
                continue
            msg: JSON = {"role": "assistant", "content": text_of(m) or None}
            if m.tool_calls:
                msg["tool_calls"] = [
                    {
                        "id": chat_call_id(c.call_id),
                        "type": "function",
                        "function": {
                            "name": call_name(c.name),
                            "arguments": args_text(c.arguments_json),
                        },
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
            elif (img := inline_image(p, data, OPENAI_IMAGES)) is not None and role == "user":
                parts.append(
                    {"type": "image_url", "image_url": {"url": f"data:{img[0]};base64,{img[1]}"}}
                )
            else:
                parts.append({"type": "text", "text": image_note(p, OPENAI_IMAGES)})
        only_text = all(p["type"] == "text" for p in parts)
        content: Any = "\n".join(p["text"] for p in parts) if only_text else parts
        messages.append({"role": role, "content": content})
    body: JSON = {
        "model": view.route.model,
        "messages": messages,
        "max_completion_tokens": output_cap(view),
        "prompt_cache_key": cache_key(view),
    }
    if view.tools:
        body["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": t.spec.name,
                    "description": t.spec.description,
                    "parameters": schema(
                        t.spec.input_schema_json, flat=view.rendering >= FLAT_SINCE
                    ),
                },
            }
            for t in view.tools
        ]
    return body


def openai_responses(view: CompiledView, data: Mapping[str, bytes]) -> JSON:
    items: list[JSON] = []
    for m in view.messages:
        if m.role is Role.TOOL:
            items.append(
                {"type": "function_call_output", "call_id": m.tool_call_id, "output": text_of(m)}
            )
            continue
        if m.role is Role.ASSISTANT:
            if text_of(m):
                # Earlier assistant output goes back as an "easy" message with string
                # content: the output-message item would need the id and status of a
                # stored response, and input_text parts are refused for this role.
                items.append({"type": "message", "role": "assistant", "content": text_of(m)})
            items += [
                {
                    "type": "function_call",
                    "call_id": c.call_id,
                    "name": call_name(c.name),
                    "arguments": args_text(c.arguments_json),
                }
                for c in m.tool_calls
            ]
            continue
        content: list[JSON] = []
        for p in m.parts:
            if p.text is not None:
                content.append({"type": "input_text", "text": p.text})
            elif (img := inline_image(p, data, OPENAI_IMAGES)) is not None:
                content.append(
                    {
                        "type": "input_image",
                        "image_url": f"data:{img[0]};base64,{img[1]}",
                        "detail": "auto",
                    }
                )
            else:
                content.append({"type": "input_text", "text": image_note(p, OPENAI_IMAGES)})
        role = "developer" if m.role is Role.SYSTEM else "user"
        items.append({"type": "message", "role": role, "content": content})
    body: JSON = {
        "model": view.route.model,
        "input": items,
        "max_output_tokens": output_cap(view),
        "prompt_cache_key": cache_key(view),
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
                "parameters": schema(t.spec.input_schema_json, flat=view.rendering >= FLAT_SINCE),
                # Strict mode needs every property required and no extra ones: agents'
                # schemas rarely are, so calls are validated by the agent, as in Chat.
                "strict": False,
            }
            for t in view.tools
        ]
    return body
