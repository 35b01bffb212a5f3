"""The first vertical slice through a real server, on TCP and on the Unix socket:
create a session, append a user message, compile a view holding it, report usage."""

from __future__ import annotations

import grpc
import pytest

from ctxcc.v1 import (
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
from tests.conftest import Stubs
from tests.helpers import ROUTE, assistant, compile_request, error_info, tool_result, user


async def test_create_append_compile_report(api: Stubs) -> None:
    created = await api.sessions.CreateSession(
        spb.CreateSessionRequest(session=session_pb2.Session(session_id="s1", project_id="p"))
    )
    assert created.session.session_id == "s1"
    assert created.session.head_seq == 0
    appended = await api.sessions.AppendEvents(
        spb.AppendEventsRequest(session_id="s1", events=[user("list the files in src/")])
    )
    assert (appended.first_seq, appended.last_seq) == (1, 1)

    view = (await api.compiles.Compile(compile_request("s1"))).view
    assert view.event_boundary == 1
    assert [m.role for m in view.messages] == [event_pb2.MESSAGE_ROLE_USER]
    assert view.messages[0].parts[0].text == "list the files in src/"
    assert view.messages[0].layer == view_pb2.LAYER_WORKING_SET
    kinds = [s.kind for s in view.system_sections]
    assert kinds[0] == view_pb2.SECTION_KIND_KERNEL
    assert kinds[-1] == view_pb2.SECTION_KIND_ENVIRONMENT
    assert view.system_prompt.startswith(view.system_sections[0].text)
    assert len(view.prefix_digest) == 64
    ledger = {row.layer: row.tokens for row in view.layers}
    assert sum(ledger.values()) == view.budget.estimated_input_tokens == view.budget.ledger_tokens
    assert view.budget.estimate_method == view_pb2.ESTIMATE_METHOD_FULL
    assert ledger[view_pb2.LAYER_WORKING_SET] > 0
    assert view.decision == view_pb2.DECISION_OK
    # The catalog knows claude-sonnet-4: a 200K window, so R-BUD-1 reserves 16K.
    assert not view.budget.window_unknown
    assert (view.budget.context_window, view.budget.output_reserve) == (200_000, 16_384)
    assert view.budget.input_budget == 200_000 - 16_384

    usage = await api.compiles.ReportUsage(
        cpb.ReportUsageRequest(
            compile_id=view.compile_id, route=ROUTE, input_tokens=1000, output_tokens=300
        )
    )
    assert usage.estimated_input_tokens == view.budget.estimated_input_tokens
    assert usage.error_tokens == 1000 - view.budget.estimated_input_tokens
    assert not usage.replayed
    assert usage.next_output_reserve == 1024  # R-BUD-2: 2 x 300 clamped up to 1K
    again = await api.compiles.ReportUsage(
        cpb.ReportUsageRequest(
            compile_id=view.compile_id, route=ROUTE, input_tokens=1000, output_tokens=300
        )
    )
    assert again.replayed
    assert again.error_tokens == usage.error_tokens

    # After a usage report the same route's next view reserves 2 x last output (1K floor)
    # and estimates from the reported baseline plus what changed since (nothing here but,
    # at most, the minute in the environment section).
    view2 = (await api.compiles.Compile(compile_request("s1"))).view
    assert view2.budget.output_reserve == 1024
    assert view2.budget.estimate_method == view_pb2.ESTIMATE_METHOD_BASELINE_DELTA
    assert view2.budget.baseline_tokens == 1000
    assert abs(view2.budget.estimated_input_tokens - 1000) < 20


async def test_view_follows_the_log_and_drops_reasoning(api: Stubs) -> None:
    await api.sessions.CreateSession(spb.CreateSessionRequest(session=session_pb2.Session()))
    listed = await api.sessions.ListSessions(spb.ListSessionsRequest())
    sid = listed.sessions[0].session_id
    assert sid.startswith("s-")
    events = [
        user("old question"),
        assistant("old answer", reasoning="secret chain of thought"),
        user("run ls"),
        assistant("", ("c1", "shell", '{"cmd": "ls"}')),
        tool_result("c1", "a.py\nb.py"),
    ]
    await api.sessions.AppendEvents(spb.AppendEventsRequest(session_id=sid, events=events))
    view = (await api.compiles.Compile(compile_request(sid))).view
    roles = [m.role for m in view.messages]
    assert roles == [
        event_pb2.MESSAGE_ROLE_USER,
        event_pb2.MESSAGE_ROLE_ASSISTANT,
        event_pb2.MESSAGE_ROLE_USER,
        event_pb2.MESSAGE_ROLE_ASSISTANT,
        event_pb2.MESSAGE_ROLE_TOOL,
    ]
    layers = [m.layer for m in view.messages]
    assert layers == [view_pb2.LAYER_HISTORY] * 2 + [view_pb2.LAYER_WORKING_SET] * 3
    assert "secret chain of thought" not in str(view)
    assert view.messages[3].tool_calls[0].name == "shell"
    assert view.messages[4].tool_call_id == "c1"
    # Time travel: as of seq 2 the view ends before the second question.
    past = (await api.compiles.Compile(compile_request(sid, as_of_seq=2))).view
    assert past.event_boundary == 2
    assert len(past.messages) == 2


async def test_bad_input_gets_status_and_reason(api: Stubs) -> None:
    async def fails(call: object) -> tuple[grpc.StatusCode, str]:
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await call  # type: ignore[misc]
        return exc.value.code(), error_info(exc.value).reason

    s = api.sessions
    assert await fails(s.GetSession(spb.GetSessionRequest(session_id="nope"))) == (
        grpc.StatusCode.NOT_FOUND,
        "SESSION_NOT_FOUND",
    )
    assert await fails(
        s.AppendEvents(spb.AppendEventsRequest(session_id="nope", events=[user("x")]))
    ) == (grpc.StatusCode.NOT_FOUND, "SESSION_NOT_FOUND")
    assert await fails(s.GetSession(spb.GetSessionRequest(session_id="../etc"))) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_FIELD",
    )
    await s.CreateSession(spb.CreateSessionRequest(session=session_pb2.Session(session_id="b")))
    assert await fails(
        s.CreateSession(spb.CreateSessionRequest(session=session_pb2.Session(session_id="b")))
    ) == (grpc.StatusCode.ALREADY_EXISTS, "SESSION_ALREADY_EXISTS")
    # An empty message, an empty event and an empty batch.
    empty_text = s.AppendEvents(spb.AppendEventsRequest(session_id="b", events=[user("")]))
    assert await fails(empty_text) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD")
    assert await fails(
        s.AppendEvents(spb.AppendEventsRequest(session_id="b", events=[event_pb2.Event()]))
    ) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD")
    assert await fails(s.AppendEvents(spb.AppendEventsRequest(session_id="b"))) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_FIELD",
    )
    # An oversized field: a 2 MiB user message is over the 1 MiB event limit.
    code, reason = await fails(
        s.AppendEvents(spb.AppendEventsRequest(session_id="b", events=[user("x" * (2 << 20))]))
    )
    assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "FIELD_TOO_LARGE")
    # Nothing of the refused appends was written.
    assert (await s.GetSession(spb.GetSessionRequest(session_id="b"))).session.head_seq == 0
    # Compile: unknown session, missing route, seq beyond head.
    c = api.compiles
    assert await fails(c.Compile(compile_request("nope"))) == (
        grpc.StatusCode.NOT_FOUND,
        "SESSION_NOT_FOUND",
    )
    assert await fails(c.Compile(cpb.CompileRequest(session_id="b"))) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_FIELD",
    )
    assert await fails(c.Compile(compile_request("b", as_of_seq=5))) == (
        grpc.StatusCode.OUT_OF_RANGE,
        "SEQ_OUT_OF_RANGE",
    )
    # Usage: unknown compile (the id in the metadata, as on a stream step's error, also
    # for one not shaped <session>:<suffix>), and a route other than the compile's.
    for unknown in ("b:nope", "nope"):
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await c.ReportUsage(cpb.ReportUsageRequest(compile_id=unknown, input_tokens=1))
        info = error_info(exc.value)
        assert (exc.value.code(), info.reason, info.metadata["compile_id"]) == (
            grpc.StatusCode.NOT_FOUND,
            "COMPILE_NOT_FOUND",
            unknown,
        )
    # A rebuild naming an id of no compile's shape: not found, not "another session's".
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await c.Compile(cpb.CompileRequest(session_id="b", rebuild_compile_id="nope"))
    info = error_info(exc.value)
    assert (exc.value.code(), info.reason, info.metadata["compile_id"]) == (
        grpc.StatusCode.NOT_FOUND,
        "COMPILE_NOT_FOUND",
        "nope",
    )
    await s.AppendEvents(spb.AppendEventsRequest(session_id="b", events=[user("hi")]))
    view = (await c.Compile(compile_request("b"))).view
    other = common_pb2.Route(model="gpt-4o")
    assert await fails(
        c.ReportUsage(
            cpb.ReportUsageRequest(compile_id=view.compile_id, route=other, input_tokens=1)
        )
    ) == (grpc.StatusCode.FAILED_PRECONDITION, "ROUTE_MISMATCH")


async def test_append_is_idempotent_and_optimistic(api: Stubs) -> None:
    s = api.sessions
    await s.CreateSession(spb.CreateSessionRequest(session=session_pb2.Session(session_id="i")))
    req = spb.AppendEventsRequest(session_id="i", events=[user("one")], request_id="r-1")
    first = await s.AppendEvents(req)
    retry = await s.AppendEvents(req)
    assert (retry.first_seq, retry.last_seq, retry.replayed) == (1, 1, True)
    assert not first.replayed
    assert list(retry.event_ids) == list(first.event_ids)
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await s.AppendEvents(
            spb.AppendEventsRequest(session_id="i", events=[user("two")], request_id="r-1")
        )
    assert error_info(exc.value).reason == "REQUEST_ID_REUSED"
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await s.AppendEvents(
            spb.AppendEventsRequest(session_id="i", events=[user("two")], expected_last_seq=0)
        )
    assert exc.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    info = error_info(exc.value)
    assert (info.reason, info.metadata["head_seq"]) == ("SEQUENCE_MISMATCH", "1")
    ok = await s.AppendEvents(
        spb.AppendEventsRequest(session_id="i", events=[user("two")], expected_last_seq=1)
    )
    assert ok.last_seq == 2
    listed = await s.ListEvents(spb.ListEventsRequest(session_id="i"))
    assert [e.user_message.parts[0].text for e in listed.events] == ["one", "two"]
