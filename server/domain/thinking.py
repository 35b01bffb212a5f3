"""Anthropic's thinking blocks, kept as an assistant message's native state.

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
"""

from __future__ import annotations

import json
from typing import Any

KIND = "anthropic.thinking"

# The fields each block type carries, all strings (the SDK's ThinkingBlockParam and
# RedactedThinkingBlockParam).
_FIELDS = {"thinking": ("thinking", "signature"), "redacted_thinking": ("data",)}


def thinking_blocks(data: bytes) -> tuple[dict[str, Any], ...] | None:
    """The blocks `data` holds, each with only the fields the API takes, in their order;
    None when it is not a non-empty JSON array of such blocks."""
    try:
        parsed = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(parsed, list) or not parsed:
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
