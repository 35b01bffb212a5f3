"""Rendered bodies as TypeScript declarations typed with the SDKs' request types, for
`tsc --strict`: the conformance corpus's and the real tool sets' checks write them alike."""

from __future__ import annotations

import json
from typing import Any

# The request types, by the SDK module that exports them.
IMPORTS = (
    ("ChatCompletionCreateParamsNonStreaming", "openai/resources/chat/completions"),
    ("ResponseCreateParamsNonStreaming", "openai/resources/responses/responses"),
    ("MessageCreateParamsNonStreaming", "@anthropic-ai/sdk/resources/messages"),
    ("Content, GenerationConfig, Tool", "@google/genai"),
)
TYPES = {
    "openai_chat": "ChatCompletionCreateParamsNonStreaming",
    "openai_responses": "ResponseCreateParamsNonStreaming",
    "anthropic_messages": "MessageCreateParamsNonStreaming",
}
# The generateContent REST body's fields and the @google/genai type of each.
GEMINI = {
    "contents": "Content[]",
    "systemInstruction": "Content",
    "tools": "Tool[]",
    "generationConfig": "GenerationConfig",
}


def imports() -> list[str]:
    return [f'import type {{ {names} }} from "{module}";' for names, module in IMPORTS]


def declarations(n: int, fmt: str, body: dict[str, Any]) -> list[str]:
    """Body number `n` of format `fmt`, declared with its type. @google/genai types the
    REST body's fields (camelCase, as the wire has them), not the body as one: each field
    of a Gemini body is declared with its own type."""
    if fmt == "gemini":
        return [f"export const b{n}_{k}: {GEMINI[k]} = {json.dumps(v)};" for k, v in body.items()]
    return [f"export const b{n}: {TYPES[fmt]} = {json.dumps(body)};"]
