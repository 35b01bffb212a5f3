"""The system prompt of a compile, remembered: its source sections, its sections in
R-SYS order, the prompt joined and the digests of its sections.

A step's system prompt is nearly always its previous step's: it is a function of the
session's sources, the paths the current turn names, the kernel text, the approval
mode, the environment (its time cut to a granule), the excluded sections and the token
counter, and none of these changes from one step to the next but the paths, rarely. The
sources are the very object the service keeps between writes of their tables (and the
counter one object per tokenizer), so they are matched by identity, the rest by value.
A memo of a pure function: every value it answers is the one the functions it stands
for return for those inputs (the property tests compare incremental compiles with
compiles from scratch, which pass it by).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from server.compiler.sources import BuiltSources, SourceInputs, build_source_sections
from server.compiler.system import (
    ApprovalMode,
    EnvironmentInfo,
    assemble,
    join_sections,
    prefix_digest,
)
from server.compiler.tokens import TokenCounter
from server.compiler.view import SectionKind, SystemSection

_SIZE = 256


@dataclass(frozen=True, slots=True)
class Prompt:
    built: BuiltSources
    sections: tuple[SystemSection, ...]
    text: str
    # prefix_digest(sections), and (kind, digest) of each section (section_digests
    # without the tools).
    stable_digest: str
    digests: tuple[tuple[int, str], ...]


def section_text_digests(sections: Sequence[SystemSection]) -> tuple[tuple[int, str], ...]:
    return tuple((int(s.kind), hashlib.sha256(s.text.encode()).hexdigest()[:32]) for s in sections)


@dataclass(frozen=True, slots=True)
class PromptInputs:
    """What a system prompt is made of, besides the token counter."""

    sources: SourceInputs
    paths: tuple[str, ...]
    kernel_text: str
    approval_mode: ApprovalMode
    environment: EnvironmentInfo
    exclude: frozenset[SectionKind]

    def key(self) -> tuple[object, ...]:
        """The sources by identity (the service keeps the object), the rest by value."""
        return (
            id(self.sources),
            self.paths,
            self.kernel_text,
            self.approval_mode,
            self.environment,
            self.exclude,
        )


def made(inputs: PromptInputs, counter: TokenCounter) -> Prompt:
    """The prompt, made now."""
    built = build_source_sections(inputs.sources, inputs.paths, counter)
    sections = assemble(
        kernel_text=inputs.kernel_text,
        approval_mode=inputs.approval_mode,
        environment=inputs.environment,
        extra=built.sections,
        exclude=inputs.exclude,
        counter=counter,
    )
    return Prompt(
        built,
        sections,
        join_sections(sections),
        prefix_digest(sections),
        section_text_digests(sections),
    )


class _Prompts:
    def __init__(self, size: int) -> None:
        self._size = size
        self._lock = threading.Lock()
        # key -> (sources, counter, prompt): the two matched by identity are held, so
        # their ids cannot name other objects while the entry lives.
        self._items: OrderedDict[tuple[object, ...], tuple[object, object, Prompt]] = OrderedDict()

    def get(
        self, inputs: PromptInputs, counter: TokenCounter, counter_key: object, recall: bool
    ) -> Prompt:
        key = (id(counter_key), *inputs.key())
        with self._lock:
            hit = self._items.get(key) if recall else None
            if hit is not None and hit[0] is inputs.sources and hit[1] is counter_key:
                self._items.move_to_end(key)
                return hit[2]
        prompt = made(inputs, counter)
        with self._lock:
            self._items[key] = (inputs.sources, counter_key, prompt)
            self._items.move_to_end(key)
            while len(self._items) > self._size:
                self._items.popitem(last=False)
        return prompt


_PROMPTS = _Prompts(_SIZE)


def system_prompt(
    inputs: PromptInputs, counter: TokenCounter, counter_key: object, *, recall: bool = True
) -> Prompt:
    """The system prompt these inputs make (see the module's docstring). `counter` counts
    (it may also check the compile's budget); `counter_key` is the counter that answers
    its counts (one object per tokenizer). Without `recall` it is made afresh, as a
    compile from scratch does, and remembered for the next."""
    return _PROMPTS.get(inputs, counter, counter_key, recall)
