"""The compile's injected work check (compiler/work.py): called between units of work,
it can stop a compile, and a check that never stops it changes nothing in the view."""

from __future__ import annotations

from unittest.mock import patch

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from server.compiler.compile import CompileInputs, compile_incremental, compile_view
from server.domain.errors import CtxccError, Reason
from server.domain.model import Session
from server.service.cpu_budget import Abandoned, CpuBudget, LaneExceeded
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


class _Clocks:
    """A thread's CPU clock and the monotonic clock, moved by the test (CPU never faster
    than wall time, as on a real thread)."""

    def __init__(self) -> None:
        self.wall = 100.0
        self.cpu = 7.0
        self.cpu_reads = 0

    def perf_counter(self) -> float:
        return self.wall

    def thread_time(self) -> float:
        self.cpu_reads += 1
        return self.cpu


@settings(max_examples=300, deadline=None)
@example([(500, 1.0, False)] * 60)  # CPU as fast as wall time, checked every 0.5 ms
@example([(4000, 1.0, False)] + [(1000, 0.5, True)] * 30)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 3000),
            st.sampled_from([1.0, 1.0, 1.0, 0.5, 0.0]),
            st.sampled_from([False] * 7 + [True]),
        ),
        min_size=10,
        max_size=80,
    )
)
def test_a_budget_check_raises_exactly_when_the_cpu_spent_is_over_the_limit(
    moves: list[tuple[int, float, bool]],
) -> None:
    """Checks that skip reading the CPU clock while the wall time left cannot have run
    out raise at the very check where the CPU spent passes the limit, as reading it every
    time does; also over several stretches (a compile's hops) with waits between."""
    clocks = _Clocks()
    budget = CpuBudget(limit_ms=20)
    spent = 0.0
    with patch("server.service.cpu_budget.time", clocks):
        budget.__enter__()
        for wall_us, share, hop in moves:
            clocks.wall += wall_us / 1e6
            # The thread ran for part of that wall time at most.
            ran = wall_us * share / 1e6
            clocks.cpu += ran
            spent += ran
            if hop:  # the stretch ends, another begins (time passes between them)
                budget.__exit__(None, None, None)
                clocks.wall += 0.003
                budget.__enter__()
            over = spent * 1000 > 20 + 1e-9
            try:
                budget.check()
            except CtxccError as err:
                assert err.reason is Reason.QUOTA_EXCEEDED
                assert spent * 1000 > 20 - 1e-9, "raised before the limit was reached"
                return
            assert not over, f"not raised with {spent * 1000:.3f} ms spent"


def test_a_budget_check_skips_the_cpu_clock_while_the_limit_cannot_be_reached() -> None:
    clocks = _Clocks()
    budget = CpuBudget(limit_ms=20)
    with patch("server.service.cpu_budget.time", clocks), budget.running():
        for _ in range(100):
            clocks.wall += 0.0001
            clocks.cpu += 0.0001
            budget.check()
        reads = clocks.cpu_reads
        assert reads <= 3, reads  # 10 ms of wall time: never near the 20 ms limit
        clocks.wall += 0.011
        clocks.cpu += 0.011  # 21 ms spent
        with pytest.raises(CtxccError):
            budget.check()


def test_an_abandoned_budget_stops_at_its_next_check_and_counts_once() -> None:
    counted: list[int] = []
    budget = CpuBudget(limit_ms=0, on_abandoned=lambda: counted.append(1))
    budget.check()
    budget.abandon()
    for _ in range(2):
        with pytest.raises(Abandoned):
            budget.check()
    assert counted == [1]


@pytest.mark.parametrize("limit_ms", [0, 30_000])
def test_a_lane_limit_stops_light_work_before_the_budget_does(limit_ms: int) -> None:
    """On the light lane the budget raises LaneExceeded past the lane's limit (with the
    compile's own budget far off, or none), not QUOTA_EXCEEDED; off the lane again the
    same CPU spent passes, and the budget's own limit still holds."""
    clocks = _Clocks()
    budget = CpuBudget(limit_ms=limit_ms)
    with patch("server.service.cpu_budget.time", clocks), budget.running():
        budget.lane(5)
        for _ in range(40):  # 4 ms: within the lane's 5
            clocks.wall += 0.0001
            clocks.cpu += 0.0001
            budget.check()
        clocks.wall += 0.002
        clocks.cpu += 0.002  # 6 ms spent
        with pytest.raises(LaneExceeded):
            budget.check()
        budget.lane(0)
        budget.check()  # the compute pool continues the same budget
        if limit_ms:
            clocks.wall += 31
            clocks.cpu += 31
            with pytest.raises(CtxccError):
                budget.check()
