"""What a client stores counts against a quota or has a bound: checkpoints use the
session's byte quota, route fields and labels are bounded, each source scope holds a
bounded number of entries, and ListSessions pages end by size."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any

import grpc
import pytest

from ctxcc.v1 import checkpoint_pb2, common_pb2, session_pb2, source_pb2
from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_service_pb2 as spb
from ctxcc.v1 import source_service_pb2 as rpb
from server.app import Daemon
from server.service import sessions as sessions_module
from server.service import sources as sources_module
from server.service.sources import MAX_ENTRIES_PER_SCOPE
from server.transport.paging import MAX_PAGE_BYTES
from tests.conftest import Stubs, make_config, stubs_for
from tests.helpers import compile_request, error_info, user


@pytest.fixture
async def api(short_tmp: Path) -> AsyncIterator[Stubs]:
    d = Daemon(make_config(short_tmp, max_session_bytes="300000"))
    await d.start()
    assert d.endpoints.unix is not None
    stubs = stubs_for(f"unix:{d.endpoints.unix}")
    try:
        yield stubs
    finally:
        await stubs.channel.close()
        await d.stop()


async def _fails(call: Awaitable[Any]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await call
    return exc.value.code(), error_info(exc.value).reason


async def test_checkpoints_use_the_session_quota(api: Stubs) -> None:
    await api.sessions.CreateSession(
        spb.CreateSessionRequest(session=session_pb2.Session(session_id="q"))
    )
    await api.sessions.AppendEvents(spb.AppendEventsRequest(session_id="q", events=[user("hi")]))
    before = (await api.sessions.GetSession(spb.GetSessionRequest(session_id="q"))).session

    def create() -> Awaitable[Any]:
        return api.compiles.CreateCheckpoint(
            cpb.CreateCheckpointRequest(
                checkpoint=checkpoint_pb2.Checkpoint(
                    session_id="q", covers_through_seq=1, summary="s" * 100_000
                )
            )
        )

    await create()
    after = (await api.sessions.GetSession(spb.GetSessionRequest(session_id="q"))).session
    assert after.stored_bytes >= before.stored_bytes + 100_000
    await create()
    assert await _fails(create()) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "QUOTA_EXCEEDED")


async def test_route_fields_and_labels_are_bounded(api: Stubs) -> None:
    await api.sessions.CreateSession(
        spb.CreateSessionRequest(session=session_pb2.Session(session_id="r"))
    )
    await api.sessions.AppendEvents(spb.AppendEventsRequest(session_id="r", events=[user("hi")]))
    huge = common_pb2.Route(model="m" * (1 << 20))
    request = cpb.CompileRequest(session_id="r", route=huge)
    assert await _fails(api.compiles.Compile(request)) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_FIELD",
    )
    view = (await api.compiles.Compile(compile_request("r"))).view
    report = cpb.ReportUsageRequest(compile_id=view.compile_id, route=huge, input_tokens=5)
    assert await _fails(api.compiles.ReportUsage(report)) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_FIELD",
    )
    for labels in ({"k": "v" * (20 << 20)}, {f"k{i}": "v" for i in range(65)}, {"": "v"}):
        session = session_pb2.Session(session_id="l", labels=labels)
        code, reason = await _fails(
            api.sessions.CreateSession(spb.CreateSessionRequest(session=session))
        )
        assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD")
    ok = session_pb2.Session(session_id="l", labels={f"k{i}": "v" * 1_000 for i in range(64)})
    await api.sessions.CreateSession(spb.CreateSessionRequest(session=ok))


async def test_a_scope_holds_a_bounded_number_of_entries(api: Stubs) -> None:
    def put(i: int) -> Awaitable[Any]:
        return api.sources.PutMemory(
            rpb.PutMemoryRequest(
                memory=source_pb2.MemoryEntry(
                    memory_id=f"m{i}", scope=common_pb2.SCOPE_GLOBAL, text=f"fact {i}"
                )
            )
        )

    for i in range(MAX_ENTRIES_PER_SCOPE):
        await put(i)
    assert await _fails(put(MAX_ENTRIES_PER_SCOPE)) == (
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "QUOTA_EXCEEDED",
    )
    await put(0)  # replacing an entry needs no room


async def test_projects_holding_entries_are_bounded(
    api: Stubs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each project holds a bounded number of entries, outside any session's quota, and
    project ids come from clients: past MAX_PROJECT_SCOPES projects (3 here) a new
    project's first entry is refused with nothing written; projects that hold entries
    take more, and one whose last entry is deleted leaves room."""
    monkeypatch.setattr(sources_module, "MAX_PROJECT_SCOPES", 3)
    project = common_pb2.SCOPE_PROJECT

    def memory(pid: str, mid: str) -> Awaitable[Any]:
        entry = source_pb2.MemoryEntry(memory_id=mid, scope=project, scope_id=pid, text="f")
        return api.sources.PutMemory(rpb.PutMemoryRequest(memory=entry))

    def rule(pid: str) -> Awaitable[Any]:
        entry = source_pb2.Rule(
            rule_id="r",
            scope=project,
            scope_id=pid,
            name="r",
            text="t",
            activation=source_pb2.RULE_ACTIVATION_ALWAYS,
        )
        return api.sources.PutRule(rpb.PutRuleRequest(rule=entry))

    await memory("p1", "m")
    await rule("p2")  # a project counts whatever kind it holds
    await memory("p3", "m")
    code, reason = await _fails(memory("p4", "m"))
    assert (code, reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "QUOTA_EXCEEDED")
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await rule("p4")
    assert error_info(exc.value).metadata["quota"] == "max_project_scopes"
    listed = await api.sources.ListMemory(rpb.ListMemoryRequest(scope=project, scope_id="p4"))
    assert list(listed.memories) == []
    await memory("p1", "m2")  # a project that holds entries takes more
    await rule("p1")
    await api.sources.DeleteRule(rpb.DeleteRuleRequest(scope=project, scope_id="p2", rule_id="r"))
    await memory("p4", "m")


async def test_list_sessions_pages_end_by_size(api: Stubs) -> None:
    labels = {f"k{i}": "v" * 1_000 for i in range(64)}  # about 66 KB a session
    for i in range(60):
        session = session_pb2.Session(session_id=f"s{i:03}", labels=labels)
        await api.sessions.CreateSession(spb.CreateSessionRequest(session=session))
    seen: list[str] = []
    token = ""
    pages = 0
    while True:
        page = await api.sessions.ListSessions(
            spb.ListSessionsRequest(page_size=1_000, page_token=token)
        )
        assert page.ByteSize() <= MAX_PAGE_BYTES + (100 << 10)
        seen += [s.session_id for s in page.sessions]
        pages += 1
        token = page.next_page_token
        if not token:
            break
    assert seen == [f"s{i:03}" for i in range(60)] and pages >= 2


async def test_a_listing_filtered_by_project_reads_a_bounded_number_of_sessions(
    api: Stubs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page filtered by project examines at most EXAMINE_PER_PAGE sessions (here 5 of
    the 23): short pages, an empty one too, carry a token, and the pages together hold
    every session of the project once, in id order."""
    monkeypatch.setattr(sessions_module, "EXAMINE_PER_PAGE", 5)
    for i in range(23):
        project = "rare" if i in (1, 3, 17) else "common"
        session = session_pb2.Session(session_id=f"s{i:03}", project_id=project)
        await api.sessions.CreateSession(spb.CreateSessionRequest(session=session))
    pages: list[list[str]] = []
    token = ""
    while True:
        page = await api.sessions.ListSessions(
            spb.ListSessionsRequest(page_size=2, page_token=token, project_id="rare")
        )
        pages.append([s.session_id for s in page.sessions])
        token = page.next_page_token
        if not token:
            break
    assert pages == [["s001", "s003"], [], [], ["s017"], []]
    # Unfiltered, a page is as full as asked.
    whole = await api.sessions.ListSessions(spb.ListSessionsRequest(page_size=20))
    assert len(whole.sessions) == 20 and whole.next_page_token


async def test_a_stream_step_over_the_event_limit_is_refused_before_conversion(
    api: Stubs,
) -> None:
    await api.sessions.CreateSession(
        spb.CreateSessionRequest(session=session_pb2.Session(session_id="st"))
    )
    step = cpb.StepRequest(step_id="s1", compile=compile_request("st"))
    step.events.extend([user("x")] * 1_001)

    async def one() -> AsyncIterator[cpb.CompileStreamRequest]:
        yield cpb.CompileStreamRequest(step=step)

    replies = [r async for r in api.compiles.CompileStream(one())]
    assert [r.error.reason for r in replies] == ["TOO_MANY_EVENTS"]
    head = (await api.sessions.GetSession(spb.GetSessionRequest(session_id="st"))).session
    assert head.head_seq == 0
