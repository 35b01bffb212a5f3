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
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


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

    def shutdown(self) -> None:
        self._compute.shutdown(wait=True)
        self._pool.shutdown(wait=True)
