"""Runs blocking work off the event loop on bounded pools, so one slow disk write or
one heavy compile never stalls other sessions' RPCs.

Two pools: `run` for storage work (reads, appends, fsyncs), `compute` for CPU-heavy
work (compiles, rendering, result searches). Appends of one session never queue
behind compiles of another: with every compute thread busy, storage threads are
still free. Both are threads: the heavy parts (tokenizer, RE2, RocksDB) release the GIL
or run in bounded slices, and the compile's inputs never cross a process boundary.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")
U = TypeVar("U")


class Blocking:
    def __init__(self, workers: int, compute_workers: int = 2) -> None:
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ctxcc-io")
        self._compute = ThreadPoolExecutor(
            max_workers=compute_workers, thread_name_prefix="ctxcc-compute"
        )

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))

    async def compute(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._compute, functools.partial(fn, *args, **kwargs))

    async def run_landing(self, write: Callable[[], T], landed: Callable[[T], U]) -> U:
        """`write` on the storage pool, then `landed` with its result on the event loop,
        also when the awaiting call was cancelled meanwhile (a client gone, a deadline):
        what `write` wrote stands, so what follows it on the loop (watchers told, metrics)
        must happen too."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[U] = loop.create_future()

        def finish(wrote: asyncio.Future[T]) -> None:
            failed = wrote.exception()
            try:
                if failed is not None:
                    raise failed
                value = landed(wrote.result())
            except BaseException as exc:  # raised in the awaiting call, if it is there
                if not done.done():
                    done.set_exception(exc)
                return
            if not done.done():
                done.set_result(value)

        loop.run_in_executor(self._pool, write).add_done_callback(finish)
        return await done

    async def run_then_compute(
        self,
        first: Callable[[], T],
        then: Callable[[], U],
        landed: Callable[[T], object] | None = None,
    ) -> tuple[T, U | BaseException]:
        """`first` on the storage pool, then `then` on the compute pool, handed from the
        one thread to the other: the event loop is woken once for both (each wake-up of
        the loop costs a step ~0.1-0.2 ms of CPU: the GIL handed over and back, the
        self-pipe, a callback round). A failure of `first` is raised and `then` does not
        run; one of `then` is returned beside the result of `first`, which stands:
        `landed` takes that result on the loop first, also when the awaiting call was
        cancelled meanwhile (see `run_landing`).
        The storage pool never runs `then`, so appends still never queue behind compiles."""
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

        def hand(value: tuple[T, U | BaseException] | BaseException) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(deliver, value)

        def second(value: T) -> None:
            try:
                hand((value, then()))
            except BaseException as exc:  # handed to the awaiting call, as an executor does
                hand((value, exc))

        def start() -> None:
            try:
                value = first()
            except BaseException as exc:  # raised in the awaiting call
                hand(exc)
                return
            try:
                self._compute.submit(second, value)
            except RuntimeError as exc:  # the pool was shut down
                hand((value, exc))

        self._pool.submit(start)
        return await done

    def shutdown(self) -> None:
        self._compute.shutdown(wait=True)
        self._pool.shutdown(wait=True)
