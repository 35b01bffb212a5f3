"""The data directory is private to the daemon's user: every file it writes is checked by
stat, and another local user (`nobody`) is shown to read nothing of the conversation,
while a member of the socket group reaches the socket and nothing else."""

from __future__ import annotations

import grp
import json
import os
import pwd
import stat
import subprocess
from pathlib import Path
from typing import Any

import grpc
import pytest

from ctxcc.v1 import compile_service_pb2_grpc, session_pb2, session_service_pb2_grpc
from ctxcc.v1 import session_service_pb2 as spb
from storage import open_rocks
from tests.e2e.proc import DaemonProcess
from tests.helpers import compile_request, user

SECRET = "the-launch-code-is-8675309"
# A stdlib-only python another user can run (the test's venv may sit in root's home).
SYSTEM_PYTHON = Path("/usr/bin/python3")

PROBE = r"""
import json, os, socket, sys
data = sys.argv[1]
seen = {"listed": [], "read": [], "connected": False}
for root in (data, os.path.join(data, "db")):
    try:
        seen["listed"].append([root, os.listdir(root)])
    except OSError:
        pass
for path in sys.argv[2:]:
    try:
        with open(path, "rb") as f:
            seen["read"].append([path, SECRET.encode() in f.read()])
    except OSError:
        pass
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(os.path.join(data, "ctxcc.sock"))
    seen["connected"] = True
except OSError:
    pass
print(json.dumps(seen))
"""


def _as_nobody(data: Path, files: list[Path], groups: list[int]) -> dict[str, Any]:
    if os.getuid() != 0:
        pytest.skip("checking what another user can read needs root to become `nobody`")
    if not SYSTEM_PYTHON.exists():
        pytest.skip(f"no {SYSTEM_PYTHON} for the `nobody` probe to run with")
    nobody = pwd.getpwnam("nobody")

    def drop() -> None:
        os.setgroups(groups)
        os.setgid(nobody.pw_gid)
        os.setuid(nobody.pw_uid)

    code = PROBE.replace("SECRET", repr(SECRET))
    done = subprocess.run(
        [str(SYSTEM_PYTHON), "-I", "-c", code, str(data), *map(str, files)],
        preexec_fn=drop,  # the child only drops privileges, then execs
        capture_output=True,
        text=True,
        cwd="/",
        check=True,
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def _write_a_conversation(d: DaemonProcess) -> None:
    with grpc.insecure_channel(d.target) as ch:
        sessions: Any = session_service_pb2_grpc.SessionServiceStub(ch)
        compiles: Any = compile_service_pb2_grpc.CompileServiceStub(ch)
        sessions.CreateSession(
            spb.CreateSessionRequest(session=session_pb2.Session(session_id="p"))
        )
        for i in range(20):
            req = spb.AppendEventsRequest(session_id="p", events=[user(f"{SECRET} {i} " * 200)])
            sessions.AppendEvents(req)
        compiles.Compile(compile_request("p"))


def _files(data: Path) -> list[Path]:
    return sorted(p for p in data.rglob("*") if p.is_file() and not p.is_socket())


def _modes(data: Path) -> dict[str, str]:
    return {
        str(p.relative_to(data)): oct(stat.S_IMODE(p.stat().st_mode))
        for p in [data, *data.rglob("*")]
        if not p.is_socket()
    }


@pytest.mark.parametrize("with_group", [False, True], ids=["private", "socket-group"])
def test_nothing_in_the_data_dir_is_readable_by_another_user(
    short_tmp: Path, with_group: bool
) -> None:
    # Only our own modes may stand between `nobody` and the files.
    os.chmod(short_tmp, 0o755)
    data = short_tmp / "data"
    # A data directory as an older version left it: world-readable files and dirs.
    old = os.umask(0o022)
    try:
        data.mkdir(mode=0o755)
        open_rocks(data / "db").close()
        os.chmod(data / "db", 0o755)
        for p in (data / "db").iterdir():
            os.chmod(p, 0o644)
    finally:
        os.umask(old)

    nogroup = grp.getgrgid(pwd.getpwnam("nobody").pw_gid)
    extra = ["--socket-group", nogroup.gr_name] if with_group else []
    d = DaemonProcess(data, *extra).start()
    try:
        d.wait_ready()
        _write_a_conversation(d)
        modes_running = _modes(data)
        # The probe runs while the write-ahead log holds the conversation.
        seen = _as_nobody(data, _files(data), [nogroup.gr_gid])
    finally:
        assert d.terminate() == 0
    modes = _modes(data)
    assert any((data / "db").glob("*.sst")) or any((data / "db").glob("*.log"))

    assert modes.pop(".") == ("0o710" if with_group else "0o700"), modes
    assert modes.pop("db") == "0o700"
    assert {k: v for k, v in {**modes_running, **modes}.items() if k not in (".", "db")} == {
        k: "0o600" for k in {**modes_running, **modes} if k not in (".", "db")
    }
    if with_group:
        assert data.stat().st_gid == nogroup.gr_gid
    assert seen["listed"] == []
    assert seen["read"] == []
    # The socket is the one door, and only for its group.
    assert seen["connected"] is with_group
