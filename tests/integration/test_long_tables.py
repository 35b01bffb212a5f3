"""Views of hundreds of messages whose per-message tables are stored as chunks (compile
records, route states, compile bases; see domain/table_chunks.py), through a real daemon
and a restart: the estimate that needs the baseline's table (messages left the view
behind a checkpoint) is the same from the records kept in memory and from those read
back from disk, and every recorded compile rebuilds byte for byte after the restart."""

from __future__ import annotations

from pathlib import Path

import pytest

from ctxcc.v1 import checkpoint_pb2, event_pb2, session_pb2, view_pb2
from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_service_pb2 as spb
from server.app import Daemon
from server.domain import table_chunks
from tests.conftest import Stubs, make_config, stubs_for
from tests.helpers import ROUTE, assistant, compile_request, tool_result, user

SID = "long-tables"


async def _append(api: Stubs, events: list[event_pb2.Event]) -> None:
    for i in range(0, len(events), 500):
        await api.sessions.AppendEvents(
            spb.AppendEventsRequest(session_id=SID, events=events[i : i + 500])
        )


def _pairs(tag: str, n: int) -> list[event_pb2.Event]:
    out: list[event_pb2.Event] = []
    for k in range(n):
        out += [
            assistant(f"{tag} step {k}", (f"{tag}{k}", "shell", '{"cmd": "ls"}')),
            tool_result(f"{tag}{k}", f"{tag} file {k} " + "line of output " * (k % 7 + 1)),
        ]
    return out


async def _reported(api: Stubs, extra: int) -> view_pb2.CompiledView:
    got = (await api.compiles.Compile(compile_request(SID))).view
    await api.compiles.ReportUsage(
        cpb.ReportUsageRequest(
            compile_id=got.compile_id,
            route=ROUTE,
            input_tokens=got.budget.estimated_input_tokens + extra,
            output_tokens=20,
        )
    )
    return got


async def _long_session(short_tmp: Path, pairs: int) -> tuple[Daemon, Stubs]:
    """A started daemon (a day's time granularity: its views do not move with the clock)
    and session SID holding a user request and `pairs` tool calls with their results."""
    d = Daemon(make_config(short_tmp, time_granularity="86400"))
    await d.start()
    api = stubs_for(str(d.endpoints.tcp))
    await api.sessions.CreateSession(
        spb.CreateSessionRequest(session=session_pb2.Session(session_id=SID))
    )
    await _append(api, [user("start the long task"), *_pairs("a", pairs)])
    return d, api


async def test_long_tables_estimate_and_rebuild_the_same_after_a_restart(short_tmp: Path) -> None:
    d, api = await _long_session(short_tmp, 330)
    try:
        recorded = [await _reported(api, 41)]
        await _append(api, _pairs("b", 2))
        recorded.append(await _reported(api, 57))
        assert len(recorded[-1].messages) > 600
        assert recorded[-1].budget.estimate_method == view_pb2.ESTIMATE_METHOD_BASELINE_DELTA
        # Behind a checkpoint, messages leave the view: the estimate subtracts what left
        # by the baseline's per-message table.
        await api.compiles.CreateCheckpoint(
            cpb.CreateCheckpointRequest(
                checkpoint=checkpoint_pb2.Checkpoint(
                    session_id=SID, covers_through_seq=201, summary="the first hundred steps"
                ),
                covered_digest_mode=cpb.COVERED_DIGEST_MODE_COMPUTE,
            )
        )
        await _append(api, _pairs("c", 1))
        kept = (await api.compiles.Compile(compile_request(SID, dry_run=True))).view
    finally:
        await api.channel.close()
        await d.stop()
    assert kept.budget.estimate_method == view_pb2.ESTIMATE_METHOD_BASELINE_DELTA
    assert len(kept.messages) < len(recorded[-1].messages) - 150

    # Nothing kept in memory: every record is read from disk.
    d = Daemon(make_config(short_tmp, time_granularity="86400"))
    await d.start()
    api = stubs_for(str(d.endpoints.tcp))
    try:
        read_back = (await api.compiles.Compile(compile_request(SID))).view
        assert read_back.budget == kept.budget
        assert [m.SerializeToString() for m in read_back.messages] == [
            m.SerializeToString() for m in kept.messages
        ]
        await _rebuild_byte_for_byte(api, [*recorded, read_back])
    finally:
        await api.channel.close()
        await d.stop()


async def _rebuild_byte_for_byte(api: Stubs, views: list[view_pb2.CompiledView]) -> None:
    """Each recorded view, rebuilt from its compile id, is the same bytes."""
    for view in views:
        again = await api.compiles.Compile(cpb.CompileRequest(rebuild_compile_id=view.compile_id))
        assert again.view.SerializeToString() == view.SerializeToString()


async def test_a_step_compares_its_table_with_an_earlier_one_once(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The basis of a step's compile holds its route state's table, the reported record's:
    the store split that table when it wrote the record, so the compile finds that split
    (the daemon has one splitter) and only the new record's table is compared, thousands
    of entries, with the table before it. Every compile still rebuilds byte for byte."""
    compared: list[int] = []
    same_start = table_chunks._same_start

    def counted(old: table_chunks.Split, digests: bytes, tokens: tuple[int, ...], n: int) -> bool:
        compared.append(len(tokens))
        return same_start(old, digests, tokens, n)

    monkeypatch.setattr(table_chunks, "_same_start", counted)
    d, api = await _long_session(short_tmp, 300)
    try:
        recorded = [await _reported(api, 41)]
        for k in range(4):
            await _append(api, _pairs(f"b{k}", 1))
            compared.clear()
            recorded.append(await _reported(api, 57 + k))
            assert len(compared) == 1
        await _rebuild_byte_for_byte(api, recorded)
    finally:
        await api.channel.close()
        await d.stop()
