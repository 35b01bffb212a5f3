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
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence

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


def _ascii_words(text: str) -> set[str]:
    return set(_ASCII_WORD.findall(text.lower().replace("_", " ")))


def _unicode_words(text: str) -> set[str]:
    if text.isascii():  # NFKC and casefold are lower(); the words are ASCII ones
        return _ascii_words(text)
    words: set[str] = set()
    for run in set(_RUN.findall(unicodedata.normalize("NFKC", text).casefold())):
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


def search_tools(
    registry: Sequence[ToolSpec], query: str, max_results: int = 0, *, any_script: bool = True
) -> list[ToolSpec]:
    """Deferred tools matching the query, best first: name words count three times,
    keywords twice, description once; ties break by name. `any_script` False: words of
    ASCII letters and digits only (compiles recorded before tool_cap.TOOL_CAPPING 3)."""
    words = _unicode_words if any_script else _ascii_words
    terms = words(query)
    if not terms:
        return []
    scored: list[tuple[int, str, ToolSpec]] = []
    for spec in registry:
        if spec.visibility != ToolVisibility.DEFERRED:
            continue
        name_words = words(spec.name) | {spec.name.lower()}
        keyword_words = set().union(*(words(k) for k in spec.search_keywords))
        score = (
            3 * len(terms & name_words)
            + 2 * len(terms & keyword_words)
            + len(terms & words(spec.description))
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
