"""The token-counter port. Adapters (tiktoken, per-character) implement it; the core
only calls it, so estimates stay deterministic for a given counter."""

from __future__ import annotations

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
