"""Limits and quotas through a real daemon configured small, and watchers that stall."""

from __future__ import annotations

import asyncio
import hashlib
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from ctxcc.v1 import artifact_service_pb2 as apb
from ctxcc.v1 import artifact_service_pb2_grpc as apb_grpc
from ctxcc.v1 import checkpoint_pb2, common_pb2, session_pb2, source_pb2, tool_pb2
from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_service_pb2 as spb
from ctxcc.v1 import source_service_pb2 as rpb
from ctxcc.v1 import tool_service_pb2 as tpb
from server.app import Daemon
from server.service.limits import ServiceLimits
from server.service.watch import WatchHub
from tests.conftest import Stubs, make_config, stubs_for
from tests.helpers import compile_request, error_info, user


@pytest.fixture
async def small(short_tmp: Path) -> AsyncIterator[Stubs]:
    cfg = make_config(
        short_tmp,
        max_events_per_append="5",
        max_session_bytes="4000",
        max_sessions="3",
    )
    d = Daemon(cfg)
    await d.start()
    s = stubs_for(f"unix:{d.endpoints.unix}")
    try:
        yield s
    finally:
        await s.channel.close()
        await d.stop()


async def _create(api: Stubs, sid: str) -> None:
    await api.sessions.CreateSession(
        spb.CreateSessionRequest(session=session_pb2.Session(session_id=sid))
    )


async def test_limits_answer_with_reasons_and_write_nothing(small: Stubs) -> None:
    await _create(small, "q")
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await small.sessions.AppendEvents(
            spb.AppendEventsRequest(session_id="q", events=[user(str(i)) for i in range(6)])
        )
    assert (exc.value.code(), error_info(exc.value).reason) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "TOO_MANY_EVENTS",
    )
    await small.sessions.AppendEvents(spb.AppendEventsRequest(session_id="q", events=[user("a")]))
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await small.sessions.AppendEvents(
            spb.AppendEventsRequest(session_id="q", events=[user("x" * 5000)])
        )
    assert exc.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert error_info(exc.value).metadata["quota"] == "max_session_bytes"
    data = b"y" * 5000
    header = apb.ArtifactHeader(
        session_id="q",
        mime_type="image/png",
        size_bytes=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
    )

    async def upload() -> AsyncIterator[apb.UploadArtifactRequest]:
        yield apb.UploadArtifactRequest(header=header)
        yield apb.UploadArtifactRequest(data=data)

    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await small.artifacts.UploadArtifact(upload())
    assert error_info(exc.value).reason == "QUOTA_EXCEEDED"
    head = (await small.sessions.GetSession(spb.GetSessionRequest(session_id="q"))).session
    assert head.head_seq == 1
    await _create(small, "q2")
    await _create(small, "q3")
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await _create(small, "q4")
    assert error_info(exc.value).metadata["quota"] == "max_sessions"
    deleted = await small.sessions.DeleteSession(spb.DeleteSessionRequest(session_id="q"))
    assert deleted.deleted_events == 1
    await _create(small, "q4")


async def test_a_stalled_watcher_never_blocks_appends(api: Stubs) -> None:
    await _create(api, "slow")
    stalled = api.sessions.WatchSession(spb.WatchSessionRequest(session_id="slow"))
    await asyncio.sleep(0.2)  # subscribed, and never read from until the appends are done
    for i in range(60):
        await asyncio.wait_for(
            api.sessions.AppendEvents(
                spb.AppendEventsRequest(
                    session_id="slow", events=[user(f"{i}-{k}" + "z" * 2000) for k in range(10)]
                )
            ),
            timeout=10,
        )
    head = (await api.sessions.GetSession(spb.GetSessionRequest(session_id="slow"))).session
    assert head.head_seq == 600
    # Whatever the watcher could not keep, it learns about: seqs only grow, and any gap
    # is announced by a resync marker carrying the head to re-read from.
    last, resynced = 0, 0

    async def drain() -> None:
        nonlocal last, resynced
        async for update in stalled:
            if update.WhichOneof("update") == "resync":
                resynced = max(resynced, update.resync.head_seq)
                last = max(last, resynced)
            elif update.WhichOneof("update") == "event":
                assert update.event.seq == last + 1 or update.event.seq > resynced >= last
                last = update.event.seq
            if last >= 600:
                return

    await asyncio.wait_for(drain(), timeout=20)
    stalled.cancel()


async def test_free_form_fields_kept_in_records_or_views_are_bounded(api: Stubs) -> None:
    """A workspace id rides in the session record every append rewrites (30 MB of it made
    each one-event append write 30 MB and take ~200 ms); a compile's platform and shell are
    rendered into its view; a checkpoint's route and origin are read by every compile.
    Over their caps they are refused, and nothing is stored."""

    async def refused(call: Any, field: str) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await call
        info = error_info(exc.value)
        assert (exc.value.code(), info.reason, info.metadata["field"]) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_FIELD",
            field,
        )

    big = spb.CreateSessionRequest(
        session=session_pb2.Session(session_id="ws", workspace_id="w" * 1_025)
    )
    await refused(api.sessions.CreateSession(big), "session.workspace_id")
    listed = await api.sessions.ListSessions(spb.ListSessionsRequest())
    assert [s.session_id for s in listed.sessions] == []
    big.session.workspace_id = "w" * 1_024
    await api.sessions.CreateSession(big)
    await api.sessions.AppendEvents(spb.AppendEventsRequest(session_id="ws", events=[user("a")]))
    for name in ("platform", "shell"):
        env = cpb.Environment(**{name: "x" * 257})
        req = compile_request("ws", environment=env)
        await refused(api.compiles.Compile(req), f"environment.{name}")
    checkpoints = [
        (
            checkpoint_pb2.Checkpoint(source_route=common_pb2.Route(model="m" * 257)),
            "checkpoint.source_route.model",
        ),
        (checkpoint_pb2.Checkpoint(origin_session_id="o" * 129), "checkpoint.origin_session_id"),
    ]
    for checkpoint, field in checkpoints:
        checkpoint.MergeFrom(
            checkpoint_pb2.Checkpoint(session_id="ws", covers_through_seq=1, summary="s")
        )
        create = cpb.CreateCheckpointRequest(checkpoint=checkpoint)
        await refused(api.compiles.CreateCheckpoint(create), field)
    kept = await api.compiles.ListCheckpoints(cpb.ListCheckpointsRequest(session_id="ws"))
    assert list(kept.checkpoints) == []


async def test_search_keywords_are_bounded(api: Stubs) -> None:
    """The tool registry is read by every compile and kept outside the session's byte
    quota: one 50 MB keyword used to be stored as it came (stored_bytes unchanged)."""
    await _create(api, "kw")

    def register(*keywords: str) -> tpb.RegisterToolsRequest:
        tool = tool_pb2.ToolDefinition(name="deploy", search_keywords=keywords)
        return tpb.RegisterToolsRequest(session_id="kw", tools=[tool])

    for keywords in (["k" * 129], ["k" * 128] * 600):
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await api.tools.RegisterTools(register(*keywords))
        info = error_info(exc.value)
        assert (info.reason, info.metadata["field"]) == (
            "INVALID_FIELD",
            "tools[0].search_keywords",
        )
    assert list((await api.tools.ListTools(tpb.ListToolsRequest(session_id="kw"))).tools) == []
    await api.tools.RegisterTools(register("k" * 128, "release"))


async def test_listings_over_the_message_limit_answer_with_a_reason(short_tmp: Path) -> None:
    """Listings that are not paged (memory, rules, skills of every scope; a session's
    tools) grow past the message limit with what any client may register; gRPC then
    failed the call with a bare RESOURCE_EXHAUSTED, no ErrorInfo. ListCheckpoints, paged
    by count only, did the same with large summaries, and so did any listing paged at
    3 MiB under a lower --max-message-bytes."""
    d = Daemon(make_config(short_tmp, max_message_bytes=str(1 << 20)))
    await d.start()
    api = stubs_for(f"unix:{d.endpoints.unix}")
    try:
        await _create(api, "big")
        text = "m" * 60_000
        for i in range(20):
            entry = source_pb2.MemoryEntry(
                memory_id=f"m{i}",
                scope=common_pb2.SCOPE_PROJECT,
                scope_id=f"p{i % 2}",
                text=text,
            )
            await api.sources.PutMemory(rpb.PutMemoryRequest(memory=entry))
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await api.sources.ListMemory(rpb.ListMemoryRequest())
        info = error_info(exc.value)
        assert (exc.value.code(), info.reason, info.metadata["quota"]) == (
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "QUOTA_EXCEEDED",
            "max_message_bytes",
        )
        one = rpb.ListMemoryRequest(scope=common_pb2.SCOPE_PROJECT, scope_id="p0")
        assert len((await api.sources.ListMemory(one)).memories) == 10
        await api.sessions.AppendEvents(
            spb.AppendEventsRequest(session_id="big", events=[user("a")])
        )
        for i in range(5):
            checkpoint = checkpoint_pb2.Checkpoint(
                session_id="big", covers_through_seq=1, summary=f"{i}" + "s" * 900_000
            )
            await api.compiles.CreateCheckpoint(cpb.CreateCheckpointRequest(checkpoint=checkpoint))
        # ListEvents' pages (3 MiB) are cut within the lower limit too.
        for i in range(4):
            event = user(f"{i}" + "e" * 300_000)
            await api.sessions.AppendEvents(
                spb.AppendEventsRequest(session_id="big", events=[event])
            )
        listed = await api.sessions.ListEvents(spb.ListEventsRequest(session_id="big"))
        assert 1 <= len(listed.events) < 5 and listed.next_page_token
        seen, token = 0, ""
        while True:
            page = await api.compiles.ListCheckpoints(
                cpb.ListCheckpointsRequest(session_id="big", page_token=token)
            )
            assert 1 <= len(page.checkpoints) < 5
            seen += len(page.checkpoints)
            token = page.next_page_token
            if not token:
                break
        assert seen == 5
    finally:
        await api.channel.close()
        await d.stop()


async def test_a_watch_of_an_unknown_session_past_the_watcher_cap_answers_not_found(
    short_tmp: Path,
) -> None:
    """The daemon-wide watcher cap was charged before the session was looked up: once
    it was reached, a watch of a session that does not exist answered QUOTA_EXCEEDED
    ("retry later", forever) instead of SESSION_NOT_FOUND."""
    d = Daemon(make_config(short_tmp))
    # The cap in all (4,096) is not a flag; a hub of the same kind with a cap of one.
    limits = ServiceLimits()
    d.hub = WatchHub(limits.watch_queue_size, limits.max_watchers_per_session, most=1)
    await d.start()
    api = stubs_for(f"unix:{d.endpoints.unix}")
    held: Any = None
    try:
        for sid in ("w", "other"):
            await _create(api, sid)
            await api.sessions.AppendEvents(
                spb.AppendEventsRequest(session_id=sid, events=[user("hi")])
            )
        held = api.sessions.WatchSession(spb.WatchSessionRequest(session_id="w"))
        assert (await held.read()).event.seq == 1  # subscribed: the cap is reached

        async def first_of(sid: str) -> Any:
            return await api.sessions.WatchSession(spb.WatchSessionRequest(session_id=sid)).read()

        with pytest.raises(grpc.aio.AioRpcError) as unknown:
            await first_of("nobody")
        assert (unknown.value.code(), error_info(unknown.value).reason) == (
            grpc.StatusCode.NOT_FOUND,
            "SESSION_NOT_FOUND",
        )
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await first_of("other")  # a session that exists is still refused
        _refused_over(refused.value, "watchers")
    finally:
        if held is not None:
            held.cancel()
        await api.channel.close()
        await d.stop()


def _without_error_info(err: grpc.aio.AioRpcError) -> bool:
    return all(key != "grpc-status-details-bin" for key, _ in err.trailing_metadata() or ())


def _listed_without_error_info() -> str:
    """The README's list of the statuses gRPC answers itself, without an ErrorInfo."""
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = text[text.index("#### Statuses without an ErrorInfo") :]
    return section[: section.index("\n#", 1)]


async def test_what_grpc_answers_itself_carries_no_error_info_as_the_readme_says(
    short_tmp: Path,
) -> None:
    """A request message over --max-message-bytes is refused by gRPC while it is
    received, before the daemon decodes it: it carries no ErrorInfo, and the README
    lists it, so clients know to branch on the code. The refused messages write nothing
    and the daemon serves on."""
    d = Daemon(make_config(short_tmp, max_message_bytes=str(1 << 20)))
    await d.start()
    api = stubs_for(f"unix:{d.endpoints.unix}")
    listed = _listed_without_error_info()
    try:
        await _create(api, "big")
        data, header = _artifact_of(2 << 20)
        header.session_id = "big"
        too_large: list[Any] = [
            api.sessions.AppendEvents(
                spb.AppendEventsRequest(session_id="big", events=[user("x" * (2 << 20))])
            ),
            api.artifacts.UploadArtifact(
                iter(
                    [apb.UploadArtifactRequest(header=header), apb.UploadArtifactRequest(data=data)]
                )
            ),
        ]
        for call in too_large:
            with pytest.raises(grpc.aio.AioRpcError) as exc:
                await call
            assert exc.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "larger than max" in str(exc.value.details())
            assert _without_error_info(exc.value)
        assert '`RESOURCE_EXHAUSTED` (message "Received message larger than max")' in listed
        # An unknown method is answered with a reason on the API's ports (below); the
        # health port's is gRPC's own.
        assert '`UNIMPLEMENTED` (message "Method not found!"): anything but health' in listed
        got = await api.sessions.GetSession(spb.GetSessionRequest(session_id="big"))
        assert got.session.head_seq == 0
    finally:
        await api.channel.close()
        await d.stop()


def _artifact_of(size: int) -> tuple[bytes, apb.ArtifactHeader]:
    """`size` bytes for session "art", with the header of their upload."""
    data = bytes(range(256)) * (size // 256)
    header = apb.ArtifactHeader(
        session_id="art",
        mime_type="image/png",
        size_bytes=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
    )
    return data, header


def _refused_over(err: grpc.aio.AioRpcError, quota: str) -> None:
    """`err` is the refusal of a call past the daemon's `quota`."""
    info = error_info(err)
    assert (err.code(), info.reason, info.metadata["quota"]) == (
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "QUOTA_EXCEEDED",
        quota,
    )


async def _until(attempt: Callable[[], Awaitable[str]], wanted: str, never: str) -> None:
    """Retries `attempt` until it answers `wanted`: a bounded wait for the daemon to see
    what the test did (a stream read, a cancel), not for a time."""
    for _ in range(400):
        if await attempt() == wanted:
            return
        await asyncio.sleep(0.025)
    raise AssertionError(never)


async def test_upload_bytes_held_in_memory_are_bounded(short_tmp: Path) -> None:
    """Uploads are buffered whole until their sha256 is checked: a client that never
    ended its streams held what it sent for as long as it liked (40 held uploads of
    19 MiB took the daemon to 1.1 GB). Together they may now hold eight artifacts of the
    largest size; past that an upload answers QUOTA_EXCEEDED
    (quota=upload_bytes_in_memory), and the room comes back when the held ones end."""
    size = 1 << 20
    d = Daemon(make_config(short_tmp, max_artifact_bytes=str(size)))
    await d.start()
    api = stubs_for(f"unix:{d.endpoints.unix}")
    held: list[Any] = []
    try:
        await _create(api, "art")
        data, header = _artifact_of(size)
        for _ in range(8):  # all but the end of the stream: each holds the whole artifact
            call = api.artifacts.UploadArtifact()
            await call.write(apb.UploadArtifactRequest(header=header))
            await call.write(apb.UploadArtifactRequest(data=data))
            held.append(call)

        async def upload() -> str:
            messages = [apb.UploadArtifactRequest(header=header)]
            messages.append(apb.UploadArtifactRequest(data=data))
            try:
                await api.artifacts.UploadArtifact(iter(messages))
            except grpc.aio.AioRpcError as err:
                _refused_over(err, "upload_bytes_in_memory")
                return "refused"
            return "stored"

        # Refused once the daemon has read the held uploads' data.
        await _until(upload, "refused", "uploads held past the budget were never refused")
        for call in held:
            call.cancel()
        # The cancelled uploads give their room back as they end.
        await _until(upload, "stored", "the held uploads never gave their room back")
    finally:
        for call in held:
            call.cancel()
        await api.channel.close()
        await d.stop()


class _BlobReads:
    """The store's engine, counting the reads of blobs (an artifact's bytes)."""

    def __init__(self, kv: Any) -> None:
        self.kv = kv
        self.reads = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.kv, name)

    def get(self, cf: str, key: bytes) -> Any:
        self.reads += cf == "blobs"
        return self.kv.get(cf, key)


async def test_download_bytes_held_in_memory_are_bounded(short_tmp: Path) -> None:
    """A download's bytes stay in memory until its call ends: gRPC keeps what a reader
    has not taken (30 unread downloads of 19 MiB held ~625 MB). Downloads in progress may
    hold eight artifacts of the largest size together; past that one answers
    QUOTA_EXCEEDED (quota=download_bytes_in_memory) before sending anything, or reading
    the artifact's bytes from the store, and the room comes back when the unread ones
    end."""
    size = 1 << 20
    d = Daemon(make_config(short_tmp, max_artifact_bytes=str(size)))
    await d.start()
    api = stubs_for(f"unix:{d.endpoints.unix}")
    # A reader whose HTTP/2 window stays at its 64 KiB default (no BDP probing to grow
    # it): what it does not read stays with the daemon, as with a large artifact.
    slow = grpc.aio.insecure_channel(
        f"unix:{d.endpoints.unix}", options=[("grpc.http2.bdp_probe", 0)]
    )
    unread: list[Any] = []
    try:
        await _create(api, "art")
        data, header = _artifact_of(size)
        messages = [apb.UploadArtifactRequest(header=header), apb.UploadArtifactRequest(data=data)]
        ref = (await api.artifacts.UploadArtifact(iter(messages))).artifact
        ask = apb.DownloadArtifactRequest(session_id="art", artifact_id=ref.artifact_id)

        async def download() -> str:
            got = b""
            try:
                async for msg in api.artifacts.DownloadArtifact(ask):
                    got += msg.data
            except grpc.aio.AioRpcError as err:
                _refused_over(err, "download_bytes_in_memory")
                assert not got  # refused before any byte was sent
                return "refused"
            assert got == data
            return "whole"

        assert await download() == "whole"
        slow_artifacts = apb_grpc.ArtifactServiceStub(slow)
        for _ in range(8):  # started, their first message read, the rest left unread
            call = slow_artifacts.DownloadArtifact(ask)
            first = await call.read()
            assert isinstance(first, apb.DownloadArtifactResponse)
            assert first.artifact.artifact_id == ref.artifact_id
            unread.append(call)
        # Refused from the artifact's recorded size: its blob is not even read.
        store: Any = d._store
        counted = _BlobReads(store._kv)
        store._kv = counted
        try:
            assert await download() == "refused"
        finally:
            store._kv = counted.kv
        assert counted.reads == 0
        for call in unread:
            call.cancel()
        # The cancelled downloads give their room back as they end.
        await _until(download, "whole", "the unread downloads never gave their room back")
    finally:
        for call in unread:
            call.cancel()
        await api.channel.close()
        await slow.close()
        await d.stop()


async def test_an_artifact_over_the_download_budget_is_still_served_alone(
    short_tmp: Path,
) -> None:
    """An artifact stored under a larger --max-artifact-bytes can be larger than the
    whole download budget (eight of the new largest size): it was refused as
    QUOTA_EXCEEDED, 'retry later', forever. With nothing else held it is served."""
    size = 1 << 20
    d = Daemon(make_config(short_tmp, max_artifact_bytes=str(size)))
    await d.start()
    api = stubs_for(f"unix:{d.endpoints.unix}")
    try:
        await _create(api, "art")
        data, header = _artifact_of(size)
        messages = [apb.UploadArtifactRequest(header=header), apb.UploadArtifactRequest(data=data)]
        ref = (await api.artifacts.UploadArtifact(iter(messages))).artifact
    finally:
        await api.channel.close()
        await d.stop()
    d = Daemon(make_config(short_tmp, max_artifact_bytes=str(size // 16)))
    await d.start()
    api = stubs_for(f"unix:{d.endpoints.unix}")
    try:
        ask = apb.DownloadArtifactRequest(session_id="art", artifact_id=ref.artifact_id)
        got = b"".join([msg.data async for msg in api.artifacts.DownloadArtifact(ask)])
        assert got == data
    finally:
        await api.channel.close()
        await d.stop()


async def test_watchers_of_a_session_are_bounded(short_tmp: Path) -> None:
    """Every append is offered to each watcher of its session on the event loop: 8,000
    watches of one session made each append spend seconds there, stalling every other
    session. A session has at most 64 watchers; the 65th answers QUOTA_EXCEEDED
    (quota=watchers_per_session), and one that ends makes room."""
    d = Daemon(make_config(short_tmp))
    await d.start()
    api = stubs_for(f"unix:{d.endpoints.unix}")
    watches: list[Any] = []
    try:
        for sid in ("w", "other"):
            await _create(api, sid)
            await api.sessions.AppendEvents(
                spb.AppendEventsRequest(session_id=sid, events=[user("hi")])
            )

        async def watch(sid: str) -> Any:
            call = api.sessions.WatchSession(spb.WatchSessionRequest(session_id=sid))
            first = await call.read()  # the backlog's event: subscribed by then
            assert isinstance(first, spb.WatchSessionResponse) and first.event.seq == 1
            return call

        for _ in range(64):
            watches.append(await watch("w"))
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await watch("w")
        info = error_info(refused.value)
        assert (refused.value.code(), info.reason, dict(info.metadata)) == (
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "QUOTA_EXCEEDED",
            {"quota": "watchers_per_session", "limit": "64"},
        )
        other = await watch("other")  # another session's watchers are its own
        other.cancel()
        # The watchers still get what is appended.
        await api.sessions.AppendEvents(spb.AppendEventsRequest(session_id="w", events=[user("2")]))
        assert [(await w.read()).event.seq for w in watches] == [2] * 64
        watches.pop().cancel()

        async def another() -> str:
            try:
                watches.append(await watch("w"))
            except grpc.aio.AioRpcError as err:
                _refused_over(err, "watchers_per_session")
                return "refused"
            return "watching"

        # The cancelled watch leaves the hub as its stream ends.
        await _until(another, "watching", "an ended watch never made room")
    finally:
        for call in watches:
            call.cancel()
        await api.channel.close()
        await d.stop()


async def test_a_backlog_of_large_events_is_read_a_few_megabytes_at_a_time(api: Stubs) -> None:
    """ListEvents and a watch's catch-up read a log of large events a page's room at a
    time (3 MiB as stored, and one event more; they read 1,000 events of 1 MiB to send
    three): every event still arrives once, in order, across the pages, then the live
    ones."""
    await _create(api, "large")
    for i in range(12):
        event = user(f"{i} " + "e" * 600_000)
        await api.sessions.AppendEvents(spb.AppendEventsRequest(session_id="large", events=[event]))
    seqs, pages, token = [], 0, ""
    while True:
        page = await api.sessions.ListEvents(
            spb.ListEventsRequest(session_id="large", page_size=1_000, page_token=token)
        )
        assert 1 <= len(page.events) <= 6  # at most 3 MiB and one event as stored
        seqs += [e.seq for e in page.events]
        pages += 1
        token = page.next_page_token
        if not token:
            break
    assert seqs == list(range(1, 13)) and pages >= 3
    call = api.sessions.WatchSession(spb.WatchSessionRequest(session_id="large"))

    async def seq() -> int:
        # Bounded: a catch-up that stopped after its first page would wait for live ones.
        got = await asyncio.wait_for(call.read(), 30)
        assert isinstance(got, spb.WatchSessionResponse)
        return got.event.seq

    try:
        assert [await seq() for _ in range(12)] == list(range(1, 13))
        await api.sessions.AppendEvents(
            spb.AppendEventsRequest(session_id="large", events=[user("live")])
        )
        assert await seq() == 13
    finally:
        call.cancel()


async def test_a_method_the_daemon_does_not_serve_is_answered_with_a_reason(
    short_tmp: Path,
) -> None:
    """gRPC's own answer to an unknown method ("Method not found!") carried no ErrorInfo.
    Each kind of call to a method or service the daemon lacks, unary or streaming, is
    answered UNIMPLEMENTED with METHOD_NOT_FOUND naming it, before anything is read;
    nothing is counted under the made-up name, and the daemon serves on."""
    d = Daemon(make_config(short_tmp))
    await d.start()
    api = stubs_for(f"unix:{d.endpoints.unix}")
    try:
        ch = api.channel
        calls: list[tuple[str, Any]] = [
            ("/ctxcc.v1.SessionService/NoSuchMethod", ch.unary_unary),
            ("/no.such.Service/Watch", ch.unary_stream),
            ("/ctxcc.v1.ArtifactService/UploadMore", ch.stream_unary),
            ("/ctxcc.v1.CompileService/CompileStream2", ch.stream_stream),
        ]
        for name, kind in calls:
            method: Any = kind(name)
            with pytest.raises(grpc.aio.AioRpcError) as exc:
                if kind in (ch.unary_unary, ch.unary_stream):
                    call = method(b"\x0a\x01x")
                else:
                    call = method(iter([b"\x0a\x01x"]))
                if kind in (ch.unary_stream, ch.stream_stream):
                    async for _ in call:
                        pass
                else:
                    await call
            assert exc.value.code() == grpc.StatusCode.UNIMPLEMENTED, name
            info = error_info(exc.value)
            assert info.reason == "METHOD_NOT_FOUND" and info.metadata["method"] == name
            assert name in str(exc.value.details())
        url = f"http://{d.endpoints.metrics}/metrics"
        scraped = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=10).read())
        assert b"ctxcc_" in scraped and b"NoSuch" not in scraped and b"no.such" not in scraped
        got = await api.sessions.CreateSession(
            spb.CreateSessionRequest(session=session_pb2.Session(session_id="after"))
        )
        assert got.session.session_id == "after"
    finally:
        await api.channel.close()
        await d.stop()
