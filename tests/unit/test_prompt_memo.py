"""The system prompt a step takes from prompt_memo.py is the one its inputs make: steps
that continue a memo while one input of the prompt changes (the paths the turn names,
the sources, the approval mode, the environment, the excluded sections, the kernel
text, the tokenizer) give the view compiled from scratch, byte for byte."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from server.compiler.compile import CompileInputs, compile_incremental, compile_view
from server.compiler.projection_memo import ProjectionMemo
from server.compiler.prompt_memo import PromptInputs, system_prompt
from server.compiler.prompt_memo import made as prompt_made
from server.compiler.sources import SourceInputs
from server.compiler.system import ApprovalMode, EnvironmentInfo
from server.compiler.tokens import TokenCounter
from server.compiler.view import CompiledView, SectionKind
from server.domain.model import AssistantMessage, ContentPart, Event, Route, Session, UserMessage
from server.domain.sources import RuleActivation, RuleEntry, Scope
from tests.unit.test_system_prompt import WordCounter

_RULES = SourceInputs(
    rules=(
        RuleEntry(
            "r1",
            Scope.PROJECT,
            "p",
            "tests",
            "",
            "Tests use pytest.",
            RuleActivation.MATCHED,
            ("tests/**/*.py",),
        ),
        RuleEntry("r2", Scope.PROJECT, "p", "style", "", "Use hints.", RuleActivation.ALWAYS),
    )
)


class CharCounter:
    """Another tokenizer: one token per 3 characters."""

    name = "chars"

    def count(self, text: str) -> int:
        return (len(text) + 2) // 3


def _user(seq: int, text: str) -> Event:
    return Event(seq, f"e{seq}", seq, UserMessage((ContentPart(text=text),)))


def _said(seq: int, text: str) -> Event:
    return Event(seq, f"e{seq}", seq, AssistantMessage((ContentPart(text=text),)))


def _start(sid: str = "s") -> CompileInputs:
    return CompileInputs(
        compile_id="c",
        session=Session(sid, 1, 1),
        events=(),
        event_boundary=0,
        route=Route(model="gpt-4o"),
        sources=_RULES,
    )


def _step(
    inputs: CompileInputs,
    memo: ProjectionMemo | None,
    text: str,
    counter: TokenCounter,
    change: dict[str, Any] | None = None,
) -> tuple[CompileInputs, ProjectionMemo | None, CompiledView]:
    """Two events more (a user message with `text`) and `change` applied, compiled from
    `memo`: the view must equal the one compiled from scratch."""
    seq = len(inputs.events)
    events = (*inputs.events, _user(seq + 1, text), _said(seq + 2, f"done {seq}"))
    inputs = replace(inputs, events=events, event_boundary=len(events), **(change or {}))
    view, memo_out, reused = compile_incremental(inputs, counter, memo)
    assert reused or memo is None, "the step continued the memo"
    scratch = compile_view(inputs, counter)
    assert view == replace(scratch, compile_id=view.compile_id), (text, change)
    return inputs, memo_out, view


def _steps(changes: list[dict[str, Any]]) -> None:
    """Step i applies changes[i]; the same path is named at each step, so only the
    change makes the prompt differ."""
    inputs, memo = _start(), None
    words = WordCounter()  # one counter for all steps, as the daemon's per tokenizer
    for change in changes:
        inputs, memo, _ = _step(inputs, memo, "look at src/app.py", words, change)


def test_a_turn_that_names_a_matching_path_gets_the_rule() -> None:
    """The same sources, other paths: a turn naming tests/ gets the matched rule."""
    inputs, memo = _start(), None
    words = WordCounter()
    for text in ["look at src/a.py", "now tests/unit/test_a.py", "and src/b.py"]:
        inputs, memo, view = _step(inputs, memo, text, words)
        has_rule = "Tests use pytest." in view.system_prompt
        assert has_rule == ("tests/" in text), text


@pytest.mark.parametrize(
    "change",
    [
        {"sources": replace(_RULES, memory=())},  # equal sources, another object
        {"sources": SourceInputs(rules=(replace(_RULES.rules[1], text="No hints."),))},
        {"approval_mode": ApprovalMode.NEVER_ASK},
        {"environment": EnvironmentInfo(working_directory="/w", time_text="2026-01-01T00:00Z")},
        {"exclude_sections": frozenset({SectionKind.RULES})},
        {"kernel_text": "You are another agent."},
    ],
    ids=["equal-sources", "sources", "approval", "environment", "exclude", "kernel"],
)
def test_a_changed_input_of_the_prompt_changes_it(change: dict[str, Any]) -> None:
    _steps([{}, {}, change, {}])


def test_sessions_on_other_tokenizers_count_their_own_prompt() -> None:
    """Two sessions with the same sources, each continuing its own memo on its own
    tokenizer, stepping in turn: each takes the prompt counted by its tokenizer."""
    counters: list[TokenCounter] = [WordCounter(), CharCounter()]
    chains: list[tuple[CompileInputs, ProjectionMemo | None]] = [(_start("a"), None)] * 2
    for step in range(3):
        for k, counter in enumerate(counters):
            inputs, memo, _ = _step(*chains[k], f"step {step}", counter)
            chains[k] = (inputs, memo)


def test_the_prompt_rides_in_the_memo_to_the_next_step() -> None:
    """A step whose prompt inputs are the last step's takes the prompt its memo holds (not
    made again); one input changed, and it is made anew. Nothing is kept elsewhere: a
    compile without the memo makes it afresh."""
    inputs, memo = _start(), None
    words = WordCounter()
    inputs, memo, _ = _step(inputs, memo, "look at src/a.py", words)
    assert memo is not None and memo.prompt is not None
    first = memo.prompt
    inputs, memo, _ = _step(inputs, memo, "look at src/a.py", words)
    assert memo is not None and memo.prompt is first
    _, fresh, _ = compile_incremental(inputs, words, None)
    assert fresh is not None and fresh.prompt is not first
    assert fresh.prompt is not None and fresh.prompt.prompt == first.prompt
    inputs, memo, _ = _step(inputs, memo, "look at src/a.py", words, {"kernel_text": "Other."})
    assert memo is not None and memo.prompt is not first


def test_sources_read_anew_but_equal_keep_the_remembered_prompt() -> None:
    """Sources read from workspace files are a new object at every compile: equal ones
    are the same input, so the step takes the remembered prompt instead of making it
    again (50 rule files of 200 KB took ~240 ms a step to make again); different ones
    make a new prompt."""
    counter = WordCounter()
    inputs = PromptInputs(
        _RULES, (), "kernel", ApprovalMode.ON_REQUEST, EnvironmentInfo(), frozenset()
    )
    first = system_prompt(inputs, counter, counter)
    again = replace(inputs, sources=replace(_RULES, rules=tuple(replace(r) for r in _RULES.rules)))
    assert again.sources is not inputs.sources and again == inputs
    assert system_prompt(again, counter, counter, first) is first
    always = replace(_RULES.rules[1], text="Use unittest.")
    edited = replace(inputs, sources=replace(_RULES, rules=(_RULES.rules[0], always)))
    remade = system_prompt(edited, counter, counter, first)
    assert remade is not first and "Use unittest." in remade.prompt.text
    assert remade.prompt == prompt_made(edited, counter)
