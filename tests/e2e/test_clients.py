"""Interop: the Go, TypeScript and Python example agents run 20-step loops against a
daemon started here, over the Unix socket and TCP, receive a chunked view larger than
4 MB intact, and (Go, TypeScript) resume after the daemon restarts mid-session without
duplicating an event. `make test` builds the clients first (`make clients`)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from ctxcc.v1 import session_service_pb2 as spb
from ctxcc.v1 import session_service_pb2_grpc
from tests.e2e.proc import REPO, DaemonProcess

CLIENTS = {
    "go": [str(REPO / ".tools" / "bin" / "agentloop-go")],
    "typescript": ["node", str(REPO / "client/typescript/dist/examples/agent-loop.js")],
    "python": [sys.executable, str(REPO / "client/python/examples/agent_loop.py")],
}
OK = re.compile(r"ok (\d+) steps session (\S+) seq (\d+)(?: largest_view_bytes (\d+))?")


def _events(target: str, sid: str) -> list[str]:
    texts, token = [], ""
    with grpc.insecure_channel(
        target, options=[("grpc.max_receive_message_length", 64 << 20)]
    ) as ch:
        stub = session_service_pb2_grpc.SessionServiceStub(ch)
        while True:
            page = stub.ListEvents(
                spb.ListEventsRequest(session_id=sid, page_token=token), timeout=30
            )
            for e in page.events:
                m = e.user_message if e.HasField("user_message") else e.assistant_message
                texts.append(m.parts[0].text[:40])
            token = page.next_page_token
            if not token:
                return texts


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    d = DaemonProcess(Path(os.path.realpath("/tmp")) / f"ctxcc-cl-{os.getpid()}")
    d.start()
    d.wait_ready()
    yield d
    d.terminate()
    shutil.rmtree(d.data_dir, ignore_errors=True)
    d.log_path.unlink(missing_ok=True)


@pytest.mark.parametrize("transport", ["unix", "tcp"])
@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_twenty_step_loop_with_a_chunked_view(
    daemon: DaemonProcess, client: str, transport: str
) -> None:
    cmd = CLIENTS[client]
    assert Path(cmd[-1]).exists(), f"{cmd[-1]} missing: run `make clients`"
    target = (
        f"unix://{daemon.endpoints['unix']}"
        if transport == "unix"
        else str(daemon.endpoints["tcp"])
    )
    args = [*cmd, "--steps", "20", "--big-step", "5"]
    done = subprocess.run(
        args,
        env={**os.environ, "CTXCC_TARGET": target},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    m = OK.search(done.stdout)
    assert m, done.stdout
    steps, sid, seq = int(m.group(1)), m.group(2), int(m.group(3))
    assert steps == 20 and seq == 45
    # Six ~840 KB messages: the view is over 4 MB, came in chunks, and is intact.
    assert int(m.group(4)) == 5_040_375
    assert "missing_reason SESSION_NOT_FOUND" in done.stdout
    events = _events(str(daemon.endpoints["tcp"]), sid)
    assert len(events) == seq
    assert events[-1].startswith("next step 19") or events[-2].startswith("reply 18")


@pytest.mark.parametrize("client", ["go", "typescript"])
def test_resume_after_the_daemon_restarts(client: str, short_tmp: Path) -> None:
    daemon = DaemonProcess(short_tmp / "data").start()
    daemon.wait_ready()
    resume = short_tmp / "resume"
    target = f"unix://{daemon.endpoints['unix']}"
    proc = subprocess.Popen(
        [*CLIENTS[client], "--steps", "20", "--pause-at", "9", "--resume-file", str(resume)],
        env={**os.environ, "CTXCC_TARGET": target},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first.strip() == "paused", first + (proc.stderr.read() if proc.stderr else "")
        assert daemon.terminate() == 0
        daemon.start()
        daemon.wait_ready()
        resume.touch()
        timer = threading.Timer(120, proc.kill)
        timer.start()
        out, err = proc.communicate()
        timer.cancel()
        assert proc.returncode == 0, out + err
        m = OK.search(out)
        assert m, out
        sid, seq = m.group(2), int(m.group(3))
        # 1 + 19 x (reply, next question): the step in flight across the restart was
        # resent with its request id and replayed, not appended twice.
        assert seq == 39
        events = _events(str(daemon.endpoints["tcp"]), sid)
        assert len(events) == len(set(events)) == 39
    finally:
        if proc.poll() is None:
            proc.kill()
        daemon.terminate()
