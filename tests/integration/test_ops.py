"""What an operator touches besides the dashboard: error series that exist before the
first error, the storage gauges, `ctxcc health`, and the CLI inside a shell pipeline."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2

from ctxcc.v1 import (
    artifact_service_pb2,
    compile_service_pb2,
    session_pb2,
    session_service_pb2,
    source_service_pb2,
    tool_service_pb2,
)
from server.app import Daemon
from server.transport.errors import CODES
from tests.conftest import make_config, stubs_for
from tests.helpers import ROUTE, user

REPO = Path(__file__).resolve().parents[2]


def _scrape(d: Daemon) -> str:
    url = f"http://{d.endpoints.metrics}/metrics"
    return str(urllib.request.urlopen(url, timeout=10).read().decode())


def _errors(scrape: str) -> dict[tuple[str, str], float]:
    found = re.findall(
        r'^ctxcc_rpc_errors_total\{code="(\w+)",method="([\w/]+)"\} (\S+)$', scrape, re.M
    )
    return {(method, code): float(v) for code, method, v in found}


def _ctxcc(
    *args: str, env: dict[str, str] | None = None, cwd: Path = REPO
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "server", *args],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def test_rpc_error_series_exist_before_the_first_error(daemon: Daemon) -> None:
    services = [
        f.services_by_name[name]
        for f in (
            session_service_pb2.DESCRIPTOR,
            compile_service_pb2.DESCRIPTOR,
            artifact_service_pb2.DESCRIPTOR,
            source_service_pb2.DESCRIPTOR,
            tool_service_pb2.DESCRIPTOR,
            health_pb2.DESCRIPTOR,
        )
        for name in f.services_by_name
    ]
    methods = {f"{s.name}/{m.name}" for s in services for m in s.methods}
    codes = {c.name for c in CODES.values()} | {"CANCELLED", "DEADLINE_EXCEEDED", "UNKNOWN"}
    before = _errors(await asyncio.to_thread(_scrape, daemon))
    assert {(m, c) for m in methods for c in codes} <= set(before)
    assert set(before.values()) == {0.0}
    api = stubs_for(f"unix:{daemon.endpoints.unix}")
    try:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await api.sessions.GetSession(session_service_pb2.GetSessionRequest(session_id="nope"))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        await api.channel.close()
    # gRPC sends an aborted call's status before the handler's exception reaches the
    # interceptor that counts it: the count may land just after the client saw the error.
    after = _errors(await asyncio.to_thread(_scrape, daemon))
    for _ in range(100):
        if sum(after.values()):
            break
        await asyncio.sleep(0.05)
        after = _errors(await asyncio.to_thread(_scrape, daemon))
    # The error lands on a series that was already there: `rate` sees it.
    assert set(after) == set(before)
    assert after[("SessionService/GetSession", "NOT_FOUND")] == 1.0
    assert sum(after.values()) == 1.0


async def test_storage_gauges_report_live_data_and_free_space(daemon: Daemon) -> None:
    api = stubs_for(f"unix:{daemon.endpoints.unix}")
    try:
        await api.sessions.CreateSession(
            session_service_pb2.CreateSessionRequest(session=session_pb2.Session(session_id="s"))
        )
    finally:
        await api.channel.close()
    scrape = await asyncio.to_thread(_scrape, daemon)
    parts = dict(re.findall(r'^ctxcc_rocksdb_size_bytes\{part="(\w+)"\} (\S+)$', scrape, re.M))
    assert set(parts) == {"live_sst", "wal", "memtable"}
    # Nothing has been flushed yet: the session is in the WAL and the memtables.
    assert float(parts["wal"]) > 0 and float(parts["memtable"]) > 0
    free = re.search(r"^ctxcc_data_dir_free_bytes (\S+)$", scrape, re.M)
    capacity = re.search(r"^ctxcc_data_dir_capacity_bytes (\S+)$", scrape, re.M)
    assert free and capacity
    fs = os.statvfs(daemon.cfg.db_path)
    assert float(capacity.group(1)) == fs.f_blocks * fs.f_frsize
    assert 0 < float(free.group(1)) <= float(capacity.group(1))


async def test_health_command_reports_serving_not_serving_and_unreachable(
    short_tmp: Path, daemon: Daemon
) -> None:
    socket = f"unix:{daemon.endpoints.unix}"
    up = await asyncio.to_thread(_ctxcc, "health", "--target", socket)
    assert (up.returncode, up.stdout.strip()) == (0, f"SERVING ({socket})")
    tcp = await asyncio.to_thread(_ctxcc, "health", "--target", str(daemon.endpoints.tcp))
    assert tcp.returncode == 0, tcp.stderr
    # Without --target: the socket `ctxcc serve` would create with the same settings.
    env = {"CTXCC_DATA_DIR": str(daemon.cfg.data_dir), "CTXCC_SOCKET": ""}
    found = await asyncio.to_thread(_ctxcc, "health", env=env)
    assert (found.returncode, found.stdout.strip()) == (0, f"SERVING ({socket})")
    unknown = await asyncio.to_thread(_ctxcc, "health", "--target", socket, "--service", "x.Y")
    assert unknown.returncode == 1 and "unknown service 'x.Y'" in unknown.stderr
    bad = await asyncio.to_thread(_ctxcc, "health", env={"CTXCC_LISTEN": "nowhere"})
    assert bad.returncode == 2 and "listen must be host:port" in bad.stderr
    await daemon._health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    down = await asyncio.to_thread(_ctxcc, "health", "--target", socket)
    assert down.returncode == 1 and f"NOT_SERVING ({socket})" in down.stderr
    gone = f"unix:{short_tmp / 'absent.sock'}"
    away = await asyncio.to_thread(_ctxcc, "health", "--target", gone, "--timeout", "1")
    assert away.returncode == 1 and "unreachable: UNAVAILABLE" in away.stderr
    # No deadline to wait for, or one past what gRPC's clock holds (taken as passed
    # already: every check failed as unreachable at once): bad arguments.
    for timeout in ("0", "-1", "nan", "soon", "1e10"):
        odd = await asyncio.to_thread(_ctxcc, "health", "--target", socket, "--timeout", timeout)
        assert odd.returncode == 2 and "argument --timeout" in odd.stderr, (timeout, odd.stderr)
    # A day is waited for: the (not serving) daemon answers.
    day = await asyncio.to_thread(_ctxcc, "health", "--target", socket, "--timeout", "86400")
    assert day.returncode == 1 and f"NOT_SERVING ({socket})" in day.stderr, day.stderr


async def test_health_without_target_falls_back_from_the_socket_to_the_ports(
    short_tmp: Path, daemon: Daemon
) -> None:
    # From another directory the default relative socket (data/ctxcc.sock) is not there:
    # the API port the same settings name answers instead.
    tcp = str(daemon.endpoints.tcp)
    env = {"CTXCC_LISTEN": tcp, "CTXCC_HEALTH_LISTEN": "none"}
    found = await asyncio.to_thread(_ctxcc, "health", env=env, cwd=short_tmp)
    assert (found.returncode, found.stdout.strip()) == (0, f"SERVING ({tcp})"), found.stderr
    # The first that answers decides: a NOT_SERVING port is not passed over for the next.
    await daemon._health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    env = {"CTXCC_HEALTH_LISTEN": tcp, "CTXCC_LISTEN": "127.0.0.1:1"}
    down = await asyncio.to_thread(_ctxcc, "health", env=env, cwd=short_tmp)
    assert down.returncode == 1 and f"NOT_SERVING ({tcp})" in down.stderr
    # Nothing answers: every target tried is named.
    env = {"CTXCC_LISTEN": "127.0.0.1:1", "CTXCC_HEALTH_LISTEN": "none"}
    away = await asyncio.to_thread(_ctxcc, "health", "--timeout", "2", env=env, cwd=short_tmp)
    assert away.returncode == 1
    assert "(unix:data/ctxcc.sock)" in away.stderr and "(127.0.0.1:1)" in away.stderr


async def test_sessions_into_a_closed_pipe_ends_quietly(daemon: Daemon) -> None:
    api = stubs_for(f"unix:{daemon.endpoints.unix}")
    try:
        for i in range(3):
            session = session_pb2.Session(session_id=f"s{i}")
            await api.sessions.CreateSession(
                session_service_pb2.CreateSessionRequest(session=session)
            )
    finally:
        await api.channel.close()

    def run_into_closed_pipe() -> subprocess.CompletedProcess[str]:
        # `ctxcc sessions | head -0`, made deterministic: the reader is gone before the
        # first write, so every write meets EPIPE.
        read, write = os.pipe()
        os.close(read)
        try:
            return subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "server",
                    "sessions",
                    "--target",
                    f"unix:{daemon.endpoints.unix}",
                ],
                cwd=REPO,
                stdout=write,
                stderr=subprocess.PIPE,
                text=True,
                timeout=60,
                check=False,
            )
        finally:
            os.close(write)

    done = await asyncio.to_thread(run_into_closed_pipe)
    assert done.stderr == ""  # no BrokenPipeError traceback
    assert done.returncode == 141  # what a shell shows for a filter ended by SIGPIPE


async def test_sessions_lists_every_session_when_one_view_is_over_the_message_size(
    short_tmp: Path,
) -> None:
    """`ctxcc sessions` rebuilds each session's view over unary Compile: one view over
    the daemon's message size failed the whole listing. Its row now says why it has no
    figures, and the others are listed; the longest decision keeps its column apart."""
    d = Daemon(make_config(short_tmp / "d", max_message_bytes=str(1 << 20)))
    await d.start()
    target = f"unix:{d.endpoints.unix}"
    api = stubs_for(target)
    try:
        for sid in ("big", "over", "small"):
            await api.sessions.CreateSession(
                session_service_pb2.CreateSessionRequest(
                    session=session_pb2.Session(session_id=sid)
                )
            )
        texts = {"big": ["word " * 120_000] * 2, "over": ["word " * 3_000], "small": ["hi"]}
        for sid, parts in texts.items():
            for text in parts:  # one message each: the append is under the size too
                await api.sessions.AppendEvents(
                    session_service_pb2.AppendEventsRequest(session_id=sid, events=[user(text)])
                )
        # A recorded compile over a small window: rebuilt, it is over budget.
        tiny = compile_service_pb2.CompileRequest(
            session_id="over",
            route=ROUTE,
            limits=compile_service_pb2.ModelLimits(context_window=2_000),
        )
        await api.compiles.Compile(tiny)
        args = ("sessions", "--target", target, "--model", "gpt-4o")
        listed = await asyncio.to_thread(_ctxcc, *args)
        assert listed.returncode == 0, listed.stderr
        rows = {line.split()[0]: line for line in listed.stdout.splitlines()[1:]}
        assert set(rows) == {"big", "over", "small"}
        assert "(RESOURCE_EXHAUSTED)" in rows["big"]
        assert re.search(r"over_budget_send_anyway +\w", rows["over"]), rows["over"]
        assert " ok " in rows["small"]
        as_json = await asyncio.to_thread(_ctxcc, *args, "--json")
        by_id = {r["session_id"]: r for r in json.loads(as_json.stdout)}
        assert by_id["big"]["error"] == "RESOURCE_EXHAUSTED" and "decision" not in by_id["big"]
        assert by_id["small"]["decision"] == "ok"
    finally:
        await api.channel.close()
        await d.stop()


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (("inspect", "s0", "--at-seq", "-3"), "--at-seq"),
        (("inspect", "s0", "--at-seq", str(1 << 64)), "--at-seq"),
        (("inspect", "s0", "--top", "-1"), "--top"),
        (("sessions", "--limit", "-1"), "--limit"),
        (("sessions", "--limit", "99999999999"), "--limit"),
    ],
)
async def test_inspect_and_sessions_refuse_counts_out_of_range_with_usage(
    daemon: Daemon, args: tuple[str, ...], flag: str
) -> None:
    """A count the request cannot carry (a negative seq, a page over uint32) made protobuf
    raise ValueError: a traceback. It is a usage error naming the flag (exit 2)."""
    api = stubs_for(f"unix:{daemon.endpoints.unix}")
    try:
        await api.sessions.CreateSession(
            session_service_pb2.CreateSessionRequest(session=session_pb2.Session(session_id="s0"))
        )
    finally:
        await api.channel.close()
    done = await asyncio.to_thread(_ctxcc, *args, "--target", f"unix:{daemon.endpoints.unix}")
    assert done.returncode == 2, done.stderr
    assert f"error: argument {flag}:" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
