"""A session deleted while other calls use what it holds, on a real daemon: blobs it
shares with another session, and its watchers."""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import pytest

from ctxcc.v1 import artifact_service_pb2 as apb
from ctxcc.v1 import checkpoint_pb2, common_pb2, session_pb2, source_pb2, tool_pb2
from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_service_pb2 as spb
from ctxcc.v1 import source_service_pb2 as rpb
from ctxcc.v1 import tool_service_pb2 as tpb
from server.app import Daemon
from server.service.artifacts import ArtifactUseCases
from tests.conftest import Stubs
from tests.helpers import assistant, compile_request, error_info, png_bytes, tool_result, user

# Over the default blob threshold (16 KiB): stored once as a blob, shared by sessions.
SHARED = "a result both sessions hold\n" * 1_000


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


class _HeldWrite:
    """The store's engine, holding the writes `which` picks until `release`."""

    def __init__(self, kv: Any, which: Callable[[Any], bool]) -> None:
        self.kv = kv
        self.which = which
        self.holding = threading.Event()
        self.release = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.kv, name)

    def write(self, batch: Any) -> None:
        if self.which(batch):
            self.holding.set()
            assert self.release.wait(30)
        self.kv.write(batch)


class _Paused:
    """A store method that waits for `release` before it runs: the moment between a
    use case's checks and the store's write, where another call can land."""

    def __init__(self, store: Any, name: str) -> None:
        self.store = store
        self.name = name
        self.method = getattr(store, name)
        self.waiting = threading.Event()
        self.release = threading.Event()
        setattr(store, name, self)

    def __call__(self, *args: Any) -> Any:
        self.waiting.set()
        assert self.release.wait(30)
        return self.method(*args)

    def restore(self) -> None:
        self.release.set()
        delattr(self.store, self.name)


async def _refused_when_deleted_meanwhile(
    daemon: Daemon,
    api: Stubs,
    method: str,
    call: Awaitable[Any],
    sid: str,
    *,
    recreate: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """`call` reaches the store's `method`, is held there while session `sid` is
    deleted (and, with `recreate`, made again under its id by it), and must then answer
    SESSION_NOT_FOUND."""
    paused = _Paused(daemon._store, method)
    try:
        pending = asyncio.ensure_future(call)
        assert await asyncio.to_thread(paused.waiting.wait, 30)
        await api.sessions.DeleteSession(spb.DeleteSessionRequest(session_id=sid))
        if recreate is not None:
            await recreate()
        paused.release.set()
        with pytest.raises(grpc.RpcError) as err:
            await pending
    finally:
        paused.restore()
    assert error_info(err.value).reason == "SESSION_NOT_FOUND"


def _deletes_a_blob(batch: Any) -> bool:
    """The write of a session delete that found no other holder of one of its blobs."""
    return any(cf == "blobs" for cf, _ in batch.deletes)


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
    held = _HeldWrite(store._kv, _deletes_a_blob)
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


async def test_a_watch_whose_session_is_deleted_before_it_subscribes_ends_with_not_found(
    daemon: Daemon, unix_api: Stubs
) -> None:
    """A watch looks its session up before the watcher caps are charged. A delete that
    lands between that lookup and the subscription ends no watcher (there is none yet):
    the watch must still end with SESSION_NOT_FOUND rather than wait on a log that is
    gone."""
    api = unix_api
    await _session(api, "r")
    store: Any = daemon._store
    looked_up, release = threading.Event(), threading.Event()
    get_session = store.get_session

    def held_after_the_first_lookup(sid: str) -> Any:
        found = get_session(sid)
        if not looked_up.is_set():
            looked_up.set()
            assert release.wait(30)
        return found

    store.get_session = held_after_the_first_lookup
    try:
        # The deadline only keeps a watch that never ends from hanging the test.
        watch = api.sessions.WatchSession(spb.WatchSessionRequest(session_id="r"), timeout=30)
        first = asyncio.ensure_future(watch.read())
        assert await asyncio.to_thread(looked_up.wait, 30)
        await api.sessions.DeleteSession(spb.DeleteSessionRequest(session_id="r"))
        release.set()
        with pytest.raises(grpc.RpcError) as err:
            await first
    finally:
        release.set()
        del store.get_session
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert error_info(err.value).reason == "SESSION_NOT_FOUND"


async def test_a_session_entry_stored_while_its_session_is_deleted_goes_with_it(
    daemon: Daemon, unix_api: Stubs
) -> None:
    """A session-scoped memory entry put while its session is deleted is either refused
    or deleted with the session: it never outlives it into a session made again under
    the id, whose system prompt would show it."""
    api = unix_api
    await _session(api, "m")
    entry = source_pb2.MemoryEntry(
        memory_id="fact", scope=common_pb2.SCOPE_SESSION, scope_id="m", text="from before"
    )
    put = api.sources.PutMemory(rpb.PutMemoryRequest(memory=entry))
    await _refused_when_deleted_meanwhile(daemon, api, "put_source", put, "m")
    await _session(api, "m")
    listed = await api.sources.ListMemory(
        rpb.ListMemoryRequest(scope=common_pb2.SCOPE_SESSION, scope_id="m")
    )
    assert list(listed.memories) == []


async def test_a_search_racing_the_delete_of_its_session_activates_nothing_after_it(
    daemon: Daemon, unix_api: Stubs
) -> None:
    """tool_search activations written while their session is deleted would outlive it:
    a session made again under the id would see the deferred tool without searching."""
    api = unix_api
    await _deploy_turn(api)
    search = api.tools.SearchTools(tpb.SearchToolsRequest(session_id="t", query="deploy"))
    await _refused_when_deleted_meanwhile(daemon, api, "add_activations", search, "t")
    await _deploy_turn(api)
    view = (await api.compiles.Compile(compile_request("t"))).view
    assert "deploy" not in [t.definition.name for t in view.tools]


async def _deploy_turn(api: Stubs) -> None:
    """Session "t" made, with the deferred tool "deploy" registered and its first turn
    begun (a search in it would activate the tool)."""
    deferred = tool_pb2.ToolDefinition(
        name="deploy",
        description="deploy the site",
        input_schema_json='{"type": "object"}',
        visibility=tool_pb2.TOOL_VISIBILITY_DEFERRED,
    )
    await _session(api, "t")
    await api.tools.RegisterTools(tpb.RegisterToolsRequest(session_id="t", tools=[deferred]))
    await api.sessions.AppendEvents(
        spb.AppendEventsRequest(session_id="t", events=[user("ship it")])
    )


async def test_a_checkpoint_of_a_deleted_log_is_not_stored_in_its_successor(
    daemon: Daemon, unix_api: Stubs
) -> None:
    """CreateCheckpoint digests the log, then stores. A session deleted and created again
    under the id in between (with as many events) must not get the checkpoint: its
    summary tells of the deleted log (compiles would pass over it for its digest, but
    ListCheckpoints and watchers would show it)."""
    api = unix_api
    await _session(api, "c")
    old = [user("the deleted log"), user("its second event")]
    await api.sessions.AppendEvents(spb.AppendEventsRequest(session_id="c", events=old))
    checkpoint = checkpoint_pb2.Checkpoint(
        session_id="c", covers_through_seq=2, summary="what the deleted log said"
    )
    paused = _Paused(daemon._store, "put_checkpoint")
    try:
        create = asyncio.ensure_future(
            api.compiles.CreateCheckpoint(cpb.CreateCheckpointRequest(checkpoint=checkpoint))
        )
        assert await asyncio.to_thread(paused.waiting.wait, 30)
        await api.sessions.DeleteSession(spb.DeleteSessionRequest(session_id="c"))
        await _session(api, "c")
        new = [user("a new log"), user("its second"), user("its third")]
        await api.sessions.AppendEvents(spb.AppendEventsRequest(session_id="c", events=new))
        paused.release.set()
        with pytest.raises(grpc.RpcError) as err:
            await create
    finally:
        paused.restore()
    assert error_info(err.value).reason == "SESSION_NOT_FOUND"
    listed = await api.compiles.ListCheckpoints(cpb.ListCheckpointsRequest(session_id="c"))
    assert list(listed.checkpoints) == []


# Over a 3,000-token window: the compile asks for a built-in compaction of the listing.
LISTING = "".join(f"line {i} of a long listing\n" for i in range(400))


@pytest.mark.parametrize("new_events", [4, 1])
async def test_a_compiles_builtin_compaction_is_not_made_in_the_sessions_next_life(
    daemon: Daemon, unix_api: Stubs, monkeypatch: pytest.MonkeyPatch, new_events: int
) -> None:
    """An over-budget compile shortens older tool results by a built-in checkpoint, made
    after the compile read the session. Deleted and made again under its id in between,
    the new conversation got a BUILTIN checkpoint digested from its own log (a chat of
    four messages then compiled behind it), or the compile failed CHECKPOINT_INVALID (a
    shorter new log). It is SESSION_NOT_FOUND, and the new life is left as it is."""
    api = unix_api
    await _session(api, "b")
    old = [
        user("list the files"),
        assistant("", ("c1", "shell", '{"cmd": "ls -R"}')),
        tool_result("c1", LISTING),
        user("now the next directory"),
    ]
    await api.sessions.AppendEvents(spb.AppendEventsRequest(session_id="b", events=old))
    assert daemon.compile_servicer is not None
    checkpoints = daemon.compile_servicer._c._checkpoints
    create = checkpoints.create_reporting
    raced: list[int] = []

    async def made_again_first(template: Any, *args: Any, **kw: Any) -> Any:
        if not raced:
            raced.append(template.covers_through_seq)
            await api.sessions.DeleteSession(spb.DeleteSessionRequest(session_id="b"))
            await _session(api, "b")
            new = [user("hi"), assistant("hello"), user("bye"), assistant("ok")][:new_events]
            await api.sessions.AppendEvents(spb.AppendEventsRequest(session_id="b", events=new))
        return await create(template, *args, **kw)

    monkeypatch.setattr(checkpoints, "create_reporting", made_again_first)
    req = compile_request("b")
    req.limits.context_window = 3_000
    req.limits.max_output_tokens = 500
    with pytest.raises(grpc.RpcError) as err:
        await api.compiles.Compile(req)
    assert raced, "the compile asked for no built-in compaction"
    assert error_info(err.value).reason == "SESSION_NOT_FOUND"
    listed = await api.compiles.ListCheckpoints(cpb.ListCheckpointsRequest(session_id="b"))
    assert list(listed.checkpoints) == []
    view = (await api.compiles.Compile(compile_request("b"))).view
    assert (view.checkpoint_id, len(view.messages)) == ("", new_events)


async def test_a_range_digest_is_not_taken_from_the_sessions_next_life(
    daemon: Daemon, unix_api: Stubs
) -> None:
    """The digest of a compaction request's range, asked for the session as a compile
    read it, is kept by its life: read from the log of a session made again under its id
    since, it was kept (and sent) as the gone life's."""
    from server.domain.errors import CtxccError, Reason

    api = unix_api
    await _session(api, "d")
    await api.sessions.AppendEvents(
        spb.AppendEventsRequest(session_id="d", events=[user("old one"), user("old two")])
    )
    store, compiles = daemon._store, daemon.compile_servicer
    assert store is not None and compiles is not None
    loader = compiles._c._loader
    gone = await asyncio.to_thread(store.get_session, "d")
    await api.sessions.DeleteSession(spb.DeleteSessionRequest(session_id="d"))
    await _session(api, "d")
    await api.sessions.AppendEvents(
        spb.AppendEventsRequest(session_id="d", events=[user("new one"), user("new two")])
    )
    with pytest.raises(CtxccError) as err:
        await asyncio.to_thread(loader.range_digest, gone, 2)
    assert err.value.reason is Reason.SESSION_NOT_FOUND
    assert loader.cached_range_digest(gone, 2) is None
    now = await asyncio.to_thread(store.get_session, "d")
    assert await asyncio.to_thread(loader.range_digest, now, 2)


async def test_an_upload_spanning_a_delete_does_not_land_in_the_sessions_next_life(
    daemon: Daemon, unix_api: Stubs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An upload's stream can outlast its session: the header names the session, the
    bytes follow. Deleted and made again under the id before the stream ends, the upload
    must not store its artifact in the new session (which never uploaded it, would hold
    its bytes against its quota and could download them): SESSION_NOT_FOUND."""
    api = unix_api
    await _session(api, "u")
    data = png_bytes(2, 2)
    header = apb.ArtifactHeader(
        session_id="u",
        mime_type="image/png",
        size_bytes=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
    )
    recreated = asyncio.Event()
    # The daemon (in this process) has read the header and the session it names.
    begun = asyncio.Event()
    begin = ArtifactUseCases.begin

    async def beginning(uses: ArtifactUseCases, h: Any) -> int:
        created = await begin(uses, h)
        begun.set()
        return created

    monkeypatch.setattr(ArtifactUseCases, "begin", beginning)

    async def stream() -> Any:
        yield apb.UploadArtifactRequest(header=header)
        await recreated.wait()
        yield apb.UploadArtifactRequest(data=data)

    upload = asyncio.ensure_future(api.artifacts.UploadArtifact(stream()))
    await asyncio.wait_for(begun.wait(), 60)
    await api.sessions.DeleteSession(spb.DeleteSessionRequest(session_id="u"))
    await _session(api, "u")
    recreated.set()
    with pytest.raises(grpc.RpcError) as err:
        await upload
    assert error_info(err.value).reason == "SESSION_NOT_FOUND"
    got = await api.sessions.GetSession(spb.GetSessionRequest(session_id="u"))
    assert got.session.stored_bytes == 0


async def test_a_search_racing_a_delete_and_recreate_activates_nothing_in_the_next_life(
    daemon: Daemon, unix_api: Stubs
) -> None:
    """SearchTools reads the session's registry and turn, then activates what it found.
    Deleted and made again under the id in between (the same tool registered, a turn at
    the same seq), the activation must not land in the new session: its next view would
    carry the deferred tool no search of its own activated."""
    api = unix_api
    await _deploy_turn(api)
    search = api.tools.SearchTools(tpb.SearchToolsRequest(session_id="t", query="deploy"))
    await _refused_when_deleted_meanwhile(
        daemon, api, "add_activations", search, "t", recreate=lambda: _deploy_turn(api)
    )
    view = (await api.compiles.Compile(compile_request("t"))).view
    assert "deploy" not in [t.definition.name for t in view.tools]


async def test_an_append_naming_an_artifact_does_not_land_in_the_sessions_next_life(
    daemon: Daemon, unix_api: Stubs
) -> None:
    """An append's artifact references are checked against the session's store, then the
    events are written. Deleted and made again under the id in between, the events must
    not land in the new session: their references were checked against the deleted
    session's artifacts, which the new one does not hold (references never cross
    sessions)."""
    api = unix_api
    await _session(api, "r")
    ref = common_pb2.ArtifactRef(artifact_id=await _upload(api, "r", png_bytes(2, 2)))
    attach = spb.AppendEventsRequest(session_id="r", events=[user("look")])
    attach.events[0].user_message.parts.add(attachment=ref)
    append = api.sessions.AppendEvents(attach)

    await _refused_when_deleted_meanwhile(
        daemon, api, "append", append, "r", recreate=lambda: _session(api, "r")
    )
    listed = await api.sessions.ListEvents(spb.ListEventsRequest(session_id="r"))
    assert list(listed.events) == []
