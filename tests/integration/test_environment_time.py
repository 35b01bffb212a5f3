"""The environment section's time, which ends the system prompt and so comes before the
whole history, changes once an hour by default: steps minutes apart send the same system
prompt (a provider's prefix cache of the history holds), an hour later it moves."""

from __future__ import annotations

from pathlib import Path

import pytest

import server.app
from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_pb2
from ctxcc.v1 import session_service_pb2 as spb
from server.adapters.system import SystemClock
from server.app import Daemon
from tests.conftest import make_config, stubs_for
from tests.helpers import ROUTE, user

# The clock the daemon reads, in ns past 2026-12-02T10:00:00Z (the top of an hour).
NOW = [0]
HOUR_START_NS = 1_796_205_600 * 1_000_000_000


class _Clock(SystemClock):
    def now_ns(self) -> int:
        return HOUR_START_NS + NOW[0]


async def test_steps_within_the_hour_send_the_same_system_prompt(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server.app, "SystemClock", _Clock)
    d = Daemon(make_config(short_tmp))
    await d.start()
    api = stubs_for(f"unix:{d.endpoints.unix}")
    try:
        await api.sessions.CreateSession(
            spb.CreateSessionRequest(session=session_pb2.Session(session_id="s"))
        )
        prompts = []
        for minutes in (1, 12, 59, 61):
            NOW[0] = minutes * 60 * 1_000_000_000
            await api.sessions.AppendEvents(
                spb.AppendEventsRequest(session_id="s", events=[user(f"at {minutes}")])
            )
            req = cpb.CompileRequest(session_id="s", route=ROUTE)
            prompts.append((await api.compiles.Compile(req)).view.system_prompt)
        assert prompts[0] == prompts[1] == prompts[2] != prompts[3]
        assert "2026-12-02T10:00:00Z" in prompts[0] and "2026-12-02T11:00:00Z" in prompts[3]
    finally:
        await api.channel.close()
        await d.stop()
