"""A damaged route model on disk — bytes that do not decode, or a record whose figures
are not finite — is ignored: compiles on the route go on (a full estimate) and the next
usage report relearns it. It is advice learned from usage, not data anyone wrote."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_pb2, view_pb2
from ctxcc.v1 import session_service_pb2 as spb
from server.app import Daemon
from server.domain.model import Route
from server.domain.records import RouteModel
from storage import open_rocks
from storage.codec import encode_value
from storage.keys import session_key
from storage.kv import Batch
from tests.conftest import make_config, stubs_for
from tests.helpers import ROUTE, user

TEXT = "Read the failing test, find the cause in the parser and fix it with a small patch. "
ROUTE_ID = Route(ROUTE.connection, ROUTE.protocol, ROUTE.endpoint, ROUTE.model).route_id


async def _learn_then_compile(
    data_dir: Path, sid: str, hidden: int
) -> tuple[view_pb2.CompiledView, view_pb2.CompiledView]:
    """On a daemon started on `data_dir`: compile a new session, report `hidden` tokens
    over its ledger, compile another new session; then stop the daemon."""
    daemon = Daemon(make_config(data_dir))
    await daemon.start()
    api = stubs_for(f"unix:{daemon.endpoints.unix}")
    try:
        views = []
        for s in (sid + "-a", sid + "-b"):
            await api.sessions.CreateSession(
                spb.CreateSessionRequest(session=session_pb2.Session(session_id=s))
            )
            await api.sessions.AppendEvents(
                spb.AppendEventsRequest(session_id=s, events=[user(TEXT * 4)])
            )
            view = (await api.compiles.Compile(cpb.CompileRequest(session_id=s, route=ROUTE))).view
            views.append(view)
            if len(views) == 1:
                await api.compiles.ReportUsage(
                    cpb.ReportUsageRequest(
                        compile_id=view.compile_id,
                        route=ROUTE,
                        input_tokens=view.budget.ledger_tokens + hidden,
                        output_tokens=100,
                    )
                )
        return views[0], views[1]
    finally:
        await api.channel.close()
        await daemon.stop()


def _damage(data_dir: Path, value: bytes) -> None:
    kv = open_rocks(make_config(data_dir).db_path)
    try:
        key = b"\x00model\x00" + ROUTE_ID.encode()
        assert kv.get("routes", key) is not None  # the model the first daemon learned
        batch = Batch()
        batch.put("routes", key, value)
        kv.write(batch)
    finally:
        kv.close()


@pytest.mark.parametrize(
    "damaged",
    [
        b"\x08\x01\x12\x0aRouteModel\x1a\x03\xc1\xc1\xc1",  # a record body msgpack rejects
        encode_value(RouteModel(ROUTE_ID, overhead=math.nan, full_samples=3)),
        encode_value(RouteModel(ROUTE_ID, ratio=math.inf, delta_samples=1)),
    ],
    ids=["undecodable", "nan-overhead", "infinite-ratio"],
)
async def test_a_damaged_route_model_is_ignored_and_relearned(
    short_tmp: Path, damaged: bytes
) -> None:
    _, learned = await _learn_then_compile(short_tmp, "before", 5_000)
    assert learned.budget.estimate_method == view_pb2.ESTIMATE_METHOD_ROUTE_MODEL
    assert learned.budget.provider_overhead_tokens == 5_000

    _damage(short_tmp, damaged)
    cold, relearned = await _learn_then_compile(short_tmp, "after", 8_000)
    # The damaged model is as good as none: the route starts cold...
    assert cold.budget.estimate_method == view_pb2.ESTIMATE_METHOD_FULL
    assert cold.budget.estimated_input_tokens == cold.budget.ledger_tokens
    assert cold.budget.route_model.full_samples == 0
    # ...and the next report writes a fresh model, learned from that report alone.
    assert relearned.budget.estimate_method == view_pb2.ESTIMATE_METHOD_ROUTE_MODEL
    assert relearned.budget.route_model.full_samples == 1
    assert relearned.budget.provider_overhead_tokens == 8_000


async def _baseline_session(data_dir: Path, sid: str, report: bool = True) -> view_pb2.CompiledView:
    """On a daemon started on `data_dir`: one more message in `sid` (made if new) and a
    compile; with `report`, its usage reported (the session's baseline on the route)."""
    daemon = Daemon(make_config(data_dir))
    await daemon.start()
    api = stubs_for(f"unix:{daemon.endpoints.unix}")
    try:
        found = await api.sessions.ListSessions(spb.ListSessionsRequest())
        if sid not in {s.session_id for s in found.sessions}:
            await api.sessions.CreateSession(
                spb.CreateSessionRequest(session=session_pb2.Session(session_id=sid))
            )
        await api.sessions.AppendEvents(
            spb.AppendEventsRequest(session_id=sid, events=[user(TEXT)])
        )
        view = (await api.compiles.Compile(cpb.CompileRequest(session_id=sid, route=ROUTE))).view
        if report:
            await api.compiles.ReportUsage(
                cpb.ReportUsageRequest(
                    compile_id=view.compile_id,
                    route=ROUTE,
                    input_tokens=view.budget.ledger_tokens + 700,
                    output_tokens=100,
                )
            )
        return view
    finally:
        await api.channel.close()
        await daemon.stop()


@pytest.mark.parametrize("damage", ["undecodable", "baseline record gone"])
async def test_a_damaged_baseline_is_ignored_and_reported_again(
    short_tmp: Path, damage: str
) -> None:
    """A session's route state (its baseline) is learned from a usage report, like the
    route model: damaged, or naming a compile record that is gone, every compile of the
    session on the route failed DATA_LOSS. It is as good as none: estimated afresh, and
    the next report makes a new baseline."""
    first = await _baseline_session(short_tmp, "bl")
    assert first.budget.estimate_method != view_pb2.ESTIMATE_METHOD_BASELINE_DELTA
    kept = await _baseline_session(short_tmp, "bl", report=False)
    assert kept.budget.estimate_method == view_pb2.ESTIMATE_METHOD_BASELINE_DELTA
    kv = open_rocks(make_config(short_tmp).db_path)
    try:
        batch = Batch()
        if damage == "undecodable":
            key = session_key("bl", ROUTE_ID.encode())
            assert kv.get("routes", key) is not None
            batch.put("routes", key, b"\x08\x01\x12\x0aRouteState\x1a\x03\xc1\xc1\xc1")
        else:  # the report's compile record, whose table the route state names
            key = session_key("bl", first.compile_id.partition(":")[2].encode())
            assert kv.get("compiles", key) is not None
            batch.delete("compiles", key)
        kv.write(batch)
    finally:
        kv.close()
    fresh = await _baseline_session(short_tmp, "bl")
    assert fresh.budget.estimate_method != view_pb2.ESTIMATE_METHOD_BASELINE_DELTA
    again = await _baseline_session(short_tmp, "bl", report=False)
    assert again.budget.estimate_method == view_pb2.ESTIMATE_METHOD_BASELINE_DELTA
