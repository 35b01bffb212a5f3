"""Full garbage collections held off while compute work runs (server/adapters/gc_pauses.py)
and the compute pool's jobs run inside the hold (server/service/blocking.py)."""

from __future__ import annotations

import asyncio
import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from server.adapters.gc_pauses import FullCollections
from server.service.blocking import Blocking


@pytest.fixture(autouse=True)
def _collector_as_it_was() -> Iterator[None]:
    threshold = gc.get_threshold()
    callbacks = list(gc.callbacks)
    yield
    gc.set_threshold(*threshold)
    gc.callbacks[:] = callbacks
    gc.unfreeze()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_no_full_collection_starts_while_any_hold_lasts() -> None:
    """The old generation's threshold is out of reach while a hold lasts, the young ones'
    untouched; two overlapping holds (two compute threads) release it when both end."""
    young = gc.get_threshold()[:2]
    policy = FullCollections()
    first, second = policy.held(), policy.held()
    first.__enter__()
    assert gc.get_threshold()[:2] == young
    assert gc.get_threshold()[2] > 1_000_000
    second.__enter__()
    first.__exit__(None, None, None)
    assert gc.get_threshold()[2] > 1_000_000, "released while a job still runs"
    second.__exit__(None, None, None)
    assert gc.get_threshold() == (*young, 10)
    assert policy.holds == 1


def test_a_hold_ends_when_its_job_raises() -> None:
    policy = FullCollections()
    with pytest.raises(ValueError), policy.held():
        raise ValueError("the job failed")
    assert gc.get_threshold()[2] == 10


def test_what_a_hold_left_alive_is_frozen_until_the_next_thaw() -> None:
    """Installed (as the daemon does), what is alive when the last hold ends is frozen:
    no full collection walks it; after `thaw_s` a hold's end thaws it instead, so a full
    collection walks (and frees the cycles of) all of it again."""
    clock = Clock()
    policy = FullCollections(thaw_s=600, clock=clock)
    policy.install()
    kept = [object() for _ in range(10)] + [[i] for i in range(1000)]
    with policy.held():
        pass
    assert gc.get_freeze_count() >= 1000
    assert policy.freezes == 1
    clock.now += 601
    with policy.held():
        pass
    assert gc.get_freeze_count() == 0
    assert policy.freezes == 1
    with policy.held():
        pass
    assert gc.get_freeze_count() >= 1000, "frozen again after the thaw"
    assert kept


def test_without_install_nothing_is_frozen() -> None:
    """In-process daemons (tests) hold collections off but freeze nothing."""
    policy = FullCollections()
    with policy.held():
        pass
    assert gc.get_freeze_count() == 0


def test_a_hold_longer_than_its_bound_lets_full_collections_start_again() -> None:
    """Compute threads that never go idle together: after `max_hold_s` the collector's
    own rule applies again, at its next collection, until the hold ends."""
    clock = Clock()
    policy = FullCollections(max_hold_s=30, clock=clock)
    policy.install(freezing=False)
    with policy.held():
        gc.collect(0)
        assert gc.get_threshold()[2] > 1_000_000
        clock.now += 31
        gc.collect(0)  # the collector calls back at each collection
        assert gc.get_threshold()[2] == 10
    assert gc.get_threshold()[2] == 10


def test_compute_jobs_run_inside_the_hold_and_storage_jobs_outside() -> None:
    inside: list[tuple[str, bool]] = []
    depth = threading.local()

    @contextmanager
    def around() -> Iterator[None]:
        depth.n = getattr(depth, "n", 0) + 1
        try:
            yield
        finally:
            depth.n -= 1

    def job(name: str) -> str:
        inside.append((name, getattr(depth, "n", 0) == 1))
        return name

    async def main() -> None:
        blocking = Blocking(2, 2, around_compute=around)
        try:
            assert await blocking.compute(job, "compute") == "compute"
            assert await blocking.run(job, "storage") == "storage"
            assert await blocking.compute_light(job, "light") == "light"
        finally:
            blocking.shutdown()

    asyncio.run(main())
    assert inside == [("compute", True), ("storage", False), ("light", False)]
