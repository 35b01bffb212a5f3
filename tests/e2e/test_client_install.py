"""The interop suite: each client is installed the way its README says, in a temp project
outside the checkout (the README's install block is run as written, with `/path/to/ctxcc`
pointing here and package managers kept offline), and the same scripted agent
(tests/e2e/interop/agent.{py,ts,go}) runs against one daemon over the Unix socket and over
TCP. Its result must be the one the script implies, in every language, and the daemon's own
record of the session must agree. Each agent also logs an Anthropic response with thinking
blocks with its client's helper: the daemon stores an event that says what the response
said (its blocks, text and calls), and the Anthropic body leads the turn with the blocks;
and a Gemini response with parallel calls, the first signed: the stored event holds its
text and calls and the signature under the signed call's id, and the Gemini body puts the
signature on that call only.
The Go and TypeScript agents then run a session on delta views (`DELTAS {json}`)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import compile_service_pb2_grpc, session_service_pb2_grpc
from ctxcc.v1 import session_service_pb2 as spb
from tests.e2e.proc import REPO, DaemonProcess
from tests.helpers import leading_reasoning

INTEROP = REPO / "tests" / "e2e" / "interop"
# An Anthropic response with thinking, redacted_thinking, text and two tool_use blocks.
ANTHROPIC_RESPONSE = REPO / "tests" / "fixtures" / "client-thinking" / "anthropic-response.json"
# A Gemini response with a thought summary, text and three parallel calls: the first signed
# and without id, the second with an id, the third with neither.
GEMINI_RESPONSE = REPO / "tests" / "fixtures" / "client-thinking" / "gemini-response.json"
GEMINI_PARTS = json.loads(GEMINI_RESPONSE.read_text(encoding="utf-8"))["candidates"][0]["content"][
    "parts"
]
GEMINI_CALLS = [p for p in GEMINI_PARTS if "functionCall" in p]
# A Responses response: an unsealed reasoning item, a sealed one, a message, a call, a web
# search call, a reasoning item and another call.
OPENAI_RESPONSE = REPO / "tests" / "fixtures" / "client-thinking" / "openai-response.json"
OPENAI_OUTPUT = json.loads(OPENAI_RESPONSE.read_text(encoding="utf-8"))["output"]
OPENAI_SEALED = [
    {k: i[k] for k in ("type", "id", "summary", "encrypted_content")}
    for i in leading_reasoning(OPENAI_OUTPUT)
]
PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c489"
    "0000000d49444154789c63f8cfc0f01f00050001ff89993d1d0000000049454e44ae426082"
)
# What the script implies: 40 tool-output lines read from offset 10; one direct and one
# deferred tool plus the daemon's built-ins (`tool_search` for deferred tools, `load_rule`
# for the on-demand rule); four events (user, tool call, tool result, user with an image).
EXPECTED = {
    "artifact": [hashlib.sha256(PNG).hexdigest(), True, "image/png"],
    "checkpoint": [3, 1],
    "deleted_events": 1,
    "events": ["user_message", "assistant_message", "tool_result", "user_message"],
    "head_seq": 4,
    # A user message holding text UTF-8 cannot carry is refused by the client before it
    # is sent (TypeScript turned a lone surrogate into U+FFFD), and nothing is appended.
    "lone_surrogate": [True, True],
    "listed_session": True,
    "listed_tools": ["deploy_service", "read_file"],
    "missing_reason": "SESSION_NOT_FOUND",
    "registered": 2,
    "render_formats": [1, 2, 3, 4],
    "rule_text": "Prefer small functions.",
    "search": ["deploy_service"],
    "slice": "line 11\nline 12\nline 13\n",
    "sources": [1, 1, 1],
    "sources_after_delete": [0, 0, 0],
    "step3_append": [4, 4],
    "time_travel": [1, 1],
    "usage_estimate_matches": True,
    # The usage of view 2 rode on step 3 (recorded, not a replay, its error 10) and step 3's
    # view was estimated from it; a report for an unknown compile failed its step with
    # usage_refused and appended nothing; the next step carried no report; the report
    # queued last went by the unary ReportUsage at close (a second one is a replay).
    "carried_usage": [True, 10, False],
    "step3_baseline": True,
    "refused": ["COMPILE_NOT_FOUND", True],
    "after_refusal": [4, False],
    "flushed_at_close": True,
    "view1_tools": ["load_rule", "read_file", "tool_search"],
    "view3_boundary": 4,
    "watch_first": ["event", 4],
    # The Anthropic body's assistant turn: the response's thinking blocks, unchanged, first.
    "thinking": [["thinking", "redacted_thinking", "text", "tool_use", "tool_use"], True],
    # The Gemini body's functionCall parts: each call with the response's signature, or none.
    "gemini": [[p["functionCall"]["name"], p.get("thoughtSignature")] for p in GEMINI_CALLS],
    # The Responses body's input: the reasoning item right before the message, then the
    # message and the calls, as logged.
    "reasoning": [
        [
            "message",
            "reasoning",
            "message",
            "function_call",
            "function_call",
            "function_call_output",
            "function_call_output",
        ],
        True,
    ],
}
# The delta session: 10 steps (a tool registered at step 3, a memory changed at step 5): the
# first view whole, then deltas, but the one at step 6 damaged by the agent's hook, so it is
# fetched whole; every view equals by digest the same compile rebuilt whole. The last three
# steps also on a stream with deltas off: whole views only, more bytes received.
EXPECTED_DELTAS = {
    "steps": 10,
    "identical": 10,
    "deltas": 8,
    "whole": 2,
    "mismatches": 1,
    "plain_identical": 3,
    "plain_deltas": 0,
    "plain_whole": 3,
    "delta_bytes_smaller": True,
    # Then a session over its window: seven steps, each view recommending a compaction that
    # the deltas keep from their base except once, after a checkpoint moved its range.
    "compaction_kept": [True, True, False, True, True, True],
    "compaction_identical": 7,
    "compaction_over": 7,
    "compaction_mismatches": 0,
}


def install_block(readme: Path) -> str:
    """The README's install commands: the first ```sh block under '## Install'."""
    text = readme.read_text()
    section = text.split("\n## Install", 1)[1]
    m = re.search(r"```sh\n(.*?)```", section, re.S)
    assert m, f"{readme} has no ```sh block under ## Install"
    return m.group(1).replace("/path/to/ctxcc", str(REPO))


def offline_env(bin_dir: Path) -> dict[str, str]:
    """No registry at test time: everything comes from what `make test` already fetched."""
    return {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "GOPROXY": "off",
        "GOFLAGS": "-mod=mod",
        "npm_config_offline": "true",
        "npm_config_audit": "false",
        "npm_config_fund": "false",
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(REPO / ".tools" / "wheels"),
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }


def sh(script: str, cwd: Path, env: dict[str, str]) -> None:
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, f"$ {script}\n{done.stdout}\n{done.stderr}"


@pytest.fixture(scope="module")
def projects() -> Iterator[dict[str, list[str]]]:
    """Installs each client in its own temp project and builds the scripted agent there;
    yields the command that runs each agent."""
    wheels = REPO / ".tools" / "wheels"
    assert (wheels / ".stamp").exists(), "run `make .tools/wheels/.stamp` (part of make test)"
    root = Path(tempfile.mkdtemp(prefix="ctxcc-install-"))
    bin_dir = root / "bin"
    bin_dir.mkdir()
    # `python3` in the README is this interpreter, for which .tools/wheels was fetched.
    (bin_dir / "python3").symlink_to(getattr(sys, "_base_executable", sys.executable))
    env = offline_env(bin_dir)
    cmds: dict[str, list[str]] = {}
    try:
        py = root / "python"
        py.mkdir()
        sh(install_block(REPO / "client/python/README.md"), py, env)
        shutil.copy(INTEROP / "agent.py", py / "agent.py")
        cmds["python"] = [str(py / ".venv/bin/python"), str(py / "agent.py")]

        ts = root / "typescript"
        ts.mkdir()
        sh(install_block(REPO / "client/typescript/README.md"), ts, env)
        shutil.copy(INTEROP / "agent.ts", ts / "agent.ts")
        tsc = REPO / "client/typescript/node_modules/typescript/bin/tsc"
        types = REPO / "client/typescript/node_modules/@types"
        sh(
            f"node {tsc} --strict --target ES2022 --module NodeNext --moduleResolution NodeNext"
            f" --skipLibCheck --typeRoots {types} --types node --outDir out agent.ts",
            ts,
            env,
        )
        cmds["typescript"] = ["node", str(ts / "out/agent.js")]

        go = root / "go"
        go.mkdir()
        sh(install_block(REPO / "client/go/README.md"), go, env)
        shutil.copy(INTEROP / "agent.go", go / "main.go")
        sh("go build -o agent .", go, env)
        cmds["go"] = [str(go / "agent")]
        yield cmds
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def daemon() -> Iterator[DaemonProcess]:
    d = DaemonProcess(Path(tempfile.mkdtemp(prefix="ctxcc-io-", dir="/tmp")) / "data")
    d.start()
    d.wait_ready()
    yield d
    d.terminate()
    shutil.rmtree(d.data_dir.parent, ignore_errors=True)


def test_installs_leave_the_checkout_alone(projects: dict[str, list[str]]) -> None:
    # The installed Python package carries its generated code: it imports from the temp
    # venv, not from this checkout.
    where = subprocess.run(
        [
            projects["python"][0],
            "-c",
            "import ctxcc.v1.view_pb2 as m, ctxcc_client as c;print(m.__file__); print(c.__file__)",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd="/",
    ).stdout.split()
    assert all(not p.startswith(str(REPO)) for p in where), where


@pytest.mark.parametrize("transport", ["unix", "tcp"])
@pytest.mark.parametrize("client", ["go", "python", "typescript"])
def test_scripted_agent(
    projects: dict[str, list[str]], daemon: DaemonProcess, client: str, transport: str
) -> None:
    target = (
        f"unix://{daemon.endpoints['unix']}"
        if transport == "unix"
        else str(daemon.endpoints["tcp"])
    )
    done = subprocess.run(
        projects[client],
        env={
            **os.environ,
            "CTXCC_TARGET": target,
            "CTXCC_ANTHROPIC_RESPONSE": str(ANTHROPIC_RESPONSE),
            "CTXCC_GEMINI_RESPONSE": str(GEMINI_RESPONSE),
            "CTXCC_OPENAI_RESPONSE": str(OPENAI_RESPONSE),
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd="/",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line, done.stdout + done.stderr
    result = json.loads(line.removeprefix("RESULT "))
    sid = result.pop("session_id")
    thinking_sid = result.pop("thinking_session_id")
    gemini_sid = result.pop("gemini_session_id")
    openai_sid = result.pop("openai_session_id")
    assert result == EXPECTED
    deltas = next((ln for ln in done.stdout.splitlines() if ln.startswith("DELTAS ")), None)
    if client in ("go", "typescript"):
        assert deltas, done.stdout + done.stderr
    if deltas:
        assert json.loads(deltas.removeprefix("DELTAS ")) == EXPECTED_DELTAS
    # The daemon's own record agrees with what the agent saw.
    with grpc.insecure_channel(daemon.target) as ch:
        sessions = session_service_pb2_grpc.SessionServiceStub(ch)
        events = sessions.ListEvents(spb.ListEventsRequest(session_id=sid), timeout=10).events
        assert [e.seq for e in events] == [1, 2, 3, 4]
        assert events[1].assistant_message.tool_calls[0].name == "read_file"
        image = events[3].user_message.parts[1].attachment
        assert image.sha256 == hashlib.sha256(PNG).hexdigest() and image.size_bytes == len(PNG)
        compiles = compile_service_pb2_grpc.CompileServiceStub(ch)
        checkpoints = compiles.ListCheckpoints(
            cpb.ListCheckpointsRequest(session_id=sid), timeout=10
        ).checkpoints
        assert [c.covers_through_seq for c in checkpoints] == [3]
        # The response as the agent's helper logged it: the same blocks, text and calls
        # (the JSON in it parsed: each client writes JSON its own way).
        logged = (
            sessions.ListEvents(spb.ListEventsRequest(session_id=thinking_sid), timeout=10)
            .events[1]
            .assistant_message
        )
        content = json.loads(ANTHROPIC_RESPONSE.read_text(encoding="utf-8"))["content"]
        assert logged.native_state.kind == "anthropic.thinking"
        assert json.loads(logged.native_state.data) == [
            b for b in content if b["type"] in {"thinking", "redacted_thinking"}
        ]
        assert [p.text for p in logged.parts] == [
            b["text"] for b in content if b["type"] == "text" and b["text"]
        ]
        assert [(c.call_id, c.name, json.loads(c.arguments_json)) for c in logged.tool_calls] == [
            (b["id"], b["name"], b["input"]) for b in content if b["type"] == "tool_use"
        ]
        # The Gemini response as the helper logged it: its text but the thought summary, its
        # calls (the response's id where it gave one, else a new one), and the signature
        # under the signed call's id.
        logged = (
            sessions.ListEvents(spb.ListEventsRequest(session_id=gemini_sid), timeout=10)
            .events[1]
            .assistant_message
        )
        assert [p.text for p in logged.parts] == [
            p["text"] for p in GEMINI_PARTS if "text" in p and not p.get("thought")
        ]
        calls = [p["functionCall"] for p in GEMINI_CALLS]
        assert [(c.name, json.loads(c.arguments_json)) for c in logged.tool_calls] == [
            (c["name"], c["args"]) for c in calls
        ]
        ids = [c.call_id for c in logged.tool_calls]
        assert all(ids) and len(set(ids)) == len(ids)
        assert all(c.get("id", i) == i for c, i in zip(calls, ids, strict=True))
        assert logged.native_state.kind == "gemini.thought_signatures"
        assert json.loads(logged.native_state.data) == {
            i: p["thoughtSignature"]
            for p, i in zip(GEMINI_CALLS, ids, strict=True)
            if "thoughtSignature" in p
        }
        # The Responses response as the helper logged it: the reasoning item right before
        # the message alone (no raw reasoning text), the calls with their arguments as the
        # model wrote them.
        logged = (
            sessions.ListEvents(spb.ListEventsRequest(session_id=openai_sid), timeout=10)
            .events[1]
            .assistant_message
        )
        assert logged.native_state.kind == "openai.reasoning"
        assert json.loads(logged.native_state.data) == OPENAI_SEALED
        assert [(c.call_id, c.name, c.arguments_json) for c in logged.tool_calls] == [
            (i["call_id"], i["name"], i["arguments"])
            for i in OPENAI_OUTPUT
            if i["type"] == "function_call"
        ]


# The names each README's example leaves to the reader: what the provider answered (its
# usage, its reply, and its summary when the view asks for a compaction).
PY_PLACEHOLDERS = {"used_in", "used_out", "reply", "summary"}
GO_PLACEHOLDERS = "var in, out uint32\nvar reply, summary string\n"
TS_PLACEHOLDERS = (
    "declare const inputTokens: number, outputTokens: number, reply: string, summary: string;\n"
)


def use_block(readme: Path, lang: str) -> str:
    """The README's example: the first ```LANG block under '## Use'."""
    section = readme.read_text().split("\n## Use", 1)[1]
    m = re.search(rf"```{lang}\n(.*?)```", section, re.S)
    assert m, f"{readme} has no ```{lang} block under ## Use"
    return m.group(1)


def run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GOPROXY": "off", "GOFLAGS": "-mod=mod"}
    return subprocess.run(
        cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False
    )


@pytest.mark.parametrize("client", ["go", "python", "typescript"])
def test_readme_use_example_compiles(projects: dict[str, list[str]], client: str) -> None:
    """A user copies the README's '## Use' example into the project the README's install
    made: it compiles there as written, given only the provider's answer it leaves out."""
    if client == "python":
        project = Path(projects["python"][1]).parent
        src = project / "readme_use.py"
        src.write_text(use_block(REPO / "client/python/README.md", "python"))
        # Runs its module level (the imports, the route) in the installed venv ...
        done = run([projects["python"][0], str(src)], project)
        assert done.returncode == 0, done.stdout + done.stderr
        # ... and names nothing undefined but the placeholders.
        done = run(
            [
                str(REPO / ".venv/bin/ruff"),
                "check",
                "--isolated",
                "--no-cache",
                "--select=F821",
                "--output-format=json",
                str(src),
            ],
            project,
        )
        undefined = {
            re.sub(r"Undefined name `(.*)`", r"\1", d["message"]) for d in json.loads(done.stdout)
        }
        assert undefined == PY_PLACEHOLDERS, done.stdout + done.stderr
    elif client == "go":
        project = Path(projects["go"][0]).parent
        pkg = project / "readmeuse"
        pkg.mkdir(exist_ok=True)
        (pkg / "main.go").write_text(
            "package main\n\n"
            + use_block(REPO / "client/go/README.md", "go")
            + "\n"
            + GO_PLACEHOLDERS
            + "\nfunc main() { _ = runAgent(context.Background()) }\n"
        )
        done = run(["go", "build", "-o", os.devnull, "./readmeuse"], project)
        assert done.returncode == 0, done.stdout + done.stderr
    else:
        project = Path(projects["typescript"][1]).parent.parent
        src = project / "readme-use.ts"
        src.write_text(TS_PLACEHOLDERS + use_block(REPO / "client/typescript/README.md", "ts"))
        tsc = REPO / "client/typescript/node_modules/typescript/bin/tsc"
        types = REPO / "client/typescript/node_modules/@types"
        done = run(
            [
                "node",
                str(tsc),
                "--strict",
                "--noEmit",
                *("--target", "ES2022", "--module", "NodeNext"),
                *("--moduleResolution", "NodeNext", "--skipLibCheck"),
                *("--typeRoots", str(types), "--types", "node"),
                src.name,
            ],
            project,
        )
        assert done.returncode == 0, done.stdout + done.stderr
