"""Runs blocking work off the event loop on bounded pools, so one slow disk write or
one heavy compile never stalls other sessions' RPCs.

Three pools: `run` for storage work (reads, appends, fsyncs), `compute` for CPU-heavy
work (compiles, rendering, result searches), and the light lane (`compute_light`, one
thread) for compiles known to be small: a warm session's steps (see lanes.py), which
heavy compiles of other sessions never hold up. Appends of one session never queue
behind compiles of another: with every compute thread busy, storage threads are
still free. (A stream step's append is the exception, written by the compute thread
that then compiles it, its fsync made on a storage thread meanwhile: its answer waits
for that compile anyway, and the step saves a thread hand-over; see
`run_then_compute`.) Both are threads: the heavy parts (tokenizer, RE2, RocksDB)
release the GIL or run in bounded slices, and the compile's inputs never cross a
process boundary.

The pools are plain threads fed by one queue each, and a result comes back to the loop
as one callback that settles the awaiting future: no concurrent.futures.Future per
call, no idle semaphore, no future chained to another (what `run_in_executor` on a
ThreadPoolExecutor costs, twice per hop: most of a hop's ~30 µs of CPU when eight
sessions step at once). What the executor did is kept: a `run` or `compute` job whose
caller was cancelled before it started does not run (a landing write and a step's
append run regardless); started work finishes; `shutdown` runs what was queued, waits
for it, and refuses more with RuntimeError.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import queue
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Generic, ParamSpec, TypeVar, cast

from server.service.ports import OwedSync

P = ParamSpec("P")
T = TypeVar("T")
U = TypeVar("U")

log = logging.getLogger("ctxcc.blocking")

# How long a step's compile waits, at most, for its append's fsync to start on a
# storage thread (~0.1 ms when a storage thread is free).
SYNC_START_WAIT_S = 0.002


class _Threads:
    """Up to `size` worker threads taking jobs from one queue, started as work arrives.

    Daemon threads: the daemon's stop shuts the pools down (waiting for the work in
    flight); a process that ends without that loses no more than a crash would."""

    def __init__(
        self,
        size: int,
        name: str,
        around: Callable[[], AbstractContextManager[object]] | None = None,
    ) -> None:
        self._around = around
        self._queue: queue.SimpleQueue[Callable[[], object] | None] = queue.SimpleQueue()
        self._size = size
        self._name = name
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._closed = False

    def submit(self, job: Callable[[], object]) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot schedule new work after shutdown")
            self._queue.put(job)
            if len(self._threads) < self._size:
                thread = threading.Thread(
                    target=self._work, name=f"{self._name}_{len(self._threads)}", daemon=True
                )
                thread.start()
                self._threads.append(thread)

    def _work(self) -> None:
        take = self._queue.get
        around = self._around
        while (job := take()) is not None:
            try:
                if around is None:
                    job()
                else:
                    with around():
                        job()
            except BaseException:  # jobs hand their own failures over: this is a bug
                log.exception("a blocking job failed outside its caller's reach")
            # Not kept while the thread waits for the next one: a job holds its arguments
            # and the future it settled (a time-travel compile's whole view and history),
            # which each idle thread of the pools would keep until its next job.
            del job

    def shutdown(self) -> None:
        with self._lock:
            self._closed = True
            for _ in self._threads:  # after every queued job: they run first
                self._queue.put(None)
        for thread in self._threads:
            thread.join()


class Blocking:
    def __init__(
        self,
        workers: int,
        compute_workers: int = 2,
        sync_start_wait_s: float = SYNC_START_WAIT_S,
        around_compute: Callable[[], AbstractContextManager[object]] | None = None,
    ) -> None:
        """`around_compute`: entered around each job of the compute pool (the daemon
        holds full garbage collections off meanwhile: server/adapters/gc_pauses.py)."""
        self._sync_start_wait_s = sync_start_wait_s
        self._pool = _Threads(workers, "ctxcc-io")
        self._compute = _Threads(compute_workers, "ctxcc-compute", around_compute)
        # The light lane: compiles that continue a warm session with little new text
        # (lanes.py), on a thread heavy work never takes.
        self._light = _Threads(1, "ctxcc-light")

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        return await _call(self._pool, functools.partial(fn, *args, **kwargs))

    async def compute(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        return await _call(self._compute, functools.partial(fn, *args, **kwargs))

    async def compute_light(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """`compute` on the light lane: for work known to be small (see lanes.py)."""
        return await _call(self._light, functools.partial(fn, *args, **kwargs))

    async def run_landing(self, write: Callable[[], T], landed: Callable[[T], U]) -> U:
        """`write` on the storage pool, then `landed` with its result on the event loop,
        also when the awaiting call was cancelled meanwhile (a client gone, a deadline):
        what `write` wrote stands, so what follows it on the loop (watchers told, metrics)
        must happen too."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[U] = loop.create_future()

        def finish(wrote: T | BaseException) -> None:
            try:
                if isinstance(wrote, BaseException):
                    raise wrote
                value = landed(wrote)
            except BaseException as exc:  # raised in the awaiting call, if it is there
                if not done.done():
                    done.set_exception(exc)
                return
            if not done.done():
                done.set_result(value)

        def job() -> None:
            # Run also when the caller is gone already: nothing cancels a landing write.
            try:
                wrote: T | BaseException = write()
            except BaseException as exc:
                wrote = exc
            _hand(loop, finish, wrote)

        self._pool.submit(job)
        return await done

    async def run_then_compute(
        self,
        first: Callable[[], T],
        then: Callable[[], U],
        landed: Callable[[T], object] | None = None,
        deferring: Callable[[], AbstractContextManager[OwedSync]] | None = None,
        *,
        light: bool = False,
    ) -> tuple[T, U | BaseException]:
        """`first`, then `then`, on one compute thread: the event loop is woken once for
        both and no other thread between them (each wake-up of the loop costs a step
        ~0.1-0.2 ms of CPU: the GIL handed over and back, the self-pipe, a callback
        round; the append on a storage thread handing the compile to a compute thread,
        as before, measured one step's p50 higher in 4 of 6 alternated runs and the
        steps/s of 8 agents ~20 % lower, medians ~470 against ~590). A failure of
        `first` is raised and `then` does not run; one of `then` is returned beside the
        result of `first`, which stands: `landed` takes that result on the loop first,
        also when the awaiting call was cancelled meanwhile (see `run_landing`).
        With `deferring`, `first` runs inside it and the fsync its writes owe is made on
        a storage thread while `then` runs (its GIL-free wait overlaps the compile; `then`
        starts once that thread has started, at most `sync_start_wait_s` later); the
        result comes back once both are done, and a failed fsync fails the whole as a
        failure of `first` would. `first` runs whatever happens to the caller (a step's
        append, like a landing write, is never dropped once queued). With `light`, both
        run on the light lane (see `compute_light`)."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[tuple[T, U | BaseException]] = loop.create_future()

        def deliver(value: tuple[T, U | BaseException] | BaseException) -> None:
            if landed is not None and not isinstance(value, BaseException):
                try:
                    landed(value[0])
                except BaseException as exc:  # as a failure of `first`
                    value = exc
            if done.done():  # the awaiting call was cancelled
                return
            if isinstance(value, BaseException):
                done.set_exception(value)
            else:
                done.set_result(value)

        def second(value: T, finish: Callable[[U | BaseException], None]) -> None:
            try:
                outcome: U | BaseException = then()
            except BaseException as exc:  # handed to the awaiting call, as an executor does
                outcome = exc
            finish(outcome)

        def start() -> None:
            owed: OwedSync | None = None
            try:
                if deferring is None:
                    value = first()
                else:
                    with deferring() as owed:
                        value = first()
            except BaseException as exc:  # raised in the awaiting call
                _hand(loop, deliver, exc)
                return
            syncing = owed is not None and owed.owes()
            join = _Join(loop, deliver, value, 2 if syncing else 1)
            if owed is not None and syncing:
                # Held until the storage thread has taken the GIL to start the fsync,
                # which then releases it: waiting for that here lets the fsync overlap
                # the compile. Without it the storage thread waited for the GIL while
                # this thread compiled (up to the 5 ms switch interval; ~0.9 ms a step
                # in the step benchmark), and the answer waited out the fsync after.
                started = threading.Lock()
                started.acquire()
                try:
                    self._pool.submit(functools.partial(_sync, owed, join, started))
                except RuntimeError as exc:  # the pool was shut down
                    join.synced(exc)
                else:
                    # Bounded: with every storage thread busy, the compile goes first.
                    started.acquire(timeout=self._sync_start_wait_s)
            second(value, join.computed)

        (self._light if light else self._compute).submit(start)
        return await done

    def shutdown(self) -> None:
        self._light.shutdown()
        self._compute.shutdown()
        self._pool.shutdown()


def _sync(owed: OwedSync, join: _Join[Any, Any], started: threading.Lock) -> None:
    started.release()
    try:
        owed.sync()
    except BaseException as exc:
        join.synced(exc)
    else:
        join.synced(None)


class _Join(Generic[T, U]):
    """The compute thread's outcome and the storage thread's fsync, whichever comes
    last handing both to the loop in one wake-up."""

    __slots__ = ("_deliver", "_failed", "_left", "_lock", "_loop", "_outcome", "_value")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        deliver: Callable[[tuple[T, U | BaseException] | BaseException], None],
        value: T,
        parts: int,
    ) -> None:
        self._loop, self._deliver, self._value = loop, deliver, value
        self._left = parts
        self._outcome: U | BaseException | None = None
        self._failed: BaseException | None = None
        self._lock = threading.Lock()

    def computed(self, outcome: U | BaseException) -> None:
        with self._lock:
            self._outcome = outcome
        self._part_done()

    def synced(self, failed: BaseException | None) -> None:
        with self._lock:
            self._failed = failed
        self._part_done()

    def _part_done(self) -> None:
        with self._lock:
            self._left -= 1
            last = not self._left
        if last:
            self._hand()

    def _hand(self) -> None:
        if self._failed is not None:
            _hand(self._loop, self._deliver, self._failed)
            return
        # Set by `computed` before this runs (`then` may return None itself).
        outcome = cast("U | BaseException", self._outcome)
        _hand(self._loop, self._deliver, (self._value, outcome))


def _call(pool: _Threads, work: Callable[[], T]) -> asyncio.Future[T]:
    """`work` on `pool`, its result (or exception) settling the returned future."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def job() -> None:
        if done.cancelled():  # as an executor's job cancelled before it started
            return
        try:
            value = work()
        except BaseException as exc:
            _hand(loop, _fail, done, exc)
            return
        _hand(loop, _succeed, done, value)

    pool.submit(job)
    return done


def _succeed(done: asyncio.Future[T], value: T) -> None:
    if not done.done():  # else the awaiting call was cancelled
        done.set_result(value)


def _fail(done: asyncio.Future[T], exc: BaseException) -> None:
    if not done.done():
        done.set_exception(exc)


def _hand(loop: asyncio.AbstractEventLoop, fn: Callable[..., None], *args: object) -> None:
    """`fn(*args)` on the loop; dropped when the loop is closed: nobody waits."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(fn, *args)
