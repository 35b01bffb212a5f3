"""Fixtures: a real daemon (RocksDB in a temp dir, gRPC on a Unix socket and on
127.0.0.1:0, /metrics on an ephemeral port) and channels to it."""

from __future__ import annotations

import os
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import pytest

from ctxcc.v1 import (
    artifact_service_pb2_grpc,
    compile_service_pb2_grpc,
    session_service_pb2_grpc,
    source_service_pb2_grpc,
    tool_service_pb2_grpc,
)
from server.app import Daemon
from server.config import Config, resolve

if TYPE_CHECKING:
    from ctxcc.v1.artifact_service_pb2_grpc import ArtifactServiceAsyncStub
    from ctxcc.v1.compile_service_pb2_grpc import CompileServiceAsyncStub
    from ctxcc.v1.session_service_pb2_grpc import SessionServiceAsyncStub
    from ctxcc.v1.source_service_pb2_grpc import SourceServiceAsyncStub
    from ctxcc.v1.tool_service_pb2_grpc import ToolServiceAsyncStub


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    # Unix socket paths are limited to 107 bytes; pytest's tmp_path can be longer.
    with tempfile.TemporaryDirectory(prefix="ctxcc-", dir="/tmp") as d:
        yield Path(d)


def make_config(data_dir: Path, **overrides: str) -> Config:
    flags = {
        "data_dir": str(data_dir),
        "listen": "127.0.0.1:0",
        "metrics_listen": "127.0.0.1:0",
        "ui_listen": "127.0.0.1:0",
        "grace_period": "2",
        **overrides,
    }
    return resolve(flags, env={})


@dataclass
class Stubs:
    channel: grpc.aio.Channel
    sessions: SessionServiceAsyncStub
    compiles: CompileServiceAsyncStub
    artifacts: ArtifactServiceAsyncStub
    sources: SourceServiceAsyncStub
    tools: ToolServiceAsyncStub


def stubs_for(target: str) -> Stubs:
    channel = grpc.aio.insecure_channel(
        target, options=[("grpc.max_receive_message_length", 64 << 20)]
    )
    return Stubs(
        channel,
        session_service_pb2_grpc.SessionServiceStub(channel),
        compile_service_pb2_grpc.CompileServiceStub(channel),
        artifact_service_pb2_grpc.ArtifactServiceStub(channel),
        source_service_pb2_grpc.SourceServiceStub(channel),
        tool_service_pb2_grpc.ToolServiceStub(channel),
    )


@pytest.fixture
async def daemon(short_tmp: Path) -> AsyncIterator[Daemon]:
    d = Daemon(make_config(short_tmp))
    await d.start()
    try:
        yield d
    finally:
        await d.stop()


@pytest.fixture
async def unix_api(daemon: Daemon) -> AsyncIterator[Stubs]:
    """Stubs over the Unix socket only (a test that needs one transport)."""
    s = stubs_for(f"unix:{daemon.endpoints.unix}")
    try:
        yield s
    finally:
        await s.channel.close()


@pytest.fixture(params=["tcp", "unix"])
async def api(request: pytest.FixtureRequest, daemon: Daemon) -> AsyncIterator[Stubs]:
    """Stubs over TCP and over the Unix socket: every API test runs on both."""
    if request.param == "tcp":
        target = str(daemon.endpoints.tcp)
    else:
        target = f"unix:{daemon.endpoints.unix}"
    s = stubs_for(target)
    try:
        yield s
    finally:
        await s.channel.close()


os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
