"""The model catalog entry is one of a recorded compile's versions: after a restart with
another catalog (an upgrade changed the shipped one: a924ed8 counted Claude with
its own vocabulary instead of cl100k x 1.13; or another --model-catalog), the same
request `as_of_seq` a recorded step gets that step's view again, sized and counted as it
was, and a rebuild by id too; only compiles at the head take the new entry."""

from __future__ import annotations

import json
from pathlib import Path

from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_pb2
from ctxcc.v1 import session_service_pb2 as spb
from server.app import Daemon
from tests.conftest import make_config, stubs_for
from tests.helpers import ROUTE, assistant, tool_result, user

OLD_ENTRY = {
    "family": "anthropic",
    "context_window": 200000,
    "max_output": 64000,
    "images": True,
    "tokenizer": "cl100k",
    "token_factor": 1.13,
}


def _bytes(view: object) -> bytes:
    data: bytes = view.SerializeToString(deterministic=True)  # type: ignore[attr-defined]
    return data


async def test_as_of_seq_takes_the_recorded_catalog_entry(short_tmp: Path) -> None:
    catalog = short_tmp / "models.json"
    catalog.write_text(json.dumps({"models": {ROUTE.model: OLD_ENTRY}}))
    data = short_tmp / "data"
    req = cpb.CompileRequest(session_id="c", route=ROUTE)
    daemon = Daemon(make_config(data, model_catalog=str(catalog)))
    await daemon.start()
    api = stubs_for(f"unix:{daemon.endpoints.unix}")
    try:
        await api.sessions.CreateSession(
            spb.CreateSessionRequest(session=session_pb2.Session(session_id="c"))
        )
        events = [
            user("List the files, please."),
            assistant("", ("c1", "shell", '{"cmd": "ls -la src"}')),
            tool_result("c1", "app.py\nutil.py\n" * 20),
            assistant("Two files, twenty times."),
        ]
        await api.sessions.AppendEvents(spb.AppendEventsRequest(session_id="c", events=events))
        original = (await api.compiles.Compile(req)).view
    finally:
        await api.channel.close()
        await daemon.stop()
    daemon = Daemon(make_config(data))  # the shipped catalog: the Claude vocabulary
    await daemon.start()
    api = stubs_for(f"unix:{daemon.endpoints.unix}")
    try:
        at = cpb.CompileRequest()
        at.CopyFrom(req)
        at.as_of_seq = original.event_boundary
        past = (await api.compiles.Compile(at)).view
        assert past.compile_id.startswith("c:unrecorded-")
        past.compile_id = original.compile_id
        assert _bytes(past) == _bytes(original)
        rebuilt = await api.compiles.Compile(
            cpb.CompileRequest(rebuild_compile_id=original.compile_id)
        )
        assert _bytes(rebuilt.view) == _bytes(original)
        # The new entry counts the same messages otherwise: the check above could fail.
        now = (await api.compiles.Compile(req)).view
        assert [m.tokens for m in now.messages] != [m.tokens for m in original.messages]
    finally:
        await api.channel.close()
        await daemon.stop()
