"""Deterministic search over deferred tools (R-TOOL-1, R-TOOL-2).

The same function serves the SearchTools RPC and the replay of `tool_search` calls
found in the log, so an activation derived from the log at compile time is exactly
what the agent was shown when it ran the tool.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from server.compiler.textscan import parse_json
from server.domain.tools import ToolSpec, ToolVisibility

_WORD = re.compile(r"[a-z0-9]+")
DEFAULT_MAX_RESULTS = 5


def _words(text: str) -> set[str]:
    return set(_WORD.findall(text.lower().replace("_", " ")))


def search_tools(registry: Sequence[ToolSpec], query: str, max_results: int = 0) -> list[ToolSpec]:
    """Deferred tools matching the query, best first: name words count three times,
    keywords twice, description once; ties break by name."""
    terms = _words(query)
    if not terms:
        return []
    scored: list[tuple[int, str, ToolSpec]] = []
    for spec in registry:
        if spec.visibility != ToolVisibility.DEFERRED:
            continue
        name_words = _words(spec.name) | {spec.name.lower()}
        keyword_words = set().union(*(_words(k) for k in spec.search_keywords))
        score = (
            3 * len(terms & name_words)
            + 2 * len(terms & keyword_words)
            + len(terms & _words(spec.description))
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
