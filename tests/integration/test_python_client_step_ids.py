"""The Python client's CompileStream matches every answer to what is in flight by its
step_id, against a real daemon behind a proxying stub: a response delivered twice (a buggy
proxy) is skipped when read at a later step, so every step still gets its own view (whole,
chunked or a delta; before, the copy was taken for the next step's answer and every step
from then on returned the previous step's view); an answer that names no step the stream
sent ends the stream and the step is resent on a new one with its request id (its append
replayed, never stored twice); the answer to a step the caller cancelled, arriving late,
is never taken for the next step's; a resume's answer delivered again later is never taken
for the next resume's (it carries its own resume's step id), and a daemon that does not
echo a resume's step id is still understood."""

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


class _LateResumeCopies:
    """A relay that damages every delta's digest, so each step with a delta fetches its
    view whole with a ResumeRequest, and delivers each resume's answer (the first answer
    after a damaged delta) a second time right after the next delta: the copy arrives
    while that step's own resume is awaited. `clear`: the copy without its step id;
    `copies=False`: none, and the resume's answer without its step id instead (a daemon
    that predates ResumeRequest.step_id). State is per proxied call (a copy is never
    delivered on another stream)."""

    def __init__(self, proxy: _Proxy | None = None, *, clear: bool = False, copies: bool = True):
        self.proxy = proxy
        self._clear = clear
        self._copies = copies
        self._call = 0
        self._resuming = False
        self._held: list[cpb.CompileStreamResponse] = []
        self.delivered = 0  # copies delivered

    def __call__(self, resp: cpb.CompileStreamResponse) -> list[cpb.CompileStreamResponse]:
        assert self.proxy is not None
        if self.proxy.calls != self._call:  # a new stream
            self._call, self._resuming, self._held = self.proxy.calls, False, []
        if resp.WhichOneof("response") == "delta":
            if resp.delta.chain_sha256:
                resp.delta.chain_sha256 = "0" * 64
            else:
                resp.delta.view_sha256 = "0" * 64
            self._resuming = True
            out, self._held = [resp, *self._held], []
            self.delivered += len(out) - 1
            return out
        if self._resuming and resp.WhichOneof("response") == "view":
            self._resuming = False
            if not self._copies:
                resp.step_id = ""
            else:
                self._held.append(_copy(resp))
                if self._clear:
                    self._held[-1].step_id = ""
        return [resp]


async def _four_steps(
    api: Stubs, stream: CompileStream, sid: str
) -> list[tuple[view_pb2.CompiledView, view_pb2.CompiledView]]:
    """Four steps of one user message each: every view handed out, with its compile rebuilt
    whole."""
    req = await _session(api, sid)
    out = []
    for n in range(1, 5):
        view, appended = await stream.step(req, [user(f"ask {n}")])
        assert appended is not None and appended.last_seq == n
        again = await api.compiles.Compile(cpb.CompileRequest(rebuild_compile_id=view.compile_id))
        out.append((view, again.view))
    return out


@pytest.mark.parametrize("clear", [False, True])
async def test_a_resumes_answer_delivered_again_late_is_never_the_next_resumes(
    daemon: Daemon, clear: bool
) -> None:
    """Steps 2-4 get a damaged delta and resume; the answer to the resume of step 2 (3)
    comes again after step 3's (4's) delta, while step 3's (4's) own resume is awaited.
    The copy carries the earlier resume's step id: skipped, and each step gets its own
    view on one stream. Cleared of its id (`clear`), it is not taken either: the daemon
    echoed the first resume's id, so an empty one answers nothing the stream sent; the
    stream is reopened and step 3 resent. Before resumes had ids, the copy (no id, as
    every resume's answer) was taken for step 3's view: step 2's."""
    api = stubs_for(f"unix:{daemon.endpoints.unix}")
    relay = _LateResumeCopies(clear=clear)
    proxy = relay.proxy = _Proxy(api.compiles, relay)
    stream = CompileStream(proxy)
    try:
        views = await _four_steps(api, stream, f"lr{int(clear)}")
    finally:
        await stream.close()
        await api.channel.close()
    for n, (view, again) in enumerate(views, 1):
        assert view.event_boundary == n, f"step {n} was handed step {view.event_boundary}'s view"
        assert encoded(view) == encoded(again)
    if clear:
        # Step 3 resent on a new stream (no base: whole, no resume); step 4 resumes there,
        # and its answer's copy is never delivered (no delta follows).
        assert relay.delivered == 1 and proxy.calls == 2
        assert (stream.stats.resumed, stream.stats.stale) == (3, 0)
    else:
        assert relay.delivered == 2 and proxy.calls == 1
        assert (stream.stats.resumed, stream.stats.stale) == (3, 2)


async def test_a_daemon_that_does_not_echo_a_resumes_step_id_still_answers_resumes(
    daemon: Daemon,
) -> None:
    """A daemon that predates ResumeRequest.step_id answers a resume with an empty step id
    (the proxy clears it): the client takes it for the resume's answer, on one stream."""
    api = stubs_for(f"unix:{daemon.endpoints.unix}")
    relay = _LateResumeCopies(copies=False)
    proxy = relay.proxy = _Proxy(api.compiles, relay)
    stream = CompileStream(proxy)
    try:
        views = await _four_steps(api, stream, "noecho")
    finally:
        await stream.close()
        await api.channel.close()
    for n, (view, again) in enumerate(views, 1):
        assert view.event_boundary == n and encoded(view) == encoded(again)
    assert proxy.calls == 1 and relay.delivered == 0
    assert (stream.stats.resumed, stream.stats.stale) == (3, 0)
