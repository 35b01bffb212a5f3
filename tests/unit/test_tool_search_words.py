"""The words `tool_search` matches (TOOL_CAPPING 3 on): letters and digits of any script,
NFKC and case-folded, CJK runs as their character pairs. The recorded compiles of that
version replay their searches with them, so how they are found must not change what
they are."""

from __future__ import annotations

import re
import unicodedata

from hypothesis import given, settings
from hypothesis import strategies as st

from server.compiler import tool_search
from server.domain.tools import ToolSpec, ToolVisibility

_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\U00020000-\U0003ffff"
# The words as first defined: one pattern, CJK runs and runs of other letters and digits.
_FIRST = re.compile(f"[{_CJK}]+|(?:(?![{_CJK}])[^\\W_])+")


def first_words(text: str) -> set[str]:
    words: set[str] = set()
    for run in _FIRST.findall(unicodedata.normalize("NFKC", text).casefold()):
        if re.match(f"[{_CJK}]", run):
            words.update(run[i : i + 2] for i in range(max(1, len(run) - 1)))
        else:
            words.add(run)
    return words


# Text drawn from what descriptions hold: ASCII, accented and full-width letters, CJK
# (with kana punctuation that is not a word character), Hangul, digits, underscores.
_ALPHABET = st.sampled_from(
    list("abcXYZ019 _-.,\n")
    + list("éÅßİﬁ")
    + ["\uff21", "\uff22", "\uff11"]  # full-width A, B, 1
    + list("翻译文本部署・ファイルを読む")
    + ["\u30a0"]  # the kana double hyphen: in the CJK range, not a word character
    + list("한국어")
    + ["\U00020000", "\U0003fffe", "\u00b2", "\u0661"]
)


@settings(max_examples=600, deadline=None)
@given(st.text(_ALPHABET, max_size=40))
def test_the_words_are_the_first_definitions(text: str) -> None:
    assert tool_search._unicode_words(text) == first_words(text)


def test_ascii_text_has_its_ascii_words() -> None:
    text = "Deploy the_service to PROD-2 now."
    assert tool_search._unicode_words(text) == tool_search._ascii_words(text)
    words = {"deploy", "the", "service", "to", "prod", "2", "now"}
    assert tool_search._unicode_words(text) == words


def test_a_camel_case_name_is_found_by_its_parts() -> None:
    """Claude Code names its tools in camel case (`TodoWrite`, `WebFetch`,
    `NotebookEdit`): from TOOL_CAPPING 4 their parts are words of the name, as a snake-case
    name's are, so a search in those words finds the tool by its name (three points a
    word). Before, only the whole name ("todowrite") matched, and a description that
    said nothing of a todo list left "todo list" finding another tool."""
    registry = [
        ToolSpec(name, text, "{}", ToolVisibility.DEFERRED)
        for name, text in (
            ("TodoWrite", "Creates and updates the structured task list of the session."),
            ("WebFetch", "Retrieves a URL and answers a question about the page."),
            ("NotebookEdit", "Replaces the contents of one cell of a Jupyter notebook."),
            ("list_tasks", "Shows the tasks of the build."),
            ("HTTPRequest", "Sends an arbitrary request."),
        )
    ]

    def first(query: str, *, forms: bool = True) -> str:
        found = tool_search.search_tools(registry, query, forms=forms)
        return found[0].name if found else ""

    assert first("todo list") == "TodoWrite"
    assert first("web fetch") == "WebFetch"
    assert first("edit a notebook") == "NotebookEdit"
    assert first("http request") == "HTTPRequest"
    assert first("TodoWrite") == "TodoWrite"  # the whole name still matches
    # Words as written (compiles recorded before TOOL_CAPPING 4 replay so).
    assert first("todo list", forms=False) == "list_tasks"
    assert first("web fetch", forms=False) == ""


# Combining marks of several classes (220, 230, 232, 240, 202, 1, 8), marks that decompose
# (U+0344), starters that decompose to marks (U+0F73, U+0F75, U+0F81, U+FF9E, U+FF9F),
# starters marks compose with (Latin, Hangul jamo, Oriya U+0B47 with U+0B3E), and a
# compatibility character ending in marks (U+01D5 is Ü with a macron, U+1E9B).
_MARKS = st.sampled_from(
    [chr(c) for c in range(0x300, 0x370)]
    + ["\u0344", "\u0345", "\u0323", "\u0327", "\u0334", "\u3099", "\u0f71", "\u0f72", "\u0f80"]
    + ["\u0f73", "\u0f75", "\u0f81", "\uff9e", "\uff9f", "\u037a", "\u1e9b", "\u01d5"]
    + list("aeuoAEU ")
    + ["\u1100", "\u1161", "\u11a8", "\uac00", "\u0b47", "\u0b3e", "\u304b"]
)


@settings(max_examples=600, deadline=None)
@given(st.text(_MARKS, min_size=30, max_size=200))
def test_runs_of_marks_normalize_as_nfkc_does(text: str) -> None:
    """Long runs of marks are put in canonical order before NFKC (whose own insertion
    sort is quadratic in a run out of order): the result is NFKC's, whatever the run."""
    assert tool_search.nfkc(text) == unicodedata.normalize("NFKC", text)
    assert tool_search._unicode_words(text) == first_words(text)


def test_a_long_run_of_marks_out_of_order_is_normalized_whole() -> None:
    run = "a" + "\u0301" * 40_000 + "\u0316" * 40_000 + "\u0f73" * 1_000 + "b"
    # One run, by class: U+0F71 (129) and U+0F72 (130) of the Tibetan U+0F73, U+0316
    # (220), U+0301 (230); none of the lower classes blocks the first U+0301, which
    # makes á with the a.
    by_class = "\u0f71" * 1_000 + "\u0f72" * 1_000 + "\u0316" * 40_000 + "\u0301" * 39_999
    assert tool_search.nfkc(run) == "\u00e1" + by_class + "b"
