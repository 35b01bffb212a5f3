"""A retention sweep deleting a session when the daemon stops: the delete, which its
storage thread finishes whatever happens, is logged and counted like any other. The
stop used to cancel the sweep while it waited for that thread, so the session was gone
without its log line or its count in ctxcc_sessions_expired_total."""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path
from typing import Any

import pytest

from ctxcc.v1 import session_pb2
from ctxcc.v1 import session_service_pb2 as spb
from server.app import Daemon
from tests.conftest import make_config, stubs_for
from tests.helpers import user


async def test_a_sweep_deleting_at_stop_still_logs_and_counts_its_delete(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="server.service.retention")
    daemon = Daemon(make_config(short_tmp, session_retention="1s"))
    deleted, release = threading.Event(), threading.Event()
    await daemon.start()
    stopped = False
    try:
        store = daemon._store
        assert store is not None
        delete_idle = store.delete_idle_session

        def held_after_deleting(session_id: str, before_ns: int) -> Any:
            result = delete_idle(session_id, before_ns)
            if result is not None:
                deleted.set()
                release.wait(30)  # the stop begins meanwhile
            return result

        monkeypatch.setattr(store, "delete_idle_session", held_after_deleting)
        api = stubs_for(f"unix:{daemon.endpoints.unix}")
        try:
            session = session_pb2.Session(session_id="idle")
            await api.sessions.CreateSession(spb.CreateSessionRequest(session=session))
            await api.sessions.AppendEvents(
                spb.AppendEventsRequest(session_id="idle", events=[user("hi")])
            )
        finally:
            await api.channel.close()
        assert await asyncio.to_thread(deleted.wait, 60)
        sweep = daemon._sweep
        assert sweep is not None and not sweep.done()
        stopping = asyncio.ensure_future(daemon.stop())
        while not sweep.cancelling() and not sweep.done():  # noqa: ASYNC110 (a task state)
            await asyncio.sleep(0.01)
        release.set()
        await stopping
        stopped = True
    finally:
        release.set()
        if not stopped:
            await daemon.stop()
    lines = [r.getMessage() for r in caplog.records if "deleted: idle" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("session idle deleted"), lines
    expired = daemon.telemetry.registry.get_sample_value("ctxcc_sessions_expired_total")
    assert expired == 1
