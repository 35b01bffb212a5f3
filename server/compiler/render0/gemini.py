"""Gemini generateContent bodies (REST, camelCase), shaped as google-genai's `Content`,
`Tool` and `GenerationConfig` types.

- Roles alternate (`user` / `model`); tool results travel in user turns.
- Each `functionResponse` is matched to its `functionCall`: same `id`, and responses
  in the order of the calls, whatever order the results arrived in.
- A response's payload is `{"output": text}`, or `{"error": text}` for failed calls,
  the keys the API documents.
- Tool schemas go verbatim as `parametersJsonSchema` (full JSON Schema): `parameters`
  takes only an OpenAPI subset that refuses common keys such as `$schema`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from server.compiler.render0.anthropic import merge_turns
from server.compiler.render0.common import (
    JSON,
    args_object,
    image_note,
    inline_image,
    output_cap,
    schema,
    text_of,
)
from server.compiler.view import CompiledView, ViewMessage
from server.domain.model import Role


def _response(m: ViewMessage, names: Mapping[str, str]) -> JSON:
    key = "error" if m.is_error else "output"
    return {
        "functionResponse": {
            "id": m.tool_call_id,
            "name": names.get(m.tool_call_id, m.tool_name or "tool"),
            "response": {key: text_of(m)},
        }
    }


def _in_call_order(messages: Sequence[ViewMessage]) -> list[ViewMessage]:
    """Each run of tool results, reordered to the order of the calls it answers."""
    out: list[ViewMessage] = []
    order: dict[str, int] = {}
    run: list[ViewMessage] = []
    for m in (*messages, None):
        if m is not None and m.role is Role.TOOL:
            run.append(m)
            continue
        out += sorted(run, key=lambda r: order.get(r.tool_call_id, len(order)))
        run = []
        if m is not None:
            out.append(m)
            order = {c.call_id: i for i, c in enumerate(m.tool_calls)}
    return out


def gemini(view: CompiledView, data: Mapping[str, bytes]) -> JSON:
    names = {c.call_id: c.name for m in view.messages for c in m.tool_calls}
    turns: list[tuple[str, list[JSON]]] = []
    for m in _in_call_order(view.messages):
        if m.role is Role.TOOL:
            turns.append(("user", [_response(m, names)]))
        elif m.role is Role.ASSISTANT:
            parts: list[JSON] = [{"text": text_of(m)}] if text_of(m) else []
            parts += [
                {
                    "functionCall": {
                        "id": c.call_id,
                        "name": c.name,
                        "args": args_object(c.arguments_json),
                    }
                }
                for c in m.tool_calls
            ]
            turns.append(("model", parts))
        else:
            parts = []
            for p in m.parts:
                if p.text is not None:
                    parts.append({"text": p.text})
                elif (img := inline_image(p, data)) is not None:
                    parts.append({"inlineData": {"mimeType": img[0], "data": img[1]}})
                else:
                    parts.append({"text": image_note(p)})
            turns.append(("user", parts))
    body: JSON = {
        "contents": [{"role": r, "parts": p} for r, p in merge_turns(turns)],
        "generationConfig": {"maxOutputTokens": output_cap(view)},
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
                        "parametersJsonSchema": schema(t.spec.input_schema_json),
                    }
                    for t in view.tools
                ]
            }
        ]
    return body
