"""Write a data directory with the daemon of an earlier commit, and what it answered.

    python scripts/make_commit_datadir.py <commit> tests/fixtures/data-<commit>

Extracts the daemon's code at <commit> from this repository's history (`git archive` of
server/, storage/ and ctxcc/), runs it as a subprocess on a fresh data directory, and
drives it through the public gRPC API with this checkout's protos, sending only what that
commit's protos define: two sessions in a project, sources of every scope, a tool registry
with a deferred tool, an uploaded PNG named by a user message, a conversation with tool
calls and a result over the blob threshold, unary compiles, CompileStream steps (with
usage reports in the step where the commit has them), unary usage reports, a model-written
checkpoint, a built-in compaction on demand and one made by a compile over budget, a tool
search. Then it asks the same daemon for every compile again as of its event boundary
(and by rebuild_compile_id where the commit has it), and stops it with SIGTERM
(`--kill` stops it with SIGKILL while a second session appends, after they are sent).

The copy of the database (without RocksDB's text logs) goes to <out>/db, the views the
old daemon answered to <out>/views/*.pb.gz (serialized deterministically) and everything
else it answered to <out>/manifest.json, so tests/integration/test_commit_datadirs.py can
hold today's daemon to them.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import zlib
from pathlib import Path
from typing import Any

import grpc

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ctxcc.v1 import (  # noqa: E402
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
    view_pb2,
)

SID = "upg-session"
OTHER = "upg-other"
WIDE = "upg-wide"  # every kind of event, two routes, provider renderings
GONE = "upg-gone"  # deleted
PAIRING = "upg-pairing"  # a screenshot logged while its call ran, imported tool messages
PROJECT = "upg-project"
ROUTE = common_pb2.Route(
    connection="default", protocol="anthropic-messages", endpoint="api", model="claude-sonnet-4"
)
GPT = common_pb2.Route(connection="default", protocol="openai-chat", endpoint="api", model="gpt-4o")
GEMINI_3 = common_pb2.Route(
    connection="default", protocol="gemini", endpoint="api", model="gemini-3-pro-preview"
)
# A window small enough that the second turn is over budget (a built-in compaction).
SMALL = compile_service_pb2.ModelLimits(context_window=2500, max_output_tokens=500)
BIG_RESULT = "".join(f"line {i}: {'q' * 50}\n" for i in range(300))  # ~18 KB, a blob


def _png(side: int, shade: int) -> bytes:
    """A real grey PNG, `side` x `side`."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    raw = b"".join(b"\x00" + bytes([shade]) * side for _ in range(side))
    head = struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", head)
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


def _daemon_code(commit: str, dest: Path) -> None:
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", commit, "server", "storage", "ctxcc"],
        capture_output=True,
        check=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")


# The versions of what a compile record keeps, as the old daemon's code has them (each
# absent from the commits before it): tests tell what its recorded views already hold.
_VERSIONS = """
import importlib, json
versions = {}
for module, name in (
    ("projection", "PROJECTION"), ("render", "RENDERING"), ("tool_cap", "TOOL_CAPPING")
):
    try:
        code = importlib.import_module("server.compiler." + module)
        versions[name.lower()] = getattr(code, name)
    except (ImportError, AttributeError):
        pass
print(json.dumps(versions))
"""


def _code_versions(code: Path) -> dict[str, int]:
    shown = subprocess.run(
        [sys.executable, "-c", _VERSIONS], cwd=code, capture_output=True, text=True, check=True
    )
    return dict(json.loads(shown.stdout))


def _proto_text(commit: str) -> str:
    names = ["compile_service", "checkpoint", "tool_service", "event", "view"]
    return "\n".join(
        subprocess.run(
            ["git", "-C", str(REPO), "show", f"{commit}:proto/ctxcc/v1/{n}.proto"],
            capture_output=True,
            check=True,
            text=True,
        ).stdout
        for n in names
    )


class OldDaemon:
    def __init__(self, code: Path, data: Path) -> None:
        self.log_path = data.parent / "daemon.log"
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env["PYTHONPATH"] = str(code)
        env["PYTHONUNBUFFERED"] = "1"
        args = [sys.executable, "-m", "server", "serve", "--data-dir", str(data)]
        args += ["--listen", "127.0.0.1:0", "--metrics-listen", "none"]
        if "ui_listen" in (code / "server" / "config.py").read_text():
            args += ["--ui-listen", "none"]
        before = self._ready_lines()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                args, cwd=code, env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL
            )
        deadline = time.monotonic() + 120
        while True:
            lines = self._ready_lines()
            if len(lines) > len(before):
                self.target = "unix:" + json.loads(lines[-1].split("serving ", 1)[1])["unix"]
                return
            if self.proc.poll() is not None or time.monotonic() > deadline:
                log = self.log_path.read_text(errors="replace")
                raise SystemExit(f"the daemon of this commit did not start:\n{log}")
            time.sleep(0.05)

    def _ready_lines(self) -> list[str]:
        if not self.log_path.exists():
            return []
        text = self.log_path.read_text(errors="replace")
        whole = text[: text.rfind("\n") + 1]  # whole lines only
        return [ln for ln in whole.splitlines() if "serving {" in ln]

    def stop(self, kill: bool = False) -> int:
        self.proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        return self.proc.wait(60)


def _b(msg: Any) -> bytes:
    data: bytes = msg.SerializeToString(deterministic=True)
    return data


class Driver:
    def __init__(self, target: str, protos: str, out: Path) -> None:
        self.ch = grpc.insecure_channel(target)
        self.sessions: Any = session_service_pb2_grpc.SessionServiceStub(self.ch)
        self.compiles: Any = compile_service_pb2_grpc.CompileServiceStub(self.ch)
        self.artifacts: Any = artifact_service_pb2_grpc.ArtifactServiceStub(self.ch)
        self.sources: Any = source_service_pb2_grpc.SourceServiceStub(self.ch)
        self.tools: Any = tool_service_pb2_grpc.ToolServiceStub(self.ch)
        self.protos = protos
        self.views_dir = out / "views"
        self.views_dir.mkdir(parents=True)
        self.compiled: list[dict[str, Any]] = []  # one entry per view saved
        self.usage: list[dict[str, Any]] = []
        self.features = {
            "stream_usage": "ReportUsageRequest usage = 7" in protos,
            "rebuild": "rebuild_compile_id" in protos,
            "builtin_checkpoint": "CHECKPOINT_KIND_BUILTIN" in protos,
            "search_tools": "rpc SearchTools" in protos,
        }

    def has(self, name: str) -> bool:
        return self.features[name]

    def save(self, name: str, view: Any, request: Any, how: str) -> None:
        if how != "rebuild":  # a rebuild's bytes are the recorded view's (its sha256 says)
            (self.views_dir / f"{name}.pb.gz").write_bytes(gzip.compress(_b(view), mtime=0))
        self.compiled.append(
            {
                "name": name,
                "how": how,
                "compile_id": view.compile_id,
                "event_boundary": view.event_boundary,
                "checkpoint_id": view.checkpoint_id,
                "request": _b(request).hex(),
                "view_sha256": hashlib.sha256(_b(view)).hexdigest(),
            }
        )

    def request(self, sid: str, **kw: Any) -> Any:
        req = compile_service_pb2.CompileRequest(
            session_id=sid,
            route=ROUTE,
            image_mode=compile_service_pb2.IMAGE_MODE_REFERENCE,
            environment=compile_service_pb2.Environment(platform="linux", shell="bash"),  # noqa: S604
            **kw,
        )
        return req

    def compile(self, name: str, req: Any) -> Any:
        view = self.compiles.Compile(req).view
        self.save(name, view, req, "unary")
        return view

    def report(self, view: Any, input_tokens: int, route: Any = ROUTE) -> None:
        resp = self.compiles.ReportUsage(
            compile_service_pb2.ReportUsageRequest(
                compile_id=view.compile_id,
                route=route,
                input_tokens=input_tokens,
                output_tokens=120,
                cached_input_tokens=input_tokens // 2,
            )
        )
        self.usage.append(
            {
                "compile_id": view.compile_id,
                "route": _b(route).hex(),
                "input_tokens": input_tokens,
                "output_tokens": 120,
                "cached_input_tokens": input_tokens // 2,
                "estimated_input_tokens": resp.estimated_input_tokens,
                "error_tokens": resp.error_tokens,
            }
        )

    def stream(self, name: str, steps: list[tuple[list[Any], Any, int]]) -> Any:
        """Steps of (events, compile request, input tokens of the previous view); each
        step reports usage of the previous step's view where the commit takes it."""
        last: list[Any] = []
        out: list[Any] = []

        def requests() -> Any:
            for n, (events, req, tokens) in enumerate(steps):
                step = compile_service_pb2.StepRequest(
                    step_id=f"{name}-{n}", events=events, request_id=f"{name}-req-{n}"
                )
                step.compile.CopyFrom(req)
                if tokens and last and self.has("stream_usage"):
                    step.usage.CopyFrom(
                        compile_service_pb2.ReportUsageRequest(
                            compile_id=last[-1].compile_id,
                            route=ROUTE,
                            input_tokens=tokens,
                            output_tokens=80,
                        )
                    )
                yield compile_service_pb2.CompileStreamRequest(step=step)
                while len(out) <= n:  # one step at a time, as an agent
                    time.sleep(0.01)

        chunks: list[bytes] = []
        for resp in self.compiles.CompileStream(requests()):
            kind = resp.WhichOneof("response")
            if kind == "error":
                raise SystemExit(f"stream step {resp.step_id} failed: {resp.error}")
            if kind == "chunk":
                chunks.append(resp.chunk.data)
                if resp.chunk.index + 1 < resp.chunk.count:
                    continue
                view = view_pb2.CompiledView.FromString(b"".join(chunks))
                chunks.clear()
            else:
                view = resp.view
            n = len(out)
            if resp.HasField("usage") and n:
                self.usage.append(
                    {
                        "compile_id": out[-1].compile_id,
                        "route": _b(ROUTE).hex(),
                        "input_tokens": steps[n][2],
                        "output_tokens": 80,
                        "cached_input_tokens": 0,
                        "estimated_input_tokens": resp.usage.estimated_input_tokens,
                        "error_tokens": resp.usage.error_tokens,
                    }
                )
            self.save(f"{name}-{n}", view, steps[n][1], "stream")
            last.append(view)
            out.append(view)
        return out


def _sources(d: Driver) -> None:
    scopes = [
        (common_pb2.SCOPE_GLOBAL, ""),
        (common_pb2.SCOPE_PROJECT, PROJECT),
        (common_pb2.SCOPE_SESSION, SID),
    ]
    for n, (scope, scope_id) in enumerate(scopes):
        d.sources.PutMemory(
            source_service_pb2.PutMemoryRequest(
                memory=source_pb2.MemoryEntry(
                    memory_id=f"m{n}", scope=scope, scope_id=scope_id, text=f"memory fact {n}"
                )
            )
        )
        d.sources.PutSkill(
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
        d.sources.PutRule(
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


SHELL_DESCRIPTION = "Run a command in the workspace's shell.\n" + "".join(
    f"- Rule {i}: quote paths with spaces, prefer the dedicated tools, and keep going.\n"
    for i in range(20)
)


def _tools(d: Driver) -> None:
    d.tools.RegisterTools(
        tool_service_pb2.RegisterToolsRequest(
            session_id=SID,
            tools=[
                tool_pb2.ToolDefinition(
                    name="read_file",
                    description="Read a file",
                    input_schema_json='{"type": "object", "properties": {"path": {}}}',
                    visibility=tool_pb2.TOOL_VISIBILITY_DIRECT,
                ),
                tool_pb2.ToolDefinition(
                    name="shell",
                    # As long as real agents' shell tools (over OpenAI's 1,024 characters).
                    description=SHELL_DESCRIPTION,
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
            ],
        )
    )


def _ev(**kw: Any) -> Any:
    return event_pb2.Event(**kw)


def _user(text: str, *refs: Any) -> Any:
    ev = _ev()
    ev.user_message.parts.add(text=text)
    for ref in refs:
        ev.user_message.parts.add(attachment=ref)
    return ev


def _assistant(text: str, *calls: tuple[str, str, str], reasoning: str = "") -> Any:
    ev = _ev()
    if text:
        ev.assistant_message.parts.add(text=text)
    for call_id, name, args in calls:
        ev.assistant_message.tool_calls.add(call_id=call_id, name=name, arguments_json=args)
    ev.assistant_message.reasoning = reasoning
    ev.assistant_message.route.CopyFrom(ROUTE)
    return ev


def _result(call_id: str, name: str, text: str) -> Any:
    ev = _ev()
    ev.tool_result.call_id, ev.tool_result.tool_name, ev.tool_result.text = call_id, name, text
    return ev


def _drive(d: Driver) -> dict[str, Any]:
    for sid, labels in ((SID, {"team": "core"}), (OTHER, {})):
        d.sessions.CreateSession(
            session_service_pb2.CreateSessionRequest(
                session=session_pb2.Session(
                    session_id=sid, project_id=PROJECT, workspace_id="ws-1", labels=labels
                )
            )
        )
    png = _png(16, 120)
    header = artifact_service_pb2.ArtifactHeader(
        session_id=SID,
        mime_type="image/png",
        size_bytes=len(png),
        sha256=hashlib.sha256(png).hexdigest(),
        width=16,
        height=16,
    )
    ref = d.artifacts.UploadArtifact(
        iter(
            [
                artifact_service_pb2.UploadArtifactRequest(header=header),
                artifact_service_pb2.UploadArtifactRequest(data=png),
            ]
        )
    ).artifact
    _sources(d)
    _tools(d)

    # Turn 1, appended at once and compiled unary.
    turn1 = [
        _user("Look at src/app.py and this screenshot, then list the tree.", ref),
        _assistant(
            "Reading.",
            ("c1", "read_file", '{"path": "src/app.py"}'),
            ("c2", "shell", '{"cmd": "find . -type f"}'),
            reasoning="Two reads first.",
        ),
        _result("c1", "read_file", "print('hello')\n"),
        _result("c2", "shell", BIG_RESULT),
        _assistant("The app prints hello; the tree has 300 files."),
    ]
    d.sessions.AppendEvents(
        session_service_pb2.AppendEventsRequest(session_id=SID, events=turn1, request_id="t1")
    )
    v1 = d.compile("unary-1", d.request(SID))
    d.report(v1, v1.budget.estimated_input_tokens + 37)
    d.compile("unary-1-again", d.request(SID))  # a repeat: nothing changed
    # On OpenAI too: the shell tool's description is over its 1,024 characters.
    on_gpt = d.request(SID)
    on_gpt.route.CopyFrom(GPT)
    d.compile("unary-1-gpt", on_gpt)

    # Turn 2 by stream steps, each reporting the previous step's usage.
    req = d.request(SID)
    d.stream(
        "stream-a",
        [
            ([_user("Now run the tests.")], req, 0),
            ([_assistant("", ("c3", "shell", '{"cmd": "pytest -q"}'))], req, 2400),
            ([_result("c3", "shell", "12 passed in 0.4s\n")], req, 2450),
            ([_assistant("All 12 tests pass.")], req, 2500),
        ],
    )
    # A model-written checkpoint of turn 1, then compiles that use it.
    checkpoint = d.compiles.CreateCheckpoint(
        compile_service_pb2.CreateCheckpointRequest(
            checkpoint=checkpoint_pb2.Checkpoint(
                session_id=SID,
                covers_through_seq=5,
                summary="The user asked about src/app.py (it prints hello) and the tree.",
                source_route=ROUTE,
                portable=True,
                kind=checkpoint_pb2.CHECKPOINT_KIND_MODEL_SUMMARY,
            ),
            request_id="ck-model",
        )
    ).checkpoint
    v2 = d.compile("unary-after-checkpoint", d.request(SID))
    d.report(v2, v2.budget.estimated_input_tokens - 21)
    if d.has("search_tools"):
        d.tools.SearchTools(tool_service_pb2.SearchToolsRequest(session_id=SID, query="release"))
    # Turn 3 in a small window: over budget, a built-in compaction of the big result.
    small = d.request(SID, limits=SMALL)
    d.stream(
        "stream-small",
        [
            ([_user("Deploy it.")], small, 0),
            ([_assistant("", ("c4", "deploy", '{"env": "staging"}'))], small, 3100),
            ([_result("c4", "deploy", "deployed build 42\n")], small, 3150),
        ],
    )
    # The other session: its own turn, a built-in checkpoint on demand, a stream.
    d.sessions.AppendEvents(
        session_service_pb2.AppendEventsRequest(
            session_id=OTHER,
            events=[
                _user("Summarise the log."),
                _assistant("", ("o1", "shell", '{"cmd": "cat log"}')),
                _result("o1", "shell", BIG_RESULT.replace("q", "w")),
                _assistant("It is a list of lines."),
                _user("Thanks."),
            ],
        )
    )
    # Over budget in a small window with no model summary: a built-in compaction.
    o1 = d.compile("other-1", d.request(OTHER, limits=SMALL))
    d.report(o1, o1.budget.estimated_input_tokens + 5)
    d.sessions.AppendEvents(
        session_service_pb2.AppendEventsRequest(
            session_id=OTHER,
            events=[
                _assistant("", ("o2", "shell", '{"cmd": "cat log2"}')),
                _result("o2", "shell", BIG_RESULT.replace("q", "v")),
                _assistant("Another list."),
                _user("And now?"),
            ],
        )
    )
    builtin = None
    if d.has("builtin_checkpoint"):
        builtin = d.compiles.CreateCheckpoint(
            compile_service_pb2.CreateCheckpointRequest(
                checkpoint=checkpoint_pb2.Checkpoint(
                    session_id=OTHER,
                    covers_through_seq=8,
                    kind=checkpoint_pb2.CHECKPOINT_KIND_BUILTIN,
                ),
                request_id="ck-builtin",
            )
        ).checkpoint
    d.compile("other-2", d.request(OTHER))
    return {
        "artifact_id": ref.artifact_id,
        "artifact_sha256": ref.sha256,
        "model_checkpoint_id": checkpoint.checkpoint_id,
        "builtin_checkpoint_id": builtin.checkpoint_id if builtin else "",
    }


def _wide(d: Driver) -> None:
    """A session with every kind of event, compiled on two routes with renderings, and
    a session made and deleted."""
    for sid in (WIDE, GONE):
        d.sessions.CreateSession(
            session_service_pb2.CreateSessionRequest(
                session=session_pb2.Session(session_id=sid, project_id="wide-project")
            )
        )
    d.sessions.AppendEvents(
        session_service_pb2.AppendEventsRequest(session_id=GONE, events=[_user("bye")])
    )
    d.sessions.DeleteSession(session_service_pb2.DeleteSessionRequest(session_id=GONE))
    ref = _upload_png(d, WIDE)
    events = [_ev(), _user("Start: what is on this page?")]
    events[0].turn_started.turn_id = "t-1"
    browser = _ev()
    browser.browser_element.url = "https://example.test/page"
    browser.browser_element.selector = "#main > button"
    browser.browser_element.tag = "button"
    browser.browser_element.text = "Save"
    browser.browser_element.attributes["class"] = "primary"
    events.append(browser)
    attach = _ev()
    attach.attachment.CopyFrom(ref)
    events.append(attach)
    drawn = _assistant("A diagram of it:", reasoning="Draw it.")
    drawn.assistant_message.parts.add(attachment=ref)
    events.append(drawn)
    imported = _ev()
    imported.imported_message.origin_session_id = SID
    imported.imported_message.origin_seq = 2
    imported.imported_message.role = event_pb2.MESSAGE_ROLE_ASSISTANT
    imported.imported_message.parts.add(text="Earlier we agreed on tabs.")
    events.append(imported)
    events.append(
        _assistant("", ("w1", "edit", '{"path": "a.py", "edits": [{"old": "├──", "new": "x"}]}'))
    )
    events.append(_result("w1", "edit", "edited"))
    cancelled = _ev()
    cancelled.turn_cancelled.reason = "user pressed stop"
    cancelled.turn_cancelled.keep_reasoning = True
    events.append(cancelled)
    events.append(_user("Carry on."))
    events.append(_assistant("Done.", reasoning="Finished."))
    done = _ev()
    done.turn_completed.SetInParent()
    events.append(done)
    d.sessions.AppendEvents(
        session_service_pb2.AppendEventsRequest(session_id=WIDE, events=events, request_id="w")
    )
    formats = [
        view_pb2.RENDER_FORMAT_OPENAI_CHAT,
        view_pb2.RENDER_FORMAT_OPENAI_RESPONSES,
        view_pb2.RENDER_FORMAT_ANTHROPIC_MESSAGES,
        view_pb2.RENDER_FORMAT_GEMINI,
    ]
    for n, route in enumerate((ROUTE, GPT, ROUTE)):
        req = d.request(WIDE, render_formats=formats)
        req.route.CopyFrom(route)
        view = d.compile(f"wide-{n}", req)
        d.report(view, view.budget.estimated_input_tokens + 3 * n, route)
    # A tool loop going on, on Gemini 3, with a step it did not sign (made by another
    # model): from rendering version 4 its Gemini body carries a stand-in signature, and
    # compiles recorded before are rebuilt without it.
    d.sessions.AppendEvents(
        session_service_pb2.AppendEventsRequest(
            session_id=WIDE,
            events=[
                _user("Now b.py."),
                _assistant("", ("w2", "edit", '{"path": "b.py", "edits": []}')),
                _result("w2", "edit", "edited"),
            ],
            request_id="w-loop",
        )
    )
    req = d.request(WIDE, render_formats=formats)
    req.route.CopyFrom(GEMINI_3)
    d.compile("wide-gemini-3", req)
    _pairing(d, formats)


def _upload_png(d: Driver, sid: str) -> Any:
    png = _png(8, 30)
    header = artifact_service_pb2.ArtifactHeader(
        session_id=sid,
        mime_type="image/png",
        size_bytes=len(png),
        sha256=hashlib.sha256(png).hexdigest(),
        width=8,
        height=8,
    )
    return d.artifacts.UploadArtifact(
        iter(
            [
                artifact_service_pb2.UploadArtifactRequest(header=header),
                artifact_service_pb2.UploadArtifactRequest(data=png),
            ]
        )
    ).artifact


def _pairing(d: Driver, formats: list[Any]) -> None:
    """A screenshot logged while its call ran, then two tool messages imported in a row:
    from projection 8 the attachment waits for the call's result and each imported one
    keeps a stand-in call of its own; compiles recorded before are rebuilt as they paired."""
    d.sessions.CreateSession(
        session_service_pb2.CreateSessionRequest(
            session=session_pb2.Session(session_id=PAIRING, project_id="wide-project")
        )
    )
    ref = _upload_png(d, PAIRING)
    imported_results = []
    for seq, text in ((5, "cart: 2 items"), (7, "total: 41.90 EUR")):
        result = _ev()
        result.imported_message.origin_session_id = SID
        result.imported_message.origin_seq = seq
        result.imported_message.role = event_pb2.MESSAGE_ROLE_TOOL
        result.imported_message.parts.add(text=text)
        imported_results.append(result)
    shot = _ev()
    shot.attachment.CopyFrom(ref)
    d.sessions.AppendEvents(
        session_service_pb2.AppendEventsRequest(
            session_id=PAIRING,
            events=[
                _user("What is in the cart?"),
                _assistant("", ("w3", "screenshot", '{"url": "https://example.test/cart"}')),
                shot,
                _result("w3", "screenshot", "saved"),
                *imported_results,
            ],
            request_id="w-pairing",
        )
    )
    d.compile("pairing", d.request(PAIRING, render_formats=formats))


def _time_travel(d: Driver) -> None:
    """Each compile asked again of the same daemon: as of its event boundary, and by id."""
    for entry in list(d.compiled):
        if entry["how"] == "as_of" or entry["how"] == "rebuild":
            continue
        req = compile_service_pb2.CompileRequest.FromString(bytes.fromhex(entry["request"]))
        req.as_of_seq = entry["event_boundary"]
        view = d.compiles.Compile(req).view
        d.save(entry["name"] + "@as_of", view, req, "as_of")
        if d.has("rebuild"):
            req = compile_service_pb2.CompileRequest(
                rebuild_compile_id=entry["compile_id"],
                image_mode=compile_service_pb2.IMAGE_MODE_REFERENCE,
                render_formats=req.render_formats,
            )
            view = d.compiles.Compile(req).view
            d.save(entry["name"] + "@rebuild", view, req, "rebuild")


def _read_back(d: Driver) -> dict[str, Any]:
    out: dict[str, Any] = {"sessions": {}}
    for sid in (SID, OTHER, WIDE, PAIRING):
        session = d.sessions.GetSession(session_service_pb2.GetSessionRequest(session_id=sid))
        events = d.sessions.ListEvents(
            session_service_pb2.ListEventsRequest(session_id=sid, page_size=1000)
        ).events
        checkpoints = d.compiles.ListCheckpoints(
            compile_service_pb2.ListCheckpointsRequest(session_id=sid)
        ).checkpoints
        out["sessions"][sid] = {
            "head_seq": session.session.head_seq,
            "session": _b(session.session).hex(),
            "events": [_b(e).hex() for e in events],
            "checkpoints": [_b(c).hex() for c in checkpoints],
        }
    return out


def _kill_mid_write(code: Path, data: Path) -> dict[str, Any]:
    """Restart the old daemon and SIGKILL it while a thread appends to the other session:
    what was acknowledged is recorded, what was in flight may or may not be kept."""
    daemon = OldDaemon(code, data)
    ch = grpc.insecure_channel(daemon.target)
    sessions: Any = session_service_pb2_grpc.SessionServiceStub(ch)
    acked: list[int] = []
    errors: list[grpc.RpcError] = []
    stop = threading.Event()

    def appender() -> None:
        n = 0
        while not stop.is_set():
            try:
                resp = sessions.AppendEvents(
                    session_service_pb2.AppendEventsRequest(
                        session_id=OTHER,
                        events=[_user(f"burst {n} " + "x" * 100)],
                        request_id=f"burst-{n}",
                    ),
                    timeout=10,
                )
            except grpc.RpcError as exc:
                errors.append(exc)
                return
            acked.append(resp.last_seq)
            n += 1

    thread = threading.Thread(target=appender)
    thread.start()
    while len(acked) < 40 and thread.is_alive():
        time.sleep(0.01)
    daemon.stop(kill=True)
    if len(acked) < 40:
        raise SystemExit(f"appends to the restarted daemon failed: {errors}")
    stop.set()
    thread.join()
    ch.close()
    return {"killed_after_acked_seq": max(acked)}


def main(commit: str, out: Path, kill: bool) -> None:
    with tempfile.TemporaryDirectory(prefix="ctxcc-upg-", dir="/tmp") as tmp:
        code, data = Path(tmp) / "code", Path(tmp) / "data"
        _daemon_code(commit, code)
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        daemon = OldDaemon(code, data)
        d = Driver(daemon.target, _proto_text(commit), out)
        try:
            ids = _drive(d)
            _wide(d)
            _time_travel(d)
            back = _read_back(d)
        except BaseException:
            print((Path(tmp) / "daemon.log").read_text(errors="replace")[-5000:])
            raise
        finally:
            d.ch.close()
            rc = daemon.stop()
        if rc != 0:
            raise SystemExit(f"the old daemon exited with {rc}")
        killed = _kill_mid_write(code, data) if kill else {}
        shutil.copytree(
            data / "db",
            out / "db",
            ignore=shutil.ignore_patterns("LOG", "LOG.old.*", "LOCK*", "RESERVE*"),
        )
        full = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", commit],
            capture_output=True,
            text=True,
            check=True,
        )
        manifest = {
            "commit": full.stdout.strip(),
            "features": d.features,
            "versions": _code_versions(code),
            "route": {
                "connection": ROUTE.connection,
                "protocol": ROUTE.protocol,
                "endpoint": ROUTE.endpoint,
                "model": ROUTE.model,
            },
            "compiles": d.compiled,
            "usage": d.usage,
            **ids,
            **back,
            **killed,
        }
        (out / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("commit", help="a commit of this repository's history")
    parser.add_argument("out", type=Path, help="directory to (re)create")
    parser.add_argument("--kill", action="store_true", help="end with a SIGKILL mid-append")
    args = parser.parse_args()
    main(args.commit, args.out, args.kill)
