"""ResumeRequest does what the proto says: the named view again (same compile_id) while
nothing new is in the log, a fresh compile once something is, or when the view is not kept;
every message of the answer carries the resume's step_id (the whole view, each chunk, the
StepError), and an empty one when the resume has none, as before the field existed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_pb2
from ctxcc.v1 import session_service_pb2 as spb
from server.app import Daemon
from tests.conftest import Stubs, make_config, stubs_for
from tests.helpers import compile_request, user


async def _one(api: Stubs, msg: cpb.CompileStreamRequest) -> cpb.CompileStreamResponse:
    async def requests() -> AsyncIterator[cpb.CompileStreamRequest]:
        yield msg

    out = [r async for r in api.compiles.CompileStream(requests())]
    assert len(out) == 1
    return out[0]


def _resume(compile_id: str, session_id: str, step_id: str = "") -> cpb.CompileStreamRequest:
    return cpb.CompileStreamRequest(
        resume=cpb.ResumeRequest(
            compile_id=compile_id, compile=compile_request(session_id), step_id=step_id
        )
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


async def _read(call: Any) -> cpb.CompileStreamResponse:
    resp = await call.read()
    assert isinstance(resp, cpb.CompileStreamResponse), resp
    return resp


async def test_every_message_of_a_resumes_answer_carries_its_step_id(short_tmp: Path) -> None:
    """On one stream: the kept view resent, a fresh compile sent in chunks, a StepError,
    each under its resume's step_id; a resume without one is answered without one."""
    daemon = Daemon(make_config(short_tmp, stream_chunk_bytes="4096"))
    await daemon.start()
    api = stubs_for(f"unix:{daemon.endpoints.unix}")
    sent: asyncio.Queue[cpb.CompileStreamRequest | None] = asyncio.Queue()

    async def requests() -> AsyncIterator[cpb.CompileStreamRequest]:
        while (msg := await sent.get()) is not None:
            yield msg

    try:
        await api.sessions.CreateSession(
            spb.CreateSessionRequest(session=session_pb2.Session(session_id="ri"))
        )
        call = api.compiles.CompileStream(requests())
        step = cpb.StepRequest(
            step_id="1", events=[user("ask")], request_id="q1", compile=compile_request("ri")
        )
        await sent.put(cpb.CompileStreamRequest(step=step))
        first = await _read(call)
        assert first.step_id == "1"
        # The kept view, resent whole.
        await sent.put(_resume(first.view.compile_id, "ri", "2"))
        kept = await _read(call)
        assert kept.step_id == "2" and kept.view == first.view
        # Something new and long in the log: a fresh compile, over the chunk size.
        await api.sessions.AppendEvents(
            spb.AppendEventsRequest(session_id="ri", events=[user("x" * 20_000)], request_id="q2")
        )
        await sent.put(_resume(first.view.compile_id, "ri", "3"))
        chunks = [await _read(call)]
        while chunks[-1].chunk.index + 1 < chunks[-1].chunk.count:
            chunks.append(await _read(call))
        assert len(chunks) > 1 and {c.step_id for c in chunks} == {"3"}
        assert chunks[0].chunk.compile_id != first.view.compile_id
        # A resume that fails answers in-band, under its id too.
        await sent.put(_resume(first.view.compile_id, "no-such-session", "4"))
        failed = await _read(call)
        assert failed.step_id == "4" and failed.error.reason == "SESSION_NOT_FOUND"
        # No id: none in the answer, whole or in chunks, as a client of before expects.
        await sent.put(_resume(first.view.compile_id, "ri"))
        old = [await _read(call)]
        while old[-1].chunk.index + 1 < old[-1].chunk.count:
            old.append(await _read(call))
        assert len(old) == len(chunks) and {c.step_id for c in old} == {""}
        await sent.put(None)
    finally:
        await api.channel.close()
        await daemon.stop()
