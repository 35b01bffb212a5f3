"""A restarted daemon reads back which sessions' latest compile was over budget, and
when, from the stored compile records (tests/e2e/test_prometheus_sessions.py does it
under a real Prometheus). Here the restarted daemon's wall clock is moved on, so the age
of those records is known: inside the gauge's 5-minute window they count, past it not."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

import server.app
from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_pb2, view_pb2
from ctxcc.v1 import session_service_pb2 as spb
from server.adapters.system import SystemClock
from server.app import Daemon
from storage import open_rocks
from storage.keys import LAST_COMPILE, session_key
from storage.kv import Batch
from tests.conftest import make_config, stubs_for
from tests.helpers import ROUTE, assistant, user

SMALL = cpb.ModelLimits(context_window=20_000, max_output_tokens=1_000)
OVER = view_pb2.DECISION_OVER_BUDGET_SEND_ANYWAY
TEXT = "Read the failing test, find the cause in the parser and fix it with a small patch. "


def over_budget_gauge(d: Daemon) -> float:
    with urllib.request.urlopen(f"http://{d.endpoints.metrics}/metrics", timeout=10) as r:
        text = r.read().decode()
    (value,) = [
        s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "ctxcc_sessions_over_budget"
    ]
    return float(value)


async def _over_budget(d: Daemon, sids: list[str]) -> None:
    api = stubs_for(f"unix:{d.endpoints.unix}")
    try:
        for sid in sids:
            session = session_pb2.Session(session_id=sid)
            await api.sessions.CreateSession(spb.CreateSessionRequest(session=session))
            for n in range(10):
                events = [user(f"result {n} " + TEXT * 120), assistant("done")]
                await api.sessions.AppendEvents(
                    spb.AppendEventsRequest(session_id=sid, events=events)
                )
                req = cpb.CompileRequest(session_id=sid, route=ROUTE, limits=SMALL)
                if (await api.compiles.Compile(req)).view.decision == OVER:
                    break
            else:
                raise AssertionError(f"{sid} never went over budget")
    finally:
        await api.channel.close()


@pytest.mark.parametrize(("later_s", "counted"), [(0, 2), (200, 2), (400, 0)])
async def test_a_restart_counts_the_sessions_over_budget_of_the_last_five_minutes(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch, later_s: int, counted: int
) -> None:
    d = Daemon(make_config(short_tmp))
    await d.start()
    try:
        await _over_budget(d, ["a", "b"])
        assert over_budget_gauge(d) == 2
    finally:
        await d.stop()

    class Later(SystemClock):
        def now_ns(self) -> int:
            return super().now_ns() + later_s * 1_000_000_000

    monkeypatch.setattr(server.app, "SystemClock", Later)
    d = Daemon(make_config(short_tmp))
    await d.start()
    try:
        assert over_budget_gauge(d) == counted
    finally:
        await d.stop()


@pytest.mark.parametrize(("cf", "key", "counted"), [("compiles", "a", 1), ("sessions", "a", 2)])
async def test_a_damaged_record_does_not_stop_the_restart(
    short_tmp: Path, cf: str, key: str, counted: int
) -> None:
    """Session "a"'s copy of its latest compile record (or its session record) damaged
    on disk: the daemon starts all the same and counts what it could read: "b", and "a"
    too when only its session record is damaged (listed by its id alone, its compile
    records intact)."""
    d = Daemon(make_config(short_tmp))
    await d.start()
    try:
        await _over_budget(d, ["a", "b"])
    finally:
        await d.stop()
    kv = open_rocks(short_tmp / "db")
    try:
        batch = Batch()
        where = session_key(key, LAST_COMPILE) if cf == "compiles" else key.encode()
        batch.put(cf, where, b"\x00not a record")
        kv.write(batch)
    finally:
        kv.close()
    d = Daemon(make_config(short_tmp))
    await d.start()
    try:
        assert over_budget_gauge(d) == counted
    finally:
        await d.stop()
