"""Steps of a session over its window: what the daemon remembers between them (the
compaction request, the events found with nothing to shorten) never hides a change."""

from __future__ import annotations

from ctxcc.v1 import checkpoint_pb2, event_pb2, session_pb2, view_pb2
from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_service_pb2 as spb
from tests.conftest import Stubs
from tests.helpers import ROUTE, assistant, tool_result, user


async def _append(api: Stubs, sid: str, *events: event_pb2.Event) -> None:
    await api.sessions.AppendEvents(spb.AppendEventsRequest(session_id=sid, events=list(events)))


async def test_a_result_to_shorten_after_steps_with_none_is_shortened(api: Stubs) -> None:
    """Over budget with nothing the built-in compaction could shorten, steps ask for a
    summary; a large result that arrives later, once its turn is history, is shortened by
    a built-in checkpoint at the next step."""
    sid = "ob-elide"
    await api.sessions.CreateSession(
        spb.CreateSessionRequest(session=session_pb2.Session(session_id=sid))
    )
    chat: list[event_pb2.Event] = []
    for i in range(12):
        chat += [user(f"question {i} " + "about the design " * 30), assistant(f"answer {i}")]
    await _append(api, sid, *chat)
    req = cpb.CompileRequest(
        session_id=sid, route=ROUTE, limits=cpb.ModelLimits(context_window=1_500)
    )
    for k in range(3):  # steps of one turn: calls with small results
        await _append(api, sid, assistant("", (f"s{k}", "sql", "{}")), tool_result(f"s{k}", "ok"))
        view = (await api.compiles.Compile(req)).view
        assert view.decision != view_pb2.DECISION_OK and view.compaction.prompt
        assert not view.checkpoint_id  # nothing to shorten: no built-in checkpoint
    big = "\n".join(f"row {i} " + "zq" * 30 for i in range(300))
    await _append(api, sid, assistant("", ("c1", "sql", "{}")), tool_result("c1", big))
    await _append(api, sid, user("next question"))  # the big result is history now
    view = (await api.compiles.Compile(req)).view
    assert view.checkpoint_id, "a built-in checkpoint was made"
    listed = await api.compiles.ListCheckpoints(cpb.ListCheckpointsRequest(session_id=sid))
    assert listed.checkpoints[0].kind == checkpoint_pb2.CHECKPOINT_KIND_BUILTIN
    tool = next(m for m in view.messages if m.tool_call_id == "c1")
    assert "elided by compaction" in tool.parts[0].text
