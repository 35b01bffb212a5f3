"""A compile's CPU budget: the CPU time of the threads that do its work, summed over
its hops (loading and compiling, then recording and rendering), against a limit.

The core cannot read clocks; it calls `check` (injected, see compiler/work.py) between
units of work, and so does the service between phases. The clock is the thread's own
CPU time, so waiting for the GIL, for the disk or for a busy machine is not charged: a
compile is stopped for the work it does, never for the load around it.

The same checks stop a compile whose caller went away (deadline passed, call cancelled,
stream closed): the awaiting coroutine is cancelled at once, but the worker thread would
otherwise finish work nobody will read, up to the whole budget.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from server.domain.errors import CtxccError, Reason

QUOTA = "compile_cpu_budget_ms"


class Abandoned(Exception):
    """Raised in the worker thread of a compile whose caller went away; it reaches no
    client (the awaiting call was already cancelled) and nothing is recorded."""


class CpuBudget:
    """One request's budget; `running` brackets each stretch of its work on a thread.
    Stretches run one after another (each awaited), never at once."""

    def __init__(self, limit_ms: int, on_abandoned: Callable[[], None] | None = None) -> None:
        self.limit_ms = limit_ms
        self.spent_s = 0.0
        self._since: float | None = None
        self._abandoned = threading.Event()
        self._on_abandoned = on_abandoned

    def abandon(self) -> None:
        """The caller went away: the work stops at its next check (from the event loop)."""
        self._abandoned.set()

    @contextmanager
    def running(self) -> Iterator[None]:
        self._since = time.thread_time()
        try:
            yield
        finally:
            self.spent_s += time.thread_time() - self._since
            self._since = None

    def used_s(self) -> float:
        now = time.thread_time() - self._since if self._since is not None else 0.0
        return self.spent_s + now

    def check(self) -> None:
        if self._abandoned.is_set():
            if self._on_abandoned is not None:
                self._on_abandoned()
                self._on_abandoned = None  # counted once, whichever check stops it
            raise Abandoned
        if self.limit_ms and self.used_s() * 1000 > self.limit_ms:
            raise over_budget(self.limit_ms)


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
