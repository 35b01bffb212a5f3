"""Server reflection describes the whole API: every service, method and message of
proto/ resolves through the reflection service alone, as grpcurl, ghz or Postman
load it (the official Python reflection client, with no local descriptors)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf import descriptor_pool
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from ctxcc.v1 import (
    artifact_service_pb2,
    compile_service_pb2,
    session_service_pb2,
    source_service_pb2,
    tool_service_pb2,
)
from tests.e2e.proc import DaemonProcess

SERVICES = [
    m.DESCRIPTOR.services_by_name[name]
    for m in (
        session_service_pb2,
        compile_service_pb2,
        artifact_service_pb2,
        source_service_pb2,
        tool_service_pb2,
    )
    for name in m.DESCRIPTOR.services_by_name
]


def _messages_of(service: object) -> set[str]:
    """Every message a service's methods reach, through fields, transitively."""
    out: set[str] = set()
    todo = [
        t
        for m in service.methods  # type: ignore[attr-defined]
        for t in (m.input_type, m.output_type)
    ]
    while todo:
        msg = todo.pop()
        if msg.full_name in out:
            continue
        out.add(msg.full_name)
        todo.extend(f.message_type for f in msg.fields if f.message_type is not None)
        todo.extend(msg.nested_types)
    return out


@pytest.fixture(scope="module")
def target() -> Iterator[str]:
    d = DaemonProcess(Path("/tmp") / f"ctxcc-reflect-{os.getpid()}")
    d.start()
    d.wait_ready()
    try:
        yield d.target
    finally:
        d.terminate()
        d.ensure_stopped()
        shutil.rmtree(d.data_dir, ignore_errors=True)
        d.log_path.unlink(missing_ok=True)


def test_every_service_and_message_resolves_through_reflection(target: str) -> None:
    with grpc.insecure_channel(target) as channel:
        db = ProtoReflectionDescriptorDatabase(channel)
        listed = set(db.get_services())
        expected = {s.full_name for s in SERVICES}
        assert expected <= listed, expected - listed
        pool = descriptor_pool.DescriptorPool(db)
        checked = 0
        for service in SERVICES:
            found = pool.FindServiceByName(service.full_name)
            assert [m.name for m in found.methods] == [m.name for m in service.methods]
            for name in sorted(_messages_of(service)):
                remote = pool.FindMessageTypeByName(name)
                local = service.file.pool.FindMessageTypeByName(name)
                assert [f.name for f in remote.fields] == [f.name for f in local.fields], name
                checked += 1
            # Symbols by their method names too, as `grpcurl describe Svc.Method` asks.
            for method in service.methods:
                assert db.FindFileContainingSymbol(method.full_name) is not None
        assert checked > 50


def test_every_file_and_dependency_resolves_by_name(target: str) -> None:
    """Clients like ghz load files by name, following imports (well-known types too)."""
    with grpc.insecure_channel(target) as channel:
        db = ProtoReflectionDescriptorDatabase(channel)
        assert "grpc.health.v1.Health" in set(db.get_services())
        seen: set[str] = set()
        todo = [s.file.name for s in SERVICES]
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            proto = db.FindFileByName(name)
            assert proto.name == name
            todo.extend(proto.dependency)
            for enum in proto.enum_type:
                assert db.FindFileContainingSymbol(f"{proto.package}.{enum.name}") is not None
        assert "google/protobuf/timestamp.proto" in seen or any("google/" in n for n in seen)


GRPCURL = Path(__file__).resolve().parents[2] / ".tools" / "bin" / "grpcurl"
_TYPE = re.compile(r"\.((?:ctxcc|google)\.[A-Za-z0-9_.]+)")


def test_grpcurl_describes_every_symbol_through_reflection(target: str) -> None:
    """`grpcurl describe` of every service, then of every type they name, transitively."""
    assert GRPCURL.exists(), "run `make test`: it installs grpcurl (pinned) first"
    address = target.replace("unix:", "unix://", 1)

    def grpcurl(*args: str) -> str:
        done = subprocess.run(
            [str(GRPCURL), "-plaintext", address, *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, (args, done.stderr)
        return done.stdout

    services = grpcurl("list").split()
    assert {s.full_name for s in SERVICES} <= set(services)
    todo, seen = list(services), set()
    while todo:
        symbol = todo.pop()
        if symbol in seen:
            continue
        seen.add(symbol)
        todo.extend(_TYPE.findall(grpcurl("describe", symbol)))
    assert len(seen) > 100, len(seen)
