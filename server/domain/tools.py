"""Tool definitions of a session's registry (R-TOOL-1)."""

from __future__ import annotations

import enum
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


@dataclass(frozen=True, slots=True)
class ToolActivations:
    """Deferred tools activated by SearchTools in one turn (the turn's first seq)."""

    turn_seq: int
    names: tuple[str, ...]
