"""Gemini generateContent bodies (REST, camelCase), shaped as google-genai's `Content`,
`Tool` and `GenerationConfig` types.

- Roles alternate (`user` / `model`); tool results travel in user turns.
- Each `functionResponse` is matched to its `functionCall` by order: responses in the
  order of the calls, whatever order the results arrived in (no `id`, which Vertex AI
  refuses, from rendering 7; the same `id` before).
- A response's payload is `{"output": text}`, or `{"error": text}` for failed calls,
  the keys the API documents.
- Tool schemas go verbatim as `parametersJsonSchema` (full JSON Schema): `parameters`
  takes only an OpenAPI subset that refuses common keys such as `$schema`.
- No part is an empty text (the API refuses "an empty text parameter"); call names as
  every API takes them (`call_name`), in the call and its response alike.
- A function call of the current turn carries the `thoughtSignature` logged for it
  (`view.thinking`, domain/thinking.py): Gemini 3 refuses a turn whose signed call
  comes back without it. From rendering 4, on Gemini 3 and later models, each step of
  the current turn whose first call has no logged signature (made by another model
  before a switch, logged without its state, or injected by the agent) carries the
  stand-in Google documents for calls the model did not make, so the turn is not
  refused ("Function call is missing a thought_signature in functionCall parts").
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from server.compiler import renderings
from server.compiler.provider_rules import OPENER
from server.compiler.render_anthropic import merge_turns, opened_turns
from server.compiler.render_common import (
    GEMINI_IMAGES,
    JSON,
    accepted_images,
    args_object,
    call_name,
    image_note,
    inline_image,
    output_cap,
    schema,
    text_of,
)
from server.compiler.turn_thinking import of_kind
from server.compiler.view import CompiledView, ViewMessage
from server.domain.model import Role
from server.domain.thinking import GEMINI_KIND, thought_signatures

# Google's documented value for a function call without a signature of the model's own
# (the thought-signatures guide: calls from another model, or injected ones). It stands
# for no state, so the estimate does not count it as it counts logged signatures.
SKIP_SIGNATURE = "skip_thought_signature_validator"
# Gemini 3 began validating signatures; a model is named "gemini-<major>...", bare or
# as the last segment of a resource path ("models/…", Vertex's "publishers/google/…").
_GEMINI_MAJOR = re.compile(r"(?:^|/)gemini-(\d+)(?:[.-]|$)")


def validates_signatures(model: str) -> bool:
    found = _GEMINI_MAJOR.search(model)
    return found is not None and int(found.group(1)) >= 3


def stand_in_signatures(contents: list[JSON]) -> None:
    """The first call of each step of the current turn given the stand-in where it has
    no signature. The turn, as the API sees it, follows the latest user turn without a
    function response (a message the user typed while tools ran shares its turn with
    their results, which lead it); each model turn in it is a step, whose first call
    the API checks (parallel calls: only the first is signed)."""
    start = 0
    for i, c in enumerate(contents):
        if c["role"] == "user" and not any("functionResponse" in p for p in c["parts"]):
            start = i + 1
    for c in contents[start:]:
        if c["role"] != "model":
            continue
        first = next((p for p in c["parts"] if "functionCall" in p), None)
        if first is not None and "thoughtSignature" not in first:
            first["thoughtSignature"] = SKIP_SIGNATURE


def _response(m: ViewMessage, names: Mapping[str, str], ids: bool, rendering: int) -> JSON:
    key = "error" if m.is_error else "output"
    response: JSON = {
        "name": call_name(names.get(m.tool_call_id, m.tool_name or "tool")),
        "response": {key: text_of(m, rendering)},
    }
    return {"functionResponse": {"id": m.tool_call_id, **response} if ids else response}


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


def _signatures(view: CompiledView, m: ViewMessage) -> dict[str, str]:
    """Call id to the thought signature logged with the events `m` holds."""
    out: dict[str, str] = {}
    for data in of_kind(view.thinking, GEMINI_KIND, m.first_seq, m.last_seq):
        out.update(thought_signatures(data) or {})
    return out


# A call id reused after its pair closed is shown as "<id>~<n>" (pairing.py); its state
# was logged under the id the model gave it.
_REUSED = re.compile(r"^(.+)~\d+$")


def _signature_of(
    view: CompiledView, call_id: str, signed: Mapping[str, str], m: ViewMessage
) -> str | None:
    """The signature logged for the call shown as `call_id` in `m`: under that id, or,
    from rendering 5, for a reused id, under the id as logged when no other call of `m`
    is shown so."""
    if call_id in signed:
        return signed[call_id]
    if view.rendering < renderings.LOOPS_GO_ON:
        return None
    reused = _REUSED.match(call_id)
    if reused is None or (logged := reused.group(1)) not in signed:
        return None
    return None if any(c.call_id == logged for c in m.tool_calls) else signed[logged]


def gemini(view: CompiledView, data: Mapping[str, bytes]) -> JSON:
    images = accepted_images(view, GEMINI_IMAGES)
    # Vertex AI refuses an `id` in functionCall and functionResponse ('Unknown name "id"
    # at contents[1].parts[0].function_call: Cannot find field'), which the Gemini API
    # ignores: from rendering 7 no body sends one (responses follow their calls' order).
    ids = view.rendering < renderings.PROVIDER_LIMITS
    names = {c.call_id: c.name for m in view.messages for c in m.tool_calls}
    turns: list[tuple[str, list[JSON]]] = []
    for m in _in_call_order(view.messages):
        if m.role is Role.TOOL:
            turns.append(("user", [_response(m, names, ids, view.rendering)]))
        elif m.role is Role.ASSISTANT:
            parts: list[JSON] = (
                [{"text": text_of(m, view.rendering)}] if text_of(m, view.rendering) else []
            )
            signed = _signatures(view, m) if view.thinking else {}
            for c in m.tool_calls:
                call: JSON = {"name": call_name(c.name), "args": args_object(c.arguments_json)}
                part: JSON = {"functionCall": {"id": c.call_id, **call} if ids else call}
                if (signature := _signature_of(view, c.call_id, signed, m)) is not None:
                    part["thoughtSignature"] = signature
                parts.append(part)
            turns.append(("model", parts))
        else:
            parts = []
            for p in m.parts:
                if p.text is not None:
                    if p.text:
                        parts.append({"text": p.text})
                elif (img := inline_image(p, data, images)) is not None:
                    parts.append({"inlineData": {"mimeType": img[0], "data": img[1]}})
                else:
                    parts.append({"text": image_note(p, images)})
            turns.append(("user", parts))
    contents = [
        {"role": r, "parts": p} for r, p in opened_turns(merge_turns(turns), {"text": OPENER})
    ]
    if not contents and view.rendering >= renderings.EMPTY_VIEWS:
        contents = [{"role": "user", "parts": [{"text": OPENER}]}]
    if view.rendering >= renderings.STAND_IN_SIGNATURES and validates_signatures(view.route.model):
        stand_in_signatures(contents)
    body: JSON = {
        "contents": contents,
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
