"""Model families: a bounded label for metrics and the key of tokenizer choice."""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=1024)
def family_of(model: str) -> str:
    """A bounded label from an unbounded model name (remembered: every compile asks)."""
    m = model.lower()
    for family, needles in (
        ("openai", ("gpt", "o1", "o3", "o4", "chatgpt")),
        ("anthropic", ("claude",)),
        ("google", ("gemini", "gemma")),
        ("llama", ("llama",)),
        ("qwen", ("qwen",)),
        ("deepseek", ("deepseek",)),
        ("mistral", ("mistral", "mixtral", "codestral", "devstral")),
    ):
        if any(n in m for n in needles):
            return family
    return "other"
