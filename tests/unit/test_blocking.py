"""Blocking.run_then_compute: a stream step's append and compile in one hop of the loop."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import queue
import threading
import weakref
from collections.abc import Awaitable, Callable, Iterator

import pytest

from server.service.blocking import Blocking


def test_the_second_part_starts_while_the_event_loop_is_busy() -> None:
    """`first` and `then` run one after the other on one compute thread: `then` runs
    while the loop is still blocked (a hand-over through the loop would wait for it, and
    the loop here waits for `then`: the version with two awaited hops times out), and no
    other thread is woken between them."""
    blocking = Blocking(2, 2)
    threads: dict[str, str] = {}
    then_ran = threading.Event()

    def first() -> int:
        threads["first"] = threading.current_thread().name
        return 41

    def then() -> str:
        threads["then"] = threading.current_thread().name
        then_ran.set()
        return "compiled"

    async def main() -> tuple[int, str | BaseException]:
        call = asyncio.ensure_future(blocking.run_then_compute(first, then))
        await asyncio.sleep(0)  # the call submits `first` and waits
        # The loop is blocked from here until `then` has run.
        assert then_ran.wait(5), "`then` waited for the event loop"
        return await call

    try:
        assert asyncio.run(main()) == (41, "compiled")
    finally:
        blocking.shutdown()
    assert threads["first"] == threads["then"]
    assert threads["then"].startswith("ctxcc-compute")


def test_a_failure_of_the_first_part_is_raised_and_the_second_does_not_run() -> None:
    blocking = Blocking(1, 1)
    ran: list[str] = []

    def first() -> int:
        raise ValueError("sequence mismatch")

    async def main() -> None:
        await blocking.run_then_compute(first, lambda: ran.append("then"))

    try:
        with pytest.raises(ValueError, match="sequence mismatch"):
            asyncio.run(main())
    finally:
        blocking.shutdown()
    assert ran == []


def test_a_failure_of_the_second_part_comes_back_beside_the_first_result() -> None:
    """The first part's result stands (an append that was written): the caller gets it
    with the second part's exception instead of losing it to a raise."""
    blocking = Blocking(1, 1)

    def then() -> str:
        raise RuntimeError("over budget")

    async def main() -> tuple[int, str | BaseException]:
        return await blocking.run_then_compute(lambda: 7, then)

    try:
        value, outcome = asyncio.run(main())
    finally:
        blocking.shutdown()
    assert value == 7
    assert isinstance(outcome, RuntimeError) and str(outcome) == "over budget"


def test_a_cancelled_call_gets_nothing_and_the_work_still_finishes() -> None:
    """Like run_in_executor: cancelling the awaiting call does not stop a started write."""
    blocking = Blocking(1, 1)
    release, finished = threading.Event(), threading.Event()

    def first() -> int:
        release.wait(5)
        return 1

    async def main() -> None:
        call = asyncio.ensure_future(blocking.run_then_compute(first, finished.set))
        await asyncio.sleep(0.01)
        call.cancel()
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await call
        # The late result reaches a loop whose future is already done: dropped quietly.
        await asyncio.get_running_loop().run_in_executor(None, finished.wait, 5)
        await asyncio.sleep(0.01)

    try:
        asyncio.run(main())
    finally:
        blocking.shutdown()
    assert finished.is_set()


def test_each_pool_runs_at_most_its_size_at_once_and_every_job_runs() -> None:
    """The pools are bounded: more jobs than threads wait their turn."""
    blocking = Blocking(2, 1)
    lock = threading.Lock()
    running = {"io": 0, "compute": 0}
    most = {"io": 0, "compute": 0}

    def job(pool: str, k: int) -> int:
        with lock:
            running[pool] += 1
            most[pool] = max(most[pool], running[pool])
        threading.Event().wait(0.02)
        with lock:
            running[pool] -= 1
        return k

    async def main() -> list[int]:
        io = [blocking.run(job, "io", k) for k in range(6)]
        compute = [blocking.compute(job, "compute", k) for k in range(6, 10)]
        return list(await asyncio.gather(*io, *compute))

    try:
        assert asyncio.run(main()) == list(range(10))
    finally:
        blocking.shutdown()
    assert most == {"io": 2, "compute": 1}


def test_a_job_whose_caller_was_cancelled_before_it_started_does_not_run() -> None:
    """As with an executor: a queued read nobody waits for any more is skipped; its
    exception, and a failing job's, reach their callers as raised."""
    blocking = Blocking(1, 1)
    release = threading.Event()
    ran: list[str] = []

    def failing() -> None:
        raise KeyError("gone")

    async def main() -> None:
        busy = asyncio.ensure_future(blocking.run(release.wait, 5))
        queued = asyncio.ensure_future(blocking.run(ran.append, "queued"))
        await asyncio.sleep(0.01)
        queued.cancel()
        release.set()
        assert await busy
        with pytest.raises(KeyError, match="gone"):
            await blocking.run(failing)
        await blocking.run(ran.append, "later")

    try:
        asyncio.run(main())
    finally:
        blocking.shutdown()
    assert ran == ["later"]


def test_shutdown_runs_what_was_queued_then_refuses_new_work() -> None:
    blocking = Blocking(1, 1)
    release = threading.Event()
    ran: list[int] = []

    async def main() -> None:
        busy = asyncio.ensure_future(blocking.run(release.wait, 5))
        queued = [asyncio.ensure_future(blocking.run(ran.append, k)) for k in range(3)]
        await asyncio.sleep(0.01)
        stopping = asyncio.ensure_future(asyncio.to_thread(blocking.shutdown))
        await asyncio.sleep(0.05)
        assert not stopping.done(), "shutdown waits for the work in flight"
        release.set()
        await stopping
        assert ran == [0, 1, 2]
        assert await busy
        await asyncio.gather(*queued)
        with pytest.raises(RuntimeError):
            await blocking.run(ran.append, 3)

    asyncio.run(main())


def test_a_landing_write_runs_and_lands_also_when_its_caller_left_before_it_started() -> None:
    """Unlike a plain job, a write handed to `run_landing` is never dropped: its caller
    (a unary append past its deadline) may have gone while it queued, and it still
    writes and lands, as it did on an executor whose future nobody cancelled."""
    blocking = Blocking(1, 1)
    release = threading.Event()
    events: list[object] = []

    def write() -> int:
        events.append("wrote")
        return 1

    async def main() -> None:
        busy = asyncio.ensure_future(blocking.run(release.wait, 5))
        call = asyncio.ensure_future(blocking.run_landing(write, events.append))
        await asyncio.sleep(0.01)
        call.cancel()  # before its write started: the one storage thread is busy
        release.set()
        assert await busy
        with pytest.raises(asyncio.CancelledError):
            await call
        await blocking.run(lambda: None)  # the write ran before this job
        await asyncio.sleep(0.01)  # and its landing was handed to the loop

    try:
        asyncio.run(main())
    finally:
        blocking.shutdown()
    assert events == ["wrote", 1]


def test_a_job_failing_outside_its_hand_off_does_not_take_its_thread_down(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The pool's one thread survives a job that raises past its own guard (a bug) and
    runs the next job; the failure is logged."""
    blocking = Blocking(1, 1)

    def broken() -> None:
        raise ZeroDivisionError("bug")

    async def main() -> int:
        blocking._pool.submit(broken)
        return await asyncio.wait_for(blocking.run(lambda: 5), 5)

    try:
        assert asyncio.run(main()) == 5
    finally:
        blocking.shutdown()
    assert any("outside its caller" in r.getMessage() for r in caplog.records)


class _Owed:
    """What a store's `deferring_sync` yields: `sync` records its thread, waits for
    `gate`, then fails with `error` if one is given."""

    def __init__(
        self, gate: threading.Event, error: BaseException | None = None, owes: bool = True
    ) -> None:
        self.gate, self.error, self._owes = gate, error, owes
        self.entered = threading.Event()
        self.syncs: list[str] = []
        self.inside = False

    def owes(self) -> bool:
        return self._owes

    def sync(self) -> None:
        self.syncs.append(threading.current_thread().name)
        self.entered.set()
        assert self.gate.wait(5)
        if self.error is not None:
            raise self.error

    def deferring(self) -> contextlib.AbstractContextManager[_Owed]:
        @contextlib.contextmanager
        def scope() -> Iterator[_Owed]:
            self.inside = True
            try:
                yield self
            finally:
                self.inside = False

        return scope()


def test_a_deferred_sync_runs_on_the_storage_thread_while_the_second_part_runs() -> None:
    """`first` runs inside the deferral; its sync is made on the storage thread at the
    same time as `then` (which here waits for the sync to have started: one after the
    other would time out), and the result comes only once the sync is done."""
    gate = threading.Event()
    owed = _Owed(gate)
    blocking = Blocking(2, 2)
    seen: dict[str, object] = {}

    def first() -> int:
        seen["inside"] = owed.inside
        return 41

    def then() -> str:
        seen["sync_started_first"] = owed.entered.wait(5)
        return "compiled"

    async def main() -> tuple[int, str | BaseException]:
        call = asyncio.ensure_future(blocking.run_then_compute(first, then, None, owed.deferring))
        await asyncio.sleep(0.2)
        seen["answered_before_the_sync"] = call.done()
        gate.set()
        return await call

    try:
        assert asyncio.run(main()) == (41, "compiled")
    finally:
        blocking.shutdown()
    assert seen == {"inside": True, "sync_started_first": True, "answered_before_the_sync": False}
    assert len(owed.syncs) == 1 and owed.syncs[0].startswith("ctxcc-io")


def test_the_second_part_starts_once_the_deferred_sync_has_started() -> None:
    """The compute thread holds the GIL through a compile: a storage thread woken for the
    fsync would wait for it, and the fsync would follow the compile instead of
    overlapping it. So `then` starts only once the sync has started."""
    gate = threading.Event()
    gate.set()
    owed = _Owed(gate)
    blocking = Blocking(2, 2, sync_start_wait_s=30)
    seen: list[bool] = []

    def then() -> str:
        seen.append(owed.entered.is_set())
        return "x"

    async def main() -> tuple[int, str | BaseException]:
        return await blocking.run_then_compute(lambda: 41, then, None, owed.deferring)

    try:
        for _ in range(20):
            owed.entered.clear()
            assert asyncio.run(main()) == (41, "x")
    finally:
        blocking.shutdown()
    assert seen == [True] * 20 and len(owed.syncs) == 20


def test_with_every_storage_thread_busy_the_second_part_does_not_wait_for_the_sync() -> None:
    """The wait for the sync to start is bounded: behind a storage thread held by other
    work, the compile runs, and the answer still comes only after the sync."""
    gate = threading.Event()
    owed = _Owed(gate)
    blocking = Blocking(1, 2, sync_start_wait_s=0.05)
    held = threading.Event()
    seen: dict[str, object] = {}

    ran = threading.Event()

    def then() -> str:
        seen["sync_started"] = owed.entered.is_set()
        ran.set()
        return "compiled"

    async def main() -> tuple[int, str | BaseException]:
        hold = asyncio.ensure_future(blocking.run(held.wait, 30))
        call = asyncio.ensure_future(
            blocking.run_then_compute(lambda: 41, then, None, owed.deferring)
        )
        assert await asyncio.to_thread(ran.wait, 30)
        seen["answered_before_the_sync"] = call.done()
        held.set()
        gate.set()
        await hold
        return await call

    try:
        assert asyncio.run(main()) == (41, "compiled")
    finally:
        blocking.shutdown()
    assert seen == {"sync_started": False, "answered_before_the_sync": False}
    assert len(owed.syncs) == 1


def test_a_failed_deferred_sync_fails_the_call_and_nothing_lands() -> None:
    """The writes were not made durable: the call fails as a failure of `first` would,
    whatever `then` returned, and `landed` is not told of a result."""
    gate = threading.Event()
    gate.set()
    owed = _Owed(gate, OSError("fsync failed"))
    blocking = Blocking(2, 2)
    landed: list[int] = []

    async def main() -> object:
        return await blocking.run_then_compute(
            lambda: 41, lambda: "x", landed.append, owed.deferring
        )

    try:
        with pytest.raises(OSError, match="fsync failed"):
            asyncio.run(main())
    finally:
        blocking.shutdown()
    assert landed == [] and len(owed.syncs) == 1


def test_a_failure_of_the_second_part_still_waits_for_the_deferred_sync() -> None:
    gate = threading.Event()
    owed = _Owed(gate)
    blocking = Blocking(2, 2)
    landed: list[int] = []

    def then() -> str:
        raise ValueError("compile failed")

    async def main() -> tuple[int, str | BaseException]:
        call = asyncio.ensure_future(
            blocking.run_then_compute(lambda: 41, then, landed.append, owed.deferring)
        )
        assert await asyncio.to_thread(owed.entered.wait, 5)
        await asyncio.sleep(0.1)
        assert not call.done()
        gate.set()
        return await call

    try:
        value, outcome = asyncio.run(main())
    finally:
        blocking.shutdown()
    assert value == 41 and isinstance(outcome, ValueError) and landed == [41]


def test_writes_that_owe_no_sync_wake_no_storage_thread() -> None:
    """With durability off nothing is owed: the call is answered from the compute thread
    alone, no sync made."""
    owed = _Owed(threading.Event(), owes=False)
    blocking = Blocking(2, 2)

    async def main() -> tuple[int, str | BaseException]:
        return await blocking.run_then_compute(lambda: 41, lambda: "x", None, owed.deferring)

    try:
        assert asyncio.run(main()) == (41, "x")
    finally:
        blocking.shutdown()
    assert owed.syncs == []


class _Result:
    """A job's result, as large as a time-travel compile's view, but weakly referable."""


class _Watched:
    """A pool's queue that counts the jobs put and the takes its threads make: a thread
    that has taken every job but one more waits for the next, its last job done."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Callable[[], object] | None] = queue.SimpleQueue()
        self._changed = threading.Condition()
        self._puts = 0
        self._takes = 0

    def put(self, job: Callable[[], object] | None) -> None:
        with self._changed:
            self._puts += 1
        self._queue.put(job)

    def get(self) -> Callable[[], object] | None:
        with self._changed:
            self._takes += 1
            self._changed.notify_all()
        return self._queue.get()

    def idle(self, threads: int) -> bool:
        """Waits until each of the pool's `threads` waits for a job none was put for."""
        with self._changed:
            return self._changed.wait_for(lambda: self._takes == self._puts + threads, 5)


def _deferred(blocking: Blocking) -> Awaitable[object]:
    gate = threading.Event()
    gate.set()
    owed = _Owed(gate)
    return blocking.run_then_compute(_Result, _Result, None, owed.deferring)


@pytest.mark.parametrize(
    "call",
    [
        lambda b: b.run(_Result),
        lambda b: b.compute(_Result),
        lambda b: b.compute_light(_Result),
        lambda b: b.run_then_compute(_Result, _Result),
        _deferred,
    ],
    ids=["run", "compute", "compute_light", "run_then_compute", "run_then_compute_synced"],
)
def test_an_idle_thread_holds_nothing_of_the_last_job_it_ran(
    call: Callable[[Blocking], Awaitable[object]],
) -> None:
    """Once answered, a job's result (and its arguments) are held by its caller alone:
    a pool's thread waiting for its next job kept the last one it ran, with the future
    it settled, so up to one time-travel compile's view and history per thread of the
    pools (eleven by default) stayed alive while the daemon was idle."""
    blocking = Blocking(1, 1)
    pools = (blocking._pool, blocking._compute, blocking._light)
    watched = [_Watched() for _ in pools]
    for pool, q in zip(pools, watched, strict=True):
        pool._queue = q  # type: ignore[assignment]

    async def main() -> list[weakref.ref[_Result]]:
        answer = await call(blocking)
        values = answer if isinstance(answer, tuple) else (answer,)
        return [weakref.ref(v) for v in values]

    try:
        results = asyncio.run(main())
        for pool, q in zip(pools, watched, strict=True):
            assert q.idle(len(pool._threads))
        gc.collect()
        assert results and all(r() is None for r in results)
    finally:
        blocking.shutdown()
