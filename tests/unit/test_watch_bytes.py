"""WatchBytes: a watch's next page waits while the watches hold the budget, watches stalled
while others wait are ended once each, and their bytes come back."""

from __future__ import annotations

import asyncio

from server.service.watch import WatchBytes
from server.transport.held import HeldBytes


def test_a_page_waits_for_room_and_a_stalled_holder_is_ended_once() -> None:
    async def run() -> None:
        held = HeldBytes(100, "watches", "watch")
        budget = WatchBytes(held, stalled_s=0.05)
        ended: list[str] = []
        stalled = budget.holding(lambda: ended.append("stalled"))
        # Alone, a watch reads whatever its page asks for, past the budget.
        assert await stalled.reserve(150, 10) == 150
        page = stalled.read(160, 120, 20)
        stalled.sending(15)  # drawn from what its page set aside
        assert held.held == 140
        reader = budget.holding(lambda: ended.append("reader"))
        waiting = asyncio.ensure_future(reader.reserve(30, 10))
        await asyncio.sleep(0.2)
        assert not waiting.done()
        assert ended == ["stalled"]  # once, however long the reader waits
        stalled.sent(15)
        stalled.handed_on(page)
        stalled.close()
        assert await waiting == 30
        assert held.held == 40
        reader.give(40)
        reader.close()
        assert held.held == 0

    asyncio.run(run())


def test_room_is_what_the_budget_leaves_past_what_a_page_may_add() -> None:
    async def run() -> None:
        held = HeldBytes(100, "watches", "watch")
        budget = WatchBytes(held)
        first = budget.holding(lambda: None)
        assert await first.reserve(30, 10) == 30
        second = budget.holding(lambda: None)
        assert await second.reserve(80, 10) == 50  # 100 - 40 held - 10 over
        assert held.held == 100
        first.close()
        second.close()
        assert held.held == 0

    asyncio.run(run())


def test_a_watch_reading_its_page_is_not_ended_however_long_the_read_takes() -> None:
    """Only a watch whose message waits on gRPC (its client reads nothing) is stalled: one
    whose page read is slow (the storage pool busy with appends' syncs) has nothing its
    client could take, and was ended QUOTA_EXCEEDED as if it had stopped reading."""

    async def run() -> None:
        held = HeldBytes(100, "watches", "watch")
        budget = WatchBytes(held, stalled_s=0.05)
        ended: list[str] = []
        reading = budget.holding(lambda: ended.append("reading"))
        assert await reading.reserve(80, 10) == 80  # its page is being read from here
        waiter = budget.holding(lambda: ended.append("waiter"))
        waiting = asyncio.ensure_future(waiter.reserve(30, 10))
        await asyncio.sleep(0.2)  # the read takes longer than stalled_s
        assert ended == []
        page = reading.read(90, 75, 20)  # the page came: 95 held
        reading.sending(15)
        await asyncio.sleep(0.01)
        assert ended == []  # its first message was only just handed to gRPC
        await asyncio.sleep(0.2)
        assert ended == ["reading"]  # that one waited on its client: stalled
        reading.sent(15)
        reading.handed_on(page)
        reading.close()
        assert await waiting == 30
        waiter.close()
        assert held.held == 0

    asyncio.run(run())
