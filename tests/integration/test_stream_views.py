"""The last views open CompileStreams keep between steps are bounded together
(server/transport/stream_views.py), on a real daemon: past the budget the stream that
stepped least recently lets go of its view, its next step is still answered right (a
delta against a recent view, or whole when its view was too large to be among those),
`ctxcc_stream_view_bytes` shows what is kept, and an ended stream keeps nothing."""

from __future__ import annotations

import asyncio
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_pb2
from ctxcc.v1 import session_service_pb2 as spb
from server.app import Daemon
from server.transport import stream_views
from tests.conftest import Stubs, stubs_for
from tests.helpers import assistant, compile_request, user
from tests.integration.delta_session import RawStream, encoded


@pytest.fixture
def views_budget(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    """The daemon made next keeps at most `request.param` bytes of stream views (pytest
    makes a test's fixtures in the order it names them: this one before `daemon`)."""
    monkeypatch.setattr(stream_views, "STREAM_VIEWS_BYTES", request.param)


def _kept(d: Daemon) -> float:
    url = f"http://{d.endpoints.metrics}/metrics"
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return next(
        s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "ctxcc_stream_view_bytes"
    )


async def _rebuilt_is(api: Stubs, view: object) -> None:
    rebuilt = await api.compiles.Compile(cpb.CompileRequest(rebuild_compile_id=view.compile_id))  # type: ignore[attr-defined]
    assert encoded(view) == encoded(rebuilt.view)  # type: ignore[arg-type]


async def _huge(api: Stubs, sid: str) -> None:
    """A session whose view is ~17 MiB: over a quarter of the recent views' bytes, so the
    stream that sent it is the only one that keeps it."""
    await api.sessions.CreateSession(
        spb.CreateSessionRequest(session=session_pb2.Session(session_id=sid))
    )
    text = "word " * 12_000
    for k in range(10):
        batch = [user(f"{k}.{i} {text}") for i in range(29)]
        await api.sessions.AppendEvents(spb.AppendEventsRequest(session_id=sid, events=batch))


@pytest.mark.parametrize("views_budget", [20 << 20], indirect=True)
async def test_the_least_recently_stepped_stream_lets_go_and_is_still_answered_right(
    views_budget: None, daemon: Daemon
) -> None:
    api = stubs_for(f"unix:{daemon.endpoints.unix}")
    await _huge(api, "h1")
    await _huge(api, "h2")
    a, b = RawStream(api), RawStream(api)
    try:
        first = await a.step(compile_request("h1"), [user("and now?")])
        assert _kept(daemon) == first.ByteSize() > 16 << 20
        # Two such views pass the budget: b's step makes a let go of its view.
        other = await b.step(compile_request("h2"), [user("and here?")])
        assert _kept(daemon) == other.ByteSize()
        # a names its view as the base: no stream keeps it, so the view goes whole (in
        # chunks), and it is the view a rebuild of its compile gives.
        before = len(a.answers)
        view = await a.step(compile_request("h1"), [assistant("a short answer")])
        assert {x.WhichOneof("response") for x in a.answers[before:]} == {"chunk"}
        await _rebuilt_is(api, view)
        assert _kept(daemon) == view.ByteSize()
        # The stream that stepped last keeps its view: its next step is a delta again.
        again = await a.step(compile_request("h1"), [user("one more")])
        assert a.answers[-1].WhichOneof("response") == "delta"
        await _rebuilt_is(api, again)
    finally:
        await a.close()
        await b.close()
    await api.channel.close()


@pytest.mark.parametrize("views_budget", [1], indirect=True)
async def test_small_views_stay_deltas_and_ended_streams_keep_nothing(
    views_budget: None, daemon: Daemon
) -> None:
    """Views small enough to be among the recent views: a stream that let go of its own
    still gets a delta against that copy. Under a budget of one byte only the stream
    that stepped last keeps its view."""
    api = stubs_for(f"unix:{daemon.endpoints.unix}")
    streams = [RawStream(api) for _ in range(3)]
    try:
        for k, s in enumerate(streams):
            await api.sessions.CreateSession(
                spb.CreateSessionRequest(session=session_pb2.Session(session_id=f"s{k}"))
            )
            await s.step(compile_request(f"s{k}"), [user("hello")])
        for turn in range(3):
            for k, s in enumerate(streams):
                view = await s.step(compile_request(f"s{k}"), [user(f"turn {turn}")])
                assert s.answers[-1].WhichOneof("response") == "delta"
                assert _kept(daemon) == view.ByteSize()
                await _rebuilt_is(api, view)
    finally:
        for s in streams:
            await s.close()
    await api.channel.close()
    deadline = time.monotonic() + 30
    while _kept(daemon):  # the streams' ends reach their handlers
        assert time.monotonic() < deadline, "ended streams still keep their views"
        await asyncio.sleep(0.05)
