"""Graceful shutdown at the transport: which calls are in flight, and when to stop.

grpc's own `server.stop(grace)` cancels every call it has not yet handed to a handler
(a request still being received) with a bare CANCELLED, and waits the whole grace for
long-lived streams that never end by themselves. So the daemon drains first, with the
server still running:

- a call whose headers arrived before `close()` is admitted and served; one that
  arrives after answers UNAVAILABLE with reason SHUTTING_DOWN (health checks still
  answer, NOT_SERVING), which the clients treat as "reconnect and resend the same
  request id";
- an admitted call is pending until its request is received, then busy until it
  returns; a `CompileStream` is busy only while it works on a step, and an idle one
  is ended at once with SHUTTING_DOWN;
- `wait_idle` returns when nothing is busy and no admitted call has arrived or made
  progress for a short settle time (so calls already on the wire reach the handlers and
  get an answer with a reason rather than grpc's bare CANCELLED; a client that stopped
  sending mid-request is waited for a little longer, not forever), or when the grace
  period is over; only then is the server stopped. Calls turned away count only in the
  drain's first second (those on the wire at the signal): a client retrying every
  50-250 ms would otherwise hold the drain for the whole grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from collections.abc import Iterator

from server.domain.errors import CtxccError, Reason

# Quiet time (no call arriving, starting or ending) after which the drain is done.
SETTLE_S = 0.3
# The same while an admitted call is still receiving its request.
PENDING_SETTLE_S = 2.0
# How long after the drain starts a call turned away still counts as activity: the calls
# that were on the wire at the signal arrive then. Later ones are clients retrying every
# 50-250 ms, which would otherwise hold the drain until the grace period is over.
TURNED_AWAY_S = 1.0
_POLL_S = 0.02


def shutting_down() -> CtxccError:
    return CtxccError(
        Reason.SHUTTING_DOWN,
        "the daemon is shutting down: reconnect and resend with the same request id",
    )


def cut_short() -> CtxccError:
    """The answer of a call still running when the drain ends (grace period over, or a
    second stop signal). What it wrote stays written; a resend with the same request id
    finds it."""
    return CtxccError(
        Reason.SHUTTING_DOWN,
        "the daemon is shutting down and ended this call before it finished (its grace "
        "period was over, or a second stop signal came): reconnect and resend with the "
        "same request id",
    )


class Drain:
    def __init__(self) -> None:
        self._busy = 0
        # Weak: a call that ends before its handler runs (the client gave up) drops out.
        self._pending: weakref.WeakSet[Ticket] = weakref.WeakSet()
        self._progress = time.monotonic()
        self._closing = asyncio.Event()
        self._closed_at = 0.0
        self._hurried = False
        # The tasks of the calls in their handlers, ended by `cut` when the drain is over.
        self._running: set[asyncio.Task[object]] = set()
        self._cut = False

    @property
    def closing(self) -> bool:
        return self._closing.is_set()

    def close(self) -> None:
        if not self.closing:
            # The signal counts as activity: the drain settles after it, so idle
            # CompileStreams end by their own SHUTTING_DOWN answer (a few loop turns
            # away) before `cut` would end them as calls over the grace period, and
            # calls on the wire at the signal reach their handlers.
            self._closed_at = self._progress = time.monotonic()
        self._closing.set()

    async def closed(self) -> None:
        await self._closing.wait()

    def admit(self, counted: bool) -> Ticket | None:
        """Called when a call's headers arrive: None once shutting down. A call turned
        away after the drain's first TURNED_AWAY_S is no activity to wait for."""
        now = time.monotonic()
        if self.closing:
            if now - self._closed_at < TURNED_AWAY_S:
                self._progress = now
            return None
        self._progress = now
        return Ticket(self, counted)

    def _moved(self, busy: int) -> None:
        self._busy += busy
        self._progress = time.monotonic()

    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        self._moved(1)
        try:
            yield
        finally:
            self._moved(-1)

    @contextlib.contextmanager
    def cuttable(self) -> Iterator[None]:
        """The calling task (a call in its handler) is ended by `cut` if still running."""
        task = asyncio.current_task()
        if task is None:
            yield
            return
        self._running.add(task)
        try:
            yield
        finally:
            self._running.discard(task)

    @property
    def in_handlers(self) -> int:
        """The calls in their handlers now, idle streams included."""
        return len(self._running)

    @property
    def running(self) -> int:
        """The calls in their handlers the drain waits for (idle streams are not)."""
        return self._busy

    @property
    def was_cut(self) -> bool:
        """Whether `cut` ended the calls still running (their handler's CancelledError is
        then the drain's, to answer with `cut_short`, not the client's)."""
        return self._cut

    async def cut(self, wait_s: float) -> int:
        """Ends the calls still in their handlers (the grace period is over): each is
        cancelled and answers UNAVAILABLE with SHUTTING_DOWN (grpc's own stop would end it
        without ErrorInfo, which only this project's clients know to resend); waits at most
        `wait_s` for their answers to be sent. The number of calls cut."""
        tasks = [t for t in self._running if not t.done()]
        self._cut = True
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=wait_s)
        return len(tasks)

    def hurry(self) -> None:
        """Ends the wait for calls in flight now (a second stop signal: the operator
        will not wait out the grace period); what runs then is cut as at its end."""
        self._hurried = True

    @property
    def hurried(self) -> bool:
        """Whether a second stop signal ended the wait (not the grace period)."""
        return self._hurried

    async def wait_idle(self, grace_s: float) -> bool:
        """True when every admitted call finished within `grace_s` seconds."""
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and not self._hurried:
            quiet = time.monotonic() - self._progress
            if self._busy == 0 and quiet > (PENDING_SETTLE_S if self._pending else SETTLE_S):
                return True
            await asyncio.sleep(_POLL_S)
        # At the deadline (at once with a grace of 0): idle is idle, settled or not.
        return self._busy == 0 and not self._pending


class Ticket:
    """One admitted call: pending until its handler runs, busy while it does."""

    def __init__(self, drain: Drain, counted: bool) -> None:
        self._drain = drain
        self._counted = counted
        if counted:
            drain._pending.add(self)

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        if not self._counted:
            yield
            return
        self._drain._pending.discard(self)
        with self._drain.busy():
            yield
