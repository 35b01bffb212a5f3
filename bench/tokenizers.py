"""o200k_base counting speed: bpe-openai (what the daemon uses) against tiktoken on the
same verified ranks, over the development traces' texts. Also the reference encoder the
exactness test compares with."""

from __future__ import annotations

import base64
import gzip
import importlib.resources
import json
import lzma
import time
from pathlib import Path

import tiktoken
from tiktoken_ext import openai_public


def bundled_ranks_file(name: str) -> bytes:
    """The `.tiktoken` file bpe-openai ships (gzipped) for `name`."""
    data = importlib.resources.files("bpe_openai") / "data" / f"{name}.tiktoken.gz"
    return gzip.decompress(data.read_bytes())


def reference_o200k() -> tiktoken.Encoding:
    """tiktoken's own o200k_base definition (pattern, special tokens), its ranks read
    from bpe-openai's file instead of downloaded; the file's sha256 is checked against
    tiktoken's pin by tests/unit/test_o200k.py."""
    ranks = {
        base64.b64decode(token): int(rank)
        for token, rank in (line.split() for line in bundled_ranks_file("o200k_base").splitlines())
    }
    original = openai_public.load_tiktoken_bpe
    openai_public.load_tiktoken_bpe = lambda *a, **k: ranks
    try:
        spec = openai_public.o200k_base()
    finally:
        openai_public.load_tiktoken_bpe = original
    return tiktoken.Encoding(**spec)


def trace_texts(trace: Path) -> list[str]:
    texts: list[str] = []
    with lzma.open(trace, "rt", encoding="utf-8") as f:
        for line in f:
            req = json.loads(line)
            for m in req["messages"]:
                c = m.get("content")
                texts.append(c if isinstance(c, str) else json.dumps(c))
            if req.get("tools"):
                texts.append(json.dumps(req["tools"]))
    return list(dict.fromkeys(texts))


def run(trace: Path, scale: float = 1.0) -> dict[str, float]:
    from server.adapters.tokenizer import load_o200k

    texts = trace_texts(trace)
    texts = texts[: max(20, int(len(texts) * scale))]
    chars = sum(map(len, texts))
    ours, ref = load_o200k(), reference_o200k()
    rounds = 3 if scale >= 1 else 1

    def rate(count: object) -> float:
        best = float("inf")
        for _ in range(rounds):
            t0 = time.perf_counter()
            for t in texts:
                count(t)  # type: ignore[operator]
            best = min(best, time.perf_counter() - t0)
        return chars / best / 1e6

    bpe = rate(ours.count)
    tik = rate(lambda t: len(ref.encode(t, disallowed_special=())))
    return {
        "o200k_bpe_openai_mchar_s": bpe,
        "o200k_tiktoken_mchar_s": tik,
        "o200k_speed_vs_tiktoken": bpe / tik,
    }
