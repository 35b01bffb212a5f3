"""Sources of the system prompt: memory, rules, skills and instruction files.

Entries registered over the API and entries read from workspace files share these
values; `origin` says where each came from (an API id or a file path) so the view can
tag every section with its source.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Scope(enum.IntEnum):
    GLOBAL = 1
    PROJECT = 2
    SESSION = 3


class Authority(enum.IntEnum):
    KERNEL = 1
    OPERATOR = 2
    USER_CONTROLLABLE = 3
    UNTRUSTED = 4


class RuleActivation(enum.IntEnum):
    ALWAYS = 1
    ON_DEMAND = 2
    MATCHED = 3


class SourceKind(enum.Enum):
    MEMORY = "memory"
    RULE = "rule"
    SKILL = "skill"


@dataclass(frozen=True, slots=True)
class MemoryEntry:
    memory_id: str
    scope: Scope
    scope_id: str
    text: str
    update_time_ns: int = 0
    origin: str = ""


@dataclass(frozen=True, slots=True)
class RuleEntry:
    rule_id: str
    scope: Scope
    scope_id: str
    name: str
    description: str
    text: str
    activation: RuleActivation
    path_globs: tuple[str, ...] = ()
    update_time_ns: int = 0
    origin: str = ""


@dataclass(frozen=True, slots=True)
class SkillEntry:
    skill_id: str
    scope: Scope
    scope_id: str
    name: str
    description: str
    load_hint: str
    enabled: bool = True
    update_time_ns: int = 0
    origin: str = ""


SourceEntry = MemoryEntry | RuleEntry | SkillEntry


def entry_id(entry: SourceEntry) -> str:
    match entry:
        case MemoryEntry(memory_id=i) | RuleEntry(rule_id=i) | SkillEntry(skill_id=i):
            return i
    raise TypeError(type(entry).__name__)  # pragma: no cover - exhaustive above


def kind_of_entry(entry: SourceEntry) -> SourceKind:
    if isinstance(entry, MemoryEntry):
        return SourceKind.MEMORY
    if isinstance(entry, RuleEntry):
        return SourceKind.RULE
    return SourceKind.SKILL


@dataclass(frozen=True, slots=True)
class InstructionFile:
    """One instruction file as read by the workspace adapter."""

    path: str
    scope: Scope
    text: str
    # True when invalid UTF-8 was replaced while decoding; the view reports it.
    decode_replaced: bool = False
    # How notes name the file: relative to its root, never the daemon's absolute path.
    display: str = ""


@dataclass(frozen=True, slots=True)
class WorkspaceSources:
    """Everything the workspace adapter found for one compile, plus what it skipped."""

    instruction_files: tuple[InstructionFile, ...] = ()
    skills: tuple[SkillEntry, ...] = ()
    rules: tuple[RuleEntry, ...] = ()
    memory: tuple[MemoryEntry, ...] = ()
    notes: tuple[str, ...] = ()
