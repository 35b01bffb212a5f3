"""The token-counter port. Adapters (tiktoken, per-character) implement it; the core
only calls it, so estimates stay deterministic for a given counter."""

from __future__ import annotations

import json
from typing import Protocol


class TokenCounter(Protocol):
    @property
    def name(self) -> str: ...

    def count(self, text: str) -> int: ...


# Framing cost of one message (role markers, separators) in the chat formats the
# providers use; small, but it adds up over hundreds of messages.
MESSAGE_OVERHEAD = 4
# Cost of one image when its provider-specific size is unknown (about a 1024x1024
# image on the common providers); attachments are estimated, never counted.
IMAGE_TOKENS = 1_600


def arguments_text(arguments_json: str, as_parameters: bool) -> str:
    """What a provider tokenizes of a tool call's arguments. OpenAI-style APIs take them
    as one JSON string, read as is. Anthropic takes them as an object and shows the
    model each parameter with its value as is: strings unescaped (a file's new lines
    and quotes, not `\\n` and `\\"`), other values as JSON. Counting the escaped JSON
    overcounts code and text written through tool calls by 5-8% on Claude."""
    if not as_parameters or not arguments_json:
        return arguments_json
    try:
        args = json.loads(arguments_json)
    except ValueError:
        return arguments_json
    if not isinstance(args, dict):
        return arguments_json
    return "\n".join(
        f"{key}: {value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)}"
        for key, value in args.items()
    )
