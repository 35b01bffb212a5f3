"""Event-log features through a real server: watch, artifacts, blobs, checkpoints,
the compile stream, health, reflection and /metrics."""

from __future__ import annotations

import asyncio
import hashlib
import urllib.request
from collections.abc import AsyncIterator
from typing import Any, cast

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from ctxcc.v1 import (
    artifact_service_pb2 as apb,
)
from ctxcc.v1 import (
    checkpoint_pb2,
    session_pb2,
)
from ctxcc.v1 import (
    compile_service_pb2 as cpb,
)
from ctxcc.v1 import (
    session_service_pb2 as spb,
)
from server.app import Daemon
from server.transport import convert_events, session_servicer
from tests.conftest import Stubs
from tests.helpers import compile_request, error_info, tool_result, user


async def _session(api: Stubs, sid: str) -> None:
    await api.sessions.CreateSession(
        spb.CreateSessionRequest(session=session_pb2.Session(session_id=sid))
    )


async def test_watch_resumes_then_streams_live(api: Stubs) -> None:
    await _session(api, "w")
    await api.sessions.AppendEvents(
        spb.AppendEventsRequest(session_id="w", events=[user("1"), user("2"), user("3")])
    )
    call = api.sessions.WatchSession(spb.WatchSessionRequest(session_id="w", after_seq=1))
    got: list[int] = []
    async for update in call:
        got.append(update.event.seq)
        if len(got) == 2:
            break
    assert got == [2, 3]
    call.cancel()
    call = api.sessions.WatchSession(spb.WatchSessionRequest(session_id="w", after_seq=3))
    it = call.__aiter__()
    await api.sessions.AppendEvents(spb.AppendEventsRequest(session_id="w", events=[user("4")]))
    first = await asyncio.wait_for(it.__anext__(), 30)  # a bound, not a wait
    assert first.event.seq == 4
    await api.compiles.Compile(compile_request("w"))
    notice = await asyncio.wait_for(it.__anext__(), 30)
    assert notice.WhichOneof("update") == "compile" and notice.compile.event_boundary == 4
    call.cancel()


async def test_an_event_is_encoded_once_for_all_of_its_watchers(
    api: Stubs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The watch hub hands each watcher the same event; each converted and encoded it on
    the event loop (64 watchers and a 60 MB append held the loop ~6 s). It is encoded once,
    and every watcher gets the same bytes, live event after live event."""
    converted: list[int] = []
    real = convert_events.event_out

    def counted(event: Any) -> Any:
        converted.append(event.seq)
        return real(event)

    monkeypatch.setattr(session_servicer, "event_out", counted)
    await _session(api, "fan")
    await api.sessions.AppendEvents(spb.AppendEventsRequest(session_id="fan", events=[user("0")]))
    calls = [
        api.sessions.WatchSession(spb.WatchSessionRequest(session_id="fan", after_seq=1))
        for _ in range(8)
    ]
    try:
        for c in calls:  # subscribed once its header came: live events from then on
            await asyncio.wait_for(c.initial_metadata(), 30)
        for n in (2, 3):
            await api.sessions.AppendEvents(
                spb.AppendEventsRequest(session_id="fan", events=[user(f"{n} " * 1000)])
            )
        got = [
            [cast(Any, await asyncio.wait_for(c.read(), 30)).event for _ in range(2)] for c in calls
        ]
        assert all([e.seq for e in g] == [2, 3] for g in got)
        assert all(g == got[0] for g in got)
        assert sorted(converted) == [2, 3]
    finally:
        for c in calls:
            c.cancel()


async def test_a_watch_after_a_seq_the_log_never_reached_is_refused(api: Stubs) -> None:
    """A position past the head (a client's from a log that lost its unsynced tail in a
    crash) would skip every event up to it in silence: OUT_OF_RANGE with the head."""
    await _session(api, "wp")
    await api.sessions.AppendEvents(spb.AppendEventsRequest(session_id="wp", events=[user("1")]))
    call = api.sessions.WatchSession(spb.WatchSessionRequest(session_id="wp", after_seq=5))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await asyncio.wait_for(call.__aiter__().__anext__(), 30)  # a bound, not a wait
    assert err.value.code() == grpc.StatusCode.OUT_OF_RANGE
    info = error_info(err.value)
    assert info.reason == "SEQ_OUT_OF_RANGE" and info.metadata["head_seq"] == "1"
    # At the head it waits for what comes next.
    call = api.sessions.WatchSession(spb.WatchSessionRequest(session_id="wp", after_seq=1))
    it = call.__aiter__()
    await api.sessions.AppendEvents(spb.AppendEventsRequest(session_id="wp", events=[user("2")]))
    assert (await asyncio.wait_for(it.__anext__(), 30)).event.seq == 2  # a bound, not a wait
    call.cancel()


async def _upload(
    api: Stubs, header: apb.ArtifactHeader, *chunks: bytes
) -> apb.UploadArtifactResponse:
    async def gen() -> AsyncIterator[apb.UploadArtifactRequest]:
        yield apb.UploadArtifactRequest(header=header)
        for c in chunks:
            yield apb.UploadArtifactRequest(data=c)

    return await api.artifacts.UploadArtifact(gen())


async def test_artifacts_round_trip_and_are_verified(api: Stubs) -> None:
    await _session(api, "a")
    data = bytes(range(256)) * 4096  # 1 MiB, several download chunks
    sha = hashlib.sha256(data).hexdigest()
    header = apb.ArtifactHeader(
        session_id="a", mime_type="image/png", size_bytes=len(data), sha256=sha, width=8
    )
    ref = (await _upload(api, header, data[:300_000], data[300_000:])).artifact
    assert (ref.sha256, ref.size_bytes, ref.mime_type) == (sha, len(data), "image/png")
    stream = api.artifacts.DownloadArtifact(
        apb.DownloadArtifactRequest(session_id="a", artifact_id=ref.artifact_id)
    )
    msgs = [m async for m in stream]
    assert msgs[0].artifact.artifact_id == ref.artifact_id
    assert b"".join(m.data for m in msgs[1:]) == data

    bad = apb.ArtifactHeader(session_id="a", mime_type="image/png", size_bytes=3, sha256="0" * 64)
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await _upload(api, bad, b"abc")
    assert error_info(exc.value).reason == "ARTIFACT_CHECKSUM_MISMATCH"
    huge = apb.ArtifactHeader(
        session_id="a", mime_type="image/png", size_bytes=30 << 20, sha256="0" * 64
    )
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await _upload(api, huge)
    assert exc.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert error_info(exc.value).reason == "ARTIFACT_TOO_LARGE"
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await _upload(api, header, data, b"one byte too many")
    assert error_info(exc.value).reason == "INVALID_FIELD"
    missing = api.artifacts.DownloadArtifact(
        apb.DownloadArtifactRequest(session_id="a", artifact_id="a-missing")
    )
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        _ = [m async for m in missing]
    assert error_info(exc.value).reason == "ARTIFACT_NOT_FOUND"


async def test_large_tool_result_becomes_a_blob_with_preview(api: Stubs) -> None:
    await _session(api, "b")
    big = "".join(f"line {i}: {'x' * 40}\n" for i in range(1200))  # ~60 KB
    await api.sessions.AppendEvents(
        spb.AppendEventsRequest(session_id="b", events=[user("go"), tool_result("c1", big)])
    )
    events = (await api.sessions.ListEvents(spb.ListEventsRequest(session_id="b"))).events
    result = events[1].tool_result
    assert result.WhichOneof("content") == "blob"
    assert result.blob.sha256 == hashlib.sha256(big.encode()).hexdigest()
    assert result.blob.size_bytes == len(big.encode())
    assert big.startswith(result.blob.preview) and len(result.blob.preview) == 2000
    view = (await api.compiles.Compile(compile_request("b"))).view
    # The result's call was never logged: the view restores it so the pair is whole.
    assert view.messages[1].synthetic and view.messages[1].tool_calls[0].call_id == "c1"
    text = view.messages[2].parts[0].text
    assert "history_read_tool_result" in text and len(text) < 3000
    assert "history_read_tool_result" in [t.definition.name for t in view.tools]


async def test_checkpoints_are_verified_against_the_log(api: Stubs) -> None:
    await _session(api, "k")
    await api.sessions.AppendEvents(
        spb.AppendEventsRequest(session_id="k", events=[user("a"), user("b")])
    )
    ck = checkpoint_pb2.Checkpoint(session_id="k", covers_through_seq=2, summary="two asks")
    made = (
        await api.compiles.CreateCheckpoint(
            cpb.CreateCheckpointRequest(checkpoint=ck, request_id="r")
        )
    ).checkpoint
    assert len(made.covered_digest) == 64
    again = (
        await api.compiles.CreateCheckpoint(
            cpb.CreateCheckpointRequest(checkpoint=ck, request_id="r")
        )
    ).checkpoint
    assert again.checkpoint_id == made.checkpoint_id
    wrong = checkpoint_pb2.Checkpoint(
        session_id="k", covers_through_seq=2, summary="s", covered_digest="f" * 64
    )
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await api.compiles.CreateCheckpoint(cpb.CreateCheckpointRequest(checkpoint=wrong))
    assert (exc.value.code(), error_info(exc.value).reason) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "CHECKPOINT_INVALID",
    )
    beyond = checkpoint_pb2.Checkpoint(session_id="k", covers_through_seq=9, summary="s")
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await api.compiles.CreateCheckpoint(cpb.CreateCheckpointRequest(checkpoint=beyond))
    assert error_info(exc.value).reason == "CHECKPOINT_INVALID"
    listed = await api.compiles.ListCheckpoints(cpb.ListCheckpointsRequest(session_id="k"))
    assert [c.checkpoint_id for c in listed.checkpoints] == [made.checkpoint_id]


async def test_compile_stream_appends_compiles_and_survives_a_bad_step(api: Stubs) -> None:
    await _session(api, "st")

    async def steps() -> AsyncIterator[cpb.CompileStreamRequest]:
        yield cpb.CompileStreamRequest(
            step=cpb.StepRequest(step_id="1", events=[user("hi")], compile=compile_request("st"))
        )
        yield cpb.CompileStreamRequest(
            step=cpb.StepRequest(step_id="2", compile=compile_request("missing"))
        )
        yield cpb.CompileStreamRequest(
            step=cpb.StepRequest(step_id="3", events=[user("again")], compile=compile_request("st"))
        )

    out = [r async for r in api.compiles.CompileStream(steps())]
    assert [r.step_id for r in out] == ["1", "2", "3"]
    assert out[0].view.event_boundary == 1 and out[0].append.last_seq == 1
    assert out[1].error.reason == "SESSION_NOT_FOUND"
    assert out[1].error.code == grpc.StatusCode.NOT_FOUND.value[0]
    assert out[2].view.event_boundary == 2


async def test_health_reflection_and_metrics(daemon: Daemon, api: Stubs) -> None:
    health: Any = health_pb2_grpc.HealthStub(api.channel)
    for service in ("", "ctxcc.v1.SessionService", "ctxcc.v1.CompileService"):
        resp = await health.Check(health_pb2.HealthCheckRequest(service=service))
        assert resp.status == health_pb2.HealthCheckResponse.SERVING
    refl: Any = reflection_pb2_grpc.ServerReflectionStub(cast(Any, api.channel))

    async def ask() -> AsyncIterator[reflection_pb2.ServerReflectionRequest]:
        yield reflection_pb2.ServerReflectionRequest(list_services="")

    names = set()
    async for resp in refl.ServerReflectionInfo(ask()):
        names |= {s.name for s in resp.list_services_response.service}
    assert {
        "ctxcc.v1.SessionService",
        "ctxcc.v1.CompileService",
        "ctxcc.v1.ArtifactService",
    } <= names

    await _session(api, "m")
    await api.sessions.AppendEvents(spb.AppendEventsRequest(session_id="m", events=[user("x")]))
    await api.compiles.Compile(compile_request("m"))
    url = f"http://{daemon.endpoints.metrics}/metrics"
    body = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read().decode())
    assert "ctxcc_events_appended_total 1.0" in body
    assert 'ctxcc_compile_decisions_total{decision="ok"} 1.0' in body
    assert (
        'ctxcc_rpc_duration_seconds_count{code="OK",method="SessionService/AppendEvents"} 1.0'
        in body
    )
    assert "ctxcc_build_info" in body
