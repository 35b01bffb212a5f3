"""tool_search's memo of each deferred tool's words (tool_search._SpecWords): every
compile of a turn that called tool_search runs its searches again over the registry, so
the words of each tool are remembered. A memo of a pure function: the answers must be
the ones the words give when split anew, whatever the memo holds, and it stays within
its bytes."""

from __future__ import annotations

import tracemalloc

from hypothesis import given, settings
from hypothesis import strategies as st

from server.compiler import tool_search
from server.compiler.tool_search import _SpecWords, name_words, search_tools, words_of
from server.domain.tools import ToolSpec, ToolVisibility


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
