"""The Claude counter (the `anthropic-tokenizer` package), checked against things outside
ctxcc:

1. Its vocabulary and its token ids are those of the file Anthropic published in its SDK
   (`anthropic==0.38.0`, `anthropic/tokenizer.json`, sha256 c241737d…) as run by Hugging
   Face `tokenizers`: the digests below come from scripts/claude_vocab_reference.py.
2. Against the usage Claude reported in the development traces, its counts explain the
   changes between consecutive requests better than cl100k_base does.
"""

from __future__ import annotations

import itertools
import json
import lzma
import socket
from collections import defaultdict
from collections.abc import Callable

import anthropic_tokenizer
import pytest

from bench.claude_vocab import corpus, ids_digest, vocab_digest
from bench.paths import dev_traces
from server.adapters import tokenizer
from server.adapters.catalog import load_catalog
from server.adapters.tokenizer import (
    ClaudeCounter,
    CounterRegistry,
    claude_pieces,
    load_cl100k,
    load_claude,
)

# scripts/claude_vocab_reference.py on anthropic-0.38.0-py3-none-any.whl, tokenizers 0.23.3.
PUBLISHED_VOCAB_DIGEST = "b7d4614435940dccb0742fb9dd2e6abfbca3293f3e34f8ce9ec499e3d0dfb610"
PUBLISHED_IDS_DIGEST = "4a843cb011980469dc937163c4e0be36d989ea7a49b2edb9c2ec993cbfa67a34"
PUBLISHED_HELLO_WORLD = [9381, 2253]

CORPUS = corpus()


def test_vocabulary_is_the_published_one() -> None:
    assert anthropic_tokenizer.vocab_size() == 65_000
    digest = vocab_digest(65_000, lambda i: anthropic_tokenizer.decode([i]))
    assert digest == PUBLISHED_VOCAB_DIGEST


def test_ids_equal_the_published_vocabulary() -> None:
    assert len(CORPUS) > 1_500 and sum(map(len, CORPUS)) > 700_000
    assert anthropic_tokenizer.encode("hello world") == PUBLISHED_HELLO_WORLD
    assert ids_digest(CORPUS, anthropic_tokenizer.encode) == PUBLISHED_IDS_DIGEST


def test_counting_in_pieces_adds_up_to_the_whole() -> None:
    counter = ClaudeCounter()
    long_texts = [t for t in CORPUS if len(t) > 8_192]
    assert len(long_texts) >= 10
    for t in long_texts:
        assert len(claude_pieces(t)) > 1
        assert counter.count(t) == len(anthropic_tokenizer.encode(t)), t[:60]
    # A run with no boundary is cut hard: a few tokens off at most.
    word = "x" * 100_000
    assert abs(counter.count(word) - len(anthropic_tokenizer.encode(word))) <= 16
    assert ClaudeCounter(1.1).count("hello world") == 3  # ceil(2 * 1.1)


def test_claude_loads_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("tokenizer tried to open a network connection")

    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr(socket.socket, "connect", no_network)
    tokenizer.forget_tokenizers()
    assert load_claude()("hello world") == 2


def test_anthropic_models_count_with_the_claude_vocabulary() -> None:
    catalog = load_catalog()
    registry = CounterRegistry()
    for model in ("claude-sonnet-4-20250514", "anthropic/claude-3-5-sonnet", "claude-3-haiku"):
        info = catalog.lookup(model)
        assert info.family == "anthropic" and info.tokenizer == "claude", model
        assert isinstance(registry.for_model(info), ClaudeCounter)
    assert isinstance(registry.for_model(catalog.lookup("claude-opus-4-1")), ClaudeCounter)


def _claude_changes() -> list[tuple[int, int, list[str]]]:
    """(reported change, reported total, new message texts) of every pure append on the
    Claude Code route of the development traces."""
    sessions: dict[str, list[dict[str, object]]] = defaultdict(list)
    with lzma.open(dev_traces(), "rt", encoding="utf-8") as f:
        for line in f:
            req = json.loads(line)
            if "claude-sonnet-4" in req["model"]:
                sessions[req["session"]].append(req)
    out = []
    for reqs in sessions.values():
        reqs.sort(key=lambda r: int(str(r["step"])))
        for a, b in itertools.pairwise(reqs):
            pm, cm = a["messages"], b["messages"]
            assert isinstance(pm, list) and isinstance(cm, list)
            if cm[: len(pm)] != pm:
                continue
            before, after = (int(str(r["reported_input_tokens"])) for r in (a, b))
            out.append((after - before, after, [str(m["content"]) for m in cm[len(pm) :]]))
    return out


def test_claude_counts_follow_reported_usage_better_than_cl100k() -> None:
    """With the best constant ratio chosen in hindsight for each counter, the changes
    between consecutive Claude requests are missed by much less with the Claude
    vocabulary (measured: 0.24% against 0.31% of the request, mean)."""
    changes = _claude_changes()
    assert len(changes) > 150
    claude, cl100k = ClaudeCounter(), load_cl100k()

    def residual(count: Callable[[str], int]) -> float:
        local = [sum(count(t) for t in texts) for _, _, texts in changes]
        ratio = sum(c[0] for c in changes) / sum(local)
        return sum(
            abs(rep - ratio * n) / total for (rep, total, _), n in zip(changes, local, strict=True)
        ) / len(changes)

    ours = residual(claude.count)
    reference = residual(lambda t: int(cl100k.count(t)))
    assert ours < 0.85 * reference, (ours, reference)
    assert ours < 0.26 / 100
