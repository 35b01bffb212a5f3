"""Full garbage collections held off while heavy work runs.

CPython's cyclic collector walks every object of the generation it collects while
holding the GIL, with no way to cut that walk in pieces (3.11). The young generations
are small, but a full collection walks the whole heap, and CPython starts one whenever
the objects that survived into the old generation grew by a quarter: while a compile
builds the view of a session of 100,000 events, the heap grows from ~0.1 to ~1.2 million
objects and a full collection ran at each quarter of that growth, each one longer
(60 ms, 90, 110, 145, 265, 345, 470 ms here), every other session's calls waiting
through it. Nothing that work allocates can be freed while it runs, so those walks freed
almost nothing (a few thousand objects each).

So the daemon holds automatic full collections off while work runs on the compute pool
(`held`, around each compute job and a large view's encoding: the composition root
passes it to both) and lets CPython's own rule start them again when none runs: by then
the compile's objects are freed by their reference counts and the walk is over what the
daemon keeps, not over what the compile built. The young generations are collected as
always meanwhile (short-lived cycles, such as grpc's per call, are freed as before), and
a full collection is held off for at most `max_hold_s` in a row (compute threads that
never go idle all together: the collector's own rule applies again from then until they
do). At start, the objects made while starting (modules, tables, settings) are frozen
(`gc.freeze`): they live as long as the process, and no full collection walks them
again.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

# A threshold the old generation's counter (collections of the middle one since the
# last full collection) never reaches in a daemon's life.
_NEVER = 1 << 30
MAX_HOLD_S = 30.0
# What heavy work left alive is frozen when it ends; this long after the last thaw, it is
# thawed instead (one full collection walks it all and frees the cycles frozen with it).
THAW_S = 600.0


class FullCollections:
    def __init__(
        self,
        max_hold_s: float = MAX_HOLD_S,
        thaw_s: float = THAW_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._max_hold_s = max_hold_s
        self._thaw_s = thaw_s
        self._freezing = False
        self._thawed = 0.0
        self._clock = clock
        self._lock = threading.Lock()
        self._busy = 0
        self._since = 0.0
        self._held = False
        self._threshold = gc.get_threshold()  # CPython's: (700, 10, 10)
        self.holds = 0  # how many times full collections were held off: for tests
        self.freezes = 0

    def freeze_startup(self) -> None:
        """Blocking, once started: collect what starting left, then keep every object
        alive now out of later collections' walks."""
        gc.collect()
        gc.freeze()

    def install(self, freezing: bool = True) -> None:
        """Lets a full collection held off too long start again (see `_on_collection`);
        `freezing`: what a hold leaves alive is frozen at its end (see `_release`)."""
        with self._lock:
            self._freezing = freezing
            self._thawed = self._clock()
        if self._on_collection not in gc.callbacks:
            gc.callbacks.append(self._on_collection)

    @contextmanager
    def held(self) -> Iterator[None]:
        """Around a compute job: no automatic full collection while any runs."""
        with self._lock:
            self._busy += 1
            if self._busy == 1:
                self._since = self._clock()
                self._held = True
                self.holds += 1
                gc.set_threshold(self._threshold[0], self._threshold[1], _NEVER)
        try:
            yield
        finally:
            with self._lock:
                self._busy -= 1
                if self._busy == 0:
                    self._release()

    def _release(self) -> None:
        if not self._held:
            return
        self._held = False
        if self._freezing:
            if self._clock() - self._thawed < self._thaw_s:
                gc.collect(1)  # the young generations: what died young is not frozen
                gc.freeze()
                self.freezes += 1
            else:
                gc.unfreeze()  # the next full collection walks all of it
                self._thawed = self._clock()
        gc.set_threshold(*self._threshold)

    def _on_collection(self, phase: str, info: dict[str, Any]) -> None:
        # Called by the collector itself (any thread, the GIL held): cheap, no lock taken
        # (a compute thread may hold it while the collector runs in its allocation).
        if (
            phase == "start"
            and self._held
            and self._clock() - self._since > self._max_hold_s
            and gc.get_threshold()[2] == _NEVER
        ):
            gc.set_threshold(*self._threshold)  # from the next collection on


# One per process: the collector's thresholds are the process's.
COLLECTIONS = FullCollections()
