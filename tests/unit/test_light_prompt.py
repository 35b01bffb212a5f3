"""Which system prompts the light lane makes itself (service/compiling.py `_light_prompt`):
only those that are little work, which is the source text the prompt counts and the
named paths each rule matched by path scans."""

from __future__ import annotations

import pytest

from server.compiler.prompt_memo import PromptInputs
from server.compiler.sources import SourceInputs
from server.compiler.system import DEFAULT_KERNEL, ApprovalMode, EnvironmentInfo
from server.domain.sources import RuleActivation, RuleEntry, Scope
from server.service.compiling import _light_prompt, _Stale
from server.service.lanes import sources_are_light

# The most paths a turn's rule globs are matched against (textscan.MAX_PATHS).
PATHS = tuple(f"src/module_{k:05d}/deeper/file_{k}.py" for k in range(4_096))


def _rules(n: int, activation: RuleActivation) -> tuple[RuleEntry, ...]:
    globs = tuple(f"gen{i}_{j}/**/*.q{j}" for i in range(n) for j in range(4))
    return tuple(
        RuleEntry(
            f"r{i}",
            Scope.PROJECT,
            "p",
            f"r{i}",
            "d",
            "Keep it short.",
            activation,
            globs[4 * i : 4 * i + 4] if activation == RuleActivation.MATCHED else (),
        )
        for i in range(n)
    )


def _inputs(sources: SourceInputs, paths: tuple[str, ...]) -> PromptInputs:
    return PromptInputs(
        sources, paths, DEFAULT_KERNEL, ApprovalMode.ON_REQUEST, EnvironmentInfo(), frozenset()
    )


def test_many_rules_matched_by_path_against_many_named_paths_are_no_light_prompt() -> None:
    """Each rule matched by path scans every path the turn names (~0.7 s here for 768
    rules against 4,096 paths): a few KB of rule text, but no work for the light lane."""
    many = SourceInputs(rules=_rules(768, RuleActivation.MATCHED))
    assert sources_are_light(many)  # its text alone is little
    with pytest.raises(_Stale):
        _light_prompt(_inputs(many, PATHS))
    # Few paths, or few rules matched by path, or rules that read no path: light.
    _light_prompt(_inputs(many, PATHS[:8]))
    _light_prompt(_inputs(SourceInputs(rules=_rules(8, RuleActivation.MATCHED)), PATHS))
    _light_prompt(_inputs(SourceInputs(rules=_rules(768, RuleActivation.ON_DEMAND)), PATHS))


def test_much_source_text_is_no_light_prompt_with_or_without_paths() -> None:
    big = SourceInputs(
        rules=(
            RuleEntry("r", Scope.PROJECT, "p", "r", "d", "x" * (300 << 10), RuleActivation.ALWAYS),
        )
    )
    for paths in ((), PATHS[:8]):
        with pytest.raises(_Stale):
            _light_prompt(_inputs(big, paths))
