"""Rules checked through a real daemon: budget parameters from settings (R-BUD-5), the
session's current route, invisible Unicode in instruction files (R-SYS-11) and the note
for a tool result whose call is not in view."""

from __future__ import annotations

import unicodedata
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ctxcc.v1 import common_pb2, event_pb2, session_pb2, tool_pb2, view_pb2
from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_service_pb2 as spb
from ctxcc.v1 import tool_service_pb2 as tpb
from server.app import Daemon
from server.compiler.text import sanitize
from tests.conftest import Stubs, make_config, stubs_for
from tests.helpers import ROUTE, assistant, compile_request, tool_result, user


@pytest.fixture
async def configured(short_tmp: Path) -> AsyncIterator[tuple[Stubs, Path]]:
    work = short_tmp / "work"
    proj = work / "proj"
    proj.mkdir(parents=True)
    cfg = make_config(
        short_tmp / "data",
        workspace_roots=str(work),
        first_reserve_max="4096",
        reserve_max="2000",
    )
    d = Daemon(cfg)
    await d.start()
    s = stubs_for(f"unix:{d.endpoints.unix}")
    try:
        yield s, proj
    finally:
        await s.channel.close()
        await d.stop()


async def _session(api: Stubs, sid: str, proj: Path) -> None:
    await api.sessions.CreateSession(
        spb.CreateSessionRequest(
            session=session_pb2.Session(
                session_id=sid, project_root=str(proj), working_directory=str(proj)
            )
        )
    )


async def test_budget_parameters_come_from_the_daemon_settings(
    configured: tuple[Stubs, Path],
) -> None:
    api, proj = configured
    await _session(api, "b", proj)
    await api.sessions.AppendEvents(spb.AppendEventsRequest(session_id="b", events=[user("hi")]))
    view = (await api.compiles.Compile(compile_request("b"))).view
    assert view.budget.context_window == 200_000
    assert view.budget.output_reserve == 4096  # not min(50K, 16K)

    used = await api.compiles.ReportUsage(
        cpb.ReportUsageRequest(
            compile_id=view.compile_id, route=ROUTE, input_tokens=900, output_tokens=5000
        )
    )
    assert used.next_output_reserve == 2000  # 2 x 5000 clamped to the configured 2000


async def test_compile_sets_the_current_route_and_dry_runs_do_not(
    configured: tuple[Stubs, Path],
) -> None:
    api, proj = configured
    await _session(api, "r", proj)
    await api.sessions.AppendEvents(spb.AppendEventsRequest(session_id="r", events=[user("hi")]))
    other = common_pb2.Route(connection="c2", protocol="openai-chat", endpoint="e", model="gpt-4o")
    req = compile_request("r", dry_run=True)
    req.route.CopyFrom(other)
    await api.compiles.Compile(req)
    got = (await api.sessions.GetSession(spb.GetSessionRequest(session_id="r"))).session
    assert not got.HasField("current_route")
    await api.compiles.Compile(compile_request("r"))
    got = (await api.sessions.GetSession(spb.GetSessionRequest(session_id="r"))).session
    assert got.current_route == ROUTE
    req = compile_request("r")
    req.route.CopyFrom(other)
    await api.compiles.Compile(req)
    got = (await api.sessions.GetSession(spb.GetSessionRequest(session_id="r"))).session
    assert got.current_route == other


async def test_invisible_format_characters_in_instruction_files_are_shown(
    configured: tuple[Stubs, Path],
) -> None:
    api, proj = configured
    (proj / "AGENTS.md").write_text(
        "\ufeffAlways run tests.\n"
        "access = 'user' # \u202e \u2066if admin\u2069 \u2066 begin admins only\n"
        "de\u200bploy only on fri\u200ddays\U000e0041\n",
        encoding="utf-8",
    )
    await _session(api, "u", proj)
    await api.sessions.AppendEvents(spb.AppendEventsRequest(session_id="u", events=[user("hi")]))
    view = (await api.compiles.Compile(compile_request("u"))).view
    prompt = view.system_prompt
    assert all(unicodedata.category(ch) != "Cf" for ch in prompt)
    assert "[U+202E]" in prompt and "de[U+200B]ploy" in prompt and "[U+E0041]" in prompt
    assert "Always run tests." in prompt
    assert any("7 invisible format character(s)" in n and "AGENTS.md" in n for n in view.notes)


def test_every_format_character_is_made_visible() -> None:
    for code in range(0x110000):
        ch = chr(code)
        if unicodedata.category(ch) == "Cf" and code != 0xFEFF:
            assert sanitize(f"a{ch}b") == f"a[U+{code:04X}]b", hex(code)
    assert sanitize("\ufeffx\ufeff") == "x[U+FEFF]"  # only a leading BOM just goes


async def test_a_result_without_its_call_is_repaired_with_a_note(
    configured: tuple[Stubs, Path],
) -> None:
    api, proj = configured
    await _session(api, "o", proj)
    await api.sessions.AppendEvents(
        spb.AppendEventsRequest(
            session_id="o", events=[user("go"), tool_result("lost-call", "output", "shell")]
        )
    )
    view = (await api.compiles.Compile(compile_request("o"))).view
    restored = [m for m in view.messages if m.synthetic and m.tool_calls]
    assert [c.call_id for m in restored for c in m.tool_calls] == ["lost-call"]
    assert any("lost-call" in n and "restored" in n for n in view.notes)


def _marker(kind: str, keep: bool = False) -> event_pb2.Event:
    ev = event_pb2.Event()
    if kind == "started":
        ev.turn_started.turn_id = "t2"
    elif kind == "completed":
        ev.turn_completed.SetInParent()
    else:
        ev.turn_cancelled.keep_reasoning = keep
    return ev


async def test_turn_started_starts_a_turn_for_activations_working_set_and_reasoning(
    configured: tuple[Stubs, Path],
) -> None:
    api, proj = configured
    await _session(api, "t", proj)
    await api.tools.RegisterTools(
        tpb.RegisterToolsRequest(
            session_id="t",
            tools=[
                tool_pb2.ToolDefinition(
                    name="deploy",
                    description="Deploy the service",
                    visibility=tool_pb2.TOOL_VISIBILITY_DEFERRED,
                )
            ],
        )
    )
    await api.sessions.AppendEvents(
        spb.AppendEventsRequest(
            session_id="t", events=[user("ship it"), assistant("looking", reasoning="first")]
        )
    )
    await api.tools.SearchTools(tpb.SearchToolsRequest(session_id="t", query="deploy"))

    def names(v: view_pb2.CompiledView) -> list[str]:
        return [t.definition.name for t in v.tools]

    view = (await api.compiles.Compile(compile_request("t"))).view
    assert "deploy" in names(view)
    await api.sessions.AppendEvents(
        spb.AppendEventsRequest(
            session_id="t",
            events=[
                _marker("completed"),
                _marker("started"),
                assistant("checking again", reasoning="second"),
                _marker("cancelled", keep=True),
            ],
        )
    )
    view = (await api.compiles.Compile(compile_request("t"))).view
    assert "deploy" not in names(view)  # the activation belonged to the previous turn
    texts = {"\n".join(p.text for p in m.parts): m.layer for m in view.messages}
    assert texts["ship it"] == view_pb2.LAYER_HISTORY
    # Only the cancelled turn's reasoning is kept, and that turn is the working set.
    second = "[reasoning kept from a cancelled turn]\nsecond\nchecking again"
    assert texts[second] == view_pb2.LAYER_WORKING_SET
    assert "looking" in texts and "first" not in view.SerializeToString().decode(errors="replace")
