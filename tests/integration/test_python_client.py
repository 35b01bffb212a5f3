"""The Python client across a daemon that goes away and comes back: typed errors (never a
raw AioRpcError, never a dead iterator), and the same stream object working again."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from ctxcc_client import AsyncClient, CtxccError, user

from ctxcc.v1 import common_pb2
from ctxcc.v1 import compile_service_pb2 as cpb
from server.app import Daemon
from tests.conftest import make_config

ROUTE = common_pb2.Route(connection="t", protocol="fake", endpoint="local", model="gpt-4o")


async def test_stream_survives_a_daemon_that_is_gone_then_back(short_tmp: Path) -> None:
    first = Daemon(make_config(short_tmp))
    await first.start()
    target = f"unix:{first.endpoints.unix}"
    async with AsyncClient(target, retry_seconds=0.5) as ctx:
        session = await ctx.create_session()
        req = cpb.CompileRequest(session_id=session.session_id, route=ROUTE)
        stream = ctx.stream()
        view, appended = await stream.step(req, [user("one")])
        assert appended is not None and view.event_boundary == 1
        await first.stop()
        for _ in range(2):  # a second try is the same typed error, not StopAsyncIteration
            with pytest.raises(CtxccError) as err:
                await stream.step(req, [user("two")])
            assert err.value.code == grpc.StatusCode.UNAVAILABLE
        with pytest.raises(CtxccError) as err:
            await ctx.get_session(session.session_id)
        assert err.value.code == grpc.StatusCode.UNAVAILABLE
        second = Daemon(make_config(short_tmp))
        await second.start()
        try:
            assert f"unix:{second.endpoints.unix}" == target
            view, appended = await stream.step(req, [user("two")])
            assert appended is not None and (appended.first_seq, appended.last_seq) == (2, 2)
            assert view.event_boundary == 2
            with pytest.raises(CtxccError) as missing:
                await ctx.compile("no-such-session", route=ROUTE)
            assert missing.value.reason == "SESSION_NOT_FOUND"
        finally:
            await second.stop()
