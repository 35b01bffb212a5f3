"""What a CompileStream step reads that the daemon keeps between steps (the session's
checkpoint and tool lists, the last view's encoded parts, the projection memo) is read
again when it changed, through a real daemon: a checkpoint made, tools registered or
changed, memory changed, the session deleted and made again under its id, and a second
stream stepping the same session. Each view a step hands out (rebuilt from its delta and
checked against its digest by RawStream) is checked for what the change must show, and
byte for byte against a unary rebuild of its compile."""

from __future__ import annotations

from ctxcc.v1 import checkpoint_pb2, common_pb2, session_pb2, source_pb2, tool_pb2, view_pb2
from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_service_pb2 as spb
from ctxcc.v1 import source_service_pb2 as rpb
from ctxcc.v1 import tool_service_pb2 as tpb
from tests.conftest import Stubs
from tests.helpers import ROUTE, assistant, compile_request, tool_result, user
from tests.integration.delta_session import RawStream, encoded

DIGEST = cpb.DELTA_DIGEST_MESSAGE_CHAIN


async def _create(api: Stubs, sid: str) -> None:
    await api.sessions.CreateSession(
        spb.CreateSessionRequest(session=session_pb2.Session(session_id=sid, project_id="rc"))
    )


async def _step(stream: RawStream, api: Stubs, sid: str, *events: object) -> view_pb2.CompiledView:
    view = await stream.step(compile_request(sid), list(events))  # type: ignore[arg-type]
    again = await api.compiles.Compile(cpb.CompileRequest(rebuild_compile_id=view.compile_id))
    assert encoded(view) == encoded(again.view)
    return view


def _texts(view: view_pb2.CompiledView) -> list[str]:
    return [p.text for m in view.messages for p in m.parts]


async def _register(api: Stubs, sid: str, name: str, description: str) -> None:
    await api.tools.RegisterTools(
        tpb.RegisterToolsRequest(
            session_id=sid,
            tools=[
                tool_pb2.ToolDefinition(
                    name=name, description=description, input_schema_json='{"type": "object"}'
                )
            ],
        )
    )


async def _checkpoint(
    api: Stubs, sid: str, through: int, summary: str
) -> cpb.CreateCheckpointResponse:
    return await api.compiles.CreateCheckpoint(
        cpb.CreateCheckpointRequest(
            checkpoint=checkpoint_pb2.Checkpoint(
                session_id=sid, covers_through_seq=through, summary=summary, portable=True
            ),
            covered_digest_mode=cpb.COVERED_DIGEST_MODE_COMPUTE,
        )
    )


async def _turns(stream: RawStream, api: Stubs, sid: str, n: int, tag: str) -> None:
    for i in range(n):
        await _step(
            stream,
            api,
            sid,
            user(f"{tag} question {i}"),
            assistant(f"{tag} answer {i}", (f"{tag}{i}", "read", "{}")),
            tool_result(f"{tag}{i}", f"{tag} result {i}", name="read"),
        )


async def test_a_checkpoint_made_between_steps_is_in_the_next_view(api: Stubs) -> None:
    sid = "rc-ck"
    await _create(api, sid)
    stream = RawStream(api, digest=DIGEST)
    try:
        await _turns(stream, api, sid, 4, "a")
        made = await _checkpoint(api, sid, 6, "THE SUMMARY")
        view = await _step(stream, api, sid, user("after the checkpoint"))
        assert view.checkpoint_id == made.checkpoint.checkpoint_id
        texts = _texts(view)
        assert "THE SUMMARY" in texts[0] and "a question 0" not in texts
        # And one more step on it: kept, not read back to nothing.
        again = await _step(stream, api, sid, assistant("ok"))
        assert again.checkpoint_id == made.checkpoint.checkpoint_id
    finally:
        await stream.close()


async def test_tools_registered_or_changed_between_steps_are_in_the_next_view(
    api: Stubs,
) -> None:
    sid = "rc-tools"
    await _create(api, sid)
    stream = RawStream(api, digest=DIGEST)
    try:
        await _turns(stream, api, sid, 2, "t")
        before = await _step(stream, api, sid, user("no tools yet"))
        assert [t.definition.name for t in before.tools] == []
        await _register(api, sid, "grep", "Search files")
        view = await _step(stream, api, sid, assistant("looking"))
        assert [t.definition.description for t in view.tools] == ["Search files"]
        await _register(api, sid, "grep", "Search files, faster")
        view = await _step(stream, api, sid, user("again"))
        assert [t.definition.description for t in view.tools] == ["Search files, faster"]
    finally:
        await stream.close()


async def test_memory_changed_between_steps_is_in_the_next_view(api: Stubs) -> None:
    sid = "rc-mem"
    await _create(api, sid)
    stream = RawStream(api, digest=DIGEST)
    try:
        for text in ("Use tabs.", "Use spaces."):
            await api.sources.PutMemory(
                rpb.PutMemoryRequest(
                    memory=source_pb2.MemoryEntry(
                        memory_id="style", scope=common_pb2.SCOPE_PROJECT, scope_id="rc", text=text
                    )
                )
            )
            view = await _step(stream, api, sid, user(f"step with {text}"))
            memory = [
                s.text for s in view.system_sections if s.kind == view_pb2.SECTION_KIND_MEMORY
            ]
            assert len(memory) == 1 and text in memory[0]
    finally:
        await stream.close()


async def test_a_session_deleted_and_made_again_between_steps_starts_afresh(api: Stubs) -> None:
    sid = "rc-again"
    await _create(api, sid)
    stream = RawStream(api, digest=DIGEST)
    try:
        await _turns(stream, api, sid, 3, "old")
        await _checkpoint(api, sid, 3, "OLD SUMMARY")
        await _register(api, sid, "old_tool", "Of the old session")
        await _step(stream, api, sid, user("old last"))
        await api.sessions.DeleteSession(spb.DeleteSessionRequest(session_id=sid))
        await _create(api, sid)
        view = await _step(stream, api, sid, user("new first"))
        assert view.event_boundary == 1 and _texts(view) == ["new first"]
        assert not view.checkpoint_id and not view.tools
        await _register(api, sid, "new_tool", "Of the new session")
        view = await _step(stream, api, sid, assistant("new answer"))
        assert _texts(view) == ["new first", "new answer"]
        assert [t.definition.name for t in view.tools] == ["new_tool"]
    finally:
        await stream.close()


async def test_two_streams_stepping_one_session_each_see_the_others_events(api: Stubs) -> None:
    sid = "rc-two"
    await _create(api, sid)
    one, two = RawStream(api, digest=DIGEST), RawStream(api)
    try:
        seq = 0
        for i in range(6):
            stream, other = (one, two) if i % 2 == 0 else (two, one)
            view = await _step(stream, api, sid, user(f"from {i}"), assistant(f"reply {i}"))
            seq += 2
            assert view.event_boundary == seq
            assert _texts(view)[-2:] == [f"from {i}", f"reply {i}"]
            if i:
                assert f"from {i - 1}" in _texts(view), "the other stream's step is in view"
            if other.view is not None:
                assert other.view.event_boundary == seq - 2
        assert one.applied and two.applied, "both streams answered with deltas"
    finally:
        await one.close()
        await two.close()


async def test_an_over_budget_stream_rebuilds_every_step_with_its_compaction_request(
    api: Stubs,
) -> None:
    """Over budget each view carries a compaction request whose prompt holds the history;
    a step whose request is equal to the last one's sends the record kept from it."""
    sid = "rc-over"
    await _create(api, sid)
    stream = RawStream(api, digest=DIGEST)
    small = cpb.CompileRequest(session_id=sid, route=ROUTE)
    small.limits.context_window = 1200
    small.limits.max_output_tokens = 200
    try:
        prompts = []
        for i in range(8):
            text = f"turn {i}: " + "please read the module and explain it " * 20
            view = await stream.step(small, [user(text), assistant(f"answer {i} " * 30)])
            again = await api.compiles.Compile(
                cpb.CompileRequest(rebuild_compile_id=view.compile_id)
            )
            assert encoded(view) == encoded(again.view)
            if view.HasField("compaction"):
                prompts.append(view.compaction.prompt)
        assert len(prompts) >= 4, "the view went over budget"
        assert len(stream.applied) == 7
    finally:
        await stream.close()
