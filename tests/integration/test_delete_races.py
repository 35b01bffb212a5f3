"""A session deleted while other calls use what it holds, on a real daemon: blobs it
shares with another session, and its watchers."""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from ctxcc.v1 import artifact_service_pb2 as apb
from ctxcc.v1 import session_pb2
from ctxcc.v1 import session_service_pb2 as spb
from ctxcc.v1 import tool_service_pb2 as tpb
from server.app import Daemon
from tests.conftest import Stubs, stubs_for
from tests.helpers import assistant, error_info, tool_result, user

# Over the default blob threshold (16 KiB): stored once as a blob, shared by sessions.
SHARED = "a result both sessions hold\n" * 1_000


@pytest.fixture
async def unix_api(daemon: Daemon) -> AsyncIterator[Stubs]:
    s = stubs_for(f"unix:{daemon.endpoints.unix}")
    try:
        yield s
    finally:
        await s.channel.close()


async def _session(api: Stubs, sid: str) -> None:
    await api.sessions.CreateSession(
        spb.CreateSessionRequest(session=session_pb2.Session(session_id=sid))
    )


async def _upload(api: Stubs, sid: str, data: bytes) -> str:
    header = apb.ArtifactHeader(
        session_id=sid,
        mime_type="image/png",
        size_bytes=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
    )
    messages = [apb.UploadArtifactRequest(header=header), apb.UploadArtifactRequest(data=data)]
    answer = await api.artifacts.UploadArtifact(iter(messages))
    return str(answer.artifact.artifact_id)


async def _result(api: Stubs, sid: str) -> str:
    events = [assistant("", ("c1", "shell", "{}")), tool_result("c1", SHARED)]
    await api.sessions.AppendEvents(spb.AppendEventsRequest(session_id=sid, events=events))
    return "c1"


class _HeldBlobDelete:
    """The store's engine, holding a write that deletes a blob until `release`: the
    write of a session delete that found no other holder of one of its blobs."""

    def __init__(self, kv: Any) -> None:
        self.kv = kv
        self.holding = threading.Event()
        self.release = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.kv, name)

    def write(self, batch: Any) -> None:
        if any(cf == "blobs" for cf, _ in batch.deletes):
            self.holding.set()
            assert self.release.wait(30)
        self.kv.write(batch)


@pytest.mark.parametrize("holds", ["artifact", "tool_result"])
async def test_a_blob_taken_up_while_its_last_holder_is_deleted_is_kept(
    daemon: Daemon, unix_api: Stubs, holds: str
) -> None:
    """Session a holds a blob; b stores the same content while a is deleted. The delete
    decided that nobody else holds the blob, b that the blob is stored already: b's
    acknowledged artifact (or tool result) must still read back whole."""
    api = unix_api
    await _session(api, "a")
    await _session(api, "b")
    data = SHARED.encode()
    if holds == "artifact":
        await _upload(api, "a", data)
    else:
        await _result(api, "a")
    assert daemon._store is not None
    store: Any = daemon._store
    held = _HeldBlobDelete(store._kv)
    store._kv = held
    try:
        delete = asyncio.ensure_future(
            api.sessions.DeleteSession(spb.DeleteSessionRequest(session_id="a"))
        )
        assert await asyncio.to_thread(held.holding.wait, 30)
        take = asyncio.ensure_future(
            _upload(api, "b", data) if holds == "artifact" else _result(api, "b")
        )
        # Lets b's write land before the delete's if nothing keeps it waiting (the race
        # as a client meets it); a b that waits for the delete is let go after it.
        await asyncio.wait({take}, timeout=1)
        held.release.set()
        assert (await delete).deleted_blobs == 1
        taken = await take
    finally:
        held.release.set()
        store._kv = held.kv
    if holds == "artifact":
        download = api.artifacts.DownloadArtifact(
            apb.DownloadArtifactRequest(session_id="b", artifact_id=taken)
        )
        got = b"".join([m.data async for m in download])
        assert got == data
    else:
        read = await api.tools.ReadToolResult(
            tpb.ReadToolResultRequest(
                session_id="b", call_id="c1", bytes=tpb.ByteRange(limit=len(data))
            )
        )
        assert read.slice.text == SHARED


async def test_a_watch_of_a_deleted_session_ends_with_not_found(
    daemon: Daemon, unix_api: Stubs
) -> None:
    """A watcher of a session that is deleted is told (SESSION_NOT_FOUND) instead of
    waiting forever, and never follows a new session made with the same id, whose
    events would continue the old one's seqs as if nothing had happened."""
    api = unix_api
    await _session(api, "w")
    await api.sessions.AppendEvents(
        spb.AppendEventsRequest(session_id="w", events=[user("old one"), user("old two")])
    )
    watch = api.sessions.WatchSession(spb.WatchSessionRequest(session_id="w"))
    updates = watch.__aiter__()
    assert [(await anext(updates)).event.seq for _ in range(2)] == [1, 2]
    await api.sessions.DeleteSession(spb.DeleteSessionRequest(session_id="w"))
    await _session(api, "w")
    await api.sessions.AppendEvents(
        spb.AppendEventsRequest(session_id="w", events=[user(f"new {i}") for i in range(3)])
    )
    with pytest.raises(grpc.RpcError) as err:
        await anext(updates)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert error_info(err.value).reason == "SESSION_NOT_FOUND"
