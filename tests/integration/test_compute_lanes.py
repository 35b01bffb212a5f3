"""Heavy compiles of other sessions never hold an agent's steps: a compile that continues
a warm session with little new text runs on the light lane (server/service/lanes.py).

Two sessions' first compiles are held inside the compiler, so both threads of the
compute pool are taken (as two 16 MB first compiles on a Claude route take them for
seconds); an agent's steps on a warm session are answered meanwhile. Which lane a
compile took is read from the name of the thread that ran it."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
from ctxcc_client import AsyncClient, user

from ctxcc.v1 import common_pb2
from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_service_pb2 as spb
from server.app import Daemon
from server.service.compile_types import CompileOptions
from server.service.compiling import CompileUseCases
from server.service.cpu_budget import CpuBudget
from tests.conftest import make_config, stubs_for

ROUTE = common_pb2.Route(connection="t", protocol="fake", endpoint="local", model="gpt-4o")
# Held far longer than the test needs, only so that a broken lane cannot hang the run.
HOLD_S = 120.0


class Held:
    """Compiles of sessions named heavy* wait inside the compiler until released; every
    compile's thread is noted per session, in order."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.release = threading.Event()
        self.inside = threading.Semaphore(0)
        self.threads: dict[str, list[str]] = {}
        original = CompileUseCases._prepare_within

        def prepare(uc: CompileUseCases, opts: CompileOptions, budget: CpuBudget) -> Any:
            sid = opts.session_id
            self.threads.setdefault(sid, []).append(threading.current_thread().name)
            if sid.startswith("heavy"):
                self.inside.release()
                self.release.wait(HOLD_S)
            return original(uc, opts, budget)

        monkeypatch.setattr(CompileUseCases, "_prepare_within", prepare)

    def lane(self, sid: str, nth: int) -> str:
        return self.threads[sid][nth].rsplit("_", 1)[0]


async def test_an_agents_steps_pass_heavy_compiles_of_other_sessions(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = Held(monkeypatch)
    d = Daemon(make_config(short_tmp))
    await d.start()
    target = f"unix:{d.endpoints.unix}"
    api = stubs_for(target)
    heavy: list[asyncio.Task[Any]] = []
    try:
        async with AsyncClient(target) as ctx:
            agent = (await ctx.create_session()).session_id
            req = cpb.CompileRequest(session_id=agent, route=ROUTE)
            stream = ctx.stream()
            await stream.step(req, [user("first")])  # no memo yet: the compute pool
            await stream.step(req, [user("second")])  # warm, a few bytes new: light
            assert [held.lane(agent, i) for i in (0, 1)] == ["ctxcc-compute", "ctxcc-light"]

            for sid in ("heavy1", "heavy2"):
                await ctx.create_session(session_id=sid)
                await ctx.append(sid, [user(f"{sid} " * 1000)])
                compile_req = cpb.CompileRequest(session_id=sid, route=ROUTE)
                heavy.append(asyncio.ensure_future(api.compiles.Compile(compile_req)))
            for _ in heavy:  # both compute threads are taken
                assert await asyncio.to_thread(held.inside.acquire, True, HOLD_S)

            view, _ = await asyncio.wait_for(stream.step(req, [user("third")]), HOLD_S)
            assert view.event_boundary == 3 and held.lane(agent, 2) == "ctxcc-light"
            assert not any(task.done() for task in heavy)  # still held meanwhile

            # 300 KB appended beside the stream: too much unseen text for the light lane,
            # so this step queues behind the held compiles in the compute pool.
            await api.sessions.AppendEvents(
                spb.AppendEventsRequest(session_id=agent, events=[user("x" * 300_000)])
            )
            big = asyncio.ensure_future(stream.step(req, [user("fourth")]))
            await asyncio.sleep(0)
            held.release.set()
            view, _ = await asyncio.wait_for(big, HOLD_S)
            assert view.event_boundary == 5 and held.lane(agent, 3) == "ctxcc-compute"
            await asyncio.gather(*heavy)
            # The 300 KB are seen now: the next step is light again.
            await stream.step(req, [user("fifth")])
            assert held.lane(agent, 4) == "ctxcc-light"
            # A time-travel compile never continues a memo: the compute pool.
            at = cpb.CompileRequest(session_id=agent, route=ROUTE, as_of_seq=2)
            await api.compiles.Compile(at)
            assert held.lane(agent, 5) == "ctxcc-compute"
    finally:
        held.release.set()
        for task in heavy:
            task.cancel()
        await api.channel.close()
        await d.stop()
