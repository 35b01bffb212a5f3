"""Upgrades keep data: every fixture data directory in tests/fixtures/data-v*/ (each
written by the daemon of its schema version, see scripts/make_fixture_datadir.py) opens
with this daemon, and the session it holds reads back whole through the API."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from ctxcc.v1 import (
    artifact_service_pb2 as apb,
)
from ctxcc.v1 import (
    common_pb2,
    tool_pb2,
)
from ctxcc.v1 import (
    compile_service_pb2 as cpb,
)
from ctxcc.v1 import (
    session_service_pb2 as spb,
)
from ctxcc.v1 import (
    source_service_pb2 as srcpb,
)
from ctxcc.v1 import (
    tool_service_pb2 as tpb,
)
from server.app import Daemon
from storage.rocks import open_rocks
from storage.schema import SCHEMA_VERSION, stored_version
from storage.store import KVEventStore
from tests.conftest import Stubs, make_config, stubs_for
from tests.helpers import error_info, user

FIXTURES = sorted((Path(__file__).parents[1] / "fixtures").glob("data-v*"))


def test_there_is_a_fixture_for_the_current_schema() -> None:
    versions = {int(p.name.removeprefix("data-v")) for p in FIXTURES}
    assert versions == set(range(1, SCHEMA_VERSION + 1))


@pytest.fixture(params=FIXTURES, ids=lambda p: p.name)
async def upgraded(
    request: pytest.FixtureRequest, short_tmp: Path
) -> AsyncIterator[tuple[Stubs, dict[str, Any], Path]]:
    fixture: Path = request.param
    data = short_tmp / "data"
    shutil.copytree(fixture / "db", data / "db")  # never open the committed copy
    manifest = json.loads((fixture / "manifest.json").read_text())
    daemon = Daemon(make_config(data))
    await daemon.start()
    api = stubs_for(f"unix:{daemon.endpoints.unix}")
    try:
        yield api, manifest, data
    finally:
        await api.channel.close()
        await daemon.stop()


async def test_an_old_data_dir_reads_back_whole(
    upgraded: tuple[Stubs, dict[str, Any], Path],
) -> None:
    api, m, _ = upgraded
    sid = m["session_id"]
    route = common_pb2.Route(**m["route"])
    session = (await api.sessions.GetSession(spb.GetSessionRequest(session_id=sid))).session
    assert (session.head_seq, session.project_id, dict(session.labels)) == (
        m["head_seq"],
        m["project_id"],
        {"team": "core"},
    )
    events = (await api.sessions.ListEvents(spb.ListEventsRequest(session_id=sid))).events
    assert [e.event_id for e in events] == m["event_ids"]
    assert [e.seq for e in events] == list(range(1, m["head_seq"] + 1))
    kinds = {e.WhichOneof("payload") for e in events}
    assert kinds == {
        "user_message",
        "assistant_message",
        "tool_call",
        "tool_result",
        "imported_message",
        "attachment",
        "browser_element",
        "turn_started",
        "turn_cancelled",
        "turn_completed",
    }
    big = next(e for e in events if e.event_id == "e-big").tool_result
    assert big.WhichOneof("content") == "blob" and big.blob.sha256 == m["big_result_sha256"]
    attach = next(e for e in events if e.event_id == "e-attach").attachment
    assert attach.artifact_id == m["artifact_id"]
    assert next(e for e in events if e.event_id == "e-browser").browser_element.attributes == {
        "class": "primary"
    }

    download = api.artifacts.DownloadArtifact(
        apb.DownloadArtifactRequest(session_id=sid, artifact_id=m["artifact_id"])
    )
    chunks = [c async for c in download]
    assert hashlib.sha256(b"".join(c.data for c in chunks[1:])).hexdigest() == m["artifact_sha256"]
    read = await api.tools.ReadToolResult(
        tpb.ReadToolResultRequest(
            session_id=sid, call_id="call-2", search=tpb.ResultSearch(pattern="row 799:")
        )
    )
    assert [h.line for h in read.matches] == [799]

    memory = (await api.sources.ListMemory(srcpb.ListMemoryRequest())).memories
    assert sorted(e.text for e in memory) == [f"memory fact {n}" for n in range(3)]
    rules = (await api.sources.ListRules(srcpb.ListRulesRequest())).rules
    assert sorted(r.rule_id for r in rules) == ["r-always", "r-demand", "r-matched"]
    skills = (await api.sources.ListSkills(srcpb.ListSkillsRequest())).skills
    assert sorted(s.name for s in skills) == ["skill-0", "skill-1", "skill-2"]
    registry = (await api.tools.ListTools(tpb.ListToolsRequest(session_id=sid))).tools
    assert {t.name: t.visibility for t in registry} == {
        "deploy": tool_pb2.TOOL_VISIBILITY_DEFERRED,
        "read_file": tool_pb2.TOOL_VISIBILITY_DIRECT,
        "secret_admin": tool_pb2.TOOL_VISIBILITY_HIDDEN,
    }

    checkpoints = (
        await api.compiles.ListCheckpoints(cpb.ListCheckpointsRequest(session_id=sid))
    ).checkpoints
    assert [(c.checkpoint_id, c.covered_digest) for c in checkpoints] == [
        (m["checkpoint_id"], m["covered_digest"])
    ]
    again = await api.compiles.ReportUsage(
        cpb.ReportUsageRequest(
            compile_id=m["usage_compile_id"], route=route, input_tokens=4321, output_tokens=210
        )
    )
    assert again.replayed and again.estimated_input_tokens == m["usage_estimate"]

    # The stored checkpoint still verifies against the stored log, sources still compile.
    view = (await api.compiles.Compile(cpb.CompileRequest(session_id=sid, route=route))).view
    assert view.checkpoint_id == m["checkpoint_id"] and not view.fallback_reasons
    assert "memory fact 2" in view.system_prompt and "Text of r-always." in view.system_prompt
    assert view.event_boundary == m["head_seq"]
    # Compiles recorded before bases were kept cannot be rebuilt exactly, and say so.
    if m["schema_version"] == 1:
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await api.compiles.Compile(cpb.CompileRequest(rebuild_compile_id=m["last_compile_id"]))
        assert error_info(exc.value).reason == "COMPILE_NOT_FOUND"
        assert "without its basis" in (exc.value.details() or "")
    # A compile recorded now can be rebuilt byte for byte.
    rebuilt = await api.compiles.Compile(cpb.CompileRequest(rebuild_compile_id=view.compile_id))
    assert rebuilt.view.SerializeToString(deterministic=True) == view.SerializeToString(
        deterministic=True
    )


async def test_an_old_data_dir_is_migrated_and_stays_writable(
    upgraded: tuple[Stubs, dict[str, Any], Path],
) -> None:
    api, m, _ = upgraded
    sid = m["session_id"]
    added = await api.sessions.AppendEvents(
        spb.AppendEventsRequest(session_id=sid, events=[user("after the upgrade")])
    )
    assert added.first_seq == m["head_seq"] + 1
    route = common_pb2.Route(**m["route"])
    view = (await api.compiles.Compile(cpb.CompileRequest(session_id=sid, route=route))).view
    assert view.messages[-1].parts[0].text == "after the upgrade"


def test_the_stored_schema_version_is_brought_forward(short_tmp: Path) -> None:
    for fixture in FIXTURES:
        copy = short_tmp / fixture.name
        shutil.copytree(fixture / "db", copy)
        kv = open_rocks(copy)
        try:
            assert stored_version(kv) == int(fixture.name.removeprefix("data-v"))
            store = KVEventStore(kv)
            assert store.opened_schema_version == int(fixture.name.removeprefix("data-v"))
            assert stored_version(kv) == SCHEMA_VERSION
        finally:
            kv.close()
