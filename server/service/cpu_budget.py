"""A compile's CPU budget: the CPU time of the threads that do its work, summed over
its hops (loading and compiling, then recording and rendering), against a limit.

The core cannot read clocks; it calls `check` (injected, see compiler/work.py) between
units of work, and so does the service between phases. The clock is the thread's own
CPU time, so waiting for the GIL, for the disk or for a busy machine is not charged: a
compile is stopped for the work it does, never for the load around it.

The same checks stop a compile whose caller went away (deadline passed, call cancelled,
stream closed): the awaiting coroutine is cancelled at once, but the worker thread would
otherwise finish work nobody will read, up to the whole budget.

A check runs before every token count, so it must cost next to nothing: a thread's CPU
clock is a system call (~0.2 us), the monotonic clock is not (~0.04 us). A thread spends
at most as much CPU as wall time passes (and the stretches never overlap), so until the
wall time left in the budget at the last reading has passed the limit cannot have been
reached, and the CPU clock is not read: the same checks raise as when it is read each time.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from server.domain.errors import CtxccError, Reason

QUOTA = "compile_cpu_budget_ms"


class Abandoned(Exception):
    """Raised in the worker thread of a compile whose caller went away; it reaches no
    client (the awaiting call was already cancelled) and nothing is recorded."""


class LaneExceeded(Exception):
    """Raised by `check` when work meant to be light used more CPU than its lane allows
    (see `CpuBudget.lane`): it is to be redone where heavy work runs."""


class CpuBudget:
    """One request's budget; `running` brackets each stretch of its work on a thread.
    Stretches run one after another (each awaited), never at once."""

    def __init__(self, limit_ms: int, on_abandoned: Callable[[], None] | None = None) -> None:
        self.limit_ms = limit_ms
        self.spent_s = 0.0
        self._since: float | None = None
        # A plain flag, set from the event loop and read by the worker (a threading.Event
        # per compile cost more than the checks that read it).
        self._abandoned = False
        self._on_abandoned = on_abandoned
        # The monotonic time before which the limit cannot have been reached.
        self._sure_until = -math.inf
        # A lower limit while the work runs on a lane for light work (0: none).
        self._lane_ms = 0

    def lane(self, limit_ms: int) -> None:
        """From now on `check` raises LaneExceeded once the budget has used `limit_ms`
        (0: no more): the light lane's bound on work judged light before it ran."""
        self._lane_ms = limit_ms
        self._sure_until = -math.inf

    def abandon(self) -> None:
        """The caller went away: the work stops at its next check (from the event loop)."""
        self._abandoned = True

    def running(self) -> CpuBudget:
        """`with budget.running():` brackets one stretch (no generator: two per compile)."""
        return self

    def __enter__(self) -> None:
        self._since = time.thread_time()

    def __exit__(self, *_: object) -> None:
        if self._since is not None:
            self.spent_s += time.thread_time() - self._since
        self._since = None

    def used_s(self) -> float:
        now = time.thread_time() - self._since if self._since is not None else 0.0
        return self.spent_s + now

    def check(self) -> None:
        if self._abandoned:
            if self._on_abandoned is not None:
                self._on_abandoned()
                self._on_abandoned = None  # counted once, whichever check stops it
            raise Abandoned
        limit, lane = self.limit_ms, self._lane_ms
        if not limit and not lane:
            return
        wall = time.perf_counter()  # read before the CPU clock: the bound stays safe
        if wall < self._sure_until:
            return
        used = self.used_s()
        if lane and used * 1000 > lane:
            raise LaneExceeded
        if limit and used * 1000 > limit:
            raise over_budget(limit)
        nearest = min(lane, limit) if lane and limit else lane or limit
        self._sure_until = wall + (nearest / 1000 - used)


def over_budget(limit_ms: int) -> CtxccError:
    return CtxccError(
        Reason.QUOTA_EXCEEDED,
        f"the compile used more than its {limit_ms} ms of CPU ({QUOTA}) and was stopped; "
        "nothing was recorded. The token counts and path scans it finished are remembered, "
        "so a retry continues from there; a checkpoint (CreateCheckpoint) shortens what a "
        "compile reads; the operator can raise the budget",
        quota=QUOTA,
        limit=str(limit_ms),
    )
