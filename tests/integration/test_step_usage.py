"""A usage report riding on a CompileStream step (StepRequest.usage), against real daemons:
it is recorded before the step's append and compile, so the step's view is estimated from
it exactly as after a unary ReportUsage (same budgets, same answers, same metrics, on two
fresh daemons driven the two ways); a replay is `replayed` and changes nothing; a report
ReportUsage would refuse, or one for another session's compile, fails the whole step with
`usage_refused` and appends nothing (a report not written for a passing reason, a full
disk, fails the step without `usage_refused`); a report recorded before a failing append
stays recorded; the answer carries the report's result on whole views, deltas and chunks."""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ctxcc.v1 import common_pb2, event_pb2, session_pb2, view_pb2
from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_service_pb2 as spb
from server.app import Daemon
from server.domain.errors import CtxccError, Reason
from tests.conftest import Stubs, make_config, stubs_for
from tests.helpers import ROUTE, assistant, tool_result, user

NO_CLOCK = [view_pb2.SECTION_KIND_ENVIRONMENT]  # two daemons, two clocks: leave it out


def _compile(sid: str, route: common_pb2.Route = ROUTE) -> cpb.CompileRequest:
    return cpb.CompileRequest(session_id=sid, route=route, exclude_sections=NO_CLOCK)


def _usage(view: view_pb2.CompiledView, extra: int, output: int) -> cpb.ReportUsageRequest:
    return cpb.ReportUsageRequest(
        compile_id=view.compile_id,
        route=ROUTE,
        input_tokens=view.budget.estimated_input_tokens + extra,
        output_tokens=output,
        cached_input_tokens=10,
    )


class Steps:
    """A raw CompileStream: one request in, its answers out (chunks collected)."""

    def __init__(self, api: Stubs) -> None:
        self._queue: asyncio.Queue[cpb.CompileStreamRequest | None] = asyncio.Queue()
        self._call: Any = api.compiles.CompileStream(self._requests())
        self._it = self._call.__aiter__()
        self._n = 0

    async def _requests(self) -> AsyncIterator[cpb.CompileStreamRequest]:
        while (item := await self._queue.get()) is not None:
            yield item

    async def step(
        self,
        req: cpb.CompileRequest,
        events: list[event_pb2.Event],
        usage: cpb.ReportUsageRequest | None = None,
        **fields: Any,
    ) -> list[cpb.CompileStreamResponse]:
        self._n += 1
        fields.setdefault("request_id", f"r{self._n}")
        step = cpb.StepRequest(step_id=str(self._n), events=events, compile=req, **fields)
        if usage is not None:
            step.usage.CopyFrom(usage)
        await self._queue.put(cpb.CompileStreamRequest(step=step))
        answers = [await self._it.__anext__()]
        while answers[-1].WhichOneof("response") == "chunk" and (
            answers[-1].chunk.index + 1 < answers[-1].chunk.count
        ):
            answers.append(await self._it.__anext__())
        return answers

    async def view(
        self, req: cpb.CompileRequest, events: list[event_pb2.Event], **kw: Any
    ) -> tuple[view_pb2.CompiledView, cpb.CompileStreamResponse]:
        answers = await self.step(req, events, **kw)
        first = answers[0]
        assert first.WhichOneof("response") in ("view", "chunk"), first
        if first.WhichOneof("response") == "view":
            return first.view, first
        data = b"".join(a.chunk.data for a in answers)
        return view_pb2.CompiledView.FromString(data), first

    async def close(self) -> None:
        await self._queue.put(None)
        self._call.cancel()


async def _new_session(api: Stubs, sid: str) -> None:
    await api.sessions.CreateSession(
        spb.CreateSessionRequest(session=session_pb2.Session(session_id=sid))
    )


async def _head(api: Stubs, sid: str) -> int:
    return int(
        (await api.sessions.GetSession(spb.GetSessionRequest(session_id=sid))).session.head_seq
    )


def _scrape(daemon: Daemon) -> dict[str, float]:
    """Usage-report and estimation-error samples of the daemon's /metrics, by name+labels."""
    url = f"http://{daemon.endpoints.metrics}/metrics"
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name.startswith(("ctxcc_usage_reports", "ctxcc_estimation_error")):
            for s in family.samples:
                if s.name.endswith("_created"):  # when the series began
                    continue
                out[s.name + str(sorted(s.labels.items()))] = s.value
    return out


_RESULT = "".join(f"line {i}: ok {i * i}\n" for i in range(60))


async def _agent(api: Stubs, sid: str, carried: bool) -> list[Any]:
    """Three steps, each reporting the usage of the view before it: by unary ReportUsage
    before the step, or carried by the step. Returns what a client sees of each."""
    await _new_session(api, sid)
    steps = Steps(api)
    seen: list[Any] = []
    try:
        view, _ = await steps.view(_compile(sid), [user("fix the failing test")])
        script = [
            [assistant("", ("c1", "shell", '{"cmd": "pytest"}')), tool_result("c1", _RESULT)],
            [assistant("fixed: the import was missing"), user("thanks, now the docs")],
        ]
        for n, events in enumerate(script):
            usage = _usage(view, extra=37 + 11 * n, output=120 + n)
            if carried:
                view, answer = await steps.view(_compile(sid), events, usage=usage)
                assert answer.HasField("usage"), "the step answers its report"
                reported = answer.usage
            else:
                reported = await api.compiles.ReportUsage(usage)
                view, answer = await steps.view(_compile(sid), events)
                assert not answer.HasField("usage")
            seen.append(reported.SerializeToString(deterministic=True))
            seen.append(view.budget.SerializeToString(deterministic=True))
            seen.append([m.SerializeToString(deterministic=True) for m in view.messages])
        return seen
    finally:
        await steps.close()


async def test_a_carried_report_is_the_baseline_exactly_like_a_unary_one(
    daemon: Daemon, short_tmp: Path
) -> None:
    other = Daemon(make_config(short_tmp / "other"))
    await other.start()
    unary_api, step_api = stubs_for(str(other.endpoints.tcp)), stubs_for(str(daemon.endpoints.tcp))
    try:
        by_unary = await _agent(unary_api, "s", carried=False)
        by_step = await _agent(step_api, "s", carried=True)
        assert by_step == by_unary
        # The views after a report were estimated from it, not from scratch.
        budget = view_pb2.Budget.FromString(by_step[-2])
        assert budget.estimate_method == view_pb2.ESTIMATE_METHOD_BASELINE_DELTA
        assert budget.baseline_tokens > 0
        metrics = await asyncio.to_thread(_scrape, daemon)
        assert metrics == await asyncio.to_thread(_scrape, other)
        counts = [v for k, v in metrics.items() if k.startswith("ctxcc_usage_reports_total")]
        assert sum(counts) == 2, metrics
    finally:
        await unary_api.channel.close()
        await step_api.channel.close()
        await other.stop()


async def _two_steps(
    steps: Steps, sid: str, extra: int, output: int
) -> tuple[cpb.ReportUsageRequest, view_pb2.CompiledView, cpb.CompileStreamResponse]:
    """A first step, then a second carrying the first view's usage: that report, the
    second view and its answer."""
    v1, _ = await steps.view(_compile(sid), [user("one")])
    usage = _usage(v1, extra=extra, output=output)
    v2, answer = await steps.view(_compile(sid), [user("two")], usage=usage)
    return usage, v2, answer


async def test_a_replayed_report_is_replayed_and_counted_once(daemon: Daemon, api: Stubs) -> None:
    await _new_session(api, "rp")
    steps = Steps(api)
    try:
        usage, v2, first = await _two_steps(steps, "rp", extra=50, output=200)
        assert not first.usage.replayed
        assert first.usage.error_tokens == 50
        assert v2.budget.baseline_tokens == usage.input_tokens
        # The same step resent (a reconnect): the append and the report are replays.
        again = await steps.step(_compile("rp"), [user("two")], usage=usage, request_id=f"r{2}")
        assert again[0].append.replayed and again[0].usage.replayed
        assert again[0].usage.error_tokens == 50
        # Other figures for the same compile change nothing, carried or unary.
        other = cpb.ReportUsageRequest()
        other.CopyFrom(usage)
        other.input_tokens += 999
        v3, third = await steps.view(_compile("rp"), [], usage=other)
        assert third.usage.replayed and third.usage.error_tokens == 50
        assert v3.budget.baseline_tokens == usage.input_tokens
        unary = await api.compiles.ReportUsage(other)
        assert unary.replayed and unary.error_tokens == 50
        assert await _head(api, "rp") == 2
        metrics = await asyncio.to_thread(_scrape, daemon)
        counts = [v for k, v in metrics.items() if k.startswith("ctxcc_usage_reports_total")]
        assert sum(counts) == 1, metrics
    finally:
        await steps.close()


async def test_a_refused_report_fails_the_whole_step(api: Stubs) -> None:
    await _new_session(api, "rf")
    await _new_session(api, "elsewhere")
    steps = Steps(api)
    try:
        v1, _ = await steps.view(_compile("rf"), [user("one")])
        foreign, _ = await steps.view(_compile("elsewhere"), [user("hello")])
        bad_route = _usage(v1, 0, 10)
        bad_route.route.model = "gpt-4o"
        zero = _usage(v1, 0, 10)
        zero.input_tokens = 0
        cases = [
            (_usage(foreign, 0, 10), "COMPILE_NOT_FOUND"),
            (cpb.ReportUsageRequest(compile_id="rf:nope", input_tokens=5), "COMPILE_NOT_FOUND"),
            (cpb.ReportUsageRequest(input_tokens=5), "INVALID_FIELD"),
            (zero, "USAGE_INVALID"),
            (bad_route, "ROUTE_MISMATCH"),
        ]
        for usage, reason in cases:
            (answer,) = await steps.step(
                _compile("rf"), [user("two")], usage=usage, request_id="same"
            )
            assert answer.WhichOneof("response") == "error", answer
            assert answer.error.reason == reason and answer.error.usage_refused, answer
            assert not answer.HasField("append") and not answer.HasField("usage")
            assert await _head(api, "rf") == 1, "nothing appended"
        # Nothing was recorded for either compile.
        for view in (v1, foreign):
            assert not (await api.compiles.ReportUsage(_usage(view, 3, 10))).replayed
        # The stream stays open and the same step without the report goes through.
        v2, answer = await steps.view(_compile("rf"), [user("two")], request_id="same")
        assert answer.append.first_seq == 2 and not answer.append.replayed
        assert v2.budget.baseline_tokens == v1.budget.estimated_input_tokens + 3
    finally:
        await steps.close()


async def test_a_step_without_events_is_estimated_from_its_report(api: Stubs) -> None:
    """Nothing appended, only the report is new: the view is compiled again from the new
    baseline, not answered as the repeat of the previous view."""
    await _new_session(api, "ne")
    steps = Steps(api)
    try:
        v1, _ = await steps.view(_compile("ne"), [user("one")])
        assert v1.budget.estimate_method == view_pb2.ESTIMATE_METHOD_FULL
        v2, answer = await steps.view(_compile("ne"), [], usage=_usage(v1, 25, 10))
        assert not answer.usage.replayed and not answer.HasField("append")
        assert v2.budget.estimate_method == view_pb2.ESTIMATE_METHOD_BASELINE_DELTA
        assert v2.budget.baseline_tokens == v1.budget.estimated_input_tokens + 25
        assert v2.budget.estimated_input_tokens == v2.budget.baseline_tokens
    finally:
        await steps.close()


async def test_a_recorded_report_stays_when_the_append_fails(api: Stubs) -> None:
    await _new_session(api, "af")
    steps = Steps(api)
    try:
        v1, _ = await steps.view(_compile("af"), [user("one")])
        usage = _usage(v1, 20, 10)
        (answer,) = await steps.step(
            _compile("af"), [user("two")], usage=usage, expected_last_seq=7
        )
        assert answer.error.reason == "SEQUENCE_MISMATCH" and not answer.error.usage_refused
        # The metadata a unary AppendEvents' ErrorInfo carries: the head to retry against.
        assert dict(answer.error.metadata) == {"head_seq": "1"}
        assert answer.HasField("usage") and not answer.usage.replayed
        assert answer.usage.error_tokens == 20
        assert await _head(api, "af") == 1
        assert (await api.compiles.ReportUsage(usage)).replayed
    finally:
        await steps.close()


async def test_a_carried_report_is_kept_across_a_restart(short_tmp: Path) -> None:
    """What a step's report recorded is what a restarted daemon reads: the report is a
    repeat there (its first figures answer), the next compile is estimated from it as it
    was before the restart, and the view the step returned has no report of its own."""
    daemons: list[Daemon] = []

    async def start() -> Stubs:
        daemons.append(Daemon(make_config(short_tmp / "data")))
        await daemons[-1].start()
        return stubs_for(str(daemons[-1].endpoints.tcp))

    api = await start()
    await _new_session(api, "rs")
    steps = Steps(api)
    try:
        usage, v2, answer = await _two_steps(steps, "rs", extra=60, output=300)
        assert not answer.usage.replayed and answer.usage.error_tokens == 60
        before = (await api.compiles.Compile(_compile("rs"))).view.budget
    finally:
        await steps.close()
        await api.channel.close()
        await daemons[-1].stop()
    api = await start()
    try:
        after = (await api.compiles.Compile(_compile("rs"))).view.budget
        assert after.estimate_method == view_pb2.ESTIMATE_METHOD_BASELINE_DELTA
        assert after.baseline_tokens == usage.input_tokens
        assert after.SerializeToString(deterministic=True) == before.SerializeToString(
            deterministic=True
        )
        other = cpb.ReportUsageRequest()
        other.CopyFrom(usage)
        other.input_tokens += 999
        again = await api.compiles.ReportUsage(other)
        assert again.replayed and again.error_tokens == 60
        fresh = await api.compiles.ReportUsage(_usage(v2, extra=9, output=10))
        assert not fresh.replayed and fresh.error_tokens == 9
        metrics = await asyncio.to_thread(_scrape, daemons[-1])
        counts = [v for k, v in metrics.items() if k.startswith("ctxcc_usage_reports_total")]
        assert sum(counts) == 1, metrics
    finally:
        await api.channel.close()
        await daemons[-1].stop()


async def test_the_result_rides_on_deltas_and_on_the_first_chunk(short_tmp: Path) -> None:
    d = Daemon(make_config(short_tmp, stream_chunk_bytes="4096"))
    await d.start()
    api = stubs_for(str(d.endpoints.tcp))
    await _new_session(api, "ck")
    steps = Steps(api)
    try:
        v1, _ = await steps.view(_compile("ck"), [user("hi")])
        (delta,) = await steps.step(
            _compile("ck"),
            [user("short")],
            usage=_usage(v1, 7, 10),
            delta_base_compile_id=v1.compile_id,
        )
        assert delta.WhichOneof("response") == "delta" and delta.usage.error_tokens == 7
        assert delta.append.first_seq == 2
        v2 = await steps.view(_compile("ck"), [])
        answers = await steps.step(
            _compile("ck"), [user("more " * 2000)], usage=_usage(v2[0], 5, 10)
        )
        assert len(answers) > 1 and answers[0].WhichOneof("response") == "chunk"
        assert answers[0].usage.error_tokens == 5 and answers[0].append.first_seq == 3
        assert not any(a.HasField("usage") for a in answers[1:])
    finally:
        await steps.close()
        await api.channel.close()
        await d.stop()


async def test_a_report_not_written_for_a_passing_reason_is_not_refused(
    daemon: Daemon, api: Stubs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk while recording the report: the step fails before its append, without
    usage_refused (the same report may be resent), and the resent step records it."""
    await _new_session(api, "dk")
    steps = Steps(api)
    try:
        v1, _ = await steps.view(_compile("dk"), [user("one")])
        use_cases: Any = daemon.compile_servicer._c  # type: ignore[union-attr]
        real = use_cases.report_usage

        async def disk_full(*args: Any, **kw: Any) -> Any:
            raise CtxccError(Reason.DISK_FULL, "the disk is full")

        monkeypatch.setattr(use_cases, "report_usage", disk_full)
        (answer,) = await steps.step(_compile("dk"), [user("two")], usage=_usage(v1, 4, 10))
        assert answer.error.reason == "DISK_FULL" and not answer.error.usage_refused
        assert not answer.HasField("append") and await _head(api, "dk") == 1
        monkeypatch.setattr(use_cases, "report_usage", real)
        v2, again = await steps.view(_compile("dk"), [user("two")], usage=_usage(v1, 4, 10))
        assert not again.usage.replayed and again.append.first_seq == 2
        assert v2.budget.baseline_tokens == v1.budget.estimated_input_tokens + 4
    finally:
        await steps.close()


async def test_a_step_whose_compile_is_refused_does_nothing(api: Stubs) -> None:
    """A compile request refused for what it asks (bad input, no store read needed) fails
    the step before its report and its append, like a refused report: the same step
    fixed goes through once, its events appended once (the code before appended them and
    recorded the report, then refused the compile)."""
    await _new_session(api, "cr")
    steps = Steps(api)
    try:
        v1, _ = await steps.view(_compile("cr"), [user("one")])
        no_model = _compile("cr")
        no_model.route.model = ""
        no_route = cpb.CompileRequest(session_id="cr")
        bad_dir = _compile("cr")
        bad_dir.environment.working_directory = "/tmp/a\x00b"
        bad_mode = _compile("cr")
        bad_mode.approval_mode = 99  # type: ignore[assignment]
        for req in (no_model, no_route, bad_dir, bad_mode):
            (answer,) = await steps.step(
                req, [user("two")], usage=_usage(v1, 5, 10), request_id="same"
            )
            assert answer.WhichOneof("response") == "error", answer
            assert answer.error.reason == "INVALID_FIELD" and not answer.error.usage_refused
            assert not answer.HasField("append") and not answer.HasField("usage"), answer
            assert await _head(api, "cr") == 1, "nothing appended"
        v2, answer = await steps.view(
            _compile("cr"), [user("two")], usage=_usage(v1, 5, 10), request_id="same"
        )
        assert answer.append.first_seq == 2 and not answer.append.replayed
        assert not answer.usage.replayed, "the report was not recorded before"
        assert v2.budget.baseline_tokens == v1.budget.estimated_input_tokens + 5
    finally:
        await steps.close()


async def test_a_rebuild_step_carries_its_sessions_report(api: Stubs) -> None:
    """A step that rebuilds a compile may leave compile.session_id empty (the compile id
    names the session): its report is for that session, recorded like any other. Before,
    the report was refused (`usage_refused`, so the clients dropped it) for the empty
    session id the request is allowed to have."""
    await _new_session(api, "rb")
    steps = Steps(api)
    try:
        v1, _ = await steps.view(_compile("rb"), [user("one")])
        rebuild = cpb.CompileRequest(rebuild_compile_id=v1.compile_id)
        again, answer = await steps.view(rebuild, [], usage=_usage(v1, 7, 10))
        assert again.SerializeToString() == v1.SerializeToString()
        assert answer.HasField("usage") and not answer.usage.replayed
        assert answer.usage.error_tokens == 7
        assert (await api.compiles.ReportUsage(_usage(v1, 7, 10))).replayed
    finally:
        await steps.close()
