"""Deterministic search over deferred tools (R-TOOL-1, R-TOOL-2).

The same function serves the SearchTools RPC and the replay of `tool_search` calls
found in the log, so an activation derived from the log at compile time is exactly
what the agent was shown when it ran the tool.

Words are letters and digits of any script, case-folded after NFKC (so full-width
forms match their ASCII twins). Chinese, Japanese and Korean text has no spaces between
words: a run of those characters counts as its overlapping character pairs (a lone
character as itself), so a query "翻译" finds a tool described as "翻译文本". Compiles
recorded before this (tool_cap.TOOL_CAPPING < 3) replay their searches with the first
way, ASCII letters and digits only, under which such a tool could not be found.

A word and its plural or third-person `s` form are one word (`_singular`, Harman's "S"
stemmer): a model's "edit a file" finds Gemini CLI's `replace`, which "is preferred for
surgical edits to existing files", and "list issue" finds `list_issues`. A name written
in camel case has its parts as words too (`TodoWrite`: "todo", "write", besides
"todowrite"), as a snake-case name has: "todo list" finds Claude Code's `TodoWrite` by
its name. Compiles recorded before this (tool_cap.TOOL_CAPPING 3 or less) replay their
searches with words as written, under which none of these was found.
"""

from __future__ import annotations

import functools
import itertools
import re
import sys
import threading
import unicodedata
from collections import OrderedDict
from collections.abc import Callable, Sequence

from server.compiler.textscan import parse_json
from server.domain.tools import ToolSpec, ToolVisibility

_ASCII_WORD = re.compile(r"[a-z0-9]+")
# Han (with its extensions and compatibility forms), kana and Hangul.
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\U00020000-\U0003ffff"
# A run of letters, digits and CJK characters, split below into its CJK runs and the rest
# (one pattern with a lookahead per character made a search of 512 descriptions of 64 KB
# take ~5 s of CPU; this, ~1 s, as ASCII words did).
_RUN = re.compile(f"(?:[^\\W_]|[{_CJK}])+")
_CJK_RUN = re.compile(f"[{_CJK}]+")
DEFAULT_MAX_RESULTS = 5


def _singular(word: str) -> str:
    """The word without a plural or third-person `s`, by Harman's "S" stemmer (1991):
    "-ies" becomes "-y" (not after "a" or "e"), a final "s" goes (not after "u" or "s":
    "status", "class"); words of three characters or fewer stay ("has", "its"). Both
    sides of a match are folded alike, so an odd stem ("branche") still meets itself."""
    if len(word) <= 3 or word[-1] != "s" or word.endswith(("us", "ss")):
        return word
    if word.endswith("ies") and not word.endswith(("aies", "eies")):
        return word[:-3] + "y"
    return word[:-1]


# Where a camel-case name's parts meet: a lower-case letter or digit before a capital
# (`TodoWrite`), or a capital before a capitalised word (`HTTPRequest`).
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")


def name_words(name: str, any_script: bool, forms: bool) -> set[str]:
    """A tool's name's words, and the name itself as one word (a query naming the tool
    finds it); with `forms`, camel-case parts split and plurals folded."""
    whole = {name.lower()}
    if not forms:
        return words_of(any_script, forms)(name) | whole
    return words_of(any_script, forms)(_CAMEL.sub(" ", name)) | _folded(whole)


def _folded(words: set[str]) -> set[str]:
    return {_singular(w) for w in words}


def words_of(any_script: bool, forms: bool) -> Callable[[str], set[str]]:
    """How a version of tool_search splits text into words: of any script or ASCII only
    (tool_cap.TOOL_CAPPING 3), plural forms folded or not (4; names: name_words)."""
    split = _unicode_words if any_script else _ascii_words
    return (lambda text: _folded(split(text))) if forms else split


def _ascii_words(text: str) -> set[str]:
    return set(_ASCII_WORD.findall(text.lower().replace("_", " ")))


# CPython's NFKC puts each run of combining marks in canonical order by insertion sort,
# in one C call holding the GIL: quadratic in a run out of order. 32,000 marks in a
# logged tool_search query held every session ~2.6 s at each compile of its turn (the
# query's 1 MiB would hold them for minutes), and a 64 KB description ~5 s. Runs longer
# than this are put in that order first, so NFKC finds them sorted.
_LONG_MARKS = 32


@functools.cache
def _long_marks() -> re.Pattern[str]:
    """Runs of more than _LONG_MARKS characters whose decomposition starts with a
    non-starter (combining class not 0): the marks, and five that are starters
    themselves (Tibetan U+0F73, U+0F75, U+0F81; half-width U+FF9E, U+FF9F). Other
    characters decompose to a starter first, which ends a run. Built on first use."""
    marks = []
    for code in range(sys.maxunicode + 1):
        ch = chr(code)
        if unicodedata.combining(ch) or (
            unicodedata.decomposition(ch)
            and unicodedata.combining(unicodedata.normalize("NFKD", ch)[0])
        ):
            marks.append(re.escape(ch))
    return re.compile(f"[{''.join(marks)}]{{{_LONG_MARKS + 1},}}")


def _marks_ordered(run: re.Match[str]) -> str:
    """A run decomposed and each of its stretches of non-starters stably sorted by
    combining class: what NFKD makes of it (each character's own decomposition is
    already ordered), so NFKC of the text is unchanged."""
    decomposed = "".join(unicodedata.normalize("NFKD", ch) for ch in run.group())
    out: list[str] = []
    for marks, part in itertools.groupby(decomposed, key=_is_mark):
        if not marks:
            out.extend(part)
            continue
        # By class in a loop of our own: sorted() with a C key function holds the GIL
        # for the whole run (~0.2 s for 400,000 marks).
        by_class: dict[int, list[str]] = {}
        for ch in part:
            by_class.setdefault(unicodedata.combining(ch), []).append(ch)
        for ccc in sorted(by_class):
            out.extend(by_class[ccc])
    return "".join(out)


def _is_mark(ch: str) -> bool:
    return unicodedata.combining(ch) != 0


def nfkc(text: str) -> str:
    """unicodedata.normalize("NFKC", text), in time linear in the text."""
    return unicodedata.normalize("NFKC", _long_marks().sub(_marks_ordered, text))


def _unicode_words(text: str) -> set[str]:
    if text.isascii():  # NFKC and casefold are lower(); the words are ASCII ones
        return _ascii_words(text)
    words: set[str] = set()
    for run in set(_RUN.findall(nfkc(text).casefold())):
        if run.isascii():
            words.add(run)
            continue
        rest = 0
        for cjk in _CJK_RUN.finditer(run):
            if cjk.start() > rest:
                words.add(run[rest : cjk.start()])
            pairs = cjk.group()
            words.update(pairs[i : i + 2] for i in range(max(1, len(pairs) - 1)))
            rest = cjk.end()
        if rest < len(run):
            words.add(run[rest:])
    return words


class _SpecWords:
    """The words of deferred tools seen recently (of the name, the keywords and the
    description), keyed by their texts' (hash, length) and the word rule, so that no
    text is kept alive; at most `max_bytes` of word sets (about what they hold). Every
    compile in a turn that called tool_search runs its searches again over the whole
    registry (R-TOOL-2: the activation is derived from the log): 200 deferred tools of
    ~2.5 KB each cost ~28 ms of CPU a search, at every step; with their words
    remembered, ~0.5 ms (hashes the strings have cached and a dict lookup a tool). A
    memo of a pure function: answers are the same with or without it (as in
    path_memo.py)."""

    def __init__(self, max_bytes: int) -> None:
        self._max = max_bytes
        self._bytes = 0
        self._lock = threading.Lock()
        self._items: OrderedDict[tuple[int, ...], tuple[_Words, int]] = OrderedDict()

    def get(self, spec: ToolSpec, any_script: bool, forms: bool) -> _Words:
        text = spec.description
        key = (
            hash(spec.name),
            hash(spec.search_keywords),
            hash(text),
            len(text),
            any_script,
            forms,
        )
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
                return hit[0]
        words = words_of(any_script, forms)
        found = (
            frozenset(name_words(spec.name, any_script, forms)),
            frozenset(set().union(*(words(k) for k in spec.search_keywords))),
            frozenset(words(text)),
        )
        size = _SPEC_BYTES + sum(_set_bytes(part) for part in found)
        if size > self._max:
            return found
        with self._lock:
            if key not in self._items:
                self._items[key] = (found, size)
                self._bytes += size
            while self._bytes > self._max:
                _, (_, gone) = self._items.popitem(last=False)
                self._bytes -= gone
        return found


def _set_bytes(words: frozenset[str]) -> int:
    """What a word set holds: its table and its words, each a str of its own (a word's
    characters and 64 bytes counted 2.1 times under what CJK words hold, 4 bytes a
    character past Latin-1 and an 80-byte header, and 1.4 to 1.6 times under for ASCII
    ones: the 32 MiB memo held up to ~67 MiB)."""
    return sys.getsizeof(words) + sum(map(sys.getsizeof, words))


# A tool's words: of its name (and the name itself), its keywords, its description.
_Words = tuple[frozenset[str], frozenset[str], frozenset[str]]
# What a tool's entry costs besides its word sets: its key, the tuples, the dict's slot.
_SPEC_BYTES = 512
_WORDS = _SpecWords(32 << 20)


def search_tools(
    registry: Sequence[ToolSpec],
    query: str,
    max_results: int = 0,
    *,
    any_script: bool = True,
    forms: bool = True,
) -> list[ToolSpec]:
    """Deferred tools matching the query, best first: name words count three times,
    keywords twice, description once; ties break by name. `any_script` False: words of
    ASCII letters and digits only (compiles recorded before tool_cap.TOOL_CAPPING 3);
    `forms` False: plural forms not folded nor camel-case names split (before
    TOOL_CAPPING 4)."""
    terms = words_of(any_script, forms)(query)
    if not terms:
        return []
    scored: list[tuple[int, str, ToolSpec]] = []
    for spec in registry:
        if spec.visibility != ToolVisibility.DEFERRED:
            continue
        in_name, in_keywords, in_description = _WORDS.get(spec, any_script, forms)
        score = (
            3 * len(terms & in_name) + 2 * len(terms & in_keywords) + len(terms & in_description)
        )
        if score:
            scored.append((-score, spec.name, spec))
    scored.sort(key=lambda t: (t[0], t[1]))
    return [spec for _, _, spec in scored[: max_results or DEFAULT_MAX_RESULTS]]


def query_of(arguments_json: str) -> str:
    """The `query` argument of a tool_search call; tolerant of malformed JSON."""
    _, args = parse_json(arguments_json or "{}")
    query = args.get("query") if isinstance(args, dict) else None
    return query if isinstance(query, str) else ""
