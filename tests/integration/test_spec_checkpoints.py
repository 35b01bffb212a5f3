"""Checkpoints and references through a real daemon: a damaged checkpoint record gives
way to the next older valid one and is listed as damaged; covered digests are verified
or computed by an explicit mode; attachments must name this session's artifacts."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from ctxcc.v1 import artifact_service_pb2 as apb
from ctxcc.v1 import checkpoint_pb2, common_pb2, event_pb2, session_pb2, view_pb2
from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_service_pb2 as spb
from server.app import Daemon
from server.domain.canonical import canonical_bytes, events_digest
from server.domain.model import Event, TurnStarted
from storage.kv import Batch
from storage.rocks import open_rocks
from tests.conftest import Stubs, make_config, stubs_for
from tests.helpers import ROUTE, assistant, compile_request, error_info, user


async def _session(api: Stubs, sid: str, *events: event_pb2.Event) -> None:
    await api.sessions.CreateSession(
        spb.CreateSessionRequest(session=session_pb2.Session(session_id=sid))
    )
    if events:
        await api.sessions.AppendEvents(spb.AppendEventsRequest(session_id=sid, events=events))


async def _checkpoint(api: Stubs, sid: str, through: int, summary: str) -> str:
    made = await api.compiles.CreateCheckpoint(
        cpb.CreateCheckpointRequest(
            checkpoint=checkpoint_pb2.Checkpoint(
                session_id=sid, covers_through_seq=through, summary=summary, source_route=ROUTE
            ),
            covered_digest_mode=cpb.COVERED_DIGEST_MODE_COMPUTE,
        )
    )
    assert made.digest_computed
    return made.checkpoint.checkpoint_id


async def test_a_damaged_checkpoint_gives_way_to_the_next_older_one(short_tmp: Path) -> None:
    cfg = make_config(short_tmp)
    d = Daemon(cfg)
    await d.start()
    api = stubs_for(f"unix:{d.endpoints.unix}")
    turns = [user("one"), assistant("a1"), user("two"), assistant("a2"), user("three")]
    await _session(api, "dmg", *turns)
    older = await _checkpoint(api, "dmg", 2, "SUMMARY OF ONE")
    newer = await _checkpoint(api, "dmg", 4, "SUMMARY OF TWO")
    assert (await api.compiles.Compile(compile_request("dmg"))).view.checkpoint_id == newer
    await api.channel.close()
    await d.stop()
    kv = open_rocks(cfg.db_path)
    for key, raw in list(kv.scan("checkpoints", b"dmg\x00", b"dmg\x01")):
        if key.endswith(newer.encode()):
            b = Batch()
            b.put("checkpoints", key, raw[: len(raw) // 3])  # a torn write
            kv.write(b)
    kv.close()
    d = Daemon(cfg)
    await d.start()
    api = stubs_for(f"unix:{d.endpoints.unix}")
    try:
        view = (await api.compiles.Compile(compile_request("dmg"))).view
        assert view.checkpoint_id == older
        assert list(view.fallback_reasons) == [view_pb2.FALLBACK_REASON_PROJECTION_CORRUPT]
        texts = [p.text for m in view.messages for p in m.parts]
        assert "SUMMARY OF ONE" in texts[0] and texts[1:] == ["two", "a2", "three"]
        listed = await api.compiles.ListCheckpoints(cpb.ListCheckpointsRequest(session_id="dmg"))
        assert [(c.checkpoint_id, c.damaged) for c in listed.checkpoints] == [
            (newer, True),
            (older, False),
        ]
        assert listed.checkpoints[0].create_time.seconds > 0
        assert listed.checkpoints[1].summary == "SUMMARY OF ONE"
    finally:
        await api.channel.close()
        await d.stop()


async def test_covered_digest_modes(api: Stubs) -> None:
    await _session(api, "dg", user("a"), user("b"))
    bare = checkpoint_pb2.Checkpoint(session_id="dg", covers_through_seq=2, summary="s")
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await api.compiles.CreateCheckpoint(
            cpb.CreateCheckpointRequest(
                checkpoint=bare, covered_digest_mode=cpb.COVERED_DIGEST_MODE_VERIFY
            )
        )
    info = error_info(exc.value)
    assert (exc.value.code(), info.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD")
    assert info.metadata["field"] == "checkpoint.covered_digest"
    computed = await api.compiles.CreateCheckpoint(
        cpb.CreateCheckpointRequest(
            checkpoint=bare, covered_digest_mode=cpb.COVERED_DIGEST_MODE_COMPUTE
        )
    )
    assert computed.digest_computed
    digest = computed.checkpoint.covered_digest
    verified = await api.compiles.CreateCheckpoint(
        cpb.CreateCheckpointRequest(
            checkpoint=checkpoint_pb2.Checkpoint(
                session_id="dg", covers_through_seq=2, summary="s", covered_digest=digest
            ),
            covered_digest_mode=cpb.COVERED_DIGEST_MODE_VERIFY,
        )
    )
    assert not verified.digest_computed and verified.checkpoint.covered_digest == digest
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await api.compiles.CreateCheckpoint(
            cpb.CreateCheckpointRequest(checkpoint=bare, covered_digest_mode=7)  # type: ignore[arg-type]
        )
    assert error_info(exc.value).reason == "INVALID_FIELD"


async def test_a_source_route_without_its_model_is_refused(api: Stubs) -> None:
    """A compile's route names its model (route.model is required), so a checkpoint
    bound to a route without one held on no route: it was stored, and every compile
    passed over it (ROUTE_MISMATCH) without the agent knowing why its summary was never
    used. A client that sends an empty route message (a Go `&Route{}`) meant none."""
    await _session(api, "nomodel", user("a"), assistant("b"), user("c"))
    for route in (common_pb2.Route(), common_pb2.Route(connection="c", protocol="p")):
        ck = checkpoint_pb2.Checkpoint(
            session_id="nomodel", covers_through_seq=2, summary="s", source_route=route
        )
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await api.compiles.CreateCheckpoint(cpb.CreateCheckpointRequest(checkpoint=ck))
        info = error_info(exc.value)
        assert (exc.value.code(), info.reason) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_FIELD",
        )
        assert info.metadata["field"] == "checkpoint.source_route.model"
    listed = await api.compiles.ListCheckpoints(cpb.ListCheckpointsRequest(session_id="nomodel"))
    assert not listed.checkpoints
    view = (await api.compiles.Compile(compile_request("nomodel"))).view
    assert not view.checkpoint_id and not view.fallback_reasons


def test_the_documented_encoding_example() -> None:
    """checkpoint.proto's worked example is what the daemon hashes."""
    event = Event(seq=1, event_id="e1", create_time_ns=123, payload=TurnStarted("t"))
    encoded = canonical_bytes((event.seq, event.event_id, event.payload))
    assert encoded == b"L3:I1;S2:e1D11:TurnStarted1:S1:t"
    assert events_digest([event]) == hashlib.sha256(encoded).hexdigest()
    doc = (Path(__file__).parents[2] / "proto/ctxcc/v1/checkpoint.proto").read_text()
    assert "L3:I1;S2:e1D11:TurnStarted1:S1:t" in doc


@pytest.fixture
async def two_sessions(api: Stubs) -> AsyncIterator[tuple[Stubs, common_pb2.ArtifactRef]]:
    await _session(api, "own")
    await _session(api, "other")
    data = b"\x89PNG" + bytes(3000)

    async def upload() -> AsyncIterator[apb.UploadArtifactRequest]:
        yield apb.UploadArtifactRequest(
            header=apb.ArtifactHeader(
                session_id="own",
                mime_type="image/png",
                size_bytes=len(data),
                sha256=hashlib.sha256(data).hexdigest(),
                width=32,
                height=16,
            )
        )
        yield apb.UploadArtifactRequest(data=data)

    yield api, (await api.artifacts.UploadArtifact(upload())).artifact


async def test_attachments_must_name_this_sessions_artifacts(
    two_sessions: tuple[Stubs, common_pb2.ArtifactRef],
) -> None:
    api, ref = two_sessions
    unknown = common_pb2.ArtifactRef(artifact_id="a-nope", mime_type="image/png", size_bytes=9)
    for sid, bad in [("own", unknown), ("other", ref)]:  # unknown, and another session's
        as_event = event_pb2.Event(attachment=bad)
        in_part = user("look")
        in_part.user_message.parts.add(attachment=bad)
        for ev in (as_event, in_part):
            with pytest.raises(grpc.aio.AioRpcError) as exc:
                await api.sessions.AppendEvents(
                    spb.AppendEventsRequest(session_id=sid, events=[user("before"), ev])
                )
            assert exc.value.code() == grpc.StatusCode.NOT_FOUND
            info = error_info(exc.value)
            assert info.reason == "ARTIFACT_NOT_FOUND"
            assert info.metadata["artifact_id"] == bad.artifact_id
        got = await api.sessions.GetSession(spb.GetSessionRequest(session_id=sid))
        assert got.session.head_seq == 0  # all or nothing

    # A known reference: what the client claims about it is replaced by what is stored.
    claimed = common_pb2.ArtifactRef(
        artifact_id=ref.artifact_id, mime_type="image/gif", size_bytes=1, sha256="0" * 64
    )
    ev = user("what is this?")
    ev.user_message.parts.add(attachment=claimed)
    await api.sessions.AppendEvents(
        spb.AppendEventsRequest(session_id="own", events=[ev, event_pb2.Event(attachment=claimed)])
    )
    events = (await api.sessions.ListEvents(spb.ListEventsRequest(session_id="own"))).events
    stored = [events[0].user_message.parts[1].attachment, events[1].attachment]
    for r in stored:
        assert (r.mime_type, r.size_bytes, r.sha256, r.width, r.height) == (
            "image/png",
            3004,
            ref.sha256,
            32,
            16,
        )
    view = (await api.compiles.Compile(compile_request("own"))).view
    sizes = [
        p.attachment.ref.size_bytes
        for m in view.messages
        for p in m.parts
        if p.HasField("attachment")
    ]
    assert sizes == [3004, 3004]
