"""A session's active time (its latest append or recorded compile, the later: what
--session-retention measures idleness from) through GetSession and ListSessions, and the
idle column `ctxcc sessions` shows from it."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_pb2
from ctxcc.v1 import session_service_pb2 as spb
from server.app import Daemon
from tests.conftest import Stubs, make_config, stubs_for
from tests.e2e.proc import REPO
from tests.helpers import ROUTE, user


@pytest.fixture
async def running(short_tmp: Path) -> AsyncIterator[tuple[Daemon, Stubs]]:
    daemon = Daemon(make_config(short_tmp / "data"))
    await daemon.start()
    stubs = stubs_for(f"unix:{daemon.endpoints.unix}")
    try:
        yield daemon, stubs
    finally:
        await stubs.channel.close()
        await daemon.stop()


async def _session(api: Stubs, sid: str) -> session_pb2.Session:
    got = await api.sessions.GetSession(spb.GetSessionRequest(session_id=sid))
    return got.session


async def test_the_active_time_is_the_later_of_append_and_compile(
    running: tuple[Daemon, Stubs],
) -> None:
    daemon, api = running
    for sid in ("empty", "appended", "compiled"):
        await api.sessions.CreateSession(
            spb.CreateSessionRequest(session=session_pb2.Session(session_id=sid))
        )
    empty = await _session(api, "empty")
    # Created and nothing since: the creation's update time (no append yet).
    assert empty.active_time == empty.update_time
    for sid in ("appended", "compiled"):
        await api.sessions.AppendEvents(
            spb.AppendEventsRequest(session_id=sid, events=[user("hi")])
        )
    await asyncio.sleep(0.05)  # the compile lands a clock tick after the append
    asked = time.time_ns()
    await api.compiles.Compile(cpb.CompileRequest(session_id="compiled", route=ROUTE))
    appended, compiled = await _session(api, "appended"), await _session(api, "compiled")
    assert appended.active_time == appended.update_time
    assert compiled.active_time.ToNanoseconds() > compiled.update_time.ToNanoseconds()
    assert compiled.active_time.ToNanoseconds() >= asked
    # A dry run is not recorded: it leaves the active time alone.
    await api.compiles.Compile(cpb.CompileRequest(session_id="appended", route=ROUTE, dry_run=True))
    assert (await _session(api, "appended")).active_time == appended.active_time
    listed = await api.sessions.ListSessions(spb.ListSessionsRequest())
    by_id = {s.session_id: s for s in listed.sessions}
    assert by_id["compiled"].active_time == compiled.active_time
    assert by_id["appended"].active_time == appended.active_time

    def ctxcc(*args: str) -> subprocess.CompletedProcess[str]:
        target = f"unix:{daemon.endpoints.unix}"
        return subprocess.run(
            [sys.executable, "-m", "server", "sessions", *args, "--target", target],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    before = time.time_ns()
    rows = json.loads((await asyncio.to_thread(ctxcc, "--json")).stdout)
    after = time.time_ns()
    idle = {r["session_id"]: r["idle_seconds"] for r in rows}
    for sid, s in by_id.items():
        low = (before - s.active_time.ToNanoseconds()) // 1_000_000_000
        high = (after - s.active_time.ToNanoseconds()) // 1_000_000_000
        assert low <= idle[sid] <= high, (sid, idle[sid])
    # The table is another call, later: its idle time is bounded by its own clock.
    before = time.time_ns()
    table = (await asyncio.to_thread(ctxcc)).stdout.splitlines()
    after = time.time_ns()
    assert table[0].split()[:3] == ["session", "seq", "idle"]
    row = next(line for line in table if line.startswith("compiled "))
    active = compiled.active_time.ToNanoseconds()
    shown = [f"{s}s" for s in range((before - active) // 10**9, (after - active) // 10**9 + 1)]
    assert row.split()[2] in shown
