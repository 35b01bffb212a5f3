"""Tool definitions of a session's registry (R-TOOL-1)."""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass


class ToolVisibility(enum.IntEnum):
    DIRECT = 1
    DEFERRED = 2
    HIDDEN = 3


@dataclass(frozen=True, slots=True)
class ToolSpec:
    name: str
    description: str
    input_schema_json: str
    visibility: ToolVisibility = ToolVisibility.DIRECT
    search_keywords: tuple[str, ...] = ()


# Queries whose found tools one registry remembers (a turn makes a few searches).
REGISTRY_SEARCHES = 256


class ToolRegistry(tuple[ToolSpec, ...]):
    """A session's tools as the history loader keeps them between compiles (the same
    object until the registry changes), with what each tool_search query found in them:
    every compile of a turn that called tool_search runs its searches again (R-TOOL-2),
    ~0.3 ms each over 200 deferred tools at every step. A memo of a pure function that
    lives and dies with the tools it was made from; a plain tuple (a rebuild's tools,
    a registry the route's tool cap changed) searches every time, to the same result."""

    def __init__(self, _tools: Iterable[ToolSpec] = ()) -> None:
        # (query, any_script, forms) -> names found; written from compile threads (one
        # dict operation each, whole under the GIL; two compiles may both search).
        self.searches: dict[tuple[str, bool, bool], frozenset[str]] = {}


@dataclass(frozen=True, slots=True)
class ToolActivations:
    """Deferred tools activated by SearchTools in one turn (the turn's first seq)."""

    turn_seq: int
    names: tuple[str, ...]
