"""The compile's injected work check (compiler/work.py): called between units of work,
it can stop a compile, and a check that never stops it changes nothing in the view."""

from __future__ import annotations

import pytest

from server.compiler.compile import CompileInputs, compile_incremental, compile_view
from server.domain.errors import CtxccError, Reason
from server.domain.model import Session
from server.service.cpu_budget import CpuBudget
from tests.unit.test_projection import ROUTE, C, log, said, user

EVENTS = log(
    *(user(f"question {i} about src/mod_{i}/main.py " + "word " * 50) for i in range(20)),
    said("the answer"),
)
INPUTS = CompileInputs("s:1", Session("s", 0, 0), EVENTS, len(EVENTS), ROUTE)


class Stop(Exception):
    pass


def test_a_check_that_never_stops_changes_nothing() -> None:
    calls = 0

    def count() -> None:
        nonlocal calls
        calls += 1

    view = compile_incremental(INPUTS, C, None, check=count)[0]
    assert view == compile_view(INPUTS, C)
    assert calls > len(EVENTS)  # at least once per counted message


@pytest.mark.parametrize("after", [0, 1, 5, 15])
def test_a_check_that_raises_stops_the_compile(after: int) -> None:
    calls = 0

    def stop_after() -> None:
        nonlocal calls
        calls += 1
        if calls > after:
            raise Stop

    with pytest.raises(Stop):
        compile_incremental(INPUTS, C, None, check=stop_after)
    assert calls == after + 1  # nothing ran past the check that raised


def test_a_cpu_budget_raises_quota_exceeded_once_spent() -> None:
    budget = CpuBudget(limit_ms=5)
    with budget.running():
        budget.check()  # nothing spent yet
        x = 0
        while budget.used_s() < 0.006:
            x += 1
        with pytest.raises(CtxccError) as caught:
            budget.check()
    assert caught.value.reason is Reason.QUOTA_EXCEEDED
    assert caught.value.metadata == {"quota": "compile_cpu_budget_ms", "limit": "5"}
    spent = budget.spent_s
    # Time outside `running` (another thread's work, waiting) is not charged.
    assert budget.used_s() == spent
    CpuBudget(limit_ms=0).check()  # 0: no limit
