"""The system prompt of a compile, remembered: its source sections, its sections in
R-SYS order, the prompt joined and the digests of its sections.

A step's system prompt is nearly always its previous step's: it is a function of the
session's sources, the paths the current turn names, the kernel text, the approval
mode, the environment (its time cut to a granule), the excluded sections and the token
counter, and none of these changes from one step to the next but the paths, rarely. The
sources are the very object the service keeps between writes of their tables (and the
counter one object per tokenizer): the counter is matched by identity, the rest by
value (sources read from workspace files are equal values made anew).
The prompt rides in the compile's memo (a frozen value the service keeps, bounded, per
session and route) to the session's next compile: nothing is kept here. Every value it
answers is the one the functions it stands for return for those inputs (the property
tests compare incremental compiles with compiles from scratch, which pass it by).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
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


@dataclass(frozen=True, slots=True)
class RememberedPrompt:
    """A compile's system prompt with what it was made from, kept in the compile's memo
    (projection_memo.ProjectionMemo.prompt) for the session's next compile. It holds the
    sources and the counter it matches by identity, so their ids name no other objects
    while it lives."""

    inputs: PromptInputs
    counter_key: object
    prompt: Prompt


def any_prompt(inputs: PromptInputs) -> None:
    """Any prompt may be made anew (the default of a `before_making`)."""


def system_prompt(
    inputs: PromptInputs,
    counter: TokenCounter,
    counter_key: object,
    previous: RememberedPrompt | None = None,
    before_making: Callable[[PromptInputs], None] = any_prompt,
) -> RememberedPrompt:
    """The system prompt these inputs make (see the module's docstring): `previous`'s (the
    last compile's of the session, from its memo) when its inputs are these, else made
    now. `counter` counts (it may also check the compile's budget); `counter_key` is the
    counter that answers its counts (one object per tokenizer). `before_making` is called
    before a prompt is made anew, and may raise to stop the compile: making one walks
    every source (~190 ms for 10 MB of rule files), which the service keeps off its light
    lane."""
    if previous is not None and _same(previous, inputs, counter_key):
        return previous
    before_making(inputs)
    return RememberedPrompt(inputs, counter_key, made(inputs, counter))


def _same(previous: RememberedPrompt, inputs: PromptInputs, counter_key: object) -> bool:
    """The counter by identity (one per tokenizer), the inputs by value. The service
    keeps the sources object between writes of their tables, so the usual comparison
    finds the same object and compares only the rest (a tuple comparison tries identity
    first); sources read from workspace files are made anew at every compile, and equal
    ones are compared whole (memcmp-fast: ~1 ms for 10 MB of rules, against ~240 ms to
    make their prompt again)."""
    return previous.counter_key is counter_key and previous.inputs == inputs
