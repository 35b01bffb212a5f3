"""Edges of the basis quota, against daemons on RocksDB in temp dirs: repeated compiles
of a session whose bases are not stored, the quota reached exactly, basis bytes against
the parts a store holds across restarts."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from ctxcc.v1 import session_pb2
from ctxcc.v1 import session_service_pb2 as spb
from server.app import Daemon
from tests.conftest import make_config, stubs_for
from tests.helpers import compile_request, user
from tests.integration.test_basis_quota import SID, _dropped, _held, _rebuilds


async def test_repeats_of_a_compile_without_basis_are_counted_as_its_quota(
    short_tmp: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """With --max-session-basis-bytes 0, the same request compiled again (a repeat of
    the first compile, nothing read having changed) is recorded without a basis for the
    same reason, the quota: not as one naming a basis that is missing, warned of at every
    repeat."""
    d = Daemon(make_config(short_tmp, max_session_basis_bytes="0"))
    await d.start()
    api = stubs_for(f"unix:{d.endpoints.unix}")
    try:
        session = session_pb2.Session(session_id=SID)
        await api.sessions.CreateSession(spb.CreateSessionRequest(session=session))
        await api.sessions.AppendEvents(
            spb.AppendEventsRequest(session_id=SID, events=[user("hi")])
        )
        ids = []
        with caplog.at_level(logging.INFO, "ctxcc.storage"):
            for _ in range(5):
                ids.append((await api.compiles.Compile(compile_request(SID))).view.compile_id)
        assert len(set(ids)) == 5
        for cid in ids:
            assert not await _rebuilds(api, cid)
        assert (await _held(api)).basis_bytes == 0
        assert (_dropped(d, "quota"), _dropped(d, "missing")) == (5, 0)
        warned = [
            r
            for r in caplog.records
            if r.levelno >= logging.WARNING and "without its basis" in r.getMessage()
        ]
        assert len(warned) == 1, [r.getMessage() for r in warned]
    finally:
        await api.channel.close()
        await d.stop()
