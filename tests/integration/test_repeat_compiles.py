"""Repeated compiles through a real daemon: when nothing was written since a session's
last compile, its view is sent again under a new compile id (counted as
`outcome="repeat"`); every write that a view depends on ends that, and the next view is
what a compile that repeats nothing makes (a dry run: compiled in full, recorded never).

Each case first brings the session to a repeat (the view sent again is checked against
a dry run and the recorded compile against its rebuild from the store), then makes one
write and checks that the next view changed as a compile would change it."""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from ctxcc.v1 import checkpoint_pb2, common_pb2, session_pb2, source_pb2, tool_pb2, view_pb2
from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_service_pb2 as spb
from ctxcc.v1 import source_service_pb2 as rpb
from ctxcc.v1 import tool_service_pb2 as tpb
from server.app import Daemon
from tests.conftest import Stubs, make_config, stubs_for
from tests.helpers import ROUTE, assistant, tool_result, user
from tests.integration.delta_session import RawStream, encoded

SID = "rep"


def _without_id(view: view_pb2.CompiledView) -> bytes:
    copy = view_pb2.CompiledView()
    copy.CopyFrom(view)
    copy.compile_id = ""
    return copy.SerializeToString(deterministic=True)


def _time(view: view_pb2.CompiledView) -> str:
    """The environment section, whose time moves on at the daemon's granularity."""
    return "".join(
        s.text for s in view.system_sections if s.kind == view_pb2.SECTION_KIND_ENVIRONMENT
    )


async def _repeats(d: Daemon) -> float:
    url = f"http://{d.endpoints.metrics}/metrics"
    text = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=30).read().decode())
    found = re.search(r'ctxcc_compile_memo_lookups_total\{outcome="repeat"\} (\S+)', text)
    assert found is not None
    return float(found.group(1))


class Session:
    def __init__(self, d: Daemon, api: Stubs, project_root: str) -> None:
        self.d, self.api, self.project_root = d, api, project_root

    def request(self, **kw: object) -> cpb.CompileRequest:
        return cpb.CompileRequest(session_id=SID, route=ROUTE, **kw)  # type: ignore[arg-type]

    async def compile(self) -> view_pb2.CompiledView:
        """A recorded compile, checked against a dry run made just before it (which
        writes nothing; made again when the clock's time text moved on in between) and
        against its own rebuild from the store."""
        for _ in range(3):
            dry = (await self.api.compiles.Compile(self.request(dry_run=True))).view
            got = (await self.api.compiles.Compile(self.request())).view
            if _time(dry) == _time(got):
                break
        assert _without_id(got) == _without_id(dry)
        rebuilt = await self.api.compiles.Compile(
            cpb.CompileRequest(rebuild_compile_id=got.compile_id)
        )
        assert got.SerializeToString() == rebuilt.view.SerializeToString()
        return got

    async def settled(self) -> view_pb2.CompiledView:
        """Compiles until the view is sent again, nothing written since: a repeat (tried
        again only when the clock's time text moved on, which ends a repeat)."""
        for _ in range(3):
            await self.compile()
            second = await self.compile()  # its previous sections are its own
            before = await _repeats(self.d)
            third = await self.compile()
            fourth = await self.compile()
            if await _repeats(self.d) == before + 2:
                assert len({third.compile_id, fourth.compile_id, second.compile_id}) == 3
                assert _without_id(fourth) == _without_id(third) == _without_id(second)
                return fourth
            assert _time(second) != _time(fourth), "only the clock ends a repeat here"
        raise AssertionError("no repeat in three tries")


@pytest.fixture
async def session(short_tmp: Path, request: pytest.FixtureRequest) -> AsyncIterator[Session]:
    """Only the workspace case reads project files: where they are read, a repeat reads
    them again and compares every source, which would hide a missing invalidation."""
    callspec = getattr(request.node, "callspec", None)
    reads_files = callspec is not None and callspec.params.get("write") == "workspace_file"
    root = short_tmp / "ws"
    (root / "proj").mkdir(parents=True)
    (root / "proj" / "AGENTS.md").write_text("Run the tests first.\n")
    d = Daemon(make_config(short_tmp / "data", workspace_roots=str(root)))
    await d.start()
    api = stubs_for(str(d.endpoints.tcp))
    try:
        project = str(root / "proj")
        await api.sessions.CreateSession(
            spb.CreateSessionRequest(
                session=session_pb2.Session(
                    session_id=SID, project_id="p", project_root=project if reads_files else ""
                )
            )
        )
        await api.tools.RegisterTools(
            tpb.RegisterToolsRequest(
                session_id=SID,
                tools=[
                    tool_pb2.ToolDefinition(
                        name="read", description="Read", input_schema_json="{}"
                    ),
                    tool_pb2.ToolDefinition(
                        name="deploy",
                        description="Deploy the service",
                        input_schema_json="{}",
                        visibility=tool_pb2.TOOL_VISIBILITY_DEFERRED,
                        search_keywords=["release"],
                    ),
                ],
            )
        )
        events = [
            user("fix the test"),
            assistant("", ("c1", "read", "{}")),
            tool_result("c1", "ok"),
        ]
        await api.sessions.AppendEvents(spb.AppendEventsRequest(session_id=SID, events=events))
        yield Session(d, api, project)
    finally:
        await api.channel.close()
        await d.stop()


def _memory(scope: int, scope_id: str, text: str) -> rpb.PutMemoryRequest:
    return rpb.PutMemoryRequest(
        memory=source_pb2.MemoryEntry(memory_id="m", scope=scope, scope_id=scope_id, text=text)  # type: ignore[arg-type]
    )


async def _append(s: Session) -> None:
    events = [assistant("", ("c2", "read", "{}")), tool_result("c2", "more")]
    await s.api.sessions.AppendEvents(spb.AppendEventsRequest(session_id=SID, events=events))


async def _checkpoint(s: Session) -> None:
    await s.api.compiles.CreateCheckpoint(
        cpb.CreateCheckpointRequest(
            checkpoint=checkpoint_pb2.Checkpoint(
                session_id=SID, covers_through_seq=3, summary="Fixed it.", portable=True
            ),
            covered_digest_mode=cpb.COVERED_DIGEST_MODE_COMPUTE,
        )
    )


async def _tools(s: Session) -> None:
    await s.api.tools.RegisterTools(
        tpb.RegisterToolsRequest(
            session_id=SID,
            tools=[
                tool_pb2.ToolDefinition(name="grep", description="Grep", input_schema_json="{}")
            ],
        )
    )


async def _activation(s: Session) -> None:
    found = await s.api.tools.SearchTools(tpb.SearchToolsRequest(session_id=SID, query="release"))
    assert [t.name for t in found.tools] == ["deploy"]


async def _global_memory(s: Session) -> None:
    await s.api.sources.PutMemory(_memory(common_pb2.SCOPE_GLOBAL, "", "Be brief."))


async def _project_memory(s: Session) -> None:
    await s.api.sources.PutMemory(_memory(common_pb2.SCOPE_PROJECT, "p", "Tabs."))


async def _session_memory(s: Session) -> None:
    await s.api.sources.PutMemory(_memory(common_pb2.SCOPE_SESSION, SID, "Spaces."))


async def _deleted_memory(s: Session) -> None:
    await _session_memory(s)
    await s.settled()
    await s.api.sources.DeleteMemory(
        rpb.DeleteMemoryRequest(scope=common_pb2.SCOPE_SESSION, scope_id=SID, memory_id="m")
    )


async def _usage(s: Session) -> None:
    last = await s.compile()
    await s.api.compiles.ReportUsage(
        cpb.ReportUsageRequest(compile_id=last.compile_id, route=ROUTE, input_tokens=5_000)
    )


async def _workspace_file(s: Session) -> None:
    await asyncio.to_thread(Path(s.project_root, "AGENTS.md").write_text, "Run the linter.\n")


async def _recreated(s: Session) -> None:
    """The session deleted and made again under its id, as long, with other text."""
    await s.api.sessions.DeleteSession(spb.DeleteSessionRequest(session_id=SID))
    await s.api.sessions.CreateSession(
        spb.CreateSessionRequest(session=session_pb2.Session(session_id=SID, project_id="p"))
    )
    events = [user("fix the build"), assistant("", ("c1", "read", "{}")), tool_result("c1", "ok")]
    await s.api.sessions.AppendEvents(spb.AppendEventsRequest(session_id=SID, events=events))


# Each write, with whether it changes the view itself (a usage report changes the next
# estimate; a checkpoint the history; the others a section, the tools or the messages).
WRITES: dict[str, Callable[[Session], Awaitable[None]]] = {
    "append": _append,
    "checkpoint": _checkpoint,
    "tools": _tools,
    "activation": _activation,
    "global_memory": _global_memory,
    "project_memory": _project_memory,
    "session_memory": _session_memory,
    "deleted_memory": _deleted_memory,
    "usage": _usage,
    "workspace_file": _workspace_file,
    "recreated": _recreated,
}


@pytest.mark.parametrize("write", sorted(WRITES))
async def test_a_write_ends_the_repeat_and_the_view_follows_it(
    session: Session, write: str
) -> None:
    before = await session.settled()
    await WRITES[write](session)
    after = await session.compile()
    assert _without_id(after) != _without_id(before), f"{write} changes the view"


async def test_another_sessions_report_on_the_route_ends_the_repeat(session: Session) -> None:
    """The route's learned model is shared by every session on the route."""
    api = session.api
    await api.sessions.CreateSession(
        spb.CreateSessionRequest(session=session_pb2.Session(session_id="other"))
    )
    await session.settled()
    for i in range(3):
        await api.sessions.AppendEvents(
            spb.AppendEventsRequest(session_id="other", events=[user(f"question {i}")])
        )
        other = await api.compiles.Compile(cpb.CompileRequest(session_id="other", route=ROUTE))
        await api.compiles.ReportUsage(
            cpb.ReportUsageRequest(
                compile_id=other.view.compile_id, route=ROUTE, input_tokens=9_000 + 10 * i
            )
        )
    repeats = await _repeats(session.d)
    await session.compile()
    assert await _repeats(session.d) == repeats, "not repeated after the route model moved"


async def test_the_clock_ends_the_repeat(short_tmp: Path) -> None:
    """The environment section's time moves on at its granularity (1 s here): a view
    remembered within one second is not sent again in the next."""
    d = Daemon(make_config(short_tmp, time_granularity="1"))
    await d.start()
    api = stubs_for(str(d.endpoints.tcp))
    try:
        await api.sessions.CreateSession(
            spb.CreateSessionRequest(session=session_pb2.Session(session_id=SID))
        )
        await api.sessions.AppendEvents(
            spb.AppendEventsRequest(session_id=SID, events=[user("hello")])
        )
        request = cpb.CompileRequest(session_id=SID, route=ROUTE)
        await api.compiles.Compile(request)
        remembered = (await api.compiles.Compile(request)).view
        await asyncio.sleep(1.1)
        later = (await api.compiles.Compile(request)).view
        assert _time(later) != _time(remembered)
        rebuilt = await api.compiles.Compile(
            cpb.CompileRequest(rebuild_compile_id=later.compile_id)
        )
        assert later.SerializeToString() == rebuilt.view.SerializeToString()
    finally:
        await api.channel.close()
        await d.stop()


async def test_a_restart_starts_without_repeats(short_tmp: Path) -> None:
    views: list[view_pb2.CompiledView] = []
    for _ in range(2):
        d = Daemon(make_config(short_tmp))
        await d.start()
        api = stubs_for(str(d.endpoints.tcp))
        try:
            if not views:
                await api.sessions.CreateSession(
                    spb.CreateSessionRequest(session=session_pb2.Session(session_id=SID))
                )
                await api.sessions.AppendEvents(
                    spb.AppendEventsRequest(session_id=SID, events=[user("hello")])
                )
            s = Session(d, api, "")
            before = await _repeats(d)
            views.append(await s.compile())
            assert await _repeats(d) == before, "a restarted daemon remembers no view"
            views.append(await s.settled())
        finally:
            await api.channel.close()
            await d.stop()
    assert _without_id(views[0]) == _without_id(views[2])


async def test_stream_steps_without_events_repeat_and_match_their_rebuilds(
    session: Session,
) -> None:
    """Over CompileStream, repeated views go as deltas (and whole when no base is named),
    their encodings spliced from the previous view's parts with only the head that holds
    the compile id made again: each equals its rebuild from the store, byte for byte."""
    stream = RawStream(session.api)
    try:
        before = await _repeats(session.d)
        views = [await stream.step(session.request(), []) for _ in range(4)]
        views.append(await stream.step(session.request(), [], base=""))  # whole
        await _append(session)
        views += [await stream.step(session.request(), []) for _ in range(3)]
        assert await _repeats(session.d) == before + 2 + 1 + 2
        assert len(stream.applied) == 6, "views after the first and the whole one are deltas"
        for view in views:
            rebuilt = await session.api.compiles.Compile(
                cpb.CompileRequest(rebuild_compile_id=view.compile_id)
            )
            assert encoded(view) == encoded(rebuilt.view)
        assert len({v.compile_id for v in views}) == len(views)
        assert _without_id(views[4]) == _without_id(views[2])
        assert _without_id(views[-1]) != _without_id(views[2])
    finally:
        await stream.close()


async def test_unary_repeats_back_to_back_match_their_rebuilds(session: Session) -> None:
    """Repeated unary views are spliced from the session's last view sent (see above)."""
    before = await _repeats(session.d)
    views = [(await session.api.compiles.Compile(session.request())).view for _ in range(4)]
    assert await _repeats(session.d) == before + 2
    for view in views:
        rebuilt = await session.api.compiles.Compile(
            cpb.CompileRequest(rebuild_compile_id=view.compile_id)
        )
        assert view.SerializeToString() == rebuilt.view.SerializeToString()
    assert len({v.compile_id for v in views}) == 4


@contextlib.asynccontextmanager
async def _session_lock_held(session: Session, seconds: float) -> AsyncIterator[threading.Event]:
    """Holds the session's store lock (as an append does through its fsync) until a
    timer releases it after `seconds`, so a daemon that waits for it on its event loop
    fails the test rather than hanging it; yields the event set at the release."""
    store = session.d._store
    assert store is not None
    lock = store._lock(SID)
    await asyncio.to_thread(lock.acquire)
    released = threading.Event()

    def release() -> None:
        released.set()
        lock.release()

    timer = threading.Timer(seconds, release)
    timer.start()
    try:
        yield released
    finally:
        await asyncio.to_thread(timer.join)


async def test_a_repeat_never_waits_for_the_session_lock_on_the_event_loop(
    session: Session,
) -> None:
    """While an append holds the session's store lock (through its fsync), a repeat's
    record is written from a thread: other calls are answered meanwhile (the lock is
    released by a timer, so a daemon that waited on its event loop fails, not hangs),
    and the repeat completes once the lock is free."""
    await session.settled()
    async with _session_lock_held(session, 1.5) as released:
        before = await _repeats(session.d)
        compiling = asyncio.ensure_future(session.api.compiles.Compile(session.request()))
        await asyncio.sleep(0.2)
        other = await session.api.sessions.GetSession(spb.GetSessionRequest(session_id=SID))
        assert other.session.session_id == SID
        assert not released.is_set(), "the event loop waited for the session's lock"
        assert not compiling.done()  # its record waits for the lock, on a thread
    got = (await compiling).view
    assert await _repeats(session.d) == before + 1
    rebuilt = await session.api.compiles.Compile(
        cpb.CompileRequest(rebuild_compile_id=got.compile_id)
    )
    assert got.SerializeToString() == rebuilt.view.SerializeToString()


async def test_a_usage_report_never_waits_for_the_session_lock_on_the_event_loop(
    session: Session,
) -> None:
    """A usage report is recorded on the event loop, unless the session's store lock is
    held (an append's fsync): then from a thread, other calls being answered meanwhile."""
    view = await session.compile()
    async with _session_lock_held(session, 1.5) as released:
        reporting = asyncio.ensure_future(
            session.api.compiles.ReportUsage(
                cpb.ReportUsageRequest(compile_id=view.compile_id, route=ROUTE, input_tokens=4_000)
            )
        )
        await asyncio.sleep(0.2)
        other = await session.api.sessions.GetSession(spb.GetSessionRequest(session_id=SID))
        assert other.session.session_id == SID
        assert not released.is_set(), "the event loop waited for the session's lock"
        assert not reporting.done()
    answer = await reporting
    assert answer.estimated_input_tokens == view.budget.estimated_input_tokens
    assert not answer.replayed
    again = await session.compile()  # estimated from the reported baseline now
    assert again.budget.baseline_tokens == 4_000
