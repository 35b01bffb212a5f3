"""OpenAI Chat Completions and Responses bodies, shaped as the official SDKs' request
params (`CompletionCreateParamsNonStreaming`, `ResponseCreateParamsNonStreaming`).

- Call names as every API takes them (`render_common.call_name`).
- Chat refuses a `tool_calls[].id` over 40 characters (`string_above_max_length`): a
  longer id (a Responses `fc_...` item id is 53) is sent as its first 27 characters,
  `_` and 12 hex digits of its sha256, the same in the call and its result; Responses
  likewise one over 64 (51 characters, `_`, 12 hex digits), from rendering 7.
- A failed call without output is sent as "(the tool failed with no output)", as in
  Anthropic bodies, from rendering 7: neither OpenAI API has an error flag, and "" reads
  as an empty success.
- A tool schema without `properties` is sent with `"properties": {}`, from rendering 9:
  OpenAI refuses it without ("object schema missing properties"), the form MCP servers
  give a tool that takes no arguments (render_common.schema).
- An assistant message with neither text nor calls (a step whose only text was empty)
  is left out of Chat, which refuses one; Responses sends no item for it anyway.
- Responses bodies lead each assistant message of the current tool loop with a reasoning
  item logged with it (`view.thinking`, domain/thinking.py), from rendering 8; Chat has
  no place for them. The API refuses a reasoning item that is not right before the item
  that followed it in the response ("Item 'rs_…' of type 'reasoning' was provided
  without its required following item"), and a response may hold several reasoning
  items in a row, or between its message and its calls, where a logged event keeps no
  order: only the last item logged goes, before the message and its calls, and only
  when one event of the message logged items (a message merged from several responses
  sends none). Sending none is what a client that keeps no reasoning does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from server.compiler import renderings
from server.compiler.provider_rules import OPENER
from server.compiler.render_anthropic import EMPTY_ERROR
from server.compiler.render_common import (
    JSON,
    OPENAI_IMAGES,
    accepted_images,
    args_text,
    cache_key,
    call_name,
    image_note,
    inline_image,
    output_cap,
    schema,
    short_call_id,
    system_image_note,
    text_of,
)
from server.compiler.turn_thinking import of_kind
from server.compiler.view import CompiledView, ViewMessage
from server.domain.model import Role
from server.domain.thinking import OPENAI_KIND, reasoning_items

MAX_CHAT_CALL_ID = 40
# Responses refuses a call_id over 64 characters ("Invalid 'input[N].call_id': string too
# long. Expected a string with maximum length 64"): MCP servers' ids reach 80 and more.
MAX_RESPONSES_CALL_ID = 64


def _reasoning(view: CompiledView, m: ViewMessage) -> list[JSON]:
    """The reasoning item that leads assistant message `m` (see the module's docstring)."""
    logged = of_kind(view.thinking, OPENAI_KIND, m.first_seq, m.last_seq)
    items = reasoning_items(logged[0]) if len(logged) == 1 else None
    return [items[-1]] if items else []


def chat_call_id(call_id: str) -> str:
    return short_call_id(call_id, MAX_CHAT_CALL_ID)


def _chat_call_id(view: CompiledView, call_id: str) -> str:
    return chat_call_id(_named(view, call_id))


def _responses_call_id(view: CompiledView, call_id: str) -> str:
    if view.rendering < renderings.PROVIDER_LIMITS:
        return call_id
    return short_call_id(_named(view, call_id), MAX_RESPONSES_CALL_ID)


def _named(view: CompiledView, call_id: str) -> str:
    """An empty call id (a tool message imported from another session carries none, nor
    the stand-in call the view gives it) as Anthropic bodies send it, `cx_`: Responses
    refuses an empty call_id ("Expected a string with minimum length 1"), from rendering 7."""
    return call_id or ("cx_" if view.rendering >= renderings.PROVIDER_LIMITS else call_id)


def _result_text(view: CompiledView, m: ViewMessage) -> str:
    """A result's text; a failed call's without output says it failed (from rendering 7),
    as Anthropic's is_error and Gemini's error key do: "" reads as an empty success."""
    text = text_of(m, view.rendering)
    return (
        EMPTY_ERROR
        if not text and m.is_error and view.rendering >= renderings.PROVIDER_LIMITS
        else text
    )


def openai_chat(view: CompiledView, data: Mapping[str, bytes]) -> JSON:
    images = accepted_images(view, OPENAI_IMAGES)
    flat = view.rendering >= renderings.FLAT_SCHEMAS
    properties = view.rendering >= renderings.OBJECT_PROPERTIES
    top_ref = view.rendering >= renderings.TOP_LEVEL_REFS
    ref_objects = view.rendering >= renderings.REF_OBJECTS
    messages: list[JSON] = []
    if view.system_prompt:
        messages.append({"role": "system", "content": view.system_prompt})
    for m in view.messages:
        if m.role is Role.TOOL:
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": _chat_call_id(view, m.tool_call_id),
                    "content": _result_text(view, m),
                }
            )
            continue
        if m.role is Role.ASSISTANT:
            if not text_of(m, view.rendering) and not m.tool_calls:
                continue
            msg: JSON = {"role": "assistant", "content": text_of(m, view.rendering) or None}
            if m.tool_calls:
                msg["tool_calls"] = [
                    {
                        "id": _chat_call_id(view, c.call_id),
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
            elif (img := inline_image(p, data, images)) is not None and role == "user":
                parts.append(
                    {"type": "image_url", "image_url": {"url": f"data:{img[0]};base64,{img[1]}"}}
                )
            elif img is not None and view.rendering >= renderings.IMAGE_NOTES:
                # A system message's content is text only; other formats send the image.
                parts.append({"type": "text", "text": system_image_note(p)})
            else:
                parts.append({"type": "text", "text": image_note(p, images)})
        only_text = all(p["type"] == "text" for p in parts)
        content: Any = "\n".join(p["text"] for p in parts) if only_text else parts
        messages.append({"role": role, "content": content})
    if view.rendering >= renderings.EMPTY_VIEWS and all(m["role"] == "system" for m in messages):
        messages.append({"role": "user", "content": OPENER})
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
                        t.spec.input_schema_json,
                        flat=flat,
                        properties=properties,
                        top_ref=top_ref,
                        ref_objects=ref_objects,
                    ),
                },
            }
            for t in view.tools
        ]
    return body


def openai_responses(view: CompiledView, data: Mapping[str, bytes]) -> JSON:
    images = accepted_images(view, OPENAI_IMAGES)
    flat = view.rendering >= renderings.FLAT_SCHEMAS
    properties = view.rendering >= renderings.OBJECT_PROPERTIES
    top_ref = view.rendering >= renderings.TOP_LEVEL_REFS
    ref_objects = view.rendering >= renderings.REF_OBJECTS
    items: list[JSON] = []
    for m in view.messages:
        if m.role is Role.TOOL:
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": _responses_call_id(view, m.tool_call_id),
                    "output": _result_text(view, m),
                }
            )
            continue
        if m.role is Role.ASSISTANT:
            items += _reasoning(view, m)
            if text_of(m, view.rendering):
                # Earlier assistant output goes back as an "easy" message with string
                # content: the output-message item would need the id and status of a
                # stored response, and input_text parts are refused for this role.
                items.append(
                    {"type": "message", "role": "assistant", "content": text_of(m, view.rendering)}
                )
            items += [
                {
                    "type": "function_call",
                    "call_id": _responses_call_id(view, c.call_id),
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
            elif (img := inline_image(p, data, images)) is not None:
                content.append(
                    {
                        "type": "input_image",
                        "image_url": f"data:{img[0]};base64,{img[1]}",
                        "detail": "auto",
                    }
                )
            else:
                content.append({"type": "input_text", "text": image_note(p, images)})
        role = "developer" if m.role is Role.SYSTEM else "user"
        items.append({"type": "message", "role": role, "content": content})
    if not items and view.rendering >= renderings.EMPTY_VIEWS:
        items.append({"type": "message", "role": "user", "content": OPENER})
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
                "parameters": schema(
                    t.spec.input_schema_json,
                    flat=flat,
                    properties=properties,
                    top_ref=top_ref,
                    ref_objects=ref_objects,
                ),
                # Strict mode needs every property required and no extra ones: agents'
                # schemas rarely are, so calls are validated by the agent, as in Chat.
                "strict": False,
            }
            for t in view.tools
        ]
    return body
