"""What a view says about the session, checked through a real daemon: prompt-cache
busts (changed sections, their metric and the inspector's marker) and time travel."""

from __future__ import annotations

import asyncio
import re
import urllib.request

from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_pb2, tool_pb2, view_pb2
from ctxcc.v1 import session_service_pb2 as spb
from ctxcc.v1 import tool_service_pb2 as tpb
from server.app import Daemon
from tests.conftest import Stubs, stubs_for
from tests.helpers import compile_request, user


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
