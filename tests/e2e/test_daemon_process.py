"""`ctxcc serve` as a process: health, reflection, socket mode, one owner per data
directory, clean exit on SIGTERM, and `make run`."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import compile_service_pb2_grpc, session_pb2, session_service_pb2_grpc
from ctxcc.v1 import session_service_pb2 as spb
from server.domain.model import Session
from storage import KVEventStore, open_rocks
from storage.kv import Batch
from storage.schema import SCHEMA_VERSION
from tests.contract.test_rocks import damaged_table
from tests.e2e.proc import REPO, DaemonProcess, tmpfs
from tests.e2e.test_hostile import _certs
from tests.helpers import ROUTE, error_info, user


@pytest.fixture
def data_dir(short_tmp: Path) -> Path:
    return short_tmp / "data"


@pytest.fixture
def daemon_proc(data_dir: Path) -> Iterator[DaemonProcess]:
    d = DaemonProcess(data_dir).start()
    try:
        d.wait_ready()
        yield d
    finally:
        d.ensure_stopped()


def test_serves_health_and_reflection_then_exits_zero_on_sigterm(
    daemon_proc: DaemonProcess, data_dir: Path
) -> None:
    assert daemon_proc.health() == health_pb2.HealthCheckResponse.SERVING
    sock = Path(str(daemon_proc.endpoints["unix"]))
    assert sock == data_dir / "ctxcc.sock"
    assert stat.S_IMODE(sock.stat().st_mode) == 0o660
    with grpc.insecure_channel(str(daemon_proc.endpoints["tcp"])) as ch:
        stub: Any = reflection_pb2_grpc.ServerReflectionStub(ch)
        req = reflection_pb2.ServerReflectionRequest(list_services="")
        names = {
            s.name
            for r in stub.ServerReflectionInfo(iter([req]))
            for s in r.list_services_response.service
        }
        assert {
            "ctxcc.v1.SessionService",
            "ctxcc.v1.CompileService",
            "grpc.health.v1.Health",
        } <= names
        session_service_pb2_grpc.SessionServiceStub(ch).CreateSession(
            spb.CreateSessionRequest(session=session_pb2.Session(session_id="kept")), timeout=5
        )
    started = time.monotonic()
    assert daemon_proc.terminate() == 0
    assert time.monotonic() - started < 10
    assert "stopped cleanly" in daemon_proc.log()
    assert not sock.exists()
    # RocksDB was closed cleanly: a new daemon opens it and finds the session.
    again = DaemonProcess(data_dir).start()
    try:
        again.wait_ready()
        with grpc.insecure_channel(again.target) as ch:
            got = session_service_pb2_grpc.SessionServiceStub(ch).GetSession(
                spb.GetSessionRequest(session_id="kept"), timeout=5
            )
            assert got.session.session_id == "kept"
    finally:
        assert again.terminate() == 0


def test_sighup_stops_it_as_sigterm_does(short_tmp: Path) -> None:
    """The terminal of a `make run` closes, or a supervisor hangs up: the daemon drains
    and exits 0 with its socket removed, as on SIGTERM (SIGHUP's default would kill it
    on the spot and leave the socket file)."""
    d = DaemonProcess(short_tmp / "data").start()
    try:
        d.wait_ready()
        sock = Path(str(d.endpoints["unix"]))
        assert d.proc is not None
        d.proc.send_signal(signal.SIGHUP)
        assert d.proc.wait(30) == 0
        assert "shutting down: draining" in d.log() and "stopped cleanly" in d.log()
        assert not sock.exists()
    finally:
        d.ensure_stopped()


def test_second_daemon_on_the_same_data_dir_fails_fast(
    daemon_proc: DaemonProcess, data_dir: Path
) -> None:
    started = time.monotonic()
    second = subprocess.run(
        [
            sys.executable,
            "-m",
            "server",
            "serve",
            "--data-dir",
            str(data_dir),
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "none",
            "--ui-listen",
            "none",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert second.returncode == 3
    assert "in use by another ctxcc process" in second.stderr
    assert f"pid {daemon_proc.proc.pid}" in second.stderr  # type: ignore[union-attr]
    assert "Traceback" not in second.stderr
    # The Claude table it preloads by default is not waited for, nor logged built after
    # the failure.
    assert "tokenizer" not in second.stderr, second.stderr
    assert time.monotonic() - started < 30
    # The first daemon is unharmed.
    assert daemon_proc.health() == health_pb2.HealthCheckResponse.SERVING


def test_bad_flags_exit_with_a_message_not_a_traceback(short_tmp: Path) -> None:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "server",
            "serve",
            "--data-dir",
            str(short_tmp),
            "--listen",
            "nowhere",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 2
    assert "listen must be host:port" in r.stderr and "Traceback" not in r.stderr


def test_make_run_starts_the_daemon(short_tmp: Path) -> None:
    data = short_tmp / "mk"
    args = (
        f"--data-dir {data} --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0"
        " --ui-listen 127.0.0.1:0"
    )
    d = DaemonProcess(data, command=["make", "--no-print-directory", "run", f"ARGS={args}"])
    d.start()
    try:
        d.wait_ready()
        assert d.health() == health_pb2.HealthCheckResponse.SERVING
        # make forwards SIGTERM to nothing: signal the daemon itself, as an operator would.
        daemon_pid = int((data / "db" / "LOCK.ctxcc").read_text())
        os.kill(daemon_pid, signal.SIGTERM)
        assert d.proc is not None and d.proc.wait(15) == 0
    finally:
        d.ensure_stopped()


@pytest.mark.parametrize("setting", ["listen", "health_listen"])
def test_a_busy_grpc_or_health_port_exits_2_naming_the_setting(
    short_tmp: Path, setting: str
) -> None:
    """Like a busy metrics or inspector port: exit 2 with one line naming the setting, no
    traceback, and nothing left behind (socket file, servers, the data directory's lock)."""
    data = short_tmp / "data"
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        busy = f"127.0.0.1:{held.getsockname()[1]}"
        flag = "--" + setting.replace("_", "-")
        flags = {
            "--listen": "127.0.0.1:0",
            "--health-listen": "none",
            "--metrics-listen": "127.0.0.1:0",
            "--ui-listen": "none",
        }
        flags[flag] = busy
        args = [x for kv in flags.items() for x in kv]
        r = subprocess.run(
            [sys.executable, "-m", "server", "serve", "--data-dir", str(data), *args],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert r.returncode == 2, r.stderr
    assert f"cannot serve gRPC on {busy} ({setting})" in r.stderr
    for noise in ("Traceback", "never awaited", "Event loop is closed", "RuntimeError"):
        assert noise not in r.stderr, r.stderr
    assert not (data / "ctxcc.sock").exists()
    # The lock was released: the same data directory serves at once.
    again = DaemonProcess(data).start()
    try:
        again.wait_ready()
        assert again.health() == health_pb2.HealthCheckResponse.SERVING
    finally:
        assert again.terminate() == 0


QUIET = ("--metrics-listen", "none", "--ui-listen", "none")
SERVE = (sys.executable, "-m", "server", "serve")


def serve(*args: str) -> subprocess.CompletedProcess[str]:
    """`ctxcc serve` with the given flags and no TCP listener, run to its exit."""
    return subprocess.run(
        [sys.executable, "-m", "server", "serve", "--listen", "none", *QUIET, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("where", ["file", "under_file", "db_file"])
def test_an_unusable_data_dir_exits_2_naming_it(short_tmp: Path, where: str) -> None:
    """A data directory that cannot be made or used (a file in the way of it or of its
    `db/`, or a parent that is a file) is a setting to fix: exit 2 with one line naming
    `data_dir` and the path at fault, not a traceback."""
    blocker = short_tmp / "a-file"
    blocker.write_text("")
    data = {"file": blocker, "under_file": blocker / "data", "db_file": short_tmp}[where]
    if where == "db_file":
        (short_tmp / "db").write_text("")
    r = serve("--data-dir", str(data))
    assert r.returncode == 2, r.stderr
    why = {
        "file": f"{blocker} is not a directory",
        "under_file": "[Errno 20] Not a directory",
        "db_file": f"{short_tmp / 'db'} is not a directory",
    }[where]
    assert f"cannot use data_dir {data}: {why}" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr, r.stderr


def test_a_data_dir_on_a_read_only_filesystem_exits_2_naming_it(short_tmp: Path) -> None:
    """A volume mounted read-only (a Kubernetes volume's readOnly, a full remount), with a
    store a daemon wrote before: exit 2 saying so, not a traceback from the first write
    (the directory's chmod) nor RocksDB's IO error."""
    with tmpfs(short_tmp / "vol", 512 << 20, "a read-only filesystem") as mnt:
        data = mnt / "data"
        d = DaemonProcess(data, log_path=short_tmp / "first.log").start()
        try:
            d.wait_ready()
        finally:
            assert d.terminate() == 0
        assert (data / "db" / "CURRENT").is_file()
        remount = ["mount", "-o", "remount,ro", str(mnt)]
        subprocess.run(remount, check=True, capture_output=True)
        r = serve("--data-dir", str(data))
        assert r.returncode == 2, r.stderr
        assert f"cannot use data_dir {data}: it is on a read-only filesystem" in r.stderr
        assert "Traceback" not in r.stderr, r.stderr


def test_a_socket_group_past_the_largest_gid_exits_2_before_binding(short_tmp: Path) -> None:
    """With the socket outside the data dir (the Kubernetes layout) the chown failed
    with a traceback after the server had started, and left the socket behind."""
    sock = short_tmp / "x.sock"
    r = serve("--data-dir", str(short_tmp / "d"), "--socket", str(sock), "--socket-group", "9" * 20)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().endswith(f"socket_group {'9' * 20} is not a gid (0 to 4294967294)")
    assert "Traceback" not in r.stderr and not sock.exists()


def test_a_config_file_that_is_not_utf8_exits_2(short_tmp: Path) -> None:
    bad = short_tmp / "bad.toml"
    bad.write_bytes(b'log_level = "\xffinfo"\n')
    r = serve("--data-dir", str(short_tmp / "d"), "--config", str(bad))
    assert r.returncode == 2, r.stderr
    assert "is not valid TOML: not UTF-8" in r.stderr and "Traceback" not in r.stderr


def test_a_socket_directory_that_cannot_be_made_exits_2_naming_it(short_tmp: Path) -> None:
    blocker = short_tmp / "a-file"
    blocker.write_text("")
    sock = blocker / "run" / "ctxcc.sock"
    r = serve("--data-dir", str(short_tmp / "data"), "--socket", str(sock))
    assert r.returncode == 2, r.stderr
    assert f"cannot bind Unix socket {sock} (socket):" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr, r.stderr


def test_a_rocksdb_that_cannot_open_exits_1_with_one_line(short_tmp: Path) -> None:
    """A damaged RocksDB (here its CURRENT file) is not a setting: exit 1 with RocksDB's
    own words and the path, no traceback, and the data directory's lock released."""
    data = short_tmp / "data"
    (data / "db").mkdir(parents=True)
    (data / "db" / "CURRENT").write_text("garbage\n")
    r = serve("--data-dir", str(data))
    assert r.returncode == 1, r.stderr
    assert f"cannot open RocksDB in {data / 'db'}: Corruption" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    assert not (data / "ctxcc.sock").exists()


@pytest.mark.parametrize(
    ("version", "said"),
    [
        (str(SCHEMA_VERSION + 1).encode(), "store schema version 2 is newer than this ctxcc"),
        (b"\xff1", "the store's schema version b'\\xff1' is damaged"),
        (None, "RocksDB read: Corruption"),
    ],
)
def test_a_store_this_daemon_cannot_read_exits_1_with_one_line(
    short_tmp: Path, version: bytes | None, said: str
) -> None:
    """A rollback after an upgrade (the data directory's schema version newer than this
    daemon's), a damaged version, and a store without one whose sessions (read to tell
    a new store from one that lost its version) sit in a damaged table block: exit 1
    saying so, with the directory's lock released (each was a traceback)."""
    data = short_tmp / "data"
    store = KVEventStore(open_rocks(data / "db"))
    for i in range(300):
        store.create_session(Session(f"s{i}", 1, 1, labels=(("k", "v" * 100),)))
    store.close()
    kv = open_rocks(data / "db")
    changed = Batch()
    if version is None:
        changed.delete("meta", b"schema_version")
    else:
        changed.put("meta", b"schema_version", version)
    kv.write(changed)
    kv.close()
    if version is None:
        open_rocks(data / "db").close()  # the log replayed into table files at open
        damaged_table(data / "db", at=0)  # the first session's block
    r = serve("--data-dir", str(data))
    assert r.returncode == 1, r.stderr
    assert f"cannot open the store in {data / 'db'}: {said}" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    open_rocks(data / "db").close()  # the lock was released


def test_a_short_auth_token_names_its_file(short_tmp: Path) -> None:
    """The refusal said "the auth token must be at least 16 characters" without saying
    which file was read: a newline-only or truncated file is the usual cause."""
    token = short_tmp / "token"
    token.write_text("short\n")
    r = serve("--data-dir", str(short_tmp / "data"), "--auth-token-file", str(token))
    assert r.returncode == 2, r.stderr
    assert f"auth_token_file {token} holds 5 characters" in r.stderr, r.stderr


def test_an_auth_token_grpc_cannot_send_exits_2_naming_its_file(short_tmp: Path) -> None:
    """A token with non-ASCII characters started a daemon that no gRPC client could
    call over TCP: they refuse to send such a header value."""
    token = short_tmp / "token"
    token.write_text("pässwörd-0123456789\n", encoding="utf-8")
    r = serve("--data-dir", str(short_tmp / "data"), "--auth-token-file", str(token))
    assert r.returncode == 2, r.stderr
    assert f"auth_token_file {token} holds characters other than printable ASCII" in r.stderr
    assert "Traceback" not in r.stderr, r.stderr


def test_a_model_catalog_that_is_not_an_object_exits_2_naming_it(short_tmp: Path) -> None:
    """A catalog file holding a JSON array crashed the start with a traceback (exit 1,
    AttributeError); it is a setting to fix like any other."""
    catalog = short_tmp / "models.json"
    catalog.write_text("[1, 2]")
    r = serve("--data-dir", str(short_tmp / "data"), "--model-catalog", str(catalog))
    assert r.returncode == 2, r.stderr
    assert f"cannot read model catalog {catalog}: catalog: must be a JSON object" in r.stderr
    assert "Traceback" not in r.stderr, r.stderr


def test_a_disk_reserve_over_half_the_filesystem_exits_2_naming_it(short_tmp: Path) -> None:
    """Writes wait for the reserve to be held with as much again free: a reserve over half
    the filesystem left the daemon read-only for good (a fresh one crashed, below)."""
    st = os.statvfs(short_tmp)
    capacity = st.f_blocks * st.f_frsize
    r = serve("--data-dir", str(short_tmp / "data"), "--disk-reserve-bytes", str(capacity))
    assert r.returncode == 2, r.stderr
    assert f"disk_reserve_bytes {capacity} is over half of the data directory's" in r.stderr
    assert not (short_tmp / "data" / "db").exists()


def test_a_new_store_on_a_disk_too_full_to_write_exits_1_naming_it(short_tmp: Path) -> None:
    """A new store writes its schema version at open; when the disk is too full for writes
    (here: less free than twice the reserve) that crashed with a DISK_FULL traceback."""
    st = os.statvfs(short_tmp)
    reserve = st.f_blocks * st.f_frsize // 2  # allowed, but never held with this much free
    assert st.f_bavail * st.f_frsize < 2 * reserve
    r = serve("--data-dir", str(short_tmp / "data"), "--disk-reserve-bytes", str(reserve))
    assert r.returncode == 1, r.stderr
    assert f"cannot create a new store in {short_tmp / 'data' / 'db'}: the disk is too full" in (
        r.stderr
    )
    assert f"disk_reserve_bytes {reserve}" in r.stderr
    assert "Traceback" not in r.stderr, r.stderr


def test_a_missing_global_dir_or_workspace_root_is_warned_at_start(short_tmp: Path) -> None:
    """They are read at each compile, so the daemon serves; a mistyped one used to show
    only as files that never appear in any view."""
    there = short_tmp / "work"
    there.mkdir()
    gone, typo = short_tmp / "global", short_tmp / "wrok"
    d = DaemonProcess(
        short_tmp / "data", "--global-dir", str(gone), "--workspace-roots", f"{there},{typo}"
    ).start()
    try:
        d.wait_ready()
    finally:
        assert d.terminate() == 0
    log = d.log()
    assert f"global_dir {gone} is not a directory (yet)" in log, log
    assert f"workspace_roots {typo} is not a directory (yet)" in log, log
    assert f"workspace_roots {there} " not in log, log


def _environment(**variables: str) -> dict[str, str]:
    """This process's environment with `variables` added, output unbuffered."""
    return {**os.environ, "PYTHONUNBUFFERED": "1", **variables}


def test_a_ctxcc_variable_that_names_no_setting_is_warned_at_start(short_tmp: Path) -> None:
    """CTXCC_DATADIR (for CTXCC_DATA_DIR) was ignored in silence: the daemon ran on the
    default data directory. It is warned, with the setting it was probably meant for; the
    clients' CTXCC_TARGET, often in the same environment, is not."""
    env = _environment(
        CTXCC_DATADIR=str(short_tmp / "elsewhere"),
        CTXCC_FROBNICATE="1",
        CTXCC_TARGET="unix:/tmp/x.sock",
        CTXCC_LOG_LEVEL="info",
    )
    d = DaemonProcess(short_tmp / "data", env=env).start()
    try:
        d.wait_ready()
    finally:
        assert d.terminate() == 0
    log = d.log()
    assert (
        "environment variable CTXCC_DATADIR is no ctxcc setting and is ignored "
        "(did you mean CTXCC_DATA_DIR?)" in log
    ), log
    assert "environment variable CTXCC_FROBNICATE is no ctxcc setting and is ignored\n" in log
    assert "CTXCC_TARGET" not in log and "CTXCC_LOG_LEVEL" not in log


def test_json_logs_are_one_object_per_line_from_start_to_exit(short_tmp: Path) -> None:
    """--log-format json (here from the environment, as a pod sets it): every line the
    daemon writes from start to a clean exit parses as one record, and a warning keeps
    its level and text; the text format's lines would be taken apart by a log pipeline."""
    env = _environment(CTXCC_LOG_FORMAT="json", CTXCC_FROBNICATE="1")
    d = DaemonProcess(short_tmp / "data", env=env).start()
    try:
        d.wait_ready()
        with grpc.insecure_channel(d.target) as ch:
            stub: Any = session_service_pb2_grpc.SessionServiceStub(ch)
            stub.CreateSession(spb.CreateSessionRequest(session=session_pb2.Session()))
    finally:
        assert d.terminate() == 0
    records = [json.loads(line) for line in d.log().splitlines()]
    assert all({"time", "level", "logger", "message"} <= set(r) for r in records), records
    warned = [r for r in records if "CTXCC_FROBNICATE" in r["message"]]
    assert [r["level"] for r in warned] == ["warning"], records
    messages = [r["message"] for r in records]
    serving = [r for r in records if r["message"].startswith("serving {")]
    assert len(serving) == 1, messages
    # The endpoints are an object of their own in the record, the message's JSON.
    endpoints = serving[0]["endpoints"]
    assert endpoints == json.loads(serving[0]["message"].split(" ", 1)[1]), serving
    assert f"unix:{endpoints['unix']}" == d.target, endpoints
    assert messages[-1] == "stopped cleanly", messages


def test_json_logs_stay_json_under_failed_tls_handshakes_and_start_failures(
    short_tmp: Path,
) -> None:
    """gRPC's C core writes its own text lines (one per failed TLS handshake, which any
    peer reaching the port triggers at will; a failed bind): under --log-format json the
    entry point silences it before gRPC is imported. Settings refused at start are one
    JSON record too, as are a port in use and the daemon's own lines."""
    certs = short_tmp / "certs"
    certs.mkdir()
    _certs(certs)
    env = _environment(CTXCC_LOG_FORMAT="json")
    env.pop("GRPC_VERBOSITY", None)  # the entry point's choice, not this process's
    tls = (
        "--tls-cert-file",
        str(certs / "server.pem"),
        "--tls-key-file",
        str(certs / "server.key"),
    )
    d = DaemonProcess(short_tmp / "data", *tls, env=env).start()
    try:
        d.wait_ready()
        host, port = str(d.endpoints["tcp"]).rsplit(":", 1)
        for _ in range(3):  # a plaintext client, or a port scanner, on the TLS port
            with socket.create_connection((host, int(port))) as probe:
                probe.sendall(b"GET / HTTP/1.1\r\n\r\n")
                probe.settimeout(5)
                with contextlib.suppress(OSError):
                    probe.recv(100)
        taken = subprocess.run(
            [
                *SERVE,
                "--data-dir",
                str(short_tmp / "b"),
                "--listen",
                str(d.endpoints["tcp"]),
                *QUIET,
            ],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert taken.returncode == 2, taken.stderr
    finally:
        assert d.terminate() == 0
    refused = subprocess.run(
        [*SERVE, "--data-dir", str(short_tmp / "c"), "--max-tools", "abc", "--log-format", "json"],
        cwd=REPO,
        env=_environment(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert refused.returncode == 2, refused.stderr
    for text in (d.log(), taken.stderr, refused.stderr):
        lines = text.splitlines()
        assert lines and all(json.loads(line)["message"] for line in lines), text
    assert "max_tools must be a whole number, got 'abc'" in json.loads(refused.stderr)["message"]
    assert "(listen): address in use" in taken.stderr, taken.stderr


def test_an_unknown_log_format_exits_2_naming_it(short_tmp: Path) -> None:
    r = serve("--data-dir", str(short_tmp / "data"), "--log-format", "logfmt")
    assert r.returncode == 2, r.stderr
    assert "log_format must be 'text' or 'json', got 'logfmt'" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr, r.stderr


def test_a_quoted_number_in_the_config_file_exits_2_naming_file_key_and_types(
    short_tmp: Path,
) -> None:
    """`max_tools = "10"` was taken as 10: a type mistake in TOML that nobody heard of."""
    config = short_tmp / "ctxcc.toml"
    config.write_text('max_tools = "10"\n')
    r = serve("--data-dir", str(short_tmp / "data"), "--config", str(config))
    assert r.returncode == 2, r.stderr
    assert (
        f"config file {config}: max_tools must be a TOML integer (unquoted, e.g. 10), got the "
        'string "10"' in r.stderr
    ), r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    assert not (short_tmp / "data").exists()  # refused before anything was made


def test_tls_files_with_listen_none_are_warned_unused_at_start(short_tmp: Path) -> None:
    """TLS serves only the gRPC TCP listener: with none, the files were never read (a
    missing one not even reported) while the operator believed something was encrypted."""
    cert, key = short_tmp / "absent.pem", short_tmp / "absent.key"
    d = DaemonProcess(
        short_tmp / "data",
        "--listen",
        "none",
        "--tls-cert-file",
        str(cert),
        "--tls-key-file",
        str(key),
    ).start()
    try:
        endpoints = d.wait_ready()
    finally:
        assert d.terminate() == 0
    assert endpoints["tcp"] is None
    log = d.log()
    assert (
        "WARNING ctxcc: tls_cert_file, tls_key_file are set but listen is 'none': TLS applies "
        "only to the gRPC TCP listener" in log
    ), log


def test_a_socket_another_daemon_serves_on_is_not_taken_over(short_tmp: Path) -> None:
    """The image's socket lies outside the data directory (/run/ctxcc), so the data
    directory's lock does not make a socket file found there stale: a second daemon with
    its own data directory and the same --socket exits 2 naming it, and the first keeps
    serving on it. A stale file (nothing listening) is replaced."""
    sock = short_tmp / "run" / "ctxcc.sock"
    first = DaemonProcess(short_tmp / "a", "--socket", str(sock)).start()
    try:
        first.wait_ready()
        r = serve("--data-dir", str(short_tmp / "b"), "--socket", str(sock))
        assert r.returncode == 2, r.stderr
        assert f"cannot bind Unix socket {sock} (socket): another process is serving" in r.stderr
        assert "Traceback" not in r.stderr, r.stderr
        assert first.health() == health_pb2.HealthCheckResponse.SERVING
        assert first.terminate() == 0
    finally:
        if first.proc is not None and first.proc.poll() is None:
            first.terminate()
    # A file nobody listens on (bound, never listening): stale, replaced.
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(sock))
    stale.close()
    assert stat.S_ISSOCK(sock.lstat().st_mode)
    second = DaemonProcess(short_tmp / "b", "--socket", str(sock)).start()
    try:
        second.wait_ready()
        assert second.health() == health_pb2.HealthCheckResponse.SERVING
        assert second.terminate() == 0
        assert not sock.exists()  # its own file, removed at stop
    finally:
        if second.proc is not None and second.proc.poll() is None:
            second.terminate()


def test_a_damaged_table_file_is_data_loss_not_a_shorter_log(short_tmp: Path) -> None:
    """A data block of a RocksDB table file damaged on disk (256 bytes flipped): reading
    a session's log through it answered its events before the damage as the whole log
    (105 of 200 listed, a view of 105 messages, a rebuild that was not the recorded
    view). The reads that cross it are DATA_LOSS (RECORD_CORRUPT); the session's record,
    in another block, still reads."""
    data = short_tmp / "data"
    d = DaemonProcess(data).start()
    try:
        d.wait_ready()
        with grpc.insecure_channel(d.target) as ch:
            sessions: Any = session_service_pb2_grpc.SessionServiceStub(ch)
            compiles: Any = compile_service_pb2_grpc.CompileServiceStub(ch)
            sessions.CreateSession(
                spb.CreateSessionRequest(session=session_pb2.Session(session_id="s"))
            )
            for k in range(200):
                text = f"message {k} " + "lorem ipsum " * 120
                sessions.AppendEvents(spb.AppendEventsRequest(session_id="s", events=[user(text)]))
            recorded = compiles.Compile(cpb.CompileRequest(session_id="s", route=ROUTE)).view
    finally:
        assert d.terminate() == 0
    d.start()  # the log replayed into a table file at open
    d.wait_ready()
    assert d.terminate() == 0
    damaged_table(data / "db")
    d.start()
    try:
        d.wait_ready()
        with grpc.insecure_channel(d.target) as ch:
            sessions = session_service_pb2_grpc.SessionServiceStub(ch)
            compiles = compile_service_pb2_grpc.CompileServiceStub(ch)
            got = sessions.GetSession(spb.GetSessionRequest(session_id="s")).session
            assert got.head_seq == 200
            calls: list[Callable[[], object]] = [
                lambda: sessions.ListEvents(spb.ListEventsRequest(session_id="s", page_size=1000)),
                lambda: compiles.Compile(cpb.CompileRequest(session_id="s", route=ROUTE)),
                lambda: compiles.Compile(
                    cpb.CompileRequest(
                        session_id="s", route=ROUTE, rebuild_compile_id=recorded.compile_id
                    )
                ),
            ]
            for call in calls:
                with pytest.raises(grpc.RpcError) as err:
                    call()
                assert err.value.code() == grpc.StatusCode.DATA_LOSS
                assert error_info(err.value).reason == "RECORD_CORRUPT"
                assert "Corruption" not in (err.value.details() or "")
    finally:
        assert d.terminate() == 0
    assert "RocksDB read: Corruption" in d.log()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_during_start_up_stops_the_daemon_cleanly(
    short_tmp: Path, sig: signal.Signals
) -> None:
    """The handlers were installed once the start was done: a signal while the store
    opened (a long WAL replay, over-budget sessions read back) ended the process
    undrained (SIGTERM -15, as kubelet sees 143; SIGHUP -1) or with a KeyboardInterrupt
    traceback (SIGINT). The signal is sent when the start-up's first log line (a warning
    for an unknown variable, logged before the store opens) is out: the daemon finishes
    its start, then stops as on any signal."""
    log = short_tmp / "start.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [*SERVE, "--data-dir", str(short_tmp / "d"), "--listen", "none", *QUIET],
            cwd=REPO,
            stdout=out,
            stderr=out,
            env={**os.environ, "CTXCC_NOT_A_SETTING": "1"},
        )
    try:
        deadline = time.monotonic() + 60
        while "CTXCC_NOT_A_SETTING" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.005)
        proc.send_signal(sig)
        code = proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert code == 0, text
    assert "stopped cleanly" in text and "Traceback" not in text
    assert not (short_tmp / "d" / "ctxcc.sock").exists()
