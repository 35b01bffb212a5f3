"""Tokenizer tables are built on first use: only the families a daemon counts for, once
each however many compiles meet at the first use, and one family's build never holds up
another's counts."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from server.adapters import tokenizer
from server.adapters.catalog import load_catalog
from server.adapters.tokenizer import (
    TABLES,
    CounterRegistry,
    TokenizerTable,
    load_claude,
    load_o200k,
    loaded_tokenizers,
    preload_tokenizers,
)
from server.domain.catalog import TOKENIZER_TABLES
from tests.e2e.proc import REPO

TEXT = "Контекст — the context of one request, counted 12345 times.\n" * 40


@pytest.fixture
def fresh() -> Iterator[None]:
    """No table built when the test starts; built ones are kept for later tests."""
    tokenizer.forget_tokenizers()
    yield


def test_every_catalog_tokenizer_has_a_table() -> None:
    assert set(TABLES) == set(TOKENIZER_TABLES)


def test_a_table_is_built_by_the_first_count_of_its_family_only(fresh: None) -> None:
    catalog = load_catalog()
    registry = CounterRegistry()
    counters = {
        model: registry.for_model(catalog.lookup(model))
        for model in ("claude-sonnet-4-20250514", "gpt-4o", "gpt-4-turbo", "mistral-small")
    }
    assert loaded_tokenizers() == frozenset()  # choosing a counter builds nothing
    counters["claude-sonnet-4-20250514"].count(TEXT)
    assert loaded_tokenizers() == {"claude"}
    counters["mistral-small"].count(TEXT)  # character classes: no table
    counters["gpt-4o"].count(TEXT)
    assert loaded_tokenizers() == {"claude", "o200k"}
    counters["gpt-4-turbo"].count(TEXT)
    assert loaded_tokenizers() == {"claude", "o200k", "cl100k"}


def test_preloaded_and_lazy_tables_count_alike(fresh: None) -> None:
    catalog = load_catalog()
    models = ("claude-sonnet-4-20250514", "gpt-4o", "gpt-4-turbo", "llama-4-maverick")
    lazy = [CounterRegistry().for_model(catalog.lookup(m)).count(TEXT) for m in models]
    tokenizer.forget_tokenizers()
    preload_tokenizers(TOKENIZER_TABLES)
    assert loaded_tokenizers() == set(TOKENIZER_TABLES)
    preloaded = [CounterRegistry().for_model(catalog.lookup(m)).count(TEXT) for m in models]
    assert preloaded == lazy
    assert len(set(lazy)) > 1  # the families really count differently


def test_first_uses_that_meet_build_the_table_once() -> None:
    """Eight compiles arrive while the table is still being built: one build, one table."""
    calls = 0
    started = threading.Event()

    def slow_build() -> object:
        nonlocal calls
        calls += 1
        started.set()
        time.sleep(0.2)  # the others arrive meanwhile
        return object()

    table = TokenizerTable("slow", slow_build)
    with ThreadPoolExecutor(8) as pool:
        first = pool.submit(table.get)
        assert started.wait(60)
        rest = [pool.submit(table.get) for _ in range(7)]
        got = {id(f.result(60)) for f in [first, *rest]}
    assert calls == 1 and table.builds == 1
    assert len(got) == 1


def test_the_real_tables_are_built_once_under_concurrent_first_use(fresh: None) -> None:
    builds = TABLES["o200k"].builds
    barrier = threading.Barrier(6)

    def first_use() -> int:
        barrier.wait(60)
        return id(load_o200k())

    with ThreadPoolExecutor(6) as pool:
        ids = set(pool.map(lambda _: first_use(), range(6)))
    assert len(ids) == 1
    assert TABLES["o200k"].builds == builds + 1


def test_one_familys_build_does_not_hold_up_another(
    fresh: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GPT-4o compile building o200k must not make a Claude compile wait for it."""
    release = threading.Event()
    building = threading.Event()

    # Bounds, not waits: a loaded machine may take seconds to build the Claude table,
    # and the stuck build outlasts the Claude count's bound, so a count that waited for
    # it fails instead of passing once the stuck build gives up.
    def stuck_build() -> Any:
        building.set()
        release.wait(120)
        return object()

    monkeypatch.setattr(TABLES["o200k"], "_build", stuck_build)
    gpt = threading.Thread(target=load_o200k)
    gpt.start()
    claude = ThreadPoolExecutor(1)
    try:
        assert building.wait(60)
        result = claude.submit(lambda: load_claude()("hello world"))
        assert result.result(timeout=60) == 2  # while o200k is still being built
    finally:
        release.set()
        claude.shutdown()
        gpt.join(60)
        tokenizer.forget_tokenizers()  # drop the stand-in table


def test_bpe_tables_skip_the_packages_python_rank_tables() -> None:
    """bpe-openai's `__init__` builds Python dicts of every rank file it ships (~68 MB,
    ~0.6 s); the daemon loads the Rust extension alone. Importing the package later
    still works and shares that extension."""
    script = (
        "import sys\n"
        "from server.adapters.tokenizer import load_cl100k, load_o200k\n"
        "n = load_o200k().count('hello world') + load_cl100k().count('hello world')\n"
        "print(n, 'bpe_openai' in sys.modules, 'bpe_openai.registry' in sys.modules)\n"
        "import bpe_openai\n"
        "print(bpe_openai.get_encoding('o200k_base').encode('hello world'))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.splitlines()
    assert out[0] == "4 False False"
    assert out[1] == "[24912, 2375]"  # o200k_base's ids for these words
