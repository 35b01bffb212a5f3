"""The corpus and digests that tie ctxcc's Claude counter (the `anthropic-tokenizer`
package) to the vocabulary Anthropic published: scripts/claude_vocab_reference.py
computes the digests with the published file, tests/unit/test_claude_tokenizer.py with
the package. Also the counting speed against bpe-openai's cl100k_base on the traces."""

from __future__ import annotations

import hashlib
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from bench.paths import dev_traces
from bench.tokenizers import trace_texts


def corpus(trace: Path | None = None) -> list[str]:
    """The development traces' texts plus seeded random text over many scripts, emoji,
    combining marks and every kind of whitespace (NFKC and byte-level edge cases)."""
    texts = trace_texts(trace or dev_traces())
    rng = random.Random(20261130)
    alphabet = (
        "abcXYZ 019\n\t  \r\n.,;:'\"(){}[]<>/\\-_=+*&^%$#@!~`|?"
        "éüßçñ αβγ жзий العربية 中文字符 日本語カタカナ 한국어 हिन्दी"
        "🙂🚀👍🏽\u200d\u0301\ufeff\u00a0\u2028ﬁ²①"
    )
    for _ in range(1000):
        texts.append("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 300))))
    texts.append("x" * 20_000)  # a run with no pre-token boundary
    return texts


def ids_digest(texts: Sequence[str], encode: Callable[[str], Sequence[int]]) -> str:
    h = hashlib.sha256()
    for t in texts:
        h.update(b",".join(str(i).encode() for i in encode(t)) + b";")
    return h.hexdigest()


def vocab_digest(size: int, decode: Callable[[int], str]) -> str:
    """Every id decoded alone, in id order (partial UTF-8 sequences decode the same
    lossy way in both implementations)."""
    h = hashlib.sha256()
    for i in range(size):
        h.update(decode(i).encode("utf-8", "surrogatepass") + b"\x00")
    return h.hexdigest()


def run(trace: Path, scale: float = 1.0) -> dict[str, float]:
    from server.adapters.tokenizer import ClaudeCounter, load_cl100k

    texts = trace_texts(trace)
    texts = texts[: max(20, int(len(texts) * scale))]
    chars = sum(map(len, texts))
    claude, cl100k = ClaudeCounter(), load_cl100k()
    claude.count("warm")
    t0 = time.perf_counter()
    for t in texts:
        claude._count(t)
    t1 = time.perf_counter()
    for t in texts:
        cl100k.count(t)
    t2 = time.perf_counter()
    return {
        "claude_mchars_per_s": round(chars / (t1 - t0) / 1e6, 2),
        "cl100k_mchars_per_s": round(chars / (t2 - t1) / 1e6, 2),
    }
