"""The Python client's stream carries a view's usage on the next step (one round trip per
step), against a real daemon: the report is recorded before that step's compile and no
unary ReportUsage is made; a report with no step to ride on goes by the unary call (at
close, or when a second one is queued); a refused report fails its step with
`usage_refused` and is dropped, so trying the step again appends it (one the daemon
could not write for a passing reason stays queued); a report whose step
could not reach the daemon rides on the next step after a restart."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import pytest
from ctxcc_client import AsyncClient, Client, CtxccError, user

from ctxcc.v1 import common_pb2
from ctxcc.v1 import compile_service_pb2 as cpb
from server.app import Daemon
from server.domain.errors import CtxccError as DomainError
from server.domain.errors import Reason
from tests.conftest import make_config
from tests.helpers import usage_counts

ROUTE = common_pb2.Route(connection="t", protocol="fake", endpoint="local", model="gpt-4o")


def _counts(daemon: Daemon) -> tuple[float, float]:
    return usage_counts(str(daemon.endpoints.metrics))


async def test_a_queued_report_rides_on_the_next_step(daemon: Daemon) -> None:
    async with AsyncClient(str(daemon.endpoints.tcp)) as ctx:
        session = await ctx.create_session()
        req = cpb.CompileRequest(session_id=session.session_id, route=ROUTE)
        stream = ctx.stream()
        view, _ = await stream.step(req, [user("one")])
        assert stream.last_usage is None
        used = view.budget.estimated_input_tokens + 40
        queued = await stream.report_usage(
            view.compile_id, input_tokens=used, output_tokens=77, route=ROUTE
        )
        assert queued is None, "nothing is sent until the next step"
        assert await asyncio.to_thread(_counts, daemon) == (0, 0)
        second, appended = await stream.step(req, [user("two")])
        assert appended is not None and appended.first_seq == 2
        assert stream.last_usage is not None and stream.last_usage.error_tokens == 40
        assert not stream.last_usage.replayed
        assert second.budget.baseline_tokens == used, "the step's compile used the report"
        assert await asyncio.to_thread(_counts, daemon) == (1, 0), "no unary call"
        third, _ = await stream.step(req, [user("three")])
        assert stream.last_usage is None and third.budget.baseline_tokens == used
        # A report with no step after it goes by the unary call when the stream closes.
        await stream.report_usage(third.compile_id, input_tokens=used + 50, output_tokens=5)
        await stream.close()
        assert await asyncio.to_thread(_counts, daemon) == (2, 1)
        again = await ctx.report_usage(third.compile_id, input_tokens=1, output_tokens=1)
        assert again.replayed


async def test_a_second_queued_report_sends_the_first_by_the_unary_call(daemon: Daemon) -> None:
    async with AsyncClient(str(daemon.endpoints.tcp)) as ctx:
        session = await ctx.create_session()
        req = cpb.CompileRequest(session_id=session.session_id, route=ROUTE)
        stream = ctx.stream()
        first, _ = await stream.step(req, [user("one")])
        second, _ = await stream.step(req, [])
        await stream.report_usage(first.compile_id, input_tokens=900, output_tokens=10)
        sent = await stream.report_usage(second.compile_id, input_tokens=950, output_tokens=10)
        assert sent is not None and not sent.replayed
        assert sent.estimated_input_tokens == first.budget.estimated_input_tokens
        third, _ = await stream.step(req, [user("two")])
        assert stream.last_usage is not None
        assert stream.last_usage.estimated_input_tokens == second.budget.estimated_input_tokens
        assert third.budget.baseline_tokens == 950
        assert await asyncio.to_thread(_counts, daemon) == (2, 1)
        await stream.close()


async def test_a_refused_report_fails_its_step_and_is_dropped(daemon: Daemon) -> None:
    async with AsyncClient(str(daemon.endpoints.tcp)) as ctx:
        session = await ctx.create_session()
        sid = session.session_id
        req = cpb.CompileRequest(session_id=sid, route=ROUTE)
        stream = ctx.stream()
        await stream.step(req, [user("one")])
        await stream.report_usage(f"{sid}:no-such-compile", input_tokens=9, output_tokens=1)
        with pytest.raises(CtxccError) as err:
            await stream.step(req, [user("two")])
        assert err.value.reason == "COMPILE_NOT_FOUND" and err.value.usage_refused
        assert err.value.code == grpc.StatusCode.NOT_FOUND
        assert (await ctx.get_session(sid)).head_seq == 1, "nothing appended"
        view, appended = await stream.step(req, [user("two")])
        assert appended is not None and appended.first_seq == 2 and not appended.replayed
        assert stream.last_usage is None and view.event_boundary == 2
        await stream.close()
        assert (await asyncio.to_thread(_counts, daemon))[1] == 0


async def test_a_report_whose_step_failed_rides_on_the_next_one(short_tmp: Path) -> None:
    first = Daemon(make_config(short_tmp))
    await first.start()
    target = f"unix:{first.endpoints.unix}"
    async with AsyncClient(target, retry_seconds=2.0) as ctx:
        session = await ctx.create_session()
        req = cpb.CompileRequest(session_id=session.session_id, route=ROUTE)
        stream = ctx.stream()
        view, _ = await stream.step(req, [user("one")])
        used = view.budget.estimated_input_tokens + 8
        await stream.report_usage(view.compile_id, input_tokens=used, output_tokens=3)
        await first.stop()
        with pytest.raises(CtxccError) as err:
            await stream.step(req, [user("two")])
        assert err.value.code == grpc.StatusCode.UNAVAILABLE and not err.value.usage_refused
        second = Daemon(make_config(short_tmp))
        await second.start()
        try:
            after, _ = await stream.step(req, [user("two")])
            assert stream.last_usage is not None and not stream.last_usage.replayed
            assert after.budget.baseline_tokens == used
            await stream.close()
            assert await asyncio.to_thread(_counts, second) == (1, 0)
        finally:
            await second.stop()


async def test_a_report_not_written_for_a_passing_reason_stays_queued(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_cases: Any = daemon.compile_servicer._c  # type: ignore[union-attr]
    real = use_cases.report_usage

    async def disk_full(*args: Any, **kw: Any) -> Any:
        raise DomainError(Reason.DISK_FULL, "the disk is full")

    async with AsyncClient(str(daemon.endpoints.tcp)) as ctx:
        session = await ctx.create_session()
        req = cpb.CompileRequest(session_id=session.session_id, route=ROUTE)
        stream = ctx.stream()
        view, _ = await stream.step(req, [user("one")])
        await stream.report_usage(view.compile_id, input_tokens=500, output_tokens=5)
        monkeypatch.setattr(use_cases, "report_usage", disk_full)
        with pytest.raises(CtxccError) as err:
            await stream.step(req, [user("two")])
        assert err.value.reason == "DISK_FULL" and not err.value.usage_refused
        monkeypatch.setattr(use_cases, "report_usage", real)
        after, appended = await stream.step(req, [user("two")])
        assert appended is not None and appended.first_seq == 2
        assert stream.last_usage is not None and not stream.last_usage.replayed
        assert after.budget.baseline_tokens == 500
        await stream.close()


async def test_the_unary_helpers_report_reasoning_tokens_like_the_stream(daemon: Daemon) -> None:
    """`report_usage` of AsyncClient and Client takes `reasoning_tokens` as the stream's
    does and sends it: the daemon judges it (over its bound: INVALID_FIELD naming it).
    Before, both helpers had no such argument."""
    too_many = (1 << 28) + 1
    async with AsyncClient(str(daemon.endpoints.tcp)) as ctx:
        sid = (await ctx.create_session()).session_id
        view = await ctx.compile(sid, route=ROUTE)
        with pytest.raises(CtxccError) as err:
            await ctx.report_usage(
                view.compile_id, input_tokens=900, output_tokens=10, reasoning_tokens=too_many
            )
        assert err.value.reason == "INVALID_FIELD" and "reasoning_tokens" in err.value.message

        def blocking() -> cpb.ReportUsageResponse:
            with Client(str(daemon.endpoints.tcp)) as sync:
                with pytest.raises(CtxccError) as refused:
                    sync.report_usage(
                        view.compile_id,
                        input_tokens=900,
                        output_tokens=10,
                        reasoning_tokens=too_many,
                    )
                assert "reasoning_tokens" in refused.value.message
                return sync.report_usage(
                    view.compile_id, input_tokens=900, output_tokens=10, reasoning_tokens=4
                )

        answer = await asyncio.to_thread(blocking)
        assert (
            not answer.replayed and answer.error_tokens == 900 - view.budget.estimated_input_tokens
        )


async def test_close_ends_a_step_pausing_before_a_retry_and_sends_its_report(
    short_tmp: Path,
) -> None:
    """A step waiting out a daemon that went away when the stream is closed fails
    STREAM_CLOSED instead of resending after the close, and the report it carried goes by
    the unary call at close."""
    first = Daemon(make_config(short_tmp))
    await first.start()
    target = f"unix:{first.endpoints.unix}"
    async with AsyncClient(target, retry_seconds=20.0) as ctx:
        session = await ctx.create_session()
        req = cpb.CompileRequest(session_id=session.session_id, route=ROUTE)
        stream = ctx.stream()
        view, _ = await stream.step(req, [user("one")])
        await stream.report_usage(view.compile_id, input_tokens=50, output_tokens=3)
        await first.stop()
        stepping = asyncio.create_task(stream.step(req, [user("two")]))
        await asyncio.sleep(0.3)  # the step pauses between attempts
        assert not stepping.done()
        second = Daemon(make_config(short_tmp))
        closing = asyncio.create_task(stream.close())
        await asyncio.sleep(0.05)
        assert stepping.done(), "close ends the step's pause"
        await second.start()
        try:
            await closing
            with pytest.raises(CtxccError) as err:
                await stepping
            assert err.value.reason == "STREAM_CLOSED"
            await asyncio.sleep(0.5)
            got = await ctx.get_session(session.session_id)
            assert got.head_seq == 1, "nothing was sent after the close"
            assert await asyncio.to_thread(_counts, second) == (1, 1), "the report went at close"
        finally:
            await second.stop()
