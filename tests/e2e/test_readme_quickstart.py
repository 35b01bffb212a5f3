"""The README's quick start, run as written: its grpcurl block (the pinned grpcurl, through
server reflection) against a real daemon, each command's answer checked. Only the
addresses are this daemon's, and the compile id the README leaves to the reader is the
one its Compile answered."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

from tests.e2e.proc import REPO, DaemonProcess

GRPCURL = REPO / ".tools" / "bin" / "grpcurl"


def _commands() -> list[str]:
    """The commands of the README's first ```sh block after 'Server reflection is on'."""
    readme = (REPO / "README.md").read_text()
    block = re.search(r"```sh\n(.*?)```", readme.split("Server reflection is on", 1)[1], re.S)
    assert block
    commands: list[str] = []
    for line in block.group(1).splitlines():
        if line.startswith("#") or not line.strip():
            continue
        if line.startswith("grpcurl "):
            commands.append(line)
        else:
            commands[-1] += "\n" + line
    return commands


def test_the_quick_start_grpcurl_block_runs_as_written(tmp_path: Path) -> None:
    assert GRPCURL.exists(), "run `make test`: it installs grpcurl (pinned) first"
    commands = _commands()
    assert len(commands) >= 7, commands
    d = DaemonProcess(tmp_path / "data")
    with d.serving():
        tcp, unix = d.endpoints["tcp"], d.endpoints["unix"]
        assert tcp and unix
        answers: list[str] = []
        compile_id = ""
        for command in commands:
            run = (
                command.replace("127.0.0.1:50551", tcp)
                .replace("unix:data/ctxcc.sock", f"unix:{unix}")
                .replace("<compile_id from the view>", compile_id)
            )
            assert run.startswith("grpcurl ")
            # Through a shell, as the reader runs it (quotes and line continuations).
            script = shlex.quote(str(GRPCURL)) + run.removeprefix("grpcurl")
            done = subprocess.run(
                ["bash", "-c", script], capture_output=True, text=True, timeout=60, check=False
            )
            assert done.returncode == 0, (command, done.stderr)
            answers.append(done.stdout)
            if run.rstrip().endswith("CompileService/Compile") and not compile_id:
                compile_id = json.loads(done.stdout)["view"]["compile_id"]
    listed, created, appended, compiled, reported, health, rendered = answers[:7]
    assert "ctxcc.v1.CompileService" in listed.split()
    assert json.loads(created)["session"]["session_id"] == "demo"
    assert json.loads(appended)["last_seq"] == "1"
    view = json.loads(compiled)["view"]
    assert view["event_boundary"] == "1" and compile_id.startswith("demo:")
    # The README's report is near the view's estimate, as a provider's count would be.
    usage = json.loads(reported)
    estimate = int(usage["estimated_input_tokens"])
    assert abs(130 - estimate) <= estimate // 4, usage
    assert json.loads(health)["status"] == "SERVING"
    (rendering,) = json.loads(rendered)["view"]["renderings"]
    body = json.loads(rendering["body_json"])
    assert body["model"] == "claude-sonnet-4"
    assert body["messages"][0]["content"][0]["text"] == "list the files in src/"
