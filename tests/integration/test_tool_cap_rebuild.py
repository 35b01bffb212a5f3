"""Exact time travel across the route's tool cap (tool_cap.TOOL_CAPPING, kept in each
compile's basis): a compile recorded by a daemon that capped nothing (its basis has no
`tool_capping`, read as 0) is rebuilt with every tool, as it was sent; one recorded with
the cap is rebuilt capped."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec

from ctxcc.storage.v1 import records_pb2
from ctxcc.v1 import common_pb2, session_pb2, tool_pb2
from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_service_pb2 as spb
from ctxcc.v1 import tool_service_pb2 as tpb
from server.app import Daemon
from server.compiler.tool_cap import TOOL_CAPPING
from storage.keys import PART, session_key
from storage.kv import Batch
from storage.rocks import open_rocks
from storage.store import KVEventStore
from tests.conftest import make_config, stubs_for
from tests.helpers import user

OPENAI = common_pb2.Route(connection="t", protocol="openai-chat", endpoint="api", model="gpt-4o")
SID = "capped"


def as_recorded_before_the_cap(db: Path, compile_id: str) -> None:
    """Rewrites the compile's stored basis as a daemon before the cap wrote it: the same
    fields but `tool_capping`."""
    kv = open_rocks(db)
    try:
        record = KVEventStore(kv).get_compile(compile_id)
        key = session_key(SID, PART + record.basis_digest.encode())
        raw = kv.get("compiles", key)
        assert raw is not None
        stored = records_pb2.Record.FromString(raw)
        assert stored.type == "CompileBasis"
        body = msgspec.msgpack.decode(stored.body)
        assert body.pop("tool_capping") == TOOL_CAPPING
        stored.body = msgspec.msgpack.encode(body)
        batch = Batch()
        batch.put("compiles", key, stored.SerializeToString())
        kv.write(batch)
    finally:
        kv.close()


async def test_a_compile_recorded_before_the_cap_is_rebuilt_without_it(short_tmp: Path) -> None:
    config = make_config(short_tmp / "data")
    daemon = Daemon(config)
    await daemon.start()
    api = stubs_for(f"unix:{daemon.endpoints.unix}")
    try:
        await api.sessions.CreateSession(
            spb.CreateSessionRequest(session=session_pb2.Session(session_id=SID))
        )
        registry = [
            tool_pb2.ToolDefinition(
                name=f"mcp_t{i:03d}", description=f"Tool {i}", input_schema_json='{"type":"object"}'
            )
            for i in range(200)
        ]
        await api.tools.RegisterTools(tpb.RegisterToolsRequest(session_id=SID, tools=registry))
        views = []
        for text in ("first", "second"):
            await api.sessions.AppendEvents(
                spb.AppendEventsRequest(session_id=SID, events=[user(text)])
            )
            req = cpb.CompileRequest(session_id=SID, route=OPENAI)
            views.append((await api.compiles.Compile(req)).view)
        old, kept = views
        assert len(old.tools) == len(kept.tools) == 128
    finally:
        await api.channel.close()
        await daemon.stop()

    as_recorded_before_the_cap(config.db_path, old.compile_id)

    daemon = Daemon(config)
    await daemon.start()
    api = stubs_for(f"unix:{daemon.endpoints.unix}")
    try:

        async def rebuilt(compile_id: str) -> tuple[list[str], list[str]]:
            req = cpb.CompileRequest(session_id=SID, rebuild_compile_id=compile_id)
            v = (await api.compiles.Compile(req)).view
            return [t.definition.name for t in v.tools], list(v.notes)

        names, notes = await rebuilt(old.compile_id)
        assert names == [t.name for t in registry]  # all 200, no tool_search
        assert not any("tool_search" in n for n in notes), notes
        names, notes = await rebuilt(kept.compile_id)
        assert names == [t.definition.name for t in kept.tools]
        assert notes == list(kept.notes)
        assert any("73 of the 200 direct tools" in n for n in notes), notes
        # The rewritten basis is read back whole otherwise: same route, same registry.
        assert json.dumps(names[:127]) == json.dumps([t.name for t in registry[:127]])
    finally:
        await api.channel.close()
        await daemon.stop()
