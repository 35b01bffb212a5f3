"""tool_search's memo of each deferred tool's words (tool_search._SpecWords): every
compile of a turn that called tool_search runs its searches again over the registry, so
the words of each tool are remembered. A memo of a pure function: the answers must be
the ones the words give when split anew, whatever the memo holds, and it stays within
its bytes."""

from __future__ import annotations

import json
import tracemalloc
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from server.compiler import compile as compile_module
from server.compiler import tool_search
from server.compiler.builtin_tools import TOOL_SEARCH
from server.compiler.compile import searched_in_turn
from server.compiler.tool_search import _SpecWords, name_words, search_tools, words_of
from server.domain.model import (
    AssistantMessage,
    ContentPart,
    Event,
    ToolCall,
    ToolResult,
    UserMessage,
)
from server.domain.tools import REGISTRY_SEARCHES, ToolRegistry, ToolSpec, ToolVisibility


def reference(
    registry: list[ToolSpec], query: str, most: int, any_script: bool, forms: bool
) -> list[str]:
    """The ranking as defined (tool_search's docstring), every text split anew."""
    words = words_of(any_script, forms)
    terms = words(query)
    if not terms:
        return []
    scored = []
    for spec in registry:
        if spec.visibility != ToolVisibility.DEFERRED:
            continue
        score = (
            3 * len(terms & name_words(spec.name, any_script, forms))
            + 2 * len(terms & set().union(*(words(k) for k in spec.search_keywords)))
            + len(terms & words(spec.description))
        )
        if score:
            scored.append((-score, spec.name))
    return [name for _, name in sorted(scored)[: most or tool_search.DEFAULT_MAX_RESULTS]]


_WORD = st.sampled_from(
    ["read", "file", "files", "Grep", "pull", "requests", "翻译文本", "ファイル", "x1", "queries"]
)
_TEXT = st.lists(_WORD, max_size=30).map(" ".join)
_SPEC = st.builds(
    lambda name, description, keywords, deferred: ToolSpec(
        name=name,
        description=description,
        input_schema_json="{}",
        visibility=ToolVisibility.DEFERRED if deferred else ToolVisibility.DIRECT,
        search_keywords=tuple(keywords),
    ),
    st.sampled_from(["read_file", "grep", "open_pr", "翻译", "tool", "tools", "ReadFiles"]),
    _TEXT,
    st.lists(_WORD, max_size=3),
    st.booleans(),
)


@settings(max_examples=200, deadline=None)
@given(
    registries=st.lists(st.lists(_SPEC, max_size=8), min_size=1, max_size=4),
    query=_TEXT,
    most=st.integers(0, 4),
    any_script=st.booleans(),
    forms=st.booleans(),
)
def test_searches_answer_as_the_words_split_anew(
    registries: list[list[ToolSpec]], query: str, most: int, any_script: bool, forms: bool
) -> None:
    # Registries one after another (a tool's description or keywords edited between
    # them, under the same name): each search sees the words of the texts it is given.
    for registry in registries:
        for _ in range(2):  # the second search answers from the memo
            found = search_tools(registry, query, most, any_script=any_script, forms=forms)
            assert [s.name for s in found] == reference(registry, query, most, any_script, forms)


def test_an_edited_description_is_searched_as_edited() -> None:
    old = ToolSpec("deploy", "ship the build", "{}", ToolVisibility.DEFERRED)
    new = ToolSpec("deploy", "roll back the release", "{}", ToolVisibility.DEFERRED)
    assert [s.name for s in search_tools([old], "release")] == []
    assert [s.name for s in search_tools([new], "release")] == ["deploy"]
    assert [s.name for s in search_tools([old], "release")] == []


def test_the_memo_stays_within_its_bytes() -> None:
    memo = _SpecWords(max_bytes=64 << 10)
    for i in range(500):
        spec = ToolSpec(
            f"tool_{i}", " ".join(f"w{i}x{k}" for k in range(50)), "{}", ToolVisibility.DEFERRED
        )
        words = memo.get(spec, True, True)
        assert f"w{i}x7" in words[2]
        assert memo._bytes <= 64 << 10
    assert 0 < len(memo._items) < 500  # the oldest went
    assert memo._bytes == sum(size for _, size in memo._items.values())
    # A tool whose words alone are over the bytes is answered, not kept.
    huge = ToolSpec("huge", " ".join(f"h{k}" for k in range(5_000)), "{}", ToolVisibility.DEFERRED)
    assert len(memo.get(huge, True, True)[2]) == 5_000
    assert memo._bytes <= 64 << 10


def test_the_bytes_counted_are_the_bytes_held() -> None:
    """The memo's bound is in the bytes its word sets take: a word's characters and 64
    bytes counted 2.1 times under what CJK words hold (4 bytes a character past the
    Latin-1 range, a str's 80-byte header) and 1.4 times under for ASCII ones, so the
    32 MiB memo held up to ~67 MiB."""
    for alphabet in ("abcdefghijklmnopqrstuvwxyz", "".join(map(chr, range(0x4E00, 0x4F00)))):
        memo = _SpecWords(max_bytes=1 << 40)
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for i in range(50):
                words = (alphabet[(i * 7 + k) % len(alphabet) :][:4] + str(k) for k in range(300))
                memo.get(
                    ToolSpec(f"t{i}", " ".join(words), "{}", ToolVisibility.DEFERRED), True, True
                )
            held = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        # What the memo's own dict and keys take besides the words is not counted.
        assert 0.9 < held / memo._bytes < 1.15, (alphabet[:3], held, memo._bytes)


def _turn(*queries: str) -> tuple[Event, ...]:
    """A turn whose assistant called tool_search once per query, each call answered."""
    calls = tuple(
        ToolCall(f"q{i}", TOOL_SEARCH.name, json.dumps({"query": q})) for i, q in enumerate(queries)
    )
    events: list[Event] = [Event(1, "e1", 0, UserMessage((ContentPart(text="go"),)))]
    events.append(Event(2, "e2", 0, AssistantMessage((), calls)))
    for i in range(len(queries)):
        events.append(Event(3 + i, f"e{3 + i}", 0, ToolResult(f"q{i}", TOOL_SEARCH.name, "ok")))
    return tuple(events)


@settings(max_examples=200, deadline=None)
@given(
    registry=st.lists(_SPEC, max_size=8),
    queries=st.lists(_TEXT, min_size=1, max_size=3),
    any_script=st.booleans(),
    forms=st.booleans(),
)
def test_a_registry_remembers_what_its_searches_found(
    registry: list[ToolSpec], queries: list[str], any_script: bool, forms: bool
) -> None:
    """The loader keeps a session's tools as one ToolRegistry between compiles, which
    remembers what each query found: the turn's searches at the next step answer as a
    plain tuple's (searched anew), and without searching again."""
    kept = ToolRegistry(registry)
    turn = _turn(*queries)
    plain = searched_in_turn(turn, tuple(registry), any_script=any_script, forms=forms)
    assert searched_in_turn(turn, kept, any_script=any_script, forms=forms) == plain
    assert len(kept.searches) == len(set(queries))
    searched: list[str] = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        searched.append(args[1])
        return search_tools(*args, **kwargs)

    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(compile_module, "search_tools", counted)
        again = searched_in_turn(turn, kept, any_script=any_script, forms=forms)
        other_rule = searched_in_turn(turn, kept, any_script=not any_script, forms=forms)
    assert again == plain
    # Another word rule (an older compile's tool capping version) is another search.
    assert searched == list(dict.fromkeys(queries))
    assert other_rule == searched_in_turn(
        turn, tuple(registry), any_script=not any_script, forms=forms
    )


def test_a_registry_remembers_a_bounded_number_of_queries() -> None:
    kept = ToolRegistry([ToolSpec("grep", "search files", "{}", ToolVisibility.DEFERRED)])
    queries = [f"files {i}" for i in range(REGISTRY_SEARCHES + 5)]
    assert searched_in_turn(_turn(*queries), kept) == {"grep"}
    assert len(kept.searches) == REGISTRY_SEARCHES
