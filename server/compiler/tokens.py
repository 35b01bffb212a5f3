"""The token-counter port. Adapters (tiktoken, per-character) implement it; the core
only calls it, so estimates stay deterministic for a given counter."""

from __future__ import annotations

import json
from typing import Protocol

from server.compiler.textscan import loads_strict


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


# How tool-call arguments are counted. Each compile records it, so that a compile an
# earlier daemon recorded is rebuilt counting as that daemon did (exact time travel):
# 0: nested parameter values as JSON with spaces, non-ASCII as is;
# 1: nested values as compact JSON, non-ASCII escaped (what Claude's counts follow);
# 2: as 1, and the conservative estimator of families without a tokenizer weighs each
#    script by what cl100k_base makes of it (adapters/tokenizer.charclass_count; before,
#    three weights for all non-ASCII text undercounted Armenian by 60%, Traditional
#    Chinese by 30%).
# 3: as 2, and that estimator weighs a tab, carriage return, vertical tab or form feed
#    beside other whitespace as a token (before, as a space: 0.2), and Latin Extended-A
#    and -B, the Cyrillic Supplement and other ranges of rare characters by what a run of
#    them costs (before, 0.4-0.8 of cl100k_base).
# 4: as 3, and that estimator weighs an ASCII letter after a Latin letter outside ASCII
#    more (a new piece of the word: Hungarian, Lithuanian, Esperanto, pinyin and IPA were
#    0.89-0.91 of cl100k_base) and the Cyrillic letters outside the Russian alphabet's
#    range as 1.3 (Serbian was 0.94).
# Arguments are counted as 1 from 1 on.
# BEFORE_CALL_IDS (-1), for compiles recorded before call ids were counted (the store
# tells them by their records, see CompileRecord.before_call_ids): arguments as their
# JSON string as is, and neither a call's id nor its result's counted.
COUNTING = 4
CHARCLASS_BY_SCRIPT = 2
CHARCLASS_RARE = 3
CHARCLASS_SPLIT_WORDS = 4
BEFORE_CALL_IDS = -1
# Separators of the JSON a provider renders nested parameter values with.
_COMPACT = (",", ":")


def arguments_text(arguments_json: str, as_parameters: bool, counting: int = COUNTING) -> str:
    """What a provider tokenizes of a tool call's arguments. OpenAI-style APIs take them
    as one JSON string, read as is. Anthropic takes them as an object and shows the
    model each parameter with its value as is: strings unescaped (a file's new lines
    and quotes, not `\\n` and `\\"`), other values (lists, objects, numbers) as compact
    JSON with non-ASCII characters escaped. Counting the escaped JSON overcounts code and
    text written through tool calls by 5-8% on Claude; counting nested values with
    spaces after separators overcounts a to-do list by ~40 tokens, and with non-ASCII
    characters as is undercounts a nested edit of box-drawing text by a third (measured
    against Claude Code's reported usage, tests/unit/test_claude_tokenizer.py)."""
    if not as_parameters or not arguments_json or counting == BEFORE_CALL_IDS:
        return arguments_json
    try:
        args = loads_strict(arguments_json)
    except ValueError:
        return arguments_json
    if not isinstance(args, dict):
        return arguments_json
    return "\n".join(
        f"{key}: {value if isinstance(value, str) else _nested(value, counting)}"
        for key, value in args.items()
    )


def _nested(value: object, counting: int) -> str:
    if counting == 0:
        return json.dumps(value, ensure_ascii=False)
    return json.dumps(value, separators=_COMPACT)
