"""Repeated compiles under concurrency, through a real daemon: compiles of one session
racing each other and racing writes that change their view (an append, a session memory,
a usage report, a tool registration) must never leave a view remembered as current
that a write after it made stale. After each round, the next recorded compile (a repeat
whenever the daemon remembered one) must equal a dry run made just before it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ctxcc.v1 import common_pb2, tool_pb2
from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_service_pb2 as spb
from ctxcc.v1 import tool_service_pb2 as tpb
from server.domain.errors import CtxccError, Reason
from server.domain.sources import MemoryEntry, Scope
from server.domain.tools import ToolSpec
from tests.helpers import ROUTE, user
from tests.integration import test_repeat_compiles as repeats
from tests.integration.test_repeat_compiles import SID, Session, _memory, _repeats

# The same session and daemon as test_repeat_compiles.py's cases.
session = repeats.session


async def _write(s: Session, i: int, last: str) -> None:
    match i % 4:
        case 0:
            await s.api.sessions.AppendEvents(
                spb.AppendEventsRequest(session_id=SID, events=[user(f"and then {i}")])
            )
        case 1:
            await s.api.sources.PutMemory(_memory(common_pb2.SCOPE_SESSION, SID, f"Note {i}."))
        case 2:
            await s.api.compiles.ReportUsage(
                cpb.ReportUsageRequest(compile_id=last, route=ROUTE, input_tokens=3_000 + i)
            )
        case _:
            tool = tool_pb2.ToolDefinition(
                name=f"t{i}", description=f"Tool {i}", input_schema_json="{}"
            )
            await s.api.tools.RegisterTools(tpb.RegisterToolsRequest(session_id=SID, tools=[tool]))


async def test_writes_racing_compiles_never_leave_a_stale_view_remembered(
    session: Session,
) -> None:
    before = await _repeats(session.d)
    last = (await session.compile()).compile_id
    for i in range(24):
        racing = asyncio.gather(
            *(session.api.compiles.Compile(session.request()) for _ in range(3))
        )
        await asyncio.gather(_write(session, i, last), racing)
        last = racing.result()[-1].view.compile_id
        # The first compile after the round may be a repeat; it must still be current.
        await session.compile()
        await session.compile()
    assert await _repeats(session.d) > before, "the rounds repeated views at all"


async def test_a_write_landing_during_a_compiles_reads_is_not_repeated_over(
    session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Deterministically, the race above: a global memory is written while a compile is
    reading (after it read the sources, before its record): that view is already stale
    when it is sent, so it must not be remembered as current; the next compile shows the
    memory."""
    store = session.d._store
    assert store is not None
    await session.settled()
    read_last = store.get_last_compile
    wrote: list[str] = []

    def last_compile_then_a_write(session_id: str) -> Any:
        found = read_last(session_id)
        if not wrote:
            wrote.append(session_id)
            store.put_source(MemoryEntry("late", Scope.GLOBAL, "", "Landed mid-compile."))
        return found

    monkeypatch.setattr(store, "get_last_compile", last_compile_then_a_write)
    await session.api.sessions.AppendEvents(
        spb.AppendEventsRequest(session_id=SID, events=[user("one more thing")])
    )
    stale = (await session.api.compiles.Compile(session.request())).view
    assert wrote == [SID], "the compile read the session's last compile"
    assert "Landed mid-compile." not in stale.system_prompt, "it read the sources before"
    monkeypatch.undo()
    after = await session.compile()  # equal to a dry run made just before it
    assert "Landed mid-compile." in after.system_prompt


async def test_a_compile_whose_record_was_not_written_is_not_repeated(
    session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A compile's record refused for a full disk (the view is still sent), and another
    write of the session landing right after, once space is back: the session is then
    one write further, as if the record had been the only write, but the view was
    compiled before that write. It must not be remembered as current: the next view
    shows the write."""
    store = session.d._store
    assert store is not None
    await session.settled()
    put = store.put_compile
    tool = ToolSpec("late", "Registered as space came back", "{}")
    failed: list[str] = []

    def refused_then_a_write(record: Any, *args: Any, **kwargs: Any) -> bool:
        if failed:
            return put(record, *args, **kwargs)
        failed.append(record.compile_id)
        store.put_tools(SID, (tool,), False, 512)
        raise CtxccError(Reason.DISK_FULL, "no space left on the data directory")

    monkeypatch.setattr(store, "put_compile", refused_then_a_write)
    await session.api.sessions.AppendEvents(
        spb.AppendEventsRequest(session_id=SID, events=[user("one more thing")])
    )
    sent = (await session.api.compiles.Compile(session.request())).view
    assert failed == [sent.compile_id], "its record was refused"
    assert "late" not in [t.definition.name for t in sent.tools], "compiled before the write"
    monkeypatch.undo()
    after = await session.compile()  # equal to a dry run made just before it
    assert "late" in [t.definition.name for t in after.tools]
