"""Builders for the events an agent appends."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Mapping

from ctxcc.v1 import common_pb2, event_pb2

# The native state kind of Anthropic's thinking blocks (see assistant_from_anthropic).
ANTHROPIC_THINKING = "anthropic.thinking"
# The native state kind of Gemini's thought signatures (see assistant_from_gemini).
GEMINI_THOUGHT_SIGNATURES = "gemini.thought_signatures"
# The native state kind of OpenAI's reasoning items (see assistant_from_openai_responses).
OPENAI_REASONING = "openai.reasoning"


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


def _get(obj: object, name: str) -> object:
    return obj.get(name) if isinstance(obj, Mapping) else getattr(obj, name, None)


def _add_text(m: event_pb2.AssistantMessage, text: str, after_text: bool) -> None:
    """`text` as a part of its own, or, right after text, added to that part."""
    if after_text and m.parts:
        m.parts[-1].text += text
    else:
        m.parts.add(text=text)


def assistant_from_anthropic(message: object, route_id: str) -> event_pb2.Event:
    """The assistant event to log for an Anthropic Messages response (the SDK's
    `Message`, or the same as a mapping: the response's JSON).

    Its text blocks become the message's text (adjacent ones, as Claude splits a text at
    each citation, one part: a view joins parts with line breaks), its `tool_use` blocks
    its tool calls, and
    its `thinking` / `redacted_thinking` blocks, unchanged and in order, its native state
    of kind "anthropic.thinking" on `route_id` (the compiled view's `route_id`, the route
    the request went to). With extended thinking on, the API refuses a tool loop whose
    assistant turn does not start with those blocks; ctxcc's Anthropic body puts them
    back at the head of their turn, on that route only and only in the turn that made
    them. The thinking text is not logged as reasoning: the model gets it back through
    the blocks, and no other route may see it (R-MISC-2)."""
    ev = event_pb2.Event()
    m = ev.assistant_message
    thinking: list[dict[str, object]] = []
    after_text = False  # the previous block was text: this one continues its part
    for block in _get(message, "content") or ():  # type: ignore[attr-defined]
        kind = _get(block, "type")
        if kind == "text":
            # An empty block adds nothing and joins nothing: across it, text stays apart
            # or together as it was.
            if text := str(_get(block, "text") or ""):
                _add_text(m, text, after_text)
                after_text = True
            continue
        after_text = False
        if kind == "tool_use":
            m.tool_calls.add(
                call_id=str(_get(block, "id")),
                name=str(_get(block, "name")),
                arguments_json=json.dumps(_get(block, "input") or {}, ensure_ascii=False),
            )
        elif kind == "thinking":
            thinking.append(
                {
                    "type": "thinking",
                    "thinking": _get(block, "thinking"),
                    "signature": _get(block, "signature"),
                }
            )
        elif kind == "redacted_thinking":
            thinking.append({"type": "redacted_thinking", "data": _get(block, "data")})
    if thinking:
        m.native_state.route_id = route_id
        m.native_state.kind = ANTHROPIC_THINKING
        m.native_state.data = json.dumps(thinking, ensure_ascii=False).encode()
    return ev


def assistant_from_gemini(response: object, route_id: str) -> event_pb2.Event:
    """The assistant event to log for a Gemini generateContent response (google-genai's
    `GenerateContentResponse`, or the REST response's JSON as a mapping): its first
    candidate's text parts become the message's text (thought summaries, `thought: true`,
    stay out: R-MISC-2), its `functionCall` parts its tool calls (call id: the call's `id`,
    or a new one when the API gave none; log the tool results under the ids the returned
    event holds), and the calls' thought signatures its native state of kind
    "gemini.thought_signatures" on `route_id` (the compiled view's `route_id`). Gemini 3
    refuses a tool loop whose signed call comes back without its signature; ctxcc's
    Gemini body puts each back on its call, on that route only and only in the turn that
    made it."""
    ev = event_pb2.Event()
    m = ev.assistant_message
    m.SetInParent()  # an empty message for a response without candidates, as Go and TS give
    candidates = _get(response, "candidates") or ()
    content = _get(next(iter(candidates), None), "content")  # type: ignore[call-overload]
    signatures: dict[str, str] = {}
    after_text = False  # the previous part was text: this one continues its part
    for part in _get(content, "parts") or ():  # type: ignore[attr-defined]
        call = _get(part, "function_call") or _get(part, "functionCall")
        signature = _get(part, "thought_signature") or _get(part, "thoughtSignature")
        if call is not None:
            after_text = False
            call_id = str(_get(call, "id") or f"call_{uuid.uuid4().hex[:16]}")
            m.tool_calls.add(
                call_id=call_id,
                name=str(_get(call, "name")),
                arguments_json=json.dumps(_get(call, "args") or {}, ensure_ascii=False),
            )
            if signature:
                # The SDK holds the bytes, the REST JSON their base64: sent back as base64.
                signatures[call_id] = (
                    base64.b64encode(signature).decode()
                    if isinstance(signature, bytes)
                    else str(signature)
                )
        elif _get(part, "thought"):
            after_text = False  # a thought summary, left out, stands between texts
        elif text := str(_get(part, "text") or ""):
            # Gemini may split one text over parts (a signature on the last): one part
            # here, since a view joins parts with line breaks.
            _add_text(m, text, after_text)
            after_text = True
        # An empty part (a signature alone) joins nothing and breaks nothing.
    if signatures:
        m.native_state.route_id = route_id
        m.native_state.kind = GEMINI_THOUGHT_SIGNATURES
        m.native_state.data = json.dumps(signatures).encode()
    return ev


def assistant_from_openai_responses(response: object, route_id: str) -> event_pb2.Event:
    """The assistant event to log for an OpenAI Responses API response (the SDK's
    `Response`, or the response's JSON as a mapping): the `output_text` (and `refusal`)
    parts of its `message` items become the message's text, its `function_call` items its
    tool calls (call id: the item's `call_id`, which its `function_call_output` names),
    and the reasoning item right before its first message or call its native state of
    kind "openai.reasoning" on `route_id` (the compiled view's `route_id`): the item's
    id, summary and `encrypted_content`. OpenAI asks that a reasoning model's items since
    the latest user message go back with its calls; ctxcc's Responses body sends it,
    stateless (`store: false`), on that route only and only in the turn that made it.

    The API refuses a reasoning item that is not right before the item that followed it,
    and an event keeps no order between its text and its calls: so only that item is
    logged (the reasoning items before it, and any after the first message or call, are
    left out, as a client that keeps no reasoning leaves them all), and only with its
    encrypted content (a stateless request cannot name a stored item). A response with
    nothing but reasoning (cut at its output cap) gives a message with only that state,
    which the daemon logs and sends nowhere. The raw reasoning text is not logged
    (R-MISC-2)."""
    ev = event_pb2.Event()
    m = ev.assistant_message
    m.SetInParent()  # a response with no output is an empty message, as Go and TS give
    leading: object = None  # the last reasoning item before the first message or call
    started = False
    for item in _get(response, "output") or ():  # type: ignore[attr-defined]
        kind = _get(item, "type")
        if kind == "reasoning":
            leading = leading if started else item
            continue
        if kind in ("message", "function_call"):
            started = True
        if kind == "message":
            after_text = False  # one part per message item: a view joins parts by lines
            for part in _get(item, "content") or ():  # type: ignore[attr-defined]
                part_kind = _get(part, "type")
                text = _get(part, "text" if part_kind == "output_text" else "refusal")
                if part_kind in ("output_text", "refusal") and text:
                    _add_text(m, str(text), after_text)
                    after_text = True
        elif kind == "function_call":
            m.tool_calls.add(
                call_id=_text(_get(item, "call_id")),
                name=_text(_get(item, "name")),
                arguments_json=_text(_get(item, "arguments")) or "{}",
            )
    if leading is not None and _get(leading, "encrypted_content"):
        item = {
            "type": "reasoning",
            "id": _text(_get(leading, "id")),
            "summary": [
                {"type": "summary_text", "text": _text(_get(p, "text"))}
                for p in _get(leading, "summary") or ()  # type: ignore[attr-defined]
            ],
            "encrypted_content": _text(_get(leading, "encrypted_content")),
        }
        m.native_state.route_id = route_id
        m.native_state.kind = OPENAI_REASONING
        m.native_state.data = json.dumps([item], ensure_ascii=False).encode()
    return ev


def _text(value: object) -> str:
    """A string field of a response: "" for a missing or null one (not "None")."""
    return "" if value is None else str(value)
