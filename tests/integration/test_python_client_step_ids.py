"""The Python client's CompileStream matches every answer to what is in flight by its
step_id, against a real daemon behind a proxying stub: a response delivered twice (a buggy
proxy) is skipped when read at a later step, so every step still gets its own view (whole,
chunked or a delta; before, the copy was taken for the next step's answer and every step
from then on returned the previous step's view); an answer that names no step the stream
sent ends the stream and the step is resent on a new one with its request id (its append
replayed, never stored twice); the answer to a step the caller cancelled, arriving late,
is never taken for the next step's."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from ctxcc_client import CompileStream

from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import event_pb2, session_pb2, view_pb2
from ctxcc.v1 import session_service_pb2 as spb
from server.app import Daemon
from tests.conftest import Stubs, make_config, stubs_for
from tests.helpers import ROUTE, user
from tests.integration.delta_session import encoded, scripted_session

# What a proxying call does with each response the daemon sent: the responses it delivers.
Relay = Callable[[cpb.CompileStreamResponse], list[cpb.CompileStreamResponse]]


def _copy(resp: cpb.CompileStreamResponse) -> cpb.CompileStreamResponse:
    return cpb.CompileStreamResponse.FromString(resp.SerializeToString())


class _Proxy:
    """A stub whose CompileStream calls deliver, for each response of the daemon, what
    `relay` makes of it; counts the calls."""

    def __init__(self, stub: Any, relay: Relay) -> None:
        self._stub = stub
        self._relay = relay
        self.calls = 0

    def CompileStream(self, requests: Any) -> Any:
        self.calls += 1
        return _ProxyCall(self._stub.CompileStream(requests), self._relay)


class _ProxyCall:
    def __init__(self, call: Any, relay: Relay) -> None:
        self._call = call
        self._it = call.__aiter__()
        self._relay = relay
        self._out: list[cpb.CompileStreamResponse] = []

    def __aiter__(self) -> _ProxyCall:
        return self

    async def __anext__(self) -> cpb.CompileStreamResponse:
        while not self._out:
            self._out = self._relay(await self._it.__anext__())
        return self._out.pop(0)

    def cancel(self) -> bool:
        return bool(self._call.cancel())


def _stepper(stream: CompileStream) -> Any:
    async def step(req: cpb.CompileRequest, events: list[event_pb2.Event]) -> view_pb2.CompiledView:
        view, _ = await stream.step(req, events)
        return view

    return step


@pytest.mark.parametrize("chunk_bytes", ["1048576", "4096"])
async def test_every_response_delivered_twice_each_step_gets_its_own_view(
    short_tmp: Path, chunk_bytes: str
) -> None:
    daemon = Daemon(make_config(short_tmp, stream_chunk_bytes=chunk_bytes))
    await daemon.start()
    api = stubs_for(f"unix:{daemon.endpoints.unix}")
    chunks = 0

    def twice(resp: cpb.CompileStreamResponse) -> list[cpb.CompileStreamResponse]:
        nonlocal chunks
        chunks += resp.WhichOneof("response") == "chunk"
        return [resp, _copy(resp)]

    proxy = _Proxy(api.compiles, twice)
    stream = CompileStream(proxy)
    try:
        # Every view it hands out is checked against its rebuild (and its event boundary).
        out = await scripted_session(api, f"tw{chunk_bytes}", _stepper(stream))
    finally:
        await stream.close()
        await api.channel.close()
        await daemon.stop()
    steps = len(out.views)
    # Each step's answer ends with a copy the next step reads and skips (the copies of a
    # chunked view's other chunks come within its own step and change nothing).
    assert stream.stats.stale == steps - 1
    assert stream.stats.resumed == 0 and stream.stats.deltas > steps // 2
    assert proxy.calls == 1, "a copy of an earlier answer reopened the stream"
    assert (chunks > 0) == (chunk_bytes == "4096")


async def _session(api: Stubs, sid: str) -> cpb.CompileRequest:
    await api.sessions.CreateSession(
        spb.CreateSessionRequest(session=session_pb2.Session(session_id=sid))
    )
    return cpb.CompileRequest(session_id=sid, route=ROUTE)


@pytest.mark.parametrize("stray_id", ["", "3", "x2"])
async def test_an_answer_for_no_step_sent_ends_the_stream_and_the_step_is_resent(
    daemon: Daemon, stray_id: str
) -> None:
    """Before step 2's answer the proxy delivers a copy of step 1's under a step id the
    stream never sent (none: a resume's answer, which nothing matches while a step is
    awaited; a step not sent yet; not one of its ids). Before, it was step 2's view."""
    api = stubs_for(f"unix:{daemon.endpoints.unix}")
    first: list[cpb.CompileStreamResponse] = []

    def stray(resp: cpb.CompileStreamResponse) -> list[cpb.CompileStreamResponse]:
        if not first:
            first.append(_copy(resp))
        elif resp.step_id == "2" and len(first) == 1:
            first.append(_copy(first[0]))
            first[1].step_id = stray_id
            return [first[1], resp]
        return [resp]

    proxy = _Proxy(api.compiles, stray)
    stream = CompileStream(proxy, retry_seconds=5)
    try:
        req = await _session(api, f"st{len(stray_id)}{stray_id}")
        await stream.step(req, [user("one")])
        view, appended = await stream.step(req, [user("two")])
        again = await api.compiles.Compile(cpb.CompileRequest(rebuild_compile_id=view.compile_id))
        events = await api.sessions.ListEvents(spb.ListEventsRequest(session_id=req.session_id))
    finally:
        await stream.close()
        await api.channel.close()
    assert len(first) == 2, "the stray answer was delivered"
    assert view.event_boundary == 2 and encoded(view) == encoded(again.view)
    # Resent on a new stream with its request id: the daemon replayed the append.
    assert proxy.calls == 2
    assert appended is not None and appended.replayed and appended.last_seq == 2
    assert [e.user_message.parts[0].text for e in events.events] == ["one", "two"]
    assert stream.stats.stale == 0


async def test_the_late_answer_of_a_cancelled_step_is_not_the_next_steps(daemon: Daemon) -> None:
    """The caller gives up on step 1 (a timeout) before its answer arrives; the answer
    comes later on the same stream and step 2 skips it for its own."""
    api = stubs_for(f"unix:{daemon.endpoints.unix}")
    held, release = asyncio.Event(), asyncio.Event()
    late: list[cpb.CompileStreamResponse] = []

    class Holding(_ProxyCall):
        async def __anext__(self) -> cpb.CompileStreamResponse:
            if late:
                return late.pop()
            resp: cpb.CompileStreamResponse = await self._it.__anext__()
            if resp.step_id == "1" and not held.is_set():
                late.append(resp)  # delivered by the next read if this one is cancelled
                held.set()
                await release.wait()
                return late.pop()
            return resp

    class HoldingProxy(_Proxy):
        def CompileStream(self, requests: Any) -> Any:
            self.calls += 1
            return Holding(self._stub.CompileStream(requests), self._relay)

    proxy = HoldingProxy(api.compiles, lambda resp: [resp])
    stream = CompileStream(proxy)
    try:
        req = await _session(api, "late")
        first = asyncio.create_task(stream.step(req, [user("one")]))
        await held.wait()
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        release.set()
        view, appended = await stream.step(req, [user("two")])
        again = await api.compiles.Compile(cpb.CompileRequest(rebuild_compile_id=view.compile_id))
    finally:
        await stream.close()
        await api.channel.close()
    assert not late
    assert view.event_boundary == 2 and encoded(view) == encoded(again.view)
    assert appended is not None and appended.last_seq == 2 and not appended.replayed
    assert stream.stats.stale == 1 and proxy.calls == 1
