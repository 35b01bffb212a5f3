"""The Python client across a daemon that goes away and comes back: typed errors (never a
raw AioRpcError, never a dead iterator), the same stream object working again, and a
step's request id fixed before its first attempt."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from ctxcc_client import AsyncClient, Client, CompileStream, CtxccError, retry, user

from ctxcc.v1 import common_pb2, view_pb2
from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_service_pb2 as spb
from server.app import Daemon
from tests.conftest import make_config

ROUTE = common_pb2.Route(connection="t", protocol="fake", endpoint="local", model="gpt-4o")


async def test_stream_survives_a_daemon_that_is_gone_then_back(short_tmp: Path) -> None:
    first = Daemon(make_config(short_tmp))
    await first.start()
    target = f"unix:{first.endpoints.unix}"
    # The retry budget must outlast the client's longest reconnect backoff (500 ms plus
    # grpc's 20 % jitter): with 0.5 s a restarted daemon was sometimes never tried again
    # before the step gave up ("No such file or directory" on the old socket, under load).
    async with AsyncClient(target, retry_seconds=2.0) as ctx:
        session = await ctx.create_session()
        req = cpb.CompileRequest(session_id=session.session_id, route=ROUTE)
        stream = ctx.stream()
        view, appended = await stream.step(req, [user("one")])
        assert appended is not None and view.event_boundary == 1
        await first.stop()
        for _ in range(2):  # a second try is the same typed error, not StopAsyncIteration
            with pytest.raises(CtxccError) as err:
                await stream.step(req, [user("two")])
            assert err.value.code == grpc.StatusCode.UNAVAILABLE
        with pytest.raises(CtxccError) as err:
            await ctx.get_session(session.session_id)
        assert err.value.code == grpc.StatusCode.UNAVAILABLE
        # Nobody answered, so no ErrorInfo: the code is the reason, and said once.
        assert err.value.reason == "UNAVAILABLE" and str(err.value).count("UNAVAILABLE") == 1
        second = Daemon(make_config(short_tmp))
        await second.start()
        try:
            assert f"unix:{second.endpoints.unix}" == target
            view, appended = await stream.step(req, [user("two")])
            assert appended is not None and (appended.first_seq, appended.last_seq) == (2, 2)
            assert view.event_boundary == 2
            with pytest.raises(CtxccError) as missing:
                await ctx.compile("no-such-session", route=ROUTE)
            assert missing.value.reason == "SESSION_NOT_FOUND"
            assert str(missing.value).startswith("NOT_FOUND SESSION_NOT_FOUND: ")
        finally:
            await second.stop()


# Longer than the test's deadlines by far: a call that waited for its retry budget instead
# of its deadline ends UNAVAILABLE, after this.
LONG_RETRY_BUDGET = 20.0


async def test_a_calls_timeout_bounds_it_through_its_retries(short_tmp: Path) -> None:
    """`timeout=` on a wrapped unary call is the whole call's deadline, as a deadline is in
    the Go client: every attempt got it whole, so against a daemon that is not there a call
    with timeout=0.5 was retried for the full budget (20 s here, 30 s by default) and ended
    UNAVAILABLE. It ends DEADLINE_EXCEEDED at its deadline; with the daemon there, a call
    with a timeout is answered as before."""
    target = f"unix:{short_tmp / 'ctxcc.sock'}"
    get = spb.GetSessionRequest(session_id="s-000000000000000000000000")
    create = spb.CreateSessionRequest()
    async with AsyncClient(target, retry_seconds=LONG_RETRY_BUDGET) as ctx:
        for call in (
            ctx.sessions.GetSession(get, timeout=0.5),
            ctx.sessions.CreateSession(create, timeout=0.5),
        ):
            with pytest.raises(CtxccError) as err:
                await call
            assert err.value.code == grpc.StatusCode.DEADLINE_EXCEEDED, err.value
            assert err.value.reason == "DEADLINE_EXCEEDED"
    with Client(target, retry_seconds=LONG_RETRY_BUDGET) as sync:
        with pytest.raises(CtxccError) as err:
            sync.sessions.GetSession(get, timeout=0.5)
        assert err.value.code == grpc.StatusCode.DEADLINE_EXCEEDED, err.value
    d = Daemon(make_config(short_tmp))
    await d.start()
    try:
        async with AsyncClient(target, retry_seconds=LONG_RETRY_BUDGET) as ctx:
            made = await ctx.sessions.CreateSession(create, timeout=30)
            sid = made.session.session_id
            got = await ctx.sessions.GetSession(spb.GetSessionRequest(session_id=sid), timeout=30)
            assert got.session.session_id == sid
    finally:
        await d.stop()


async def test_watch_goes_on_across_a_daemon_restart(short_tmp: Path) -> None:
    """A client's watch reopens after its daemon restarted, from the last event it got,
    as its README says: the daemon ends watches at shutdown as it ends idle compile
    streams (UNAVAILABLE, SHUTTING_DOWN). It ended them cleanly, which a client takes for
    the end of the watch: the watch stopped at the restart, nothing after it came."""
    first = Daemon(make_config(short_tmp))
    await first.start()
    target = f"unix:{first.endpoints.unix}"
    got: asyncio.Queue[Any] = asyncio.Queue()
    async with AsyncClient(target, retry_seconds=30.0) as ctx:
        session = await ctx.create_session()
        sid = session.session_id
        await ctx.append(sid, [user("one")])

        async def watching() -> None:
            try:
                async for update in ctx.watch(sid):
                    await got.put(update.event.seq if update.HasField("event") else update)
            finally:
                await got.put(None)  # the watch ended

        task = asyncio.ensure_future(watching())
        second = None
        try:
            assert await asyncio.wait_for(got.get(), 30) == 1  # a bound, not a wait
            await first.stop()
            second = Daemon(make_config(short_tmp))
            await second.start()
            await ctx.append(sid, [user("two")])
            assert await asyncio.wait_for(got.get(), 30) == 2
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            if second is not None:
                await second.stop()


class _Answering:
    """A CompileStream call that takes each request and answers it with `answer` (which
    may raise, as a call that fails)."""

    def __init__(
        self,
        requests: Any,
        sent: list[cpb.CompileStreamRequest],
        answer: Callable[[cpb.CompileStreamRequest], cpb.CompileStreamResponse],
    ) -> None:
        self._requests = requests.__aiter__()
        self._sent = sent
        self._answer = answer

    def __aiter__(self) -> _Answering:
        return self

    async def __anext__(self) -> cpb.CompileStreamResponse:
        request: cpb.CompileStreamRequest = await self._requests.__anext__()
        self._sent.append(request)
        return self._answer(request)

    def cancel(self) -> None:
        pass


def _gone(request: cpb.CompileStreamRequest) -> cpb.CompileStreamResponse:
    """A dropped connection."""
    empty = grpc.aio.Metadata()
    raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, empty, empty, "gone")


class _Stub:
    def __init__(self) -> None:
        self.sent: list[cpb.CompileStreamRequest] = []

    def CompileStream(self, requests: Any) -> _Answering:
        return _Answering(requests, self.sent, _gone)


async def test_a_step_keeps_its_request_id_through_retries_and_a_second_try(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The retry budget is read from a clock that moves 0.1 s per reading, so that each step
    # makes the same attempts however loaded the machine (on the real clock, a first
    # attempt stalled for 0.3 s left no time for the second one this test needs).
    ticks = itertools.count()
    clock = SimpleNamespace(monotonic=lambda: next(ticks) / 10, sleep=time.sleep)
    monkeypatch.setattr(retry, "time", clock)
    stub = _Stub()
    stream = CompileStream(stub, retry_seconds=0.3)
    req = cpb.CompileRequest(session_id="s", route=ROUTE)
    with pytest.raises(CtxccError):
        await stream.step(req, [user("one")])
    first = {m.step.request_id for m in stub.sent}
    assert len(stub.sent) >= 2 and len(first) == 1 and "" not in first
    stub.sent.clear()
    with pytest.raises(CtxccError):  # the agent tries the same step again
        await stream.step(req, [user("one")])
    assert {m.step.request_id for m in stub.sent} == first
    stub.sent.clear()
    with pytest.raises(CtxccError):  # a different step gets its own id
        await stream.step(req, [user("two")])
    assert {m.step.request_id for m in stub.sent}.isdisjoint(first)


async def test_a_step_tried_again_after_its_compile_failed_appends_once(
    short_tmp: Path,
) -> None:
    """A step's compile may fail after its events were appended (here `as_of_seq` beyond
    the head; a compile over its CPU budget is the everyday case, and the README says to
    retry it): `step` again with the same events reuses the request id, so the append is
    replayed (the client before picked a new id on any error but UNAVAILABLE, and the
    events went into the log twice)."""
    d = Daemon(make_config(short_tmp))
    await d.start()
    try:
        async with AsyncClient(f"unix:{d.endpoints.unix}") as ctx:
            sid = (await ctx.create_session()).session_id
            stream = ctx.stream()
            events = [user("one")]
            bad = cpb.CompileRequest(session_id=sid, route=ROUTE, as_of_seq=9)
            with pytest.raises(CtxccError) as err:
                await stream.step(bad, events)
            assert err.value.reason == "SEQ_OUT_OF_RANGE"
            # As a unary call's: the head the compile could have asked for.
            assert err.value.metadata == {"head_seq": "1"}
            req = cpb.CompileRequest(session_id=sid, route=ROUTE)
            view, appended = await stream.step(req, events)
            assert appended is not None and appended.replayed, appended
            assert (appended.first_seq, appended.last_seq) == (1, 1)
            assert view.event_boundary == 1
            _, next_step = await stream.step(req, events)  # a new step after a success
            assert next_step is not None and not next_step.replayed
            assert (await ctx.get_session(sid)).head_seq == 2
            await stream.close()
    finally:
        await d.stop()


class _Held:
    """A CompileStream call that takes each request and fails it as a dropped connection
    once `release` is set."""

    def __init__(self, requests: Any, release: asyncio.Event) -> None:
        self._requests = requests.__aiter__()
        self._release = release

    def __aiter__(self) -> _Held:
        return self

    async def __anext__(self) -> cpb.CompileStreamResponse:
        await self._requests.__anext__()
        await self._release.wait()
        empty = grpc.aio.Metadata()
        raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, empty, empty, "gone")

    def cancel(self) -> None:
        pass


async def test_a_report_queued_while_a_step_runs_never_loses_the_steps_own() -> None:
    """The step carrying c1 is in flight when c2 is queued, then fails without the daemon
    recording c1: c1 goes by the unary call, c2 rides on. The client before queued c2 at
    once, and the failed step, finding the queue taken, dropped c1 unsent."""
    release = asyncio.Event()
    unary: list[str] = []

    async def report(req: cpb.ReportUsageRequest) -> cpb.ReportUsageResponse:
        unary.append(req.compile_id)
        return cpb.ReportUsageResponse()

    stub = SimpleNamespace(CompileStream=lambda requests: _Held(requests, release))
    stream = CompileStream(stub, retry_seconds=0, report=report)
    req = cpb.CompileRequest(session_id="s", route=ROUTE)
    await stream.report_usage("s:c1", input_tokens=10, output_tokens=1)
    step = asyncio.create_task(stream.step(req, [user("one")]))
    await asyncio.sleep(0.05)  # the step carrying c1 is waiting for its answer
    second = asyncio.create_task(stream.report_usage("s:c2", input_tokens=10, output_tokens=1))
    await asyncio.sleep(0.05)
    release.set()
    with pytest.raises(CtxccError):
        await step
    await second
    await stream.flush_usage()
    assert unary == ["s:c1", "s:c2"]


class _Gated:
    """A real CompileStream call whose answers wait for `gate`: a daemon that appended a
    step but whose answer is slow (a long compile, a stalled connection)."""

    def __init__(self, call: Any, gate: asyncio.Event) -> None:
        self._call = call
        self._answers = call.__aiter__()
        self._gate = gate
        self._cancelled = asyncio.Event()

    def __aiter__(self) -> _Gated:
        return self

    async def __anext__(self) -> cpb.CompileStreamResponse:
        answer: cpb.CompileStreamResponse = await self._answers.__anext__()
        opened = asyncio.ensure_future(self._gate.wait())
        cancelled = asyncio.ensure_future(self._cancelled.wait())
        await asyncio.wait({opened, cancelled}, return_when=asyncio.FIRST_COMPLETED)
        opened.cancel()
        cancelled.cancel()
        if self._cancelled.is_set():
            raise asyncio.CancelledError  # as a grpc.aio read of a cancelled call does
        return answer

    def cancel(self) -> None:
        self._cancelled.set()
        self._call.cancel()


class _GatedStub:
    def __init__(self, real: Any, gate: asyncio.Event) -> None:
        self._real, self._gate = real, gate

    def CompileStream(self, requests: Any) -> _Gated:
        return _Gated(self._real.CompileStream(requests), self._gate)


class _Python310Task(asyncio.Task):  # type: ignore[type-arg]
    """A task as Python 3.10 makes them (the client's wheel requires 3.10 or later): it has
    no `cancelling()`, which came with 3.11."""

    def __getattribute__(self, name: str) -> Any:
        if name == "cancelling":
            raise AttributeError(name)
        return super().__getattribute__(name)


def _step_task(coro: Any, python: str) -> asyncio.Task[Any]:
    """The task a step runs in, made as `python`'s asyncio makes it."""
    if python == "3.11":
        return asyncio.create_task(coro)
    loop = asyncio.get_running_loop()
    loop.set_task_factory(lambda loop, coro, **kw: _Python310Task(coro, loop=loop, **kw))
    try:
        return asyncio.create_task(coro)
    finally:
        loop.set_task_factory(None)


@pytest.mark.parametrize("python", ["3.11", "3.10"])
@pytest.mark.parametrize("how", ["timeout", "close"])
async def test_a_step_cut_short_by_its_caller_appends_once_when_tried_again(
    short_tmp: Path, how: str, python: str
) -> None:
    """The daemon appended the step, then the caller stopped waiting (`asyncio.wait_for`,
    the only way to bound a step) or closed the stream from another task: the same events
    sent again reuse the request id, so they are replayed, not appended twice (the client
    kept the id only on its own CtxccError before); a close from another task fails the
    step with CtxccError CANCELLED/STREAM_CLOSED, not a bare CancelledError. The same in a
    task of Python 3.10, where either failed with AttributeError (no Task.cancelling())."""
    d = Daemon(make_config(short_tmp))
    await d.start()
    try:
        async with AsyncClient(f"unix:{d.endpoints.unix}") as ctx:
            sid = (await ctx.create_session()).session_id
            gate = asyncio.Event()
            stream = CompileStream(_GatedStub(ctx._compile_stub, gate))
            req = cpb.CompileRequest(session_id=sid, route=ROUTE)
            events = [user("please run the tests")]
            task = _step_task(stream.step(req, events), python)
            async for _ in ctx.watch(sid):  # the daemon appended it
                break
            if how == "timeout":
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
            else:
                await stream.close()
                with pytest.raises(CtxccError) as closed:
                    await task
                assert closed.value.code == grpc.StatusCode.CANCELLED
                assert closed.value.reason == "STREAM_CLOSED"
            gate.set()
            _, appended = await stream.step(req, events)  # a closed stream opens again
            assert appended is not None and appended.replayed, appended
            assert (await ctx.get_session(sid)).head_seq == 1
            await stream.close()
    finally:
        await d.stop()


def _damaged(request: cpb.CompileStreamRequest) -> cpb.CompileStreamResponse:
    """A one-chunk view whose bytes do not match their sha256 (damaged on the way)."""
    chunk = cpb.ViewChunk(compile_id="s:c1", index=0, count=1, data=b"\x08", sha256="0" * 64)
    return cpb.CompileStreamResponse(step_id=request.step.step_id, chunk=chunk)


async def test_a_view_that_arrives_damaged_is_a_ctxcc_error_and_keeps_the_request_id() -> None:
    """A damaged chunked view fails the step with CtxccError DATA_LOSS/VIEW_DAMAGED (a
    bare ValueError escaped before), and the same events sent again reuse the request id
    (the client kept it only on its own errors before, and the usage report it carried
    was dropped): it rides on the next step."""
    sent: list[cpb.CompileStreamRequest] = []
    stub = SimpleNamespace(CompileStream=lambda requests: _Answering(requests, sent, _damaged))
    stream = CompileStream(stub, retry_seconds=0)
    req = cpb.CompileRequest(session_id="s", route=ROUTE)
    assert await stream.report_usage("s:c0", input_tokens=10, output_tokens=2) is None
    for _ in range(2):
        with pytest.raises(CtxccError) as err:
            await stream.step(req, [user("one")])
        assert (err.value.code, err.value.reason) == (grpc.StatusCode.DATA_LOSS, "VIEW_DAMAGED")
    first, second = (m.step for m in sent)
    assert first.request_id and first.request_id == second.request_id
    assert first.usage.compile_id == "s:c0" and first.usage.input_tokens == 10
    assert second.usage == first.usage


async def test_compile_takes_a_model_or_a_route_and_says_which(short_tmp: Path) -> None:
    """`compile(sid, route=..., render_formats=[...])` as the README shows it; a Route
    given where the model name goes failed deep in the request's build ("bad argument
    type for built-in operation"): a TypeError that names the signature now, sent nothing."""
    d = Daemon(make_config(short_tmp))
    await d.start()
    try:
        async with AsyncClient(f"unix:{d.endpoints.unix}") as ctx:
            session = await ctx.create_session()
            await ctx.append(session.session_id, [user("hi")])
            view = await ctx.compile(
                session.session_id, route=ROUTE, render_formats=[view_pb2.RENDER_FORMAT_OPENAI_CHAT]
            )
            assert len(view.renderings) == 1 and view.event_boundary == 1
            with pytest.raises(TypeError, match="pass a Route as route="):
                await ctx.compile(session.session_id, ROUTE)  # type: ignore[arg-type]
            assert (await ctx.get_session(session.session_id)).head_seq == 1
    finally:
        await d.stop()
