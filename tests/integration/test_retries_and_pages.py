"""Retries that must not store twice, pages that must fit a default client, notes that must
not show the daemon's paths — against a real daemon over gRPC."""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from ctxcc.v1 import artifact_service_pb2 as apb
from ctxcc.v1 import checkpoint_pb2, session_pb2, session_service_pb2_grpc
from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_service_pb2 as spb
from server.app import Daemon
from tests.conftest import Stubs, make_config, stubs_for
from tests.helpers import compile_request, error_info, user

PNG = b"\x89PNG\r\n\x1a\n" + os.urandom(200_000)
PNG_SHA = hashlib.sha256(PNG).hexdigest()


async def _session(api: Stubs, sid: str, project_root: str = "") -> None:
    session = session_pb2.Session(session_id=sid, project_root=project_root)
    await api.sessions.CreateSession(spb.CreateSessionRequest(session=session))


async def _stored(api: Stubs, sid: str) -> int:
    got = await api.sessions.GetSession(spb.GetSessionRequest(session_id=sid))
    return got.session.stored_bytes


async def test_concurrent_checkpoints_with_one_request_id_store_one(api: Stubs) -> None:
    await _session(api, "ck")
    await api.sessions.AppendEvents(
        spb.AppendEventsRequest(session_id="ck", events=[user(f"m{i}") for i in range(4)])
    )
    req = cpb.CreateCheckpointRequest(
        request_id="compact-1",
        checkpoint=checkpoint_pb2.Checkpoint(
            session_id="ck", covers_through_seq=3, summary="the first three messages"
        ),
    )
    answers = await asyncio.gather(*(api.compiles.CreateCheckpoint(req) for _ in range(8)))
    ids = {a.checkpoint.checkpoint_id for a in answers}
    listed = await api.compiles.ListCheckpoints(cpb.ListCheckpointsRequest(session_id="ck"))
    assert len(ids) == 1
    assert [c.checkpoint_id for c in listed.checkpoints] == list(ids)


async def test_a_checkpoint_request_id_reused_for_another_checkpoint_is_refused(
    unix_api: Stubs,
) -> None:
    """As for appends and uploads: a retry (the same checkpoint again) answers the one
    stored, also after the session compiled on another route (which a checkpoint without
    a source route is bound to); another checkpoint under the same request id, say an
    agent that reuses one id for every compaction, is REQUEST_ID_REUSED, not answered
    with the first checkpoint as if the new summary had been stored."""
    api = unix_api
    await _session(api, "ckreuse")
    await api.sessions.AppendEvents(
        spb.AppendEventsRequest(session_id="ckreuse", events=[user(f"m{i}") for i in range(4)])
    )

    def request(through: int, summary: str) -> cpb.CreateCheckpointRequest:
        return cpb.CreateCheckpointRequest(
            request_id="compact",
            checkpoint=checkpoint_pb2.Checkpoint(
                session_id="ckreuse", covers_through_seq=through, summary=summary
            ),
        )

    first = (await api.compiles.CreateCheckpoint(request(2, "two messages"))).checkpoint
    await api.compiles.Compile(compile_request("ckreuse"))  # the session's route moves
    retried = (await api.compiles.CreateCheckpoint(request(2, "two messages"))).checkpoint
    assert retried == first
    for other in (request(3, "three messages"), request(2, "two other messages")):
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await api.compiles.CreateCheckpoint(other)
        assert exc.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert error_info(exc.value).reason == "REQUEST_ID_REUSED"
    listed = await api.compiles.ListCheckpoints(cpb.ListCheckpointsRequest(session_id="ckreuse"))
    assert list(listed.checkpoints) == [first]


def _upload(
    sid: str, data: bytes, request_id: str, cut_at: int | None = None
) -> AsyncIterator[apb.UploadArtifactRequest]:
    async def gen() -> AsyncIterator[apb.UploadArtifactRequest]:
        header = apb.ArtifactHeader(
            session_id=sid,
            mime_type="image/png",
            size_bytes=len(data),
            sha256=hashlib.sha256(data).hexdigest(),
            request_id=request_id,
        )
        yield apb.UploadArtifactRequest(header=header)
        for off in range(0, len(data), 50_000):
            if cut_at is not None and off >= cut_at:
                await asyncio.Event().wait()  # the connection hangs here until cut
            yield apb.UploadArtifactRequest(data=data[off : off + 50_000])

    return gen()


async def test_upload_retried_with_its_request_id_is_stored_and_counted_once(
    api: Stubs,
) -> None:
    await _session(api, "up")
    before = await _stored(api, "up")

    # Cut mid-stream: nothing is stored or counted.
    call = api.artifacts.UploadArtifact(_upload("up", PNG, "img-1", cut_at=100_000))
    await asyncio.sleep(0.3)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    await asyncio.sleep(0.1)
    assert await _stored(api, "up") == before

    first = await api.artifacts.UploadArtifact(_upload("up", PNG, "img-1"))
    counted = await _stored(api, "up")
    assert counted > before + len(PNG) // 2
    # The answer was lost, say: the retry finds the same artifact and counts nothing.
    again = await api.artifacts.UploadArtifact(_upload("up", PNG, "img-1"))
    assert again.artifact == first.artifact
    assert first.artifact.sha256 == PNG_SHA
    assert await _stored(api, "up") == counted

    other = PNG[:-1] + b"\x00"
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await api.artifacts.UploadArtifact(_upload("up", other, "img-1"))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_info(err.value).reason == "REQUEST_ID_REUSED"
    assert await _stored(api, "up") == counted


async def test_event_pages_fit_a_default_client(daemon: Daemon) -> None:
    # grpc's default receive limit (4 MiB), as most clients run.
    async with grpc.aio.insecure_channel(f"unix:{daemon.endpoints.unix}") as ch:
        sessions = session_service_pb2_grpc.SessionServiceStub(ch)
        await sessions.CreateSession(
            spb.CreateSessionRequest(session=session_pb2.Session(session_id="big"))
        )
        text = "lorem ipsum " * 5_500  # ~64 KB per event
        for chunk in range(4):
            events = [user(f"{chunk}-{i} {text}") for i in range(50)]
            await sessions.AppendEvents(spb.AppendEventsRequest(session_id="big", events=events))
        for page_size in (0, 1000):
            seqs: list[int] = []
            token = ""
            while True:
                page = await sessions.ListEvents(
                    spb.ListEventsRequest(session_id="big", page_size=page_size, page_token=token)
                )
                assert page.ByteSize() < 4 << 20
                seqs += [e.seq for e in page.events]
                token = page.next_page_token
                if not token:
                    break
            assert seqs == list(range(1, 201))


@pytest.fixture
async def workspace_daemon(short_tmp: Path) -> AsyncIterator[tuple[Stubs, Path]]:
    work, glob, outside = short_tmp / "work", short_tmp / "global", short_tmp / "outside"
    proj = work / "proj"
    for made in (proj / ".ctxcc" / "rules", glob / "rules", glob / "skills" / "bad", outside):
        made.mkdir(parents=True)
    (outside / "AGENTS.md").write_text("secret instructions from elsewhere\n")
    (proj / "AGENTS.md").symlink_to(outside / "AGENTS.md")
    (proj / ".ctxcc" / "rules" / "odd.md").write_text(
        "---\nname: odd\nactivation: sometimes\n---\n"
    )
    (glob / "rules" / "odd.md").write_text("---\nname: godd\nactivation: sometimes\n---\n")
    (glob / "skills" / "bad" / "SKILL.md").write_text("---\nname: bad\n---\nno description\n")
    (glob / "CLAUDE.md").write_text("x" * 500)
    daemon = Daemon(
        make_config(
            short_tmp / "data",
            workspace_roots=str(work),
            global_dir=str(glob),
            instruction_file_cap="100",
        )
    )
    await daemon.start()
    s = stubs_for(f"unix:{daemon.endpoints.unix}")
    try:
        yield s, short_tmp
    finally:
        await s.channel.close()
        await daemon.stop()


async def test_view_notes_name_files_relative_to_their_root(
    workspace_daemon: tuple[Stubs, Path],
) -> None:
    api, tmp = workspace_daemon
    await _session(api, "w", project_root=str(tmp / "work" / "proj"))
    await _session(api, "elsewhere", project_root=str(tmp / "outside"))
    notes: list[str] = []
    for sid in ("w", "elsewhere"):
        await api.sessions.AppendEvents(
            spb.AppendEventsRequest(session_id=sid, events=[user("hi")])
        )
        notes += (await api.compiles.Compile(compile_request(sid))).view.notes
    # Each problem is reported, by a name relative to its root ...
    assert any(n.startswith("refused AGENTS.md") for n in notes), notes
    assert any(n.startswith("skipped .ctxcc/rules/odd.md") for n in notes), notes
    assert any(n.startswith("skipped global:rules/odd.md") for n in notes), notes
    assert any(n.startswith("skipped global:skills/bad/SKILL.md") for n in notes), notes
    assert any("global:CLAUDE.md truncated" in n for n in notes), notes
    assert any("not under a workspace root" in n for n in notes), notes
    # ... and no note shows where the daemon keeps anything, nor its configured roots.
    leaks = [n for n in notes if str(tmp / "global") in n or str(tmp / "work") + ")" in n]
    assert leaks == []
    assert [n for n in notes if str(tmp / "outside") in n and "project files" not in n] == []


async def test_checkpoint_pages_hold_each_checkpoint_once_while_more_are_made(
    unix_api: Stubs,
) -> None:
    """An agent that lists its checkpoints while it (or a compile's built-in compaction)
    makes more: the new ones are newest, so they go before the listing's position, which
    must not move the next page back onto checkpoints already listed."""
    api = unix_api
    await _session(api, "ckpages")
    await api.sessions.AppendEvents(
        spb.AppendEventsRequest(session_id="ckpages", events=[user("a"), user("b")])
    )

    async def make(n: int) -> str:
        made = await api.compiles.CreateCheckpoint(
            cpb.CreateCheckpointRequest(
                checkpoint=checkpoint_pb2.Checkpoint(
                    session_id="ckpages", covers_through_seq=1, summary=f"summary {n}"
                )
            )
        )
        return made.checkpoint.checkpoint_id

    before = [await make(n) for n in range(5)]
    listed: list[str] = []
    token = ""
    while True:
        page = await api.compiles.ListCheckpoints(
            cpb.ListCheckpointsRequest(session_id="ckpages", page_size=2, page_token=token)
        )
        listed += [c.checkpoint_id for c in page.checkpoints]
        token = page.next_page_token
        if not token:
            break
        await make(len(listed) + 100)  # between two pages
    assert listed == before[::-1]
