"""The record of how an estimate was made (kept apart to avoid an import cycle)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class EstimateBasis:
    """What a later compile needs to use this one's reported usage as its baseline."""

    message_count: int
    messages_digest: str
    fixed_tokens: int
    ledger_tokens: int
    raw_delta: int | None = None
    baseline_tokens: int = 0
    # 8-byte digest prefix per message, and each message's tokens (removal accounting).
    message_digests: bytes = b""
    message_tokens: tuple[int, ...] = ()
    # Tokens of the baseline's messages that left the view (0 for a pure append).
    removed_tokens: int = 0
    # Messages that entered the view minus those that left it.
    message_change: int = 0
