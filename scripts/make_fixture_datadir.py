"""Write a fixture data directory with the daemon of this checkout.

    python scripts/make_fixture_datadir.py tests/fixtures/data-vN

Runs a real daemon on a fresh data directory and drives one representative session
through the public API: events of every kind (a large tool result becomes a blob), an
uploaded artifact referenced by an attachment, memory, rules and skills of every scope,
a tool registry with a deferred tool, a model-summary checkpoint, compiles and a usage
report. The database is then copied without RocksDB's text logs (they hold host paths)
and `manifest.json` records what was sent and the ids the daemon assigned, so the upgrade
test can check a later daemon reads it all back. Each schema version gets its own
directory, written by the code of that version and never regenerated afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ctxcc.v1 import (
    artifact_service_pb2,
    artifact_service_pb2_grpc,
    checkpoint_pb2,
    common_pb2,
    compile_service_pb2,
    compile_service_pb2_grpc,
    event_pb2,
    session_pb2,
    session_service_pb2,
    session_service_pb2_grpc,
    source_pb2,
    source_service_pb2,
    source_service_pb2_grpc,
    tool_pb2,
    tool_service_pb2,
    tool_service_pb2_grpc,
)
from server.app import Daemon
from server.config import resolve
from storage.schema import SCHEMA_VERSION

SID = "fixture-session"
PROJECT = "fixture-project"
ROUTE = common_pb2.Route(
    connection="default", protocol="anthropic-messages", endpoint="api", model="claude-sonnet-4"
)
IMAGE = bytes(range(256)) * 64  # 16 KiB; content is opaque to the store
BIG_RESULT = "".join(f"row {i}: {'z' * 40}\n" for i in range(800))  # over the blob threshold


def _events() -> list[event_pb2.Event]:
    """Events of every kind; attachments are filled in after the upload."""
    evs: list[event_pb2.Event] = []

    def add(event_id: str) -> event_pb2.Event:
        ev = event_pb2.Event(event_id=event_id)
        evs.append(ev)
        return ev

    add("e-turn").turn_started.turn_id = "turn-1"
    u = add("e-user")
    u.user_message.parts.add(text="Please look at src/app.py and the screenshot.")
    a = add("e-assistant")
    a.assistant_message.parts.add(text="Reading the file first.")
    a.assistant_message.tool_calls.add(
        call_id="call-1", name="read_file", arguments_json='{"path": "src/app.py"}'
    )
    a.assistant_message.reasoning = "The user named a file; read it."
    a.assistant_message.route.CopyFrom(ROUTE)
    r = add("e-result")
    r.tool_result.call_id = "call-1"
    r.tool_result.tool_name = "read_file"
    r.tool_result.text = "print('hello')\n"
    c = add("e-call")
    c.tool_call.call_id = "call-2"
    c.tool_call.name = "shell"
    c.tool_call.arguments_json = '{"cmd": "ls -R"}'
    big = add("e-big")
    big.tool_result.call_id = "call-2"
    big.tool_result.tool_name = "shell"
    big.tool_result.text = BIG_RESULT
    add("e-attach")  # attachment, filled in later
    b = add("e-browser")
    b.browser_element.url = "https://example.test/page"
    b.browser_element.selector = "#main > button"
    b.browser_element.tag = "button"
    b.browser_element.text = "Save"
    b.browser_element.attributes["class"] = "primary"
    i = add("e-import")
    i.imported_message.origin_session_id = "other-session"
    i.imported_message.origin_seq = 4
    i.imported_message.role = event_pb2.MESSAGE_ROLE_ASSISTANT
    i.imported_message.parts.add(text="Earlier we agreed on tabs.")
    add("e-cancel").turn_cancelled.CopyFrom(
        event_pb2.TurnCancelled(reason="user pressed stop", keep_reasoning=True)
    )
    u2 = add("e-user-2")
    u2.user_message.parts.add(text="Now run the tests.")
    a2 = add("e-assistant-2")
    a2.assistant_message.parts.add(text="All 12 tests pass.")
    add("e-done").turn_completed.SetInParent()
    return evs


async def _drive(target: str) -> dict[str, Any]:
    ch = grpc.aio.insecure_channel(target)
    sessions = session_service_pb2_grpc.SessionServiceStub(ch)
    compiles = compile_service_pb2_grpc.CompileServiceStub(ch)
    artifacts = artifact_service_pb2_grpc.ArtifactServiceStub(ch)
    sources = source_service_pb2_grpc.SourceServiceStub(ch)
    tools = tool_service_pb2_grpc.ToolServiceStub(ch)
    await sessions.CreateSession(
        session_service_pb2.CreateSessionRequest(
            session=session_pb2.Session(
                session_id=SID, project_id=PROJECT, workspace_id="ws-1", labels={"team": "core"}
            )
        )
    )
    header = artifact_service_pb2.ArtifactHeader(
        session_id=SID,
        mime_type="image/png",
        size_bytes=len(IMAGE),
        sha256=hashlib.sha256(IMAGE).hexdigest(),
        width=64,
        height=64,
    )

    async def upload() -> AsyncIterator[artifact_service_pb2.UploadArtifactRequest]:
        yield artifact_service_pb2.UploadArtifactRequest(header=header)
        yield artifact_service_pb2.UploadArtifactRequest(data=IMAGE)

    ref = (await artifacts.UploadArtifact(upload())).artifact
    events = _events()
    events[6].attachment.CopyFrom(ref)
    events[1].user_message.parts.add(attachment=ref)
    scopes = [
        (common_pb2.SCOPE_GLOBAL, ""),
        (common_pb2.SCOPE_PROJECT, PROJECT),
        (common_pb2.SCOPE_SESSION, SID),
    ]
    for n, (scope, scope_id) in enumerate(scopes):
        await sources.PutMemory(
            source_service_pb2.PutMemoryRequest(
                memory=source_pb2.MemoryEntry(
                    memory_id=f"m{n}", scope=scope, scope_id=scope_id, text=f"memory fact {n}"
                )
            )
        )
        await sources.PutSkill(
            source_service_pb2.PutSkillRequest(
                skill=source_pb2.Skill(
                    skill_id=f"s{n}",
                    scope=scope,
                    scope_id=scope_id,
                    name=f"skill-{n}",
                    description=f"does thing {n}",
                    load_hint=f"skills/{n}/SKILL.md",
                    enabled=True,
                )
            )
        )
    rules = [
        ("r-always", source_pb2.RULE_ACTIVATION_ALWAYS, []),
        ("r-demand", source_pb2.RULE_ACTIVATION_ON_DEMAND, []),
        ("r-matched", source_pb2.RULE_ACTIVATION_MATCHED, ["src/**/*.py"]),
    ]
    for (rule_id, activation, globs), (scope, scope_id) in zip(rules, scopes, strict=True):
        await sources.PutRule(
            source_service_pb2.PutRuleRequest(
                rule=source_pb2.Rule(
                    rule_id=rule_id,
                    scope=scope,
                    scope_id=scope_id,
                    name=rule_id,
                    description=f"{rule_id} description",
                    text=f"Text of {rule_id}.",
                    activation=activation,
                    path_globs=globs,
                )
            )
        )
    await tools.RegisterTools(
        tool_service_pb2.RegisterToolsRequest(
            session_id=SID,
            tools=[
                tool_pb2.ToolDefinition(
                    name="read_file",
                    description="Read a file",
                    input_schema_json='{"type": "object"}',
                    visibility=tool_pb2.TOOL_VISIBILITY_DIRECT,
                ),
                tool_pb2.ToolDefinition(
                    name="deploy",
                    description="Deploy the service",
                    input_schema_json='{"type": "object"}',
                    visibility=tool_pb2.TOOL_VISIBILITY_DEFERRED,
                    search_keywords=["release"],
                ),
                tool_pb2.ToolDefinition(
                    name="secret_admin",
                    description="Never shown",
                    visibility=tool_pb2.TOOL_VISIBILITY_HIDDEN,
                ),
            ],
        )
    )
    appended = await sessions.AppendEvents(
        session_service_pb2.AppendEventsRequest(session_id=SID, events=events, request_id="req-1")
    )
    first = await compiles.Compile(
        compile_service_pb2.CompileRequest(session_id=SID, route=ROUTE, as_of_seq=6)
    )
    usage = await compiles.ReportUsage(
        compile_service_pb2.ReportUsageRequest(
            compile_id=first.view.compile_id, route=ROUTE, input_tokens=4321, output_tokens=210
        )
    )
    checkpoint = (
        await compiles.CreateCheckpoint(
            compile_service_pb2.CreateCheckpointRequest(
                checkpoint=checkpoint_pb2.Checkpoint(
                    session_id=SID,
                    covers_through_seq=9,
                    summary="The user asked about src/app.py; it prints hello.",
                    source_route=ROUTE,
                    portable=True,
                    kind=checkpoint_pb2.CHECKPOINT_KIND_MODEL_SUMMARY,
                ),
                request_id="ck-1",
            )
        )
    ).checkpoint
    last = await compiles.Compile(compile_service_pb2.CompileRequest(session_id=SID, route=ROUTE))
    await ch.close()
    return {
        "schema_version": SCHEMA_VERSION,
        "session_id": SID,
        "project_id": PROJECT,
        "head_seq": appended.last_seq,
        "event_ids": list(appended.event_ids),
        "artifact_id": ref.artifact_id,
        "artifact_sha256": ref.sha256,
        "big_result_sha256": hashlib.sha256(BIG_RESULT.encode()).hexdigest(),
        "checkpoint_id": checkpoint.checkpoint_id,
        "covered_digest": checkpoint.covered_digest,
        "usage_compile_id": first.view.compile_id,
        "usage_estimate": usage.estimated_input_tokens,
        "last_compile_id": last.view.compile_id,
        "last_checkpoint_in_view": last.view.checkpoint_id,
        "route": {
            "connection": ROUTE.connection,
            "protocol": ROUTE.protocol,
            "endpoint": ROUTE.endpoint,
            "model": ROUTE.model,
        },
    }


async def _write(data: Path) -> dict[str, Any]:
    cfg = resolve({"data_dir": str(data), "listen": "none", "metrics_listen": "none"}, env={})
    daemon = Daemon(cfg)
    endpoints = await daemon.start()
    try:
        return await _drive(f"unix:{endpoints.unix}")
    finally:
        await daemon.stop()


def main(out: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="ctxcc-fx-", dir="/tmp") as tmp:
        data = Path(tmp) / "data"
        manifest = asyncio.run(_write(data))
        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(
            data / "db", out / "db", ignore=shutil.ignore_patterns("LOG", "LOG.old.*", "LOCK*")
        )
        (out / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="directory to (re)create")
    main(parser.parse_args().out)
