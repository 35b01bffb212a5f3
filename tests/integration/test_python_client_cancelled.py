"""A daemon stopping on SIGTERM drains its calls, then gRPC's own `server.stop` cancels
the calls that reach it meanwhile with a bare CANCELLED (no ErrorInfo): a client
retrying every 50-250 ms sends some into that window. scripts/stress_durability.py saw
it on GetSession, AppendEvents, CreateCheckpoint, CompileStream steps and watches at one
SIGTERM in 16 (a tight retry loop: 2 SIGTERMs in 10). The Python client retries such a
call as after UNAVAILABLE when it is safe to repeat, and never a call that is not.

That window is a few milliseconds of grpc's shutdown, which no test can aim a call at,
so the CANCELLED comes here from a plain grpc.aio server that answers each call's first
attempt with it, as grpc's stop does; what is under test is the client."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from ctxcc_client import AsyncClient, CtxccError, user

from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import (
    compile_service_pb2_grpc,
    event_pb2,
    session_pb2,
    session_service_pb2_grpc,
    view_pb2,
)
from ctxcc.v1 import session_service_pb2 as spb


class FirstCancelled:
    """Counts attempts per method; the first of each is cancelled as grpc's stop does."""

    def __init__(self) -> None:
        self.attempts: Counter[str] = Counter()
        self.request_ids: list[str] = []

    async def first_cancelled(self, method: str, context: Any) -> None:
        self.attempts[method] += 1
        if self.attempts[method] == 1:
            await context.abort(grpc.StatusCode.CANCELLED, "CANCELLED")


class Sessions(session_service_pb2_grpc.SessionServiceServicer):
    def __init__(self, state: FirstCancelled) -> None:
        self.state = state

    async def GetSession(self, request: Any, context: Any) -> spb.GetSessionResponse:
        await self.state.first_cancelled("GetSession", context)
        return spb.GetSessionResponse(session=session_pb2.Session(session_id="s", head_seq=2))

    async def DeleteSession(self, request: Any, context: Any) -> spb.DeleteSessionResponse:
        await self.state.first_cancelled("DeleteSession", context)
        return spb.DeleteSessionResponse()

    async def AppendEvents(self, request: Any, context: Any) -> spb.AppendEventsResponse:
        self.state.request_ids.append(request.request_id)
        await self.state.first_cancelled("AppendEvents", context)
        return spb.AppendEventsResponse(first_seq=1, last_seq=1, replayed=True)

    async def WatchSession(self, request: Any, context: Any) -> AsyncIterator[Any]:
        log = [event_pb2.Event(seq=n, event_id=f"e{n}") for n in (1, 2)]
        self.state.attempts["WatchSession"] += 1
        for ev in log[request.after_seq :]:
            yield spb.WatchSessionResponse(event=ev)
            if self.state.attempts["WatchSession"] == 1:
                await context.abort(grpc.StatusCode.CANCELLED, "CANCELLED")


class Compiles(compile_service_pb2_grpc.CompileServiceServicer):
    def __init__(self, state: FirstCancelled) -> None:
        self.state = state

    async def CompileStream(self, requests: Any, context: Any) -> AsyncIterator[Any]:
        async for req in requests:
            self.state.request_ids.append(req.step.request_id)
            await self.state.first_cancelled("CompileStream", context)
            yield cpb.CompileStreamResponse(
                step_id=req.step.step_id,
                view=view_pb2.CompiledView(compile_id="c1", event_boundary=1),
                append=cpb.AppendResult(first_seq=1, last_seq=1, replayed=True),
            )


async def serve(state: FirstCancelled, sock: Path) -> grpc.aio.Server:
    server = grpc.aio.server()
    session_service_pb2_grpc.add_SessionServiceServicer_to_server(
        Sessions(state),  # type: ignore[abstract]  # only the RPCs the test calls
        server,
    )
    compile_service_pb2_grpc.add_CompileServiceServicer_to_server(
        Compiles(state),  # type: ignore[abstract]
        server,
    )
    server.add_insecure_port(f"unix:{sock}")
    await server.start()
    return server


async def test_calls_safe_to_repeat_are_retried_after_a_bare_cancelled(short_tmp: Path) -> None:
    state = FirstCancelled()
    server = await serve(state, short_tmp / "s.sock")
    try:
        async with AsyncClient(f"unix:{short_tmp / 's.sock'}", retry_seconds=10) as c:
            assert (await c.get_session("s")).head_seq == 2
            assert state.attempts["GetSession"] == 2

            appended = await c.append("s", [user("one")])
            assert appended.last_seq == 1
            # Both attempts carried the one request id fixed before the first.
            assert len(state.request_ids) == 2 and len(set(state.request_ids)) == 1

            state.request_ids.clear()
            stream = c.stream()
            view, append = await stream.step(
                cpb.CompileRequest(session_id="s"), [user("two")], request_id="step-1"
            )
            assert view.compile_id == "c1" and append is not None
            assert state.request_ids == ["step-1", "step-1"]
            await stream.close()

            got = []
            async for msg in c.watch("s"):
                got.append(msg.event.seq)
                if len(got) == 2:
                    break
            # The watch was cancelled after event 1 and reopened after it: 1, 2, no repeat.
            assert got == [1, 2] and state.attempts["WatchSession"] == 2
    finally:
        await server.stop(None)


async def test_a_call_not_safe_to_repeat_is_not_retried(short_tmp: Path) -> None:
    state = FirstCancelled()
    server = await serve(state, short_tmp / "s.sock")
    try:
        async with AsyncClient(f"unix:{short_tmp / 's.sock'}", retry_seconds=10) as c:
            with pytest.raises(CtxccError) as caught:
                await c.sessions.DeleteSession(spb.DeleteSessionRequest(session_id="s"))
            # Whether it ran is unknown, as when a connection drops.
            assert caught.value.code == grpc.StatusCode.UNAVAILABLE
            assert state.attempts["DeleteSession"] == 1
    finally:
        await server.stop(None)
