"""The Python client's CompileStream with delta views, against a real daemon on its Unix
socket: every view it hands out over a scripted session equals the same compile rebuilt
whole, while the wire carried deltas; a damaged delta is fetched again whole and never
reaches the caller; deltas off means whole views; a reopened stream starts whole."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ctxcc_client import AsyncClient, CompileStream

from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import event_pb2, view_pb2
from server.app import Daemon
from tests.conftest import make_config, stubs_for
from tests.helpers import ROUTE, user
from tests.integration.delta_session import encoded, scripted_session


def _stepper(stream: CompileStream) -> Any:
    async def step(req: cpb.CompileRequest, events: list[event_pb2.Event]) -> view_pb2.CompiledView:
        view, _ = await stream.step(req, events)
        return view

    return step


async def test_client_hands_out_whole_views_rebuilt_from_deltas(daemon: Daemon) -> None:
    target = f"unix:{daemon.endpoints.unix}"
    api = stubs_for(target)
    try:
        async with AsyncClient(target) as ctx:
            stream = ctx.stream()
            out = await scripted_session(api, "pc", _stepper(stream))
            await stream.close()
    finally:
        await api.channel.close()
    steps = len(out.views)
    assert (stream.stats.whole_views, stream.stats.deltas) == (1, steps - 1)
    assert stream.stats.resumed == 0, "every delta matched its digest"
    # What crossed the wire after the first view, against those views whole.
    later = stream.stats.bytes_received - out.views[0].ByteSize()
    assert later * 3 < sum(v.ByteSize() for v in out.views[1:])


class _Damaging:
    """A stub whose CompileStream answers pass through, except that every other delta
    with appended messages gets one character of its last appended text changed."""

    def __init__(self, stub: Any) -> None:
        self._stub = stub
        self.damaged: list[str] = []
        self._deltas = 0

    def CompileStream(self, requests: Any) -> Any:
        return _DamagingCall(self._stub.CompileStream(requests), self)

    def damage(self, resp: cpb.CompileStreamResponse) -> None:
        if resp.WhichOneof("response") != "delta" or not resp.delta.appended_messages:
            return
        self._deltas += 1
        if self._deltas % 2:
            return
        for part in reversed(resp.delta.appended_messages[-1].parts):
            if part.text:
                part.text = ("#" if part.text[0] != "#" else "%") + part.text[1:]
                self.damaged.append(part.text)
                return


class _DamagingCall:
    def __init__(self, call: Any, owner: _Damaging) -> None:
        self._call = call
        self._it = call.__aiter__()
        self._owner = owner

    def __aiter__(self) -> _DamagingCall:
        return self

    async def __anext__(self) -> cpb.CompileStreamResponse:
        resp: cpb.CompileStreamResponse = await self._it.__anext__()
        self._owner.damage(resp)
        return resp

    def cancel(self) -> bool:
        return bool(self._call.cancel())


async def test_a_damaged_delta_is_fetched_whole(daemon: Daemon) -> None:
    target = f"unix:{daemon.endpoints.unix}"
    api = stubs_for(target)
    damaging = _Damaging(api.compiles)
    stream = CompileStream(damaging)
    try:
        out = await scripted_session(api, "dm", _stepper(stream))
    finally:
        await stream.close()
        await api.channel.close()
    assert len(damaging.damaged) >= 5
    assert stream.stats.resumed == len(damaging.damaged)
    texts = {p.text for v in out.views for m in v.messages for p in m.parts}
    assert not texts & set(damaging.damaged)


async def test_deltas_off_means_whole_views(daemon: Daemon) -> None:
    target = f"unix:{daemon.endpoints.unix}"
    api = stubs_for(target)
    try:
        async with AsyncClient(target) as ctx:
            stream = ctx.stream(deltas=False)
            out = await scripted_session(api, "off", _stepper(stream))
            await stream.close()
    finally:
        await api.channel.close()
    assert (stream.stats.whole_views, stream.stats.deltas) == (len(out.views), 0)
    assert stream.stats.bytes_received >= sum(v.ByteSize() for v in out.views)


async def test_a_reopened_stream_starts_with_a_whole_view(short_tmp: Path) -> None:
    first = Daemon(make_config(short_tmp))
    await first.start()
    target = f"unix:{first.endpoints.unix}"
    async with AsyncClient(target, retry_seconds=5) as ctx:
        session = await ctx.create_session()
        req = cpb.CompileRequest(session_id=session.session_id, route=ROUTE)
        stream = ctx.stream()
        await stream.step(req, [user("one")])
        await stream.step(req, [user("two")])
        assert (stream.stats.whole_views, stream.stats.deltas) == (1, 1)
        await first.stop()
        second = Daemon(make_config(short_tmp))
        await second.start()
        try:
            view, _ = await stream.step(req, [user("three")])
            assert (stream.stats.whole_views, stream.stats.deltas) == (2, 1)
            view, _ = await stream.step(req, [user("four")])
            assert (stream.stats.whole_views, stream.stats.deltas) == (2, 2)
            again = await ctx.compiles.Compile(
                cpb.CompileRequest(rebuild_compile_id=view.compile_id)
            )
            assert encoded(view) == encoded(again.view)
        finally:
            await stream.close()
            await second.stop()
