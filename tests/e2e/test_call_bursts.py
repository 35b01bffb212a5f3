"""Many calls opened at once on one connection: each reaches the daemon and is answered.
gRPC holds calls the event loop has not taken yet, and past its default limit (1,000)
it cancelled a share of them at random, a bare CANCELLED that no handler sent."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import compile_service_pb2_grpc
from tests.e2e.proc import DaemonProcess
from tests.helpers import ROUTE

STREAMS = 3_000


@pytest.fixture
def daemon(short_tmp: Path) -> Iterator[DaemonProcess]:
    plain = DaemonProcess(short_tmp / "data", "--metrics-listen", "none", "--ui-listen", "none")
    with plain.serving() as d:
        yield d


async def test_a_burst_of_streams_on_one_connection_is_served_whole(
    daemon: DaemonProcess,
) -> None:
    step = cpb.CompileStreamRequest(
        step=cpb.StepRequest(
            step_id="s1", compile=cpb.CompileRequest(session_id="nobody", route=ROUTE)
        )
    )
    async with grpc.aio.insecure_channel(daemon.target) as channel:
        stub: Any = compile_service_pb2_grpc.CompileServiceStub(channel)
        calls = [stub.CompileStream(timeout=300) for _ in range(STREAMS)]
        await asyncio.gather(*(call.write(step) for call in calls), return_exceptions=True)
        answers = await asyncio.gather(*(call.read() for call in calls), return_exceptions=True)
        outcome: collections.Counter[str] = collections.Counter()
        for call, answer in zip(calls, answers, strict=True):
            if isinstance(answer, cpb.CompileStreamResponse):
                outcome[answer.error.reason or "answered"] += 1
            else:
                outcome[(await call.code()).name] += 1
            call.cancel()
    # Every step reached its handler: SESSION_NOT_FOUND in-band, the stream open.
    assert outcome == {"SESSION_NOT_FOUND": STREAMS}, outcome
