"""Sessions made, stepped and deleted over and over on a real daemon: what the daemon
keeps in memory per session is released by the delete, not left for an LRU to reach."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from ctxcc.v1 import checkpoint_pb2, session_pb2, tool_pb2
from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_service_pb2 as spb
from ctxcc.v1 import tool_service_pb2 as tpb
from server.app import Daemon
from tests.conftest import Stubs
from tests.helpers import ROUTE, assistant, compile_request, png_upload, tool_result, user

TOOLS = [
    tool_pb2.ToolDefinition(
        name="deploy",
        description="deploy the site",
        input_schema_json='{"type": "object"}',
        visibility=tool_pb2.TOOL_VISIBILITY_DEFERRED,
    ),
    tool_pb2.ToolDefinition(
        name="shell", description="run a command", input_schema_json='{"type": "object"}'
    ),
]


async def _requests(
    queue: asyncio.Queue[cpb.CompileStreamRequest | None],
) -> AsyncIterator[cpb.CompileStreamRequest]:
    while (item := await queue.get()) is not None:
        yield item


async def _stepped(api: Stubs, sid: str, i: int) -> None:
    """A session's life short of its delete: tools, events, a watch, a unary compile and
    its usage, a search, an artifact, a checkpoint, stream steps with delta bases, the
    stream ended normally or cancelled."""
    await api.sessions.CreateSession(
        spb.CreateSessionRequest(session=session_pb2.Session(session_id=sid))
    )
    await api.tools.RegisterTools(tpb.RegisterToolsRequest(session_id=sid, tools=TOOLS))
    events = [user(f"hello {i}"), assistant("", ("c1", "shell", "{}")), tool_result("c1", "ok")]
    await api.sessions.AppendEvents(spb.AppendEventsRequest(session_id=sid, events=events))
    watch: Any = api.sessions.WatchSession(spb.WatchSessionRequest(session_id=sid))
    assert (await watch.read()).event.seq == 1
    view = (await api.compiles.Compile(compile_request(sid))).view
    usage = cpb.ReportUsageRequest(
        compile_id=view.compile_id, route=ROUTE, input_tokens=500, output_tokens=20
    )
    await api.compiles.ReportUsage(usage)
    await api.tools.SearchTools(tpb.SearchToolsRequest(session_id=sid, query="deploy"))
    upload = png_upload(sid, hashlib.sha256(sid.encode()).digest())
    await api.artifacts.UploadArtifact(iter(upload))
    checkpoint = checkpoint_pb2.Checkpoint(session_id=sid, covers_through_seq=2, summary="so far")
    await api.compiles.CreateCheckpoint(cpb.CreateCheckpointRequest(checkpoint=checkpoint))
    queue: asyncio.Queue[cpb.CompileStreamRequest | None] = asyncio.Queue()
    call: Any = api.compiles.CompileStream(_requests(queue))
    answers = call.__aiter__()
    base = ""
    for s in range(3):
        step = cpb.StepRequest(
            step_id=str(s),
            request_id=f"{sid}-{s}",
            events=[user(f"step {s}")],
            compile=compile_request(sid),
            delta_base_compile_id=base,
        )
        await queue.put(cpb.CompileStreamRequest(step=step))
        answer = await answers.__anext__()
        kind = answer.WhichOneof("response")
        assert kind in ("view", "delta"), answer
        if kind == "view":
            base = answer.view.compile_id
    if i % 2:
        await queue.put(None)
        assert [a async for a in answers] == []
    else:
        call.cancel()
    watch.cancel()


async def test_deleted_sessions_leave_no_memos_or_views_behind(
    daemon: Daemon, unix_api: Stubs
) -> None:
    api = unix_api
    compiles: Any = daemon.compile_servicer._c  # type: ignore[union-attr]
    generations: Any = daemon._store._generations  # type: ignore[union-attr]
    # One session lives throughout: what it keeps is the baseline.
    await _stepped(api, "live", 1)
    baseline, reads = compiles.kept(), compiles.kept_reads()
    assert baseline[0] >= 1, "the live session's memo is kept"
    assert reads >= 1, "the live session's tool and checkpoint lists are kept"
    assert set(generations._sessions) == {"live"}

    rounds, per = 3, 6
    for r in range(rounds):
        ids = [f"s{r}-{j}" for j in range(per)]
        for j, sid in enumerate(ids):
            await _stepped(api, sid, j)
        # Each compiled session holds a memo (and its last view, to repeat) until deleted.
        memos, views = compiles.kept()
        assert memos >= baseline[0] + per and views >= baseline[1] + per
        for sid in ids:
            await api.sessions.DeleteSession(spb.DeleteSessionRequest(session_id=sid))
        assert compiles.kept() == baseline, f"round {r}: a deleted session's memo kept"
        # And what its compiles read of the store (tool, checkpoint and source lists,
        # artifact sizes): they held the LRUs' room until evicted (1,024 entries each).
        assert compiles.kept_reads() == reads, f"round {r}: a deleted session's reads kept"
        assert set(generations._sessions) == {"live"}
        assert set(generations._tables) == {"live"}

    # The live session still compiles from its memo (a deletion forgot only its own).
    view = (await api.compiles.Compile(compile_request("live"))).view
    assert view.compile_id
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await api.compiles.Compile(compile_request("s0-0"))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
