"""One record damaged on disk (written over with garbage while the daemon was stopped)
must not stop operations for good: a damaged session record is listed by its id alone,
refused when read (DATA_LOSS/RECORD_CORRUPT), deleted by DeleteSession with everything
stored under it, and passed over by the retention sweep (which goes on to the sessions
after it); a damaged copy of a session's latest compile record is ignored (the next
compile replaces it). The log names the session each time."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import grpc
import pytest

from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_pb2
from ctxcc.v1 import session_service_pb2 as spb
from server.app import Daemon
from storage import open_rocks
from storage.keys import LAST_COMPILE, session_key
from storage.kv import Batch
from tests.conftest import make_config, stubs_for
from tests.helpers import ROUTE, error_info, user

SESSIONS = ("a0", "bad_compile", "bad_kept", "bad_session", "z9")


async def _write(data: Path) -> dict[str, str]:
    d = Daemon(make_config(data))
    await d.start()
    api = stubs_for(f"unix:{d.endpoints.unix}")
    compiled = {}
    try:
        for sid in SESSIONS:
            await api.sessions.CreateSession(
                spb.CreateSessionRequest(session=session_pb2.Session(session_id=sid))
            )
            await api.sessions.AppendEvents(
                spb.AppendEventsRequest(session_id=sid, events=[user("hi"), user("again")])
            )
            req = cpb.CompileRequest(session_id=sid, route=ROUTE)
            compiled[sid] = (await api.compiles.Compile(req)).view.compile_id
    finally:
        await api.channel.close()
        await d.stop()
    kv = open_rocks(data / "db")
    try:
        batch = Batch()
        batch.put("sessions", b"bad_session", b"\x07junk")
        batch.put("sessions", b"bad_kept", b"\x00")
        batch.put("compiles", session_key("bad_compile", LAST_COMPILE), b"\x00garbage")
        kv.write(batch)
    finally:
        kv.close()
    return compiled


async def test_a_damaged_record_does_not_stop_operations(
    short_tmp: Path, caplog: pytest.LogCaptureFixture
) -> None:
    compiled = await _write(short_tmp)
    caplog.set_level(logging.WARNING, logger="ctxcc.storage")
    d = Daemon(make_config(short_tmp))
    await d.start()
    api = stubs_for(f"unix:{d.endpoints.unix}")
    try:
        listed = (await api.sessions.ListSessions(spb.ListSessionsRequest())).sessions
        assert [s.session_id for s in listed] == list(SESSIONS)
        bad = next(s for s in listed if s.session_id == "bad_session")
        assert bad.head_seq == 0 and bad.create_time.ToNanoseconds() == 0
        with pytest.raises(grpc.aio.AioRpcError) as read:
            await api.sessions.GetSession(spb.GetSessionRequest(session_id="bad_session"))
        assert read.value.code() == grpc.StatusCode.DATA_LOSS
        assert error_info(read.value).reason == "RECORD_CORRUPT"
        # The compile's copy is ignored: compiles go on, and replace it.
        got = await api.sessions.GetSession(spb.GetSessionRequest(session_id="bad_compile"))
        assert got.compile_id == ""
        req = cpb.CompileRequest(session_id="bad_compile", route=ROUTE)
        again = (await api.compiles.Compile(req)).view.compile_id
        assert again != compiled["bad_compile"]
        got = await api.sessions.GetSession(spb.GetSessionRequest(session_id="bad_compile"))
        assert got.compile_id == again
        # DeleteSession removes the damaged one, with its events.
        deleted = await api.sessions.DeleteSession(
            spb.DeleteSessionRequest(session_id="bad_session")
        )
        assert deleted.deleted_events == 2
        with pytest.raises(grpc.aio.AioRpcError) as gone:
            await api.sessions.ListEvents(spb.ListEventsRequest(session_id="bad_session"))
        assert error_info(gone.value).reason == "SESSION_NOT_FOUND"
    finally:
        await api.channel.close()
        await d.stop()
    # With a retention of 1 s, the sweep gets past the damaged session record (kept: when
    # it was last used is unknown) to the idle sessions after it.
    d = Daemon(make_config(short_tmp, session_retention="1"))
    await d.start()
    api = stubs_for(f"unix:{d.endpoints.unix}")
    try:
        for _ in range(300):
            listed = (await api.sessions.ListSessions(spb.ListSessionsRequest())).sessions
            if len(listed) == 1:
                break
            await asyncio.sleep(0.1)
        assert [s.session_id for s in listed] == ["bad_kept"]
    finally:
        await api.channel.close()
        await d.stop()
    logged = caplog.text
    assert "session 'bad_session': its record is damaged" in logged
    assert "session 'bad_session': deleted with its record damaged" in logged
    assert "session 'bad_compile''s latest compile record is damaged and ignored" in logged
