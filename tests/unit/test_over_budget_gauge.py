"""ctxcc_sessions_over_budget, the gauge CtxccSessionsOverBudget watches: sessions whose
latest compile was over budget, recently. (tests/e2e/test_prometheus_sessions.py runs it
under a real Prometheus; here its clock is set by hand.)"""

from __future__ import annotations

import threading

from server.adapters.metrics import OVER_BUDGET_RECENT_SECONDS, _OverBudgetSessions


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _value(gauge: _OverBudgetSessions) -> float:
    (family,) = list(gauge.collect())
    assert family.name == "ctxcc_sessions_over_budget"
    (sample,) = family.samples
    return float(sample.value)


def test_a_session_leaves_at_a_compile_within_budget_at_delete_and_when_idle() -> None:
    lock = threading.Lock()
    clock = Clock()
    gauge = _OverBudgetSessions(lock, clock)
    assert _value(gauge) == 0
    with lock:
        gauge.decided("compacts", True)
        gauge.decided("deleted", True)
        gauge.decided("idle", True)
        gauge.decided("fine", False)
        gauge.decided("compacts", True)  # the same session again is one session
    assert _value(gauge) == 3
    with lock:
        gauge.decided("compacts", False)  # its next compile is within budget
    gauge.forget("deleted")
    assert _value(gauge) == 1
    # "idle" stopped compiling: it counts until its last compile is old, then no more.
    clock.now += OVER_BUDGET_RECENT_SECONDS - 1
    assert _value(gauge) == 1
    with lock:
        gauge.decided("stuck", True)
    clock.now += 2
    assert _value(gauge) == 1  # "stuck" compiled 2 s ago; "idle" is gone
    gauge.forget("never-seen")
    assert _value(gauge) == 1


def test_idle_sessions_are_dropped_between_scrapes_once_many_are_kept() -> None:
    lock = threading.Lock()
    clock = Clock()
    gauge = _OverBudgetSessions(lock, clock)
    with lock:
        for i in range(1024):
            gauge.decided(f"old-{i}", True)
    clock.now += OVER_BUDGET_RECENT_SECONDS + 1
    with lock:
        gauge.decided("new", True)  # over the cap: the old ones go without a scrape
    assert list(gauge._last) == ["new"]
    assert _value(gauge) == 1


def test_sessions_restored_at_start_count_until_their_compile_is_old() -> None:
    lock = threading.Lock()
    clock = Clock()
    gauge = _OverBudgetSessions(lock, clock)
    window = OVER_BUDGET_RECENT_SECONDS
    gauge.restored(
        [
            ("recent", 10.0),
            ("older", window - 100),
            ("too-old", window + 1),  # its agent stopped before the restart
            ("ahead", -5.0),  # stamped by a wall clock that later stepped back: just now
        ]
    )
    assert _value(gauge) == 3
    clock.now += 101
    assert _value(gauge) == 2  # "older"'s compile is now past the window
    clock.now += window - 10 - 101 + 1
    assert _value(gauge) == 1  # and "recent"'s, 10 s older than "ahead"'s
    clock.now += 10
    assert _value(gauge) == 0


def test_a_compile_finishing_after_its_sessions_delete_does_not_count_it_again() -> None:
    lock = threading.Lock()
    clock = Clock()
    gauge = _OverBudgetSessions(lock, clock)
    with lock:
        gauge.decided("s", True, created_ns=5)
    gauge.forget("s", created_ns=5)
    assert _value(gauge) == 0
    with lock:  # a compile of the deleted session that was running at the delete
        gauge.decided("s", True, created_ns=5)
    assert _value(gauge) == 0
    with lock:  # the session made again under its id is another one
        gauge.decided("s", True, created_ns=6)
    assert _value(gauge) == 1
    # The first one's delete reaching the loop late leaves the new session counted.
    gauge.forget("s", created_ns=5)
    assert _value(gauge) == 1
    gauge.forget("s", created_ns=6)
    assert _value(gauge) == 0
    # A delete whose session's create time is unknown (a damaged record) drops any.
    with lock:
        gauge.decided("t", True, created_ns=7)
    gauge.forget("t")
    assert _value(gauge) == 0


def test_a_deleted_sessions_late_compile_within_budget_leaves_the_new_one_counted() -> None:
    """The compile running at the delete may be within budget: it ended the count of the
    session made again under the id (over budget), which its own compiles had set."""
    lock = threading.Lock()
    clock = Clock()
    gauge = _OverBudgetSessions(lock, clock)
    with lock:
        gauge.decided("s", False, created_ns=5)
    gauge.forget("s", created_ns=5)
    with lock:
        gauge.decided("s", True, created_ns=6)
        gauge.decided("s", False, created_ns=5)  # the deleted one's, finishing late
    assert _value(gauge) == 1
    with lock:
        gauge.decided("s", False, created_ns=6)  # the new one's own
    assert _value(gauge) == 0


def test_deletes_are_remembered_only_while_a_late_compile_could_count() -> None:
    lock = threading.Lock()
    clock = Clock()
    gauge = _OverBudgetSessions(lock, clock)
    for i in range(1025):
        gauge.forget(f"gone-{i}", created_ns=i + 1)
    assert len(gauge._deleted) == 1025  # all within the window
    clock.now += OVER_BUDGET_RECENT_SECONDS + 1
    gauge.forget("last", created_ns=9)
    assert list(gauge._deleted) == ["last"]
