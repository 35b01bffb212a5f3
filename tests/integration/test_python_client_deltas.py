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
from ctxcc.v1 import event_pb2, session_pb2, view_pb2
from ctxcc.v1 import session_service_pb2 as spb
from server.app import Daemon
from tests.conftest import make_config, stubs_for
from tests.helpers import ROUTE, assistant, user
from tests.integration.delta_session import (
    OTHER_ROUTE,
    encoded,
    over_budget_session,
    scripted_session,
)


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


class _Replaying:
    """A stub whose CompileStream answers pass through, except that the answer to step
    `at` is replaced by the first delta answer it saw (a delta of an older step of the same
    stream, as a corrupting proxy could send) under step `at`'s id: the client cannot tell
    it from the step's own answer by its step id (one under its own older id is skipped,
    tests/integration/test_python_client_step_ids.py). Every delta the daemon sent is
    recorded."""

    def __init__(self, stub: Any, at: int) -> None:
        self._stub = stub
        self._at = at
        self.deltas: list[cpb.CompileStreamResponse] = []
        self.replaced: list[cpb.CompileStreamResponse] = []

    def CompileStream(self, requests: Any) -> Any:
        owner = self

        class Call:
            def __init__(self, call: Any) -> None:
                self._call, self._it = call, call.__aiter__()

            def __aiter__(self) -> Any:
                return self

            async def __anext__(self) -> cpb.CompileStreamResponse:
                resp: cpb.CompileStreamResponse = await self._it.__anext__()
                if resp.step_id == str(owner._at) and owner.deltas and not owner.replaced:
                    owner.replaced.append(resp)
                    replayed = cpb.CompileStreamResponse()
                    replayed.CopyFrom(owner.deltas[0])
                    replayed.step_id = resp.step_id
                    return replayed
                if resp.WhichOneof("response") == "delta":
                    owner.deltas.append(resp)
                return resp

            def cancel(self) -> bool:
                return bool(self._call.cancel())

        return Call(self._stub.CompileStream(requests))


async def test_an_older_delta_in_place_of_a_step_answer_never_hands_out_the_older_view(
    daemon: Daemon,
) -> None:
    """Step 3 appends nothing and switches the route; its answer is replaced by step 2's
    delta. That delta does not apply (its base is step 1's view), so the client asks for
    the view whole quoting the delta's compile id: step 2's, still the session's head. The
    daemon must not resend step 2's view (compiled for the other route) as step 3's: the
    only view a stream that sent views can be missing is the last one it sent."""
    target = f"unix:{daemon.endpoints.unix}"
    api = stubs_for(target)
    replaying = _Replaying(api.compiles, at=3)
    stream = CompileStream(replaying)
    other = cpb.CompileRequest(session_id="rp", route=OTHER_ROUTE)
    try:
        await api.sessions.CreateSession(
            spb.CreateSessionRequest(session=session_pb2.Session(session_id="rp"))
        )
        req = cpb.CompileRequest(session_id="rp", route=ROUTE)
        await stream.step(req, [user("one")])
        second, _ = await stream.step(req, [assistant("two")])
        third, _ = await stream.step(other, [])
        again = await api.compiles.Compile(cpb.CompileRequest(rebuild_compile_id=third.compile_id))
    finally:
        await stream.close()
        await api.channel.close()
    assert len(replaying.replaced) == 1 and stream.stats.resumed == 1
    assert second.route == ROUTE
    assert third.compile_id != second.compile_id
    assert third.route == OTHER_ROUTE
    assert encoded(third) == encoded(again.view)
