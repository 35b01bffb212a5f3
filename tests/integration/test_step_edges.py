"""CompileStream steps at the edges of what a step may ask, against a real daemon (the
raw stream of test_step_usage.py)."""

from __future__ import annotations

from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_service_pb2 as spb
from tests.conftest import Stubs
from tests.helpers import user
from tests.integration.test_step_usage import Steps, _compile, _head, _new_session, _usage


async def test_a_rebuild_step_appends_its_events_to_the_rebuilt_compiles_session(
    api: Stubs,
) -> None:
    """A rebuild step may leave compile.session_id empty (the compile id names the
    session), and its events then go to that session, like its report. Before, the
    append was made for the empty session id: the step failed with INVALID_FIELD
    `session_id` after its report had been recorded."""
    await _new_session(api, "rb")
    steps = Steps(api)
    try:
        v1, _ = await steps.view(_compile("rb"), [user("one")])
        rebuild = cpb.CompileRequest(rebuild_compile_id=v1.compile_id)
        again, answer = await steps.view(rebuild, [user("two")], usage=_usage(v1, 7, 10))
        assert again.SerializeToString() == v1.SerializeToString()
        assert answer.append.first_seq == answer.append.last_seq == 2
        assert answer.usage.error_tokens == 7 and not answer.usage.replayed
        assert await _head(api, "rb") == 2
        listed = await api.sessions.ListEvents(spb.ListEventsRequest(session_id="rb"))
        assert [e.user_message.parts[0].text for e in listed.events] == ["one", "two"]
    finally:
        await steps.close()
