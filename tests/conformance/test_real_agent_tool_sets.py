"""Real agents' tool sets, verbatim from their public source (the GitHub MCP server's 117
tools, the reference MCP servers' (filesystem, memory, everything, git, fetch, time),
Gemini CLI's core
tools, SWE-agent's; agent_tools.py says where each comes from),
through a real daemon as an agent uses them: registered direct, and with all but two
deferred behind `tool_search`; a short conversation calls some of them, and a
`tool_search` call (served with SearchTools, as an agent serves it) activates one. Each
compile, for an OpenAI, an Anthropic and a Gemini route, renders every format, and every
body goes through the provider SDK's own call and request types and the rules they do
not check (sdk_fuzz.check). The tools the model sees are the ones registered: names and
descriptions as registered (OpenAI's cut of a description over 1,024 characters aside)
and schemas unchanged, but for the one adaptation README documents for these sets:
OpenAI bodies give a schema without `properties` `"properties": {}`."""

from __future__ import annotations

import asyncio
import json
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from ctxcc.v1 import common_pb2, session_pb2, tool_pb2, view_pb2
from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_service_pb2 as spb
from ctxcc.v1 import tool_service_pb2 as tpb
from server.app import Daemon
from server.compiler.tool_cap import CUT_MARK
from tests.conformance import agent_tools, sdk_fuzz, ts_bodies
from tests.conformance.corpus import FORMATS
from tests.conftest import Stubs, make_config, stubs_for
from tests.helpers import assistant, tool_result, user

ROUTES = {
    "openai": common_pb2.Route(
        connection="t", protocol="openai-chat", endpoint="api", model="gpt-4o"
    ),
    "anthropic": common_pb2.Route(
        connection="t", protocol="anthropic-messages", endpoint="api", model="claude-sonnet-4"
    ),
    "gemini": common_pb2.Route(
        connection="t", protocol="gemini", endpoint="api", model="gemini-2.5-pro"
    ),
}
# The formats whose tools are shaped for a route (a view for an openai* route cuts long
# descriptions; the others send them whole).
OWN_FORMATS = {
    "openai": ("openai_chat", "openai_responses"),
    "anthropic": ("anthropic_messages",),
    "gemini": ("gemini",),
}
OPENAI_DESCRIPTION_MAX = 1_024
REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Scenario:
    """An agent's turn: the two tools it keeps direct when it defers the rest, two calls
    of them, and a search in the words a model would use for a deferred tool, which it
    then calls."""

    tools: list[dict[str, Any]]
    direct: tuple[str, str]
    calls: tuple[tuple[str, dict[str, Any]], ...]
    query: str
    wanted: str
    wanted_args: dict[str, Any]
    # More searches in a model's words, each with a tool it must find: words that meet
    # the tool's name or description only in another form ("issue", `list_issues`).
    natural: tuple[tuple[str, str], ...] = ()


SCENARIOS = {
    "github-mcp-server": Scenario(
        agent_tools.github_mcp(),
        ("get_file_contents", "search_code"),
        (
            ("get_file_contents", {"owner": "octocat", "repo": "hello", "path": "README.md"}),
            ("search_code", {"query": "repo:octocat/hello parse_args"}),
        ),
        "create a pull request",
        "create_pull_request",
        {"owner": "octocat", "repo": "hello", "title": "Fix", "head": "fix", "base": "main"},
        (
            ("list issue", "list_issues"),
            ("list pull request", "list_pull_requests"),
            ("read notification", "list_notifications"),
            ("search user", "search_users"),
        ),
    ),
    "mcp-reference-servers": Scenario(
        agent_tools.mcp_reference_servers(),
        ("mcp__filesystem__read_text_file", "mcp__filesystem__list_directory"),
        (
            ("mcp__filesystem__list_directory", {"path": "/repo"}),
            ("mcp__filesystem__read_text_file", {"path": "/repo/README.md", "head": 20}),
        ),
        "create entities in the knowledge graph",
        "mcp__memory__create_entities",
        {"entities": [{"name": "ctxcc", "entityType": "project", "observations": ["Python"]}]},
        (
            ("edit a file", "mcp__filesystem__edit_file"),
            ("add two numbers", "mcp__everything__get-sum"),
        ),
    ),
    "gemini-cli": Scenario(
        agent_tools.gemini_cli(),
        ("read_file", "run_shell_command"),
        (
            ("read_file", {"file_path": "/repo/src/main.ts"}),
            ("run_shell_command", {"command": "npm test", "description": "Run the tests"}),
        ),
        "search the web",
        "google_web_search",
        {"query": "vitest snapshot format"},
        # `replace` "is preferred for surgical edits to existing files"; `glob` "finds
        # files matching specific glob patterns".
        (("edit a file", "replace"), ("find a file by name", "glob")),
    ),
    "swe-agent": Scenario(
        agent_tools.swe_agent(),
        ("bash", "str_replace_editor"),
        (
            ("bash", {"command": "ls /repo"}),
            ("str_replace_editor", {"command": "view", "path": "/repo/setup.py"}),
        ),
        "take a screenshot",
        "screenshot_site",
        {},
    ),
}


@dataclass
class Compiled:
    view: view_pb2.CompiledView
    bodies: dict[str, dict[str, Any]]


@dataclass
class Run:
    sid: str
    registered: dict[str, dict[str, Any]]
    found: list[str] = field(default_factory=list)
    natural: dict[str, list[str]] = field(default_factory=dict)
    # Per route: before the search (deferred runs) or after the calls; after the search.
    before: dict[str, Compiled] = field(default_factory=dict)
    after: dict[str, Compiled] = field(default_factory=dict)


def _definitions(s: Scenario, deferred: bool) -> list[tool_pb2.ToolDefinition]:
    out = []
    for t in s.tools:
        hidden = deferred and t["name"] not in s.direct
        out.append(
            tool_pb2.ToolDefinition(
                name=t["name"],
                description=t["description"],
                input_schema_json=json.dumps(t["schema"]),
                visibility=tool_pb2.TOOL_VISIBILITY_DEFERRED
                if hidden
                else tool_pb2.TOOL_VISIBILITY_DIRECT,
            )
        )
    return out


async def _compile(api: Stubs, sid: str) -> dict[str, Compiled]:
    out = {}
    for route_name, route in ROUTES.items():
        req = cpb.CompileRequest(session_id=sid, route=route, render_formats=list(FORMATS.values()))
        view = (await api.compiles.Compile(req)).view
        bodies = {
            next(k for k, v in FORMATS.items() if v == r.format): json.loads(r.body_json)
            for r in view.renderings
        }
        out[route_name] = Compiled(view, bodies)
    return out


async def _run(api: Stubs, name: str, s: Scenario, deferred: bool) -> Run:
    sid = f"{name}-{'deferred' if deferred else 'direct'}"
    await api.sessions.CreateSession(
        spb.CreateSessionRequest(session=session_pb2.Session(session_id=sid))
    )
    await api.tools.RegisterTools(
        tpb.RegisterToolsRequest(session_id=sid, tools=_definitions(s, deferred))
    )
    run = Run(sid, {t["name"]: t for t in s.tools})
    if deferred:
        for query, _ in s.natural:
            hits = await api.tools.SearchTools(tpb.SearchToolsRequest(session_id=sid, query=query))
            run.natural[query] = [t.name for t in hits.tools]
    events = [user("Fix the failing test and open a pull request for it.")]
    for i, (tool, args) in enumerate(s.calls):
        events += [
            assistant("", (f"c{i}", tool, json.dumps(args))),
            tool_result(f"c{i}", f"output of {tool}", tool),
        ]
    await api.sessions.AppendEvents(spb.AppendEventsRequest(session_id=sid, events=events))
    run.before = await _compile(api, sid)
    if not deferred:
        return run
    # The model searches; the agent serves the built-in call with SearchTools.
    found = await api.tools.SearchTools(tpb.SearchToolsRequest(session_id=sid, query=s.query))
    run.found = [t.name for t in found.tools]
    await api.sessions.AppendEvents(
        spb.AppendEventsRequest(
            session_id=sid,
            events=[
                assistant("", ("ts", "tool_search", json.dumps({"query": s.query}))),
                tool_result("ts", json.dumps(run.found), "tool_search"),
                assistant("", ("cw", s.wanted, json.dumps(s.wanted_args))),
                tool_result("cw", f"output of {s.wanted}", s.wanted),
            ],
        )
    )
    run.after = await _compile(api, sid)
    return run


async def _all(tmp: Path) -> dict[tuple[str, bool], Run]:
    daemon = Daemon(make_config(tmp / "data"))
    await daemon.start()
    api = stubs_for(f"unix:{daemon.endpoints.unix}")
    try:
        return {
            (name, deferred): await _run(api, name, s, deferred)
            for name, s in SCENARIOS.items()
            for deferred in (False, True)
        }
    finally:
        await api.channel.close()
        await daemon.stop()


@pytest.fixture(scope="module")
def runs() -> Iterator[dict[tuple[str, bool], Run]]:
    with tempfile.TemporaryDirectory(prefix="ctxcc-tools-", dir="/tmp") as d:
        yield asyncio.run(_all(Path(d)))


def _compiles(run: Run) -> Iterator[tuple[str, str, Compiled]]:
    for stage, compiled in (("before", run.before), ("after", run.after)):
        for route_name, c in compiled.items():
            yield f"{run.sid} {stage} {route_name}", route_name, c


def _offered(fmt: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The body's tools as (name, description, schema) dicts."""
    if fmt == "gemini":
        decls = [d for t in body.get("tools", []) for d in t.get("functionDeclarations", [])]
        return [
            {
                "name": d["name"],
                "description": d["description"],
                "schema": d["parametersJsonSchema"],
            }
            for d in decls
        ]
    out = []
    for t in body.get("tools", []):
        f = t.get("function", t)
        schema = f.get("parameters", f.get("input_schema"))
        out.append({"name": f["name"], "description": f["description"], "schema": schema})
    return out


def test_the_real_tool_sets_are_what_their_sources_say() -> None:
    """The fixtures hold the sets whole: their sizes, and the shapes that make them worth
    testing (descriptions over OpenAI's limit, schemas without `properties`, zod's
    `$schema`, unions below the top level)."""
    gh, mcp, gem, swe = (
        SCENARIOS[n].tools
        for n in ("github-mcp-server", "mcp-reference-servers", "gemini-cli", "swe-agent")
    )
    assert (len(gh), len(mcp), len(gem), len(swe)) == (117, 51, 16, 31)
    # zod's schemas (TypeScript servers) name their draft; pydantic's (the git and fetch
    # servers; the time server writes its own) give every property a `title` and an
    # optional one `anyOf` with `null`.
    for t in mcp:
        server = t["name"].split("__")[1]
        if server in ("filesystem", "memory", "everything"):
            assert t["schema"]["$schema"].endswith("draft-07/schema#"), t["name"]
        elif server in ("git", "fetch"):
            assert "$schema" not in t["schema"] and "title" in t["schema"], t["name"]
    assert any('{"type": "null"}' in json.dumps(t["schema"]) for t in mcp)
    assert max(len(t["description"]) for t in gh) > OPENAI_DESCRIPTION_MAX
    assert any("oneOf" in json.dumps(t["schema"]) for t in gh)
    assert [t["name"] for t in gem if "$schema" in t["schema"]] == ["activate_skill"]
    assert sum("properties" not in t["schema"] for t in swe) == 10


def test_every_body_goes_through_the_providers_sdks_and_rules(
    runs: dict[tuple[str, bool], Run],
) -> None:
    failures = {}
    for run in runs.values():
        for where, _, c in _compiles(run):
            problems = sdk_fuzz.check(sdk_fuzz.Outcome(run.sid, c.bodies, []))
            anthropic = c.bodies["anthropic_messages"]
            marks = [b for b in anthropic.get("tools", []) if "cache_control" in b]
            marks += [b for b in anthropic.get("system", []) if "cache_control" in b]
            marks += [
                b for m in anthropic["messages"] for b in m["content"] if "cache_control" in b
            ]
            if len(marks) > 4:
                problems.append(f"anthropic: {len(marks)} cache breakpoints, the API takes 4")
            if problems:
                failures[where] = problems
    assert not failures, json.dumps(failures, indent=1)[:6000]


def test_the_model_sees_the_tools_as_registered(runs: dict[tuple[str, bool], Run]) -> None:
    for (name, deferred), run in runs.items():
        s = SCENARIOS[name]
        for where, route_name, c in _compiles(run):
            expected = set(run.registered)
            if deferred:
                expected = set(s.direct) | {"tool_search"}
                if c is run.after.get(route_name):
                    expected |= set(run.found)  # a search activates all it found
            for fmt, body in c.bodies.items():
                offered = _offered(fmt, body)
                assert {t["name"] for t in offered} == expected, (where, fmt)
                for t in offered:
                    if t["name"] == "tool_search":
                        continue
                    mine = run.registered[t["name"]]
                    _same_tool(f"{where} {fmt} {t['name']}", route_name, fmt, t, mine)


def _same_tool(
    where: str, route_name: str, fmt: str, sent: dict[str, Any], mine: dict[str, Any]
) -> None:
    text = mine["description"]
    if route_name == "openai" and len(text) > OPENAI_DESCRIPTION_MAX:
        # Cut to fit for OpenAI (README, "Tool caps"), its beginning kept.
        assert len(sent["description"]) <= OPENAI_DESCRIPTION_MAX, where
        assert sent["description"].endswith(CUT_MARK), where
        assert text.startswith(sent["description"].removesuffix(CUT_MARK)), where
    else:
        assert sent["description"] == text, where
    schema = mine["schema"]
    if fmt in ("openai_chat", "openai_responses") and "properties" not in schema:
        # OpenAI refuses an object schema without `properties` (rendering 9).
        schema = {**schema, "properties": {}}
    assert sent["schema"] == schema, where


def test_a_natural_search_activates_the_deferred_tool(runs: dict[tuple[str, bool], Run]) -> None:
    for name, s in SCENARIOS.items():
        run = runs[(name, True)]
        assert s.wanted in run.found, (name, s.query, run.found)
        for route_name, c in run.after.items():
            origin = {t.definition.name: t.origin for t in c.view.tools}
            assert origin[s.wanted] == view_pb2.TOOL_ORIGIN_ACTIVATED, (name, route_name)
            assert c.view.prefix_digest != run.before[route_name].view.prefix_digest
            for fmt in OWN_FORMATS[route_name]:
                calls = json.dumps(c.bodies[fmt])
                assert f'"{s.wanted}"' in calls, (name, fmt)


def test_long_descriptions_are_cut_for_openai_only_and_said(
    runs: dict[tuple[str, bool], Run],
) -> None:
    run = runs[("github-mcp-server", False)]
    long = sorted(n for n, t in run.registered.items() if len(t["description"]) > 1_024)
    assert long == ["pull_request_review_write"]
    notes = run.before["openai"].view.notes
    assert any("(pull_request_review_write) are cut to 1024" in n for n in notes), notes
    for route_name in ("anthropic", "gemini"):
        assert not any("are cut to" in n for n in run.before[route_name].view.notes)


def test_a_search_in_a_models_words_finds_the_tool_in_any_form(
    runs: dict[tuple[str, bool], Run],
) -> None:
    """A word and its plural or third-person form are one word (TOOL_CAPPING 4): before,
    "edit a file" did not find Gemini CLI's `replace` (its description says "edits" and
    "files") nor "list issue" GitHub's `list_issues`, among tools of their own server."""
    missed = {
        (name, query): runs[(name, True)].natural[query]
        for name, s in SCENARIOS.items()
        for query, wanted in s.natural
        if wanted not in runs[(name, True)].natural[query]
    }
    assert not missed, missed


def test_every_body_type_checks_with_the_typescript_sdks(
    runs: dict[tuple[str, bool], Run],
) -> None:
    """The bodies each route's own formats get, typed with the TypeScript SDKs' request
    types under `tsc --strict` (as test_provider_conformance does for its corpus; a file
    of its own, in a directory of its own, so the two checks never read each other's)."""
    ts_dir = REPO / "client" / "typescript"
    tsc = ts_dir / "node_modules" / ".bin" / "tsc"
    assert tsc.exists(), "client/typescript dev dependencies missing: run `make clients`"
    lines = ts_bodies.imports()
    n = 0
    for run in runs.values():
        for where, route_name, c in _compiles(run):
            for fmt in OWN_FORMATS[route_name]:
                lines.append(f"// {where} {fmt}")
                lines += ts_bodies.declarations(n, fmt, c.bodies[fmt])
                n += 1
    out = ts_dir / "conformance" / "real-tools" / "bodies.generated.ts"
    out.parent.mkdir(exist_ok=True)
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    done = subprocess.run(
        [
            str(tsc),
            "--noEmit",
            "--strict",
            "--skipLibCheck",
            "--target",
            "ES2022",
            "--module",
            "NodeNext",
            "--moduleResolution",
            "NodeNext",
            str(out),
        ],
        cwd=ts_dir,
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[:6000]
    # Per set, three rounds of the three routes (direct; deferred, before and after the
    # search), each round four bodies (Chat and Responses for OpenAI, one each other).
    assert n == 3 * 4 * len(SCENARIOS)


async def test_real_tool_sets_together_over_openais_limit(short_tmp: Path) -> None:
    """Gemini CLI's core tools, the GitHub MCP server's and the reference servers' (184,
    the MCP ones under Claude Code's `mcp__<server>__` names), all direct, on an OpenAI
    route: the body carries 128 (OpenAI's limit) and passes the SDKs, the view's note
    says how many went to tool_search, and each left out is found by a search in a
    model's words, activated and offered at the next step."""
    github = [dict(t, name=f"mcp__github__{t['name']}") for t in agent_tools.github_mcp()]
    registry = agent_tools.gemini_cli() + github + agent_tools.mcp_reference_servers()
    assert len(registry) == 184
    route = common_pb2.Route(
        connection="t", protocol="openai-responses", endpoint="api", model="gpt-4o"
    )
    daemon = Daemon(make_config(short_tmp / "data"))
    await daemon.start()
    api = stubs_for(f"unix:{daemon.endpoints.unix}")
    try:
        await api.sessions.CreateSession(
            spb.CreateSessionRequest(session=session_pb2.Session(session_id="all"))
        )
        tools = [
            tool_pb2.ToolDefinition(
                name=t["name"],
                description=t["description"],
                input_schema_json=json.dumps(t["schema"]),
            )
            for t in registry
        ]
        await api.tools.RegisterTools(tpb.RegisterToolsRequest(session_id="all", tools=tools))
        await api.sessions.AppendEvents(
            spb.AppendEventsRequest(session_id="all", events=[user("Tidy the README.")])
        )

        async def compiled() -> Compiled:
            req = cpb.CompileRequest(
                session_id="all", route=route, render_formats=list(FORMATS.values())
            )
            view = (await api.compiles.Compile(req)).view
            bodies = {
                next(k for k, v in FORMATS.items() if v == r.format): json.loads(r.body_json)
                for r in view.renderings
            }
            problems = sdk_fuzz.check(sdk_fuzz.Outcome("all", bodies, []))
            assert not problems, problems
            assert len(bodies["openai_responses"]["tools"]) == 128
            return Compiled(view, bodies)

        before = await compiled()
        offered = {t.definition.name for t in before.view.tools}
        left_out = {t["name"] for t in registry} - offered
        assert len(left_out) == 184 - 127  # tool_search takes the 128th slot
        assert any(f"{len(left_out)} of the 184 direct" in n for n in before.view.notes)
        # Name order: Gemini CLI's own tools that sort after `mcp__` are among those left
        # out (README, "Tool caps").
        own = {"read_file", "replace", "run_shell_command", "write_file"}
        assert own <= left_out
        searches = {
            "edit a file": "replace",
            "create entities in the knowledge graph": "mcp__memory__create_entities",
            "update a pull request title": "mcp__github__update_pull_request_title",
        }
        events = []
        for i, (query, wanted) in enumerate(searches.items()):
            assert wanted in left_out, wanted
            found = await api.tools.SearchTools(
                tpb.SearchToolsRequest(session_id="all", query=query)
            )
            names = [t.name for t in found.tools]
            assert wanted in names, (query, names)
            events += [
                assistant("", (f"s{i}", "tool_search", json.dumps({"query": query}))),
                tool_result(f"s{i}", json.dumps(names), "tool_search"),
            ]
        await api.sessions.AppendEvents(spb.AppendEventsRequest(session_id="all", events=events))
        after = await compiled()
        origin = {t.definition.name: t.origin for t in after.view.tools}
        for wanted in searches.values():
            assert origin[wanted] == view_pb2.TOOL_ORIGIN_ACTIVATED, wanted
    finally:
        await api.channel.close()
        await daemon.stop()
