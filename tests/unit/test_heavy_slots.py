"""HeavySlots: one compute-pool compile per session at a time, others never held up."""

from __future__ import annotations

import asyncio

from server.service.lanes import HeavySlots


async def test_a_sessions_compiles_take_turns_and_other_sessions_pass() -> None:
    slots = HeavySlots()
    order: list[str] = []
    first_in = asyncio.Event()
    let_go = asyncio.Event()

    async def compile_(sid: str, name: str, hold: bool = False) -> None:
        async with slots.slot(sid):
            order.append(f"{name} in")
            if hold:
                first_in.set()
                await let_go.wait()
            order.append(f"{name} out")

    a1 = asyncio.ensure_future(compile_("a", "a1", hold=True))
    await first_in.wait()
    a2 = asyncio.ensure_future(compile_("a", "a2"))
    cancelled = asyncio.ensure_future(compile_("a", "a3"))
    await compile_("b", "b1")  # another session: not held up by a1
    await asyncio.sleep(0)
    assert order == ["a1 in", "b1 in", "b1 out"] and slots.sessions() == 1
    cancelled.cancel()  # a caller gone while it waited: it never runs
    let_go.set()
    await asyncio.gather(a1, a2)
    assert order[3:] == ["a1 out", "a2 in", "a2 out"]
    assert cancelled.cancelled() and slots.sessions() == 0
