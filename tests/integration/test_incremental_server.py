"""Incremental compilation through a real daemon: steps continue from the session's memo
(counted on /metrics), and every view equals the recorded compile rebuilt from the store
from scratch, byte for byte."""

from __future__ import annotations

import asyncio
import re
import urllib.request
from pathlib import Path

import grpc

from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_pb2
from ctxcc.v1 import session_service_pb2 as spb
from server.app import Daemon
from tests.conftest import make_config, stubs_for
from tests.helpers import assistant, compile_request, tool_result, user


async def lookups(d: Daemon) -> dict[str, float]:
    url = f"http://{d.endpoints.metrics}/metrics"
    # The daemon serves on this test's event loop: a blocking read here would stall it.
    text = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=30).read().decode())
    found = re.findall(r'ctxcc_compile_memo_lookups_total\{outcome="(\w+)"\} (\S+)', text)
    return {k: float(v) for k, v in found}


async def steps(d: Daemon) -> list[tuple[cpb.CompileResponse, cpb.CompileResponse]]:
    api = stubs_for(str(d.endpoints.tcp))
    try:
        await api.sessions.CreateSession(
            spb.CreateSessionRequest(session=session_pb2.Session(session_id="inc"))
        )
        out = []
        for i in range(6):
            events = [user(f"task {i}")] if i % 2 == 0 else []
            events += [
                assistant(f"step {i}", (f"c{i}", "shell", '{"cmd": "ls"}')),
                tool_result(f"c{i}", f"files {i}"),
                assistant("", (f"open{i}", "shell", "{}")),  # left open: paired synthetically
            ]
            await api.sessions.AppendEvents(
                spb.AppendEventsRequest(session_id="inc", events=events)
            )
            got = await api.compiles.Compile(compile_request("inc"))
            again = await api.compiles.Compile(
                cpb.CompileRequest(rebuild_compile_id=got.view.compile_id)
            )
            out.append((got, again))
        return out
    finally:
        await api.channel.close()


async def test_steps_hit_the_memo_and_match_a_rebuild_from_scratch(short_tmp: Path) -> None:
    d = Daemon(make_config(short_tmp))
    await d.start()
    try:
        for got, rebuilt in await steps(d):
            assert got.view.messages, "the view has the session's history"
            assert [m.SerializeToString() for m in got.view.messages] == [
                m.SerializeToString() for m in rebuilt.view.messages
            ]
            assert got.view.SerializeToString() == rebuilt.view.SerializeToString()
        counted = await lookups(d)
        assert counted["miss"] == 1  # the first compile of the session
        assert counted["hit"] == 5
        assert counted["stale"] == 0
    finally:
        await d.stop()


async def test_memo_off_compiles_from_scratch_with_the_same_views(short_tmp: Path) -> None:
    d = Daemon(make_config(short_tmp, compile_memo_bytes="0"))
    await d.start()
    try:
        for got, rebuilt in await steps(d):
            assert got.view.SerializeToString() == rebuilt.view.SerializeToString()
        assert await lookups(d) == {"hit": 0, "miss": 0, "stale": 0, "repeat": 0}
    finally:
        await d.stop()


async def test_a_view_over_256_kib_compiled_unary_matches_its_rebuild(short_tmp: Path) -> None:
    """Views too large to encode on the event loop are encoded on a thread from the same
    cached records: each step's view equals its rebuild from scratch, and one over
    --max-message-bytes is refused with the reason instead of grpc's bare error."""
    d = Daemon(make_config(short_tmp, max_message_bytes=str(1 << 20)))
    await d.start()
    api = stubs_for(str(d.endpoints.tcp))
    try:
        await api.sessions.CreateSession(
            spb.CreateSessionRequest(session=session_pb2.Session(session_id="big"))
        )
        req = compile_request("big")
        req.limits.context_window = 2_000_000
        sizes: list[int] = []
        refused = None
        for i in range(12):
            events = [user(f"task {i}")]
            for k in range(150):
                events += [
                    assistant(f"step {i}.{k}", (f"c{i}.{k}", "shell", '{"cmd": "ls"}')),
                    tool_result(f"c{i}.{k}", f"file {k} " + "content of the file " * 40),
                ]
            await api.sessions.AppendEvents(
                spb.AppendEventsRequest(session_id="big", events=events)
            )
            try:
                got = await api.compiles.Compile(req)
            except grpc.aio.AioRpcError as err:
                refused = err
                break
            again = await api.compiles.Compile(
                cpb.CompileRequest(rebuild_compile_id=got.view.compile_id)
            )
            assert got.view.SerializeToString() == again.view.SerializeToString()
            assert len(got.view.messages) > 300 * (i + 1)
            sizes.append(got.ByteSize())
        assert sizes[0] < 256 << 10 < sizes[-1] <= 1 << 20
        assert refused is not None, "the view grew over the limit"
        assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "message limit" in str(refused.details())
    finally:
        await api.channel.close()
        await d.stop()
