"""Thinking state a provider needs back during a tool loop, kept as an assistant
message's native state: Anthropic's thinking blocks, Gemini's thought signatures and
OpenAI's reasoning items.

With extended thinking on, Claude's answer that calls a tool starts with `thinking` (or
`redacted_thinking`) blocks, and the API refuses the request that sends the tool's result
unless that assistant turn still starts with them, unmodified ("messages.1.content.0.type:
Expected `thinking` or `redacted_thinking`, but found `tool_use`. When `thinking` is
enabled, a final `assistant` message must start with a thinking block"). Their signature
binds them to the conversation before them, so they are provider-native state (R-LAYER,
R-ROUTE-2): valid on the route that produced them only, and needed only in the turn (the
tool-use cycle since the latest user message) that produced them; earlier turns' blocks
the API strips anyway. They are not the reasoning text R-MISC-2 keeps out of the view.

An agent logs them as `AssistantMessage.native_state` of kind KIND with `data` the JSON
array of the blocks exactly as the API returned them.

Gemini 3 likewise signs the first function call of each step it makes with a
`thoughtSignature` and refuses a request whose current turn holds that call without it
("Function call is missing a thought_signature in functionCall parts"). An agent logs
them as native state of kind GEMINI_KIND with `data` a JSON object from each signed
call's call id to its signature (base64, as the REST API gives it).

OpenAI's reasoning models, over the Responses API, return `reasoning` items before the
calls they make; OpenAI asks that every reasoning item since the latest user message be
sent back with the calls and their outputs, so the model goes on from its reasoning
instead of reasoning again (fewer tokens, better calls). The bodies ctxcc renders are
stateless (`store: false`), so an item goes back with the `encrypted_content` the API
returns with it: an id alone names a stored item, which the API then cannot find. An
agent logs them as native state of kind OPENAI_KIND with `data` the JSON array of the
response's reasoning items that came before its first message or call; the body sends
the last of them (see render_openai).
"""

from __future__ import annotations

import base64
import json
from typing import Any

KIND = "anthropic.thinking"
GEMINI_KIND = "gemini.thought_signatures"
OPENAI_KIND = "openai.reasoning"

# The fields each block type carries, all strings (the SDK's ThinkingBlockParam and
# RedactedThinkingBlockParam).
_FIELDS = {"thinking": ("thinking", "signature"), "redacted_thinking": ("data",)}


def thinking_blocks(data: bytes) -> tuple[dict[str, Any], ...] | None:
    """The blocks `data` holds, each with only the fields the API takes, in their order;
    None when it is not a non-empty JSON array of such blocks."""
    parsed = _json_array(data)
    if parsed is None:
        return None
    out = []
    for block in parsed:
        if not isinstance(block, dict):
            return None
        fields = _FIELDS.get(block.get("type"))  # type: ignore[arg-type]
        if fields is None or not all(isinstance(block.get(f), str) for f in fields):
            return None
        out.append({"type": block["type"], **{f: block[f] for f in fields}})
    return tuple(out)


def thought_signatures(data: bytes) -> dict[str, str] | None:
    """Call id to signature from `data`; None when it is not a non-empty JSON object of
    non-empty call ids to base64 signatures (the API refuses one it cannot decode)."""
    parsed = _parsed(data)
    if not isinstance(parsed, dict) or not parsed:
        return None
    for call_id, signature in parsed.items():
        if not call_id or not isinstance(signature, str) or not _is_base64(signature):
            return None
    return parsed


def reasoning_items(data: bytes) -> tuple[dict[str, Any], ...] | None:
    """The reasoning items `data` holds, each with only what a stateless request sends
    back (type, id, summary, encrypted_content; an item logged without an id goes
    without), in their order; None when it is not a non-empty JSON array of reasoning
    items, each with encrypted content, summary parts of type summary_text and, if any,
    a string id. Not the raw reasoning text (R-MISC-2) or the status.

    The id goes with the encrypted content, as the SDKs' request type has it: Azure AI
    Foundry's project endpoints refuse a sealed item without its id; the OpenAI API takes
    both (OpenAI's Codex sends none)."""
    parsed = _json_array(data)
    if parsed is None:
        return None
    out = []
    for item in parsed:
        if not isinstance(item, dict) or item.get("type") != "reasoning":
            return None
        item_id, sealed, summary = (
            item.get("id"),
            item.get("encrypted_content"),
            item.get("summary"),
        )
        if not (isinstance(sealed, str) and sealed and isinstance(item_id, str | None)):
            return None
        if not isinstance(summary, list) or not all(_summary_part(p) for p in summary):
            return None
        parts = [{"type": "summary_text", "text": p["text"]} for p in summary]
        named = {"id": item_id} if item_id else {}
        out.append({"type": "reasoning", **named, "summary": parts, "encrypted_content": sealed})
    return tuple(out)


def _json_array(data: bytes) -> list[Any] | None:
    """`data` parsed when it is a non-empty JSON array, else None."""
    parsed = _parsed(data)
    return parsed if isinstance(parsed, list) and parsed else None


def _parsed(data: bytes) -> Any:
    """`data` as JSON; None when it is none. RecursionError: a client's state nested
    past the interpreter's limit is as malformed as any other (not an INTERNAL)."""
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None


def _summary_part(part: object) -> bool:
    return (
        isinstance(part, dict)
        and part.get("type") == "summary_text"
        and isinstance(part.get("text"), str)
    )


def _is_base64(text: str) -> bool:
    try:
        return bool(text) and base64.b64decode(text, validate=True) is not None
    except ValueError:
        return False


def loggable_state(kind: str, data: bytes) -> bool:
    """Whether an append may log native state of `kind`: valid_state, and for thinking
    blocks a signature (and redacted data) that is not empty, which the API refuses
    back; one client wrote "" for a block the response gave none, where the others'
    null or missing field was refused. At append only: a compile reads what was logged
    as valid_state says, as compiles recorded before this rule did."""
    if kind == KIND:
        blocks = thinking_blocks(data)
        return blocks is not None and all(
            b.get("signature", "x") and b.get("data", "x") for b in blocks
        )
    return valid_state(kind, data)


def valid_state(kind: str, data: bytes) -> bool:
    """Whether native state of `kind` is what its provider takes back (any other kind is
    opaque: sent as it is)."""
    if kind == KIND:
        return thinking_blocks(data) is not None
    if kind == GEMINI_KIND:
        return thought_signatures(data) is not None
    if kind == OPENAI_KIND:
        return reasoning_items(data) is not None
    return True
