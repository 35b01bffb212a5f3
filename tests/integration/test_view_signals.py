"""What a view says about the session, checked through a real daemon: prompt-cache
busts (changed sections, their metric and the inspector's marker) and time travel."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import grpc
import pytest

from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_pb2, tool_pb2, view_pb2
from ctxcc.v1 import session_service_pb2 as spb
from ctxcc.v1 import tool_service_pb2 as tpb
from server.app import Daemon
from tests.conftest import Stubs, stubs_for
from tests.helpers import ROUTE, compile_request, error_info, user

REPO = Path(__file__).resolve().parents[2]


async def _get(url: str) -> str:
    return await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=10).read().decode())


def _prefix_changes(scrape: str) -> dict[str, float]:
    found = re.findall(r'^ctxcc_prefix_changes_total\{section="(\w+)"\} (\S+)$', scrape, re.M)
    return {section: float(value) for section, value in found}


async def _session(api: Stubs, sid: str, *texts: str) -> None:
    await api.sessions.CreateSession(
        spb.CreateSessionRequest(session=session_pb2.Session(session_id=sid, project_id="p"))
    )
    await api.sessions.AppendEvents(
        spb.AppendEventsRequest(session_id=sid, events=[user(t) for t in texts])
    )


async def test_the_environment_changing_is_no_cache_bust(daemon: Daemon) -> None:
    api = stubs_for(f"unix:{daemon.endpoints.unix}")
    try:
        await _session(api, "env", "hello")
        # A new shell changes the environment section the way the clock ticking does.
        first = (
            await api.compiles.Compile(
                compile_request("env", environment=cpb.Environment(shell="bash"))
            )
        ).view
        second = (
            await api.compiles.Compile(
                compile_request("env", environment=cpb.Environment(shell="zsh"))
            )
        ).view
        env = [s for s in second.system_sections if s.kind == view_pb2.SECTION_KIND_ENVIRONMENT]
        assert env and "zsh" in env[0].text and not env[0].stable
        assert second.prefix_digest == first.prefix_digest
        assert list(second.changed_sections) == []
        # A tool offered from now on does move the cached prefix: listed, counted, marked.
        await api.tools.RegisterTools(
            tpb.RegisterToolsRequest(
                session_id="env",
                tools=[
                    tool_pb2.ToolDefinition(
                        name="deploy", description="Deploy.", input_schema_json='{"type":"object"}'
                    )
                ],
            )
        )
        third = (await api.compiles.Compile(compile_request("env"))).view
        assert third.prefix_digest != second.prefix_digest
        assert list(third.changed_sections) == [view_pb2.SECTION_KIND_TOOLS]

        scrape = await _get(f"http://{daemon.endpoints.metrics}/metrics")
        changes = _prefix_changes(scrape)
        assert changes.get("tools") == 1.0
        assert "environment" not in changes
        assert sum(changes.values()) == 1.0

        page = await _get(f"http://{daemon.endpoints.ui}/s/env")
        assert page.count('class="bust"') == 1, "only the tool change is a cache bust"
    finally:
        await api.channel.close()


async def test_a_time_travel_compile_is_never_the_latest_nor_a_baseline(daemon: Daemon) -> None:
    api = stubs_for(f"unix:{daemon.endpoints.unix}")
    try:
        await _session(api, "tt", "first question")
        await api.compiles.Compile(compile_request("tt"))
        await api.sessions.AppendEvents(
            spb.AppendEventsRequest(
                session_id="tt", events=[user("second question " * 40), user("third " * 40)]
            )
        )
        head = (await api.compiles.Compile(compile_request("tt"))).view
        await api.compiles.ReportUsage(
            cpb.ReportUsageRequest(
                compile_id=head.compile_id, route=ROUTE, input_tokens=5000, output_tokens=10
            )
        )
        past = (await api.compiles.Compile(compile_request("tt", as_of_seq=1))).view
        assert past.event_boundary == 1 and past.compile_id != head.compile_id
        with pytest.raises(grpc.RpcError) as refused:
            await api.compiles.ReportUsage(
                cpb.ReportUsageRequest(
                    compile_id=past.compile_id, route=ROUTE, input_tokens=777, output_tokens=10
                )
            )
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND
        assert error_info(refused.value).reason == "COMPILE_NOT_FOUND"
        assert "time-travel" in (refused.value.details() or "")

        # The inspector still shows the head compile as the session's latest, and draws
        # only the two compiles the agent made.
        sessions = await _get(f"http://{daemon.endpoints.ui}/")
        shown = re.findall(r'data-field="estimate">([^<]+)<', sessions)
        assert shown == [f"{head.budget.estimated_input_tokens:,}"]
        timeline = await _get(f"http://{daemon.endpoints.ui}/s/tt")
        assert timeline.count('class="bar"') == 2

        # The next step's delta starts from the head compile's reported usage.
        await api.sessions.AppendEvents(
            spb.AppendEventsRequest(session_id="tt", events=[user("fourth")])
        )
        nxt = (await api.compiles.Compile(compile_request("tt"))).view
        assert nxt.budget.estimate_method == view_pb2.ESTIMATE_METHOD_BASELINE_DELTA
        assert nxt.budget.baseline_tokens == 5000
    finally:
        await api.channel.close()


def _ctxcc(daemon: Daemon, *args: str) -> Any:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "server",
            *args,
            "--json",
            "--target",
            f"unix:{daemon.endpoints.unix}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _layers(view: view_pb2.CompiledView) -> dict[str, int]:
    return {
        view_pb2.Layer.Name(r.layer).removeprefix("LAYER_").lower(): r.tokens for r in view.layers
    }


async def test_ctxcc_inspect_and_sessions_show_a_view_over_grpcs_default_limit(
    daemon: Daemon,
) -> None:
    """A view of ~6 MB (the daemon sends up to max_message_bytes, 64 MiB by default):
    `ctxcc inspect` and `ctxcc sessions` read it like any other, past gRPC's 4 MiB
    default for what a channel receives."""
    api = stubs_for(f"unix:{daemon.endpoints.unix}")
    try:
        await _session(api, "big", "start")
        for k in range(6):
            text = f"word{k} " * 150_000  # ~1 MB each, under the per-event limit
            await api.sessions.AppendEvents(
                spb.AppendEventsRequest(session_id="big", events=[user(text)])
            )
        view = (await api.compiles.Compile(compile_request("big"))).view
    finally:
        await api.channel.close()
    assert view.ByteSize() > 5 << 20
    shown = await asyncio.to_thread(_ctxcc, daemon, "inspect", "big")
    assert shown["shown"] == f"recorded compile {view.compile_id}"
    assert shown["estimated_input_tokens"] == view.budget.estimated_input_tokens
    listed = await asyncio.to_thread(_ctxcc, daemon, "sessions")
    assert [r["estimated_input_tokens"] for r in listed] == [view.budget.estimated_input_tokens]


async def test_ctxcc_inspect_shows_the_view_the_agent_got(daemon: Daemon) -> None:
    api = stubs_for(f"unix:{daemon.endpoints.unix}")
    # The agent sends its own system prompt: ctxcc's kernel and approval text stay out.
    own = [view_pb2.SECTION_KIND_KERNEL, view_pb2.SECTION_KIND_APPROVAL]
    try:
        await _session(api, "cli", "read the README " * 30)
        first = (await api.compiles.Compile(compile_request("cli", exclude_sections=own))).view
        await api.sessions.AppendEvents(
            spb.AppendEventsRequest(session_id="cli", events=[user("and the tests " * 50)])
        )
        latest = (await api.compiles.Compile(compile_request("cli", exclude_sections=own))).view
        await api.compiles.ReportUsage(
            cpb.ReportUsageRequest(
                compile_id=latest.compile_id, route=ROUTE, input_tokens=900, output_tokens=5
            )
        )
        # Events after the latest compile are not in what the agent got.
        await api.sessions.AppendEvents(
            spb.AppendEventsRequest(session_id="cli", events=[user("later " * 80)])
        )
    finally:
        await api.channel.close()

    for args, view in ((("cli",), latest), (("cli", "--at-seq", "1"), first)):
        shown = await asyncio.to_thread(_ctxcc, daemon, "inspect", *args)
        assert shown["event_boundary"] == view.event_boundary
        assert shown["estimated_input_tokens"] == view.budget.estimated_input_tokens
        assert shown["layers"] == _layers(view)
        assert shown["shown"] == f"recorded compile {view.compile_id}"
    # Where nothing was recorded, a dry run stands in and says so.
    dry = await asyncio.to_thread(_ctxcc, daemon, "inspect", "cli", "--at-seq", "3")
    assert dry["event_boundary"] == 3
    assert str(dry["shown"]).startswith("dry run at seq 3 (no compile recorded")
    listed = await asyncio.to_thread(_ctxcc, daemon, "sessions")
    assert [r["estimated_input_tokens"] for r in listed] == [latest.budget.estimated_input_tokens]
    # A session with events but neither a compile nor a usage report has no route: the
    # refusal says so, and how to go on.
    api = stubs_for(f"unix:{daemon.endpoints.unix}")
    try:
        await _session(api, "new", "hello")
    finally:
        await api.channel.close()
    target = f"unix:{daemon.endpoints.unix}"
    refused = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "server", "inspect", "new", "--target", target],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert refused.returncode == 1, refused.stderr
    assert refused.stderr.strip() == (
        "ctxcc inspect: session new has no compile recorded and no usage reported, so its "
        "route is unknown; pass --model"
    )
