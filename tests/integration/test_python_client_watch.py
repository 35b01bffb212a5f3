"""The Python client's `watch` ends its WatchSession call when the caller stops iterating:
a `break` out of `async for`, `aclose()`, or the task iterating it cancelled. The daemon
keeps a watcher per open call (64 per session at most, then QUOTA_EXCEEDED), so a call
left open when its generator closed made a loop that looks at a session's first update
and breaks fail at its 65th watch, against a real daemon."""

from __future__ import annotations

import asyncio

from ctxcc_client import AsyncClient, user

from ctxcc.v1 import session_service_pb2 as spb
from server.app import Daemon

# More than the daemon's 64 watchers per session.
WATCHES = 70


async def _first(ctx: AsyncClient, sid: str) -> spb.WatchSessionResponse:
    async for update in ctx.watch(sid, 0):
        return update
    raise AssertionError("the watch ended without an update")


async def test_a_watch_left_by_break_ends_its_call(daemon: Daemon) -> None:
    async with AsyncClient(f"unix:{daemon.endpoints.unix}") as ctx:
        sid = (await ctx.create_session()).session_id
        await ctx.append(sid, [user("first")])
        for i in range(WATCHES):
            update = await _first(ctx, sid)
            assert update.event.seq == 1, f"watch {i}"


async def test_a_watch_closed_ends_its_call(daemon: Daemon) -> None:
    async with AsyncClient(f"unix:{daemon.endpoints.unix}") as ctx:
        sid = (await ctx.create_session()).session_id
        await ctx.append(sid, [user("first")])
        for i in range(WATCHES):
            watch = ctx.watch(sid, 0)
            update = await anext(aiter(watch))
            assert update.event.seq == 1, f"watch {i}"
            await watch.aclose()


async def _follow(ctx: AsyncClient, sid: str, seen: asyncio.Event) -> None:
    async for _ in ctx.watch(sid, 0):
        seen.set()


async def test_a_watch_whose_task_is_cancelled_ends_its_call(daemon: Daemon) -> None:
    async with AsyncClient(f"unix:{daemon.endpoints.unix}") as ctx:
        sid = (await ctx.create_session()).session_id
        await ctx.append(sid, [user("first")])
        for _ in range(WATCHES):
            seen = asyncio.Event()
            task = asyncio.create_task(_follow(ctx, sid, seen))
            await seen.wait()  # subscribed and delivering: then the task is cancelled
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            assert task.cancelled()
