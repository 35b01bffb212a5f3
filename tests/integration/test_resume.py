"""ResumeRequest does what the proto says: the named view again (same compile_id) while
nothing new is in the log, a fresh compile once something is, or when the view is not kept;
the answer's step_id is empty."""

from __future__ import annotations

from collections.abc import AsyncIterator

from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_pb2
from ctxcc.v1 import session_service_pb2 as spb
from tests.conftest import Stubs
from tests.helpers import compile_request, user


async def _one(api: Stubs, msg: cpb.CompileStreamRequest) -> cpb.CompileStreamResponse:
    async def requests() -> AsyncIterator[cpb.CompileStreamRequest]:
        yield msg

    out = [r async for r in api.compiles.CompileStream(requests())]
    assert len(out) == 1
    return out[0]


def _resume(compile_id: str, session_id: str) -> cpb.CompileStreamRequest:
    return cpb.CompileStreamRequest(
        resume=cpb.ResumeRequest(compile_id=compile_id, compile=compile_request(session_id))
    )


async def test_resume_resends_the_named_view_until_the_log_moves(api: Stubs) -> None:
    await api.sessions.CreateSession(
        spb.CreateSessionRequest(session=session_pb2.Session(session_id="rs"))
    )
    step = cpb.StepRequest(
        step_id="1", events=[user("first ask")], request_id="q1", compile=compile_request("rs")
    )
    first = (await _one(api, cpb.CompileStreamRequest(step=step))).view
    # A new stream, as after a reconnect: the same view, not a new compile.
    again = await _one(api, _resume(first.compile_id, "rs"))
    assert again.step_id == ""
    assert again.view == first

    # Another session's id does not get this session's view.
    await api.sessions.CreateSession(
        spb.CreateSessionRequest(session=session_pb2.Session(session_id="other"))
    )
    elsewhere = (await _one(api, _resume(first.compile_id, "other"))).view
    assert elsewhere.compile_id != first.compile_id and elsewhere.event_boundary == 0

    # Something new in the log: the kept view is stale, so the answer is a fresh compile.
    await api.sessions.AppendEvents(
        spb.AppendEventsRequest(session_id="rs", events=[user("second ask")], request_id="q2")
    )
    fresh = (await _one(api, _resume(first.compile_id, "rs"))).view
    assert fresh.compile_id != first.compile_id
    assert (first.event_boundary, fresh.event_boundary) == (1, 2)


async def test_resume_of_an_unknown_compile_compiles_afresh(api: Stubs) -> None:
    await api.sessions.CreateSession(
        spb.CreateSessionRequest(session=session_pb2.Session(session_id="ru"))
    )
    await api.sessions.AppendEvents(
        spb.AppendEventsRequest(session_id="ru", events=[user("ask")], request_id="q1")
    )
    out = await _one(api, _resume("k-not-kept", "ru"))
    assert out.step_id == "" and out.view.compile_id not in ("", "k-not-kept")
    assert out.view.event_boundary == 1
    missing = await _one(api, _resume("k-not-kept", "no-such-session"))
    assert missing.error.reason == "SESSION_NOT_FOUND"
