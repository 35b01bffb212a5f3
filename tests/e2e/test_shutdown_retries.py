"""SIGTERM while clients keep retrying, as the Python client does: the daemon's drain is not
held open by the calls it turns away, and a stream step turned away is always a retryable
UNAVAILABLE in the client, never grpc's INTERNAL for a request it could not write."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import grpc
from ctxcc_client import AsyncClient, CtxccError, user

from ctxcc.v1 import artifact_service_pb2 as apb
from ctxcc.v1 import artifact_service_pb2_grpc
from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_service_pb2 as spb
from tests.e2e.proc import UPLOAD, DaemonProcess, open_upload
from tests.helpers import ROUTE

BLOB = bytes(range(256)) * 512  # 128 KiB: an upload kept open after its first 64 KiB
# Stream steps sent, one attempt each, while the daemon turns every new call away.
TURNED_AWAY = 300


async def _texts(ctx: AsyncClient, sid: str) -> list[str]:
    req = spb.ListEventsRequest(session_id=sid, page_size=1000)
    texts: list[str] = []
    while True:
        page = await ctx.sessions.ListEvents(req)
        assert [e.seq for e in page.events] == list(
            range(len(texts) + 1, len(texts) + 1 + len(page.events))
        )
        texts += [e.user_message.parts[0].text for e in page.events]
        if not page.next_page_token:
            return texts
        req.page_token = page.next_page_token


def test_a_retrying_client_does_not_hold_the_drain_for_the_grace_period(short_tmp: Path) -> None:
    """A client that retries its append every 50-250 ms (the Python client's backoff) sends
    the draining daemon a call more often than the drain's 0.3 s settle time. Those calls
    are answered SHUTTING_DOWN at once; counting them as activity kept the drain from ever
    settling, so the daemon waited out its whole grace period at every SIGTERM."""
    d = DaemonProcess(short_tmp / "data", "--grace-period", "600").start()
    d.wait_ready()
    assert d.proc is not None
    proc = d.proc

    async def run() -> tuple[list[str], list[str], int]:
        async with AsyncClient(d.target, retry_seconds=300) as ctx:
            await ctx.create_session("s")
            acked: list[str] = []
            stop = asyncio.Event()
            twenty, one_more = asyncio.Event(), asyncio.Event()

            async def appender() -> None:
                i = 0
                while not stop.is_set():
                    await ctx.append("s", [user(f"append {i}")])  # retried until acknowledged
                    acked.append(f"append {i}")
                    one_more.set()
                    if len(acked) >= 20:
                        twenty.set()
                    i += 1

            task = asyncio.create_task(appender())
            await twenty.wait()
            os.kill(proc.pid, signal.SIGTERM)
            # A bound, not a measurement: the grace period is 600 s, and a drain that
            # settles is done within a few seconds even on a loaded machine.
            rc = await asyncio.to_thread(proc.wait, 120)
            # The client is still retrying its append; the daemon comes back on the same
            # data directory and socket, and the append goes through (once).
            d.start()
            await asyncio.to_thread(d.wait_ready)
            one_more.clear()
            await one_more.wait()
            stop.set()
            await task
            texts = await _texts(ctx, "s")
            assert d.terminate(60) == 0
            return acked, texts, rc

    try:
        acked, texts, rc = asyncio.run(run())
    finally:
        d.ensure_stopped()
    assert rc == 0
    assert texts == acked


def test_stream_steps_turned_away_at_shutdown_fail_as_unavailable(short_tmp: Path) -> None:
    """While the daemon drains (held open here by an upload still sending), a new
    CompileStream is answered UNAVAILABLE/SHUTTING_DOWN as soon as it arrives, often
    while the client is still writing the step: grpc.aio then reports its failed write as
    INTERNAL "Internal error from Core" instead of the daemon's status, and a step that
    raised that was not retried (the clients retry only UNAVAILABLE). Each step here
    gets one attempt (retry_seconds=0), so each shows what one turned-away attempt
    raises; nothing of any of them is appended."""
    d = DaemonProcess(short_tmp / "data", "--grace-period", "600").start()
    d.wait_ready()
    assert d.proc is not None
    proc = d.proc

    async def run() -> tuple[dict[str, int], list[str]]:
        async with AsyncClient(d.target, retry_seconds=0) as ctx:
            await ctx.create_session("s")
            first = ctx.stream()
            await first.step(cpb.CompileRequest(session_id="s", route=ROUTE), [user("first")])
            await first.close()
            async with grpc.aio.insecure_channel(d.target) as ch:
                artifacts: Any = artifact_service_pb2_grpc.ArtifactServiceStub(ch)
                upload = await open_upload(artifacts, "s", BLOB)
                await asyncio.to_thread(d.wait_in_flight, UPLOAD, 1)
                os.kill(proc.pid, signal.SIGTERM)
                await asyncio.to_thread(d.wait_health, 2)  # NOT_SERVING: draining
                outcomes: dict[str, int] = {}
                for i in range(TURNED_AWAY):
                    stream = ctx.stream()
                    try:
                        await stream.step(
                            cpb.CompileRequest(session_id="s", route=ROUTE), [user(f"late {i}")]
                        )
                        key = "answered"
                    except CtxccError as err:
                        key = err.code.name
                    outcomes[key] = outcomes.get(key, 0) + 1
                    await stream.close()
                # The upload was admitted before the signal: it finishes, then the
                # daemon exits.
                await upload.write(apb.UploadArtifactRequest(data=BLOB[65536:]))
                await upload.done_writing()
                await upload
            assert await asyncio.to_thread(proc.wait, 120) == 0
            d.start()
            await asyncio.to_thread(d.wait_ready)
            texts = await _texts(ctx, "s")
            assert d.terminate(60) == 0
            return outcomes, texts

    try:
        outcomes, texts = asyncio.run(run())
    finally:
        d.ensure_stopped()
    assert outcomes == {"UNAVAILABLE": TURNED_AWAY}
    assert texts == ["first"]
