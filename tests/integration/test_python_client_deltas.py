"""The Python client's CompileStream with delta views, against a real daemon on its Unix
socket: every view it hands out over a scripted session equals the same compile rebuilt
whole, while the wire carried deltas with the digest asked for (chained by default, the
whole view's sha256 when not); a damaged delta (appended text, kept count, head) is
fetched again whole and never reaches the caller; deltas off means whole views; a
reopened stream starts whole; over budget, a compaction recommended again is kept from
the base instead of resent."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from ctxcc_client import AsyncClient, CompileStream

from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import event_pb2, view_pb2
from server.app import Daemon
from tests.conftest import make_config, stubs_for
from tests.helpers import ROUTE, user
from tests.integration.delta_session import encoded, over_budget_session, scripted_session


def _stepper(stream: CompileStream) -> Any:
    async def step(req: cpb.CompileRequest, events: list[event_pb2.Event]) -> view_pb2.CompiledView:
        view, _ = await stream.step(req, events)
        return view

    return step


@pytest.mark.parametrize("chained", [True, False])
async def test_client_hands_out_whole_views_rebuilt_from_deltas(
    daemon: Daemon, chained: bool
) -> None:
    target = f"unix:{daemon.endpoints.unix}"
    api = stubs_for(target)
    recording = _Damaging(api.compiles, lambda delta: None)
    # The stream as the client makes it, on a stub that records the answers.
    stream = CompileStream(recording) if chained else CompileStream(recording, chained_digest=False)
    try:
        out = await scripted_session(api, "pc", _stepper(stream))
    finally:
        await stream.close()
        await api.channel.close()
    steps = len(out.views)
    assert len(recording.deltas) == steps - 1
    for delta in recording.deltas:  # the digest asked for, and only it
        assert bool(delta.chain_sha256) == chained and bool(delta.view_sha256) != chained
    assert (stream.stats.whole_views, stream.stats.deltas) == (1, steps - 1)
    assert stream.stats.resumed == 0, "every delta matched its digest"
    # What crossed the wire after the first view, against those views whole.
    later = stream.stats.bytes_received - out.views[0].ByteSize()
    assert later * 3 < sum(v.ByteSize() for v in out.views[1:])


Damage = Callable[[cpb.ViewDelta], str | None]


def _damage_text(delta: cpb.ViewDelta) -> str | None:
    """One character of the last appended text changed (the damaged text)."""
    for part in reversed(delta.appended_messages[-1].parts):
        if part.text:
            part.text = ("#" if part.text[0] != "#" else "%") + part.text[1:]
            return part.text
    return None


def _damage_kept(delta: cpb.ViewDelta) -> str | None:
    if not delta.kept_messages:
        return None
    delta.kept_messages -= 1
    return "kept"


def _damage_head(delta: cpb.ViewDelta) -> str | None:
    delta.head.notes.append("a note the daemon did not write")
    return "head"


class _Damaging:
    """A stub whose CompileStream answers pass through, except that every other delta
    with appended messages is damaged by `damage` (it returns what it damaged, or None).
    Every delta that arrives is recorded as it came."""

    def __init__(self, stub: Any, damage: Damage = _damage_text) -> None:
        self._stub = stub
        self._damage = damage
        self.damaged: list[str] = []
        self.deltas: list[cpb.ViewDelta] = []
        # Which deltas with appended messages are damaged: every `every`-th.
        self.every = 2

    def CompileStream(self, requests: Any) -> Any:
        return _DamagingCall(self._stub.CompileStream(requests), self)

    def damage(self, resp: cpb.CompileStreamResponse) -> None:
        if resp.WhichOneof("response") != "delta":
            return
        self.deltas.append(cpb.ViewDelta.FromString(resp.delta.SerializeToString()))
        if not resp.delta.appended_messages or len(self.deltas) % self.every:
            return
        damaged = self._damage(resp.delta)
        if damaged is not None:
            self.damaged.append(damaged)


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


@pytest.mark.parametrize("chained", [True, False])
@pytest.mark.parametrize("damage", [_damage_text, _damage_kept, _damage_head])
async def test_a_damaged_delta_is_fetched_whole(
    daemon: Daemon, damage: Damage, chained: bool
) -> None:
    target = f"unix:{daemon.endpoints.unix}"
    api = stubs_for(target)
    damaging = _Damaging(api.compiles, damage)
    stream = CompileStream(damaging, chained_digest=chained)
    try:
        out = await scripted_session(api, "dm", _stepper(stream))
    finally:
        await stream.close()
        await api.channel.close()
    assert len(damaging.damaged) >= 5
    # Each damaged delta was refetched whole (scripted_session checked every view the
    # caller got against its rebuild), and the others were used.
    assert stream.stats.resumed == len(damaging.damaged)
    assert stream.stats.deltas == len(damaging.deltas) > 2 * len(damaging.damaged) - 2
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


async def test_after_three_mismatches_in_a_row_the_stream_asks_for_whole_views(
    daemon: Daemon,
) -> None:
    target = f"unix:{daemon.endpoints.unix}"
    api = stubs_for(target)
    damaging = _Damaging(api.compiles, _damage_head)
    damaging.every = 1  # every delta damaged
    stream = CompileStream(damaging)
    try:
        async with AsyncClient(target) as ctx:
            session = await ctx.create_session()
            req = cpb.CompileRequest(session_id=session.session_id, route=ROUTE)
            for i in range(7):
                view, _ = await stream.step(req, [user(f"step {i}")])
                again = await ctx.compiles.Compile(
                    cpb.CompileRequest(rebuild_compile_id=view.compile_id)
                )
                assert encoded(view) == encoded(again.view)
    finally:
        await stream.close()
        await api.channel.close()
    # Steps 2-4 got deltas that failed and were fetched whole; then whole views only.
    assert (stream.stats.deltas, stream.stats.resumed) == (3, 3)
    assert stream.stats.whole_views == 7


async def test_a_compaction_recommended_again_is_kept_from_the_base(daemon: Daemon) -> None:
    """Over budget, the client asks to keep its base's compaction: the deltas of a turn
    leave the prompt out, and every view it hands out still has it (equal to the rebuild)."""
    api = stubs_for(f"unix:{daemon.endpoints.unix}")
    recording = _Damaging(api.compiles, lambda delta: None)
    stream = CompileStream(recording)
    try:
        out = await over_budget_session(api, "pob", _stepper(stream))
    finally:
        await stream.close()
        await api.channel.close()
    assert stream.stats.resumed == 0 and stream.stats.deltas == len(out.views) - 1
    assert [d.compaction_kept for d in recording.deltas] == [True, True, False, True, True, True]
    kept = [d.ByteSize() for d in recording.deltas if d.compaction_kept]
    assert max(kept) < min(v.compaction.ByteSize() for v in out.views)
