"""Compiler II through a real daemon: a 50 KB tool result, an image on a text-only
model, a deferred tool found by tool_search, and checkpoints valid and corrupted."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from ctxcc.v1 import (
    artifact_service_pb2 as apb,
)
from ctxcc.v1 import (
    checkpoint_pb2,
    common_pb2,
    event_pb2,
    session_pb2,
    tool_pb2,
    view_pb2,
)
from ctxcc.v1 import (
    compile_service_pb2 as cpb,
)
from ctxcc.v1 import (
    session_service_pb2 as spb,
)
from ctxcc.v1 import (
    tool_service_pb2 as tpb,
)
from server.app import Daemon
from server.domain.records import Checkpoint
from storage import open_rocks
from storage.codec import decode_value, encode_value
from storage.kv import Batch
from tests.conftest import Stubs, make_config, stubs_for
from tests.helpers import ROUTE, assistant, compile_request, error_info, tool_result, user


async def _session(api: Stubs, sid: str) -> None:
    await api.sessions.CreateSession(
        spb.CreateSessionRequest(session=session_pb2.Session(session_id=sid))
    )


async def _append(api: Stubs, sid: str, *events: event_pb2.Event) -> None:
    await api.sessions.AppendEvents(spb.AppendEventsRequest(session_id=sid, events=list(events)))


async def test_large_tool_result_is_previewed_and_readable(api: Stubs) -> None:
    await _session(api, "big")
    lines = [f"{i:05d} {'ERROR' if i % 97 == 0 else 'ok'} {'x' * 40}" for i in range(1100)]
    big = "\n".join(lines)
    assert len(big) > 50_000
    await _append(
        api,
        "big",
        user("run the tests"),
        assistant("", ("c1", "shell", "{}")),
        tool_result("c1", big),
    )
    view = (await api.compiles.Compile(compile_request("big"))).view
    tool_msg = next(m for m in view.messages if m.role == event_pb2.MESSAGE_ROLE_TOOL)
    assert (
        len(tool_msg.parts[0].text) < 2_500 and "history_read_tool_result" in tool_msg.parts[0].text
    )
    read_tool = [t for t in view.tools if t.definition.name == "history_read_tool_result"]
    assert read_tool and read_tool[0].origin == view_pb2.TOOL_ORIGIN_BUILTIN_READ_TOOL_RESULT

    t = api.tools
    page = await t.ReadToolResult(
        tpb.ReadToolResultRequest(
            session_id="big", call_id="c1", lines=tpb.LineRange(offset=1000, limit=5)
        )
    )
    assert page.slice.text.splitlines() == lines[1000:1005]
    assert (page.slice.total, page.slice.has_more) == (1100, True)
    tail = await t.ReadToolResult(
        tpb.ReadToolResultRequest(
            session_id="big", call_id="c1", bytes=tpb.ByteRange(offset=len(big) - 10)
        )
    )
    assert tail.slice.text == big[-10:] and not tail.slice.has_more
    found = await t.ReadToolResult(
        tpb.ReadToolResultRequest(
            session_id="big",
            call_id="c1",
            search=tpb.ResultSearch(
                pattern=r"^\d+ ERROR", regex=True, context_lines=1, max_matches=3
            ),
        )
    )
    assert [m.line for m in found.matches] == [0, 97, 194]
    assert found.matches[1].text.splitlines() == lines[96:99]
    for bad, reason in ((tpb.ResultSearch(pattern="(", regex=True), "INVALID_PATTERN"),):
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await t.ReadToolResult(
                tpb.ReadToolResultRequest(session_id="big", call_id="c1", search=bad)
            )
        assert error_info(exc.value).reason == reason
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await t.ReadToolResult(tpb.ReadToolResultRequest(session_id="big", call_id="nope"))
    assert (exc.value.code(), error_info(exc.value).reason) == (
        grpc.StatusCode.NOT_FOUND,
        "TOOL_RESULT_NOT_FOUND",
    )


async def _upload_png(
    api: Stubs, sid: str, data: bytes, width: int = 0, height: int = 0
) -> common_pb2.ArtifactRef:
    async def upload() -> AsyncIterator[apb.UploadArtifactRequest]:
        yield apb.UploadArtifactRequest(
            header=apb.ArtifactHeader(
                session_id=sid,
                mime_type="image/png",
                size_bytes=len(data),
                sha256=hashlib.sha256(data).hexdigest(),
                width=width,
                height=height,
            )
        )
        yield apb.UploadArtifactRequest(data=data)

    return (await api.artifacts.UploadArtifact(upload())).artifact


async def test_image_on_a_text_only_model_becomes_a_note(api: Stubs) -> None:
    await _session(api, "img")
    data = b"\x89PNG" + bytes(2000)
    ref = await _upload_png(api, "img", data, width=64, height=64)
    ev = user("what is in this picture?")
    ev.user_message.parts.add(attachment=ref)
    await _append(api, "img", ev)

    sees = (await api.compiles.Compile(compile_request("img"))).view
    part = sees.messages[0].parts[1]
    assert part.attachment.ref.artifact_id == ref.artifact_id and part.attachment.data == data
    by_ref = await api.compiles.Compile(compile_request("img", image_mode=cpb.IMAGE_MODE_REFERENCE))
    assert by_ref.view.messages[0].parts[1].attachment.data == b""

    blind = cpb.CompileRequest(
        session_id="img", route=ROUTE, limits=cpb.ModelLimits(accepts_images=False)
    )
    view = (await api.compiles.Compile(blind)).view
    note = view.messages[0].parts[1]
    assert not note.HasField("attachment")
    assert ref.artifact_id in note.text and "does not accept images" in note.text
    assert any("does not accept images" in n for n in view.notes)


async def test_a_compaction_prompt_names_the_images_it_covers(api: Stubs) -> None:
    """Over budget, the view asks for a summary of the oldest messages; an image one of
    them holds leaves the view with them. The transcript names it, so the model writing
    the summary knows it was there: it was left out unsaid (R-IMG-2)."""
    await _session(api, "shot")
    ref = await _upload_png(api, "shot", b"\x89PNG" + bytes(2000))
    ev = user("what is wrong in this screenshot?")
    ev.user_message.parts.add(attachment=ref)
    await _append(api, "shot", ev, assistant("the button is red " * 200), user("fix it " * 300))
    request = compile_request("shot", limits=cpb.ModelLimits(context_window=2_400))
    view = (await api.compiles.Compile(request)).view
    assert view.decision == view_pb2.DECISION_OVER_BUDGET_SEND_ANYWAY
    assert view.compaction.from_seq == 1 <= view.compaction.through_seq
    prompt = view.compaction.prompt
    assert "what is wrong in this screenshot?" in prompt
    assert f"[image {ref.artifact_id} (image/png" in prompt


async def test_deferred_tools_described_in_chinese_and_japanese_are_found(api: Stubs) -> None:
    """tool_search words are not only ASCII: Chinese and Japanese have no spaces between
    words, and a deferred tool described only in them was unreachable (no query found
    it, so it could never be activated, R-TOOL-1)."""
    await _session(api, "cjk")
    schema = '{"type": "object"}'
    await api.tools.RegisterTools(
        tpb.RegisterToolsRequest(
            session_id="cjk",
            tools=[
                tool_pb2.ToolDefinition(
                    name=name,
                    description=description,
                    input_schema_json=schema,
                    visibility=tool_pb2.TOOL_VISIBILITY_DEFERRED,
                )
                for name, description in (
                    ("translate", "翻译文本到另一种语言"),
                    ("deploy", "部署服务到生产环境"),
                    ("read_jp", "ファイルを読む"),
                )
            ],
        )
    )
    await _append(api, "cjk", user("请部署服务"))
    await _append(
        api,
        "cjk",
        assistant("", ("s1", "tool_search", '{"query": "部署"}')),
        tool_result("s1", "deploy", name="tool_search"),
    )
    view = (await api.compiles.Compile(compile_request("cjk"))).view
    assert [t.definition.name for t in view.tools] == ["deploy", "tool_search"]
    full_width = "".join(chr(ord(c) + 0xFEE0) for c in "DEPLOY")
    for query, found in (("翻译", ["translate"]), ("読む", ["read_jp"]), (full_width, ["deploy"])):
        answer = await api.tools.SearchTools(tpb.SearchToolsRequest(session_id="cjk", query=query))
        assert [t.name for t in answer.tools] == found


async def test_deferred_tool_found_by_tool_search(api: Stubs) -> None:
    await _session(api, "tools")
    schema = '{"type": "object", "properties": {"env": {"type": "string"}}}'
    await api.tools.RegisterTools(
        tpb.RegisterToolsRequest(
            session_id="tools",
            tools=[
                tool_pb2.ToolDefinition(
                    name="read_file", description="Read a file", input_schema_json=schema
                ),
                tool_pb2.ToolDefinition(
                    name="deploy",
                    description="Deploy the service",
                    input_schema_json=schema,
                    visibility=tool_pb2.TOOL_VISIBILITY_DEFERRED,
                    search_keywords=["release"],
                ),
                tool_pb2.ToolDefinition(
                    name="drop_db",
                    description="Drop the database",
                    input_schema_json=schema,
                    visibility=tool_pb2.TOOL_VISIBILITY_HIDDEN,
                ),
            ],
        )
    )
    await _append(api, "tools", user("release the service"))

    def names(v: view_pb2.CompiledView) -> list[str]:
        return [t.definition.name for t in v.tools]

    first = (await api.compiles.Compile(compile_request("tools"))).view
    assert names(first) == ["read_file", "tool_search"]
    await _append(
        api,
        "tools",
        assistant("", ("s1", "tool_search", '{"query": "deploy"}')),
        tool_result("s1", "deploy: Deploy the service", name="tool_search"),
    )
    second = (await api.compiles.Compile(compile_request("tools"))).view
    assert names(second) == ["read_file", "deploy", "tool_search"]
    assert second.tools[1].origin == view_pb2.TOOL_ORIGIN_ACTIVATED
    # The registry itself never changes.
    listed = await api.tools.ListTools(tpb.ListToolsRequest(session_id="tools"))
    assert [t.visibility for t in listed.tools if t.name == "deploy"] == [
        tool_pb2.TOOL_VISIBILITY_DEFERRED
    ]
    # A new turn: activation is gone; the RPC activates for that turn; hidden stays hidden.
    await _append(api, "tools", user("now something else"))
    third = (await api.compiles.Compile(compile_request("tools"))).view
    assert "deploy" not in names(third)
    found = await api.tools.SearchTools(
        tpb.SearchToolsRequest(session_id="tools", query="drop deploy database")
    )
    assert [t.name for t in found.tools] == ["deploy"]
    fourth = (await api.compiles.Compile(compile_request("tools"))).view
    assert "deploy" in names(fourth) and "drop_db" not in names(fourth)
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await api.tools.RegisterTools(
            tpb.RegisterToolsRequest(
                session_id="tools",
                tools=[tool_pb2.ToolDefinition(name="bad", input_schema_json="[1, 2")],
            )
        )
    assert error_info(exc.value).reason == "INVALID_FIELD"
    # NaN and Infinity are read by Python's json, not by a provider's: not JSON either.
    for schema in ('{"type": "number", "maximum": Infinity}', '{"default": NaN}'):
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await api.tools.RegisterTools(
                tpb.RegisterToolsRequest(
                    session_id="tools",
                    tools=[tool_pb2.ToolDefinition(name="odd", input_schema_json=schema)],
                )
            )
        info = error_info(exc.value)
        assert (info.reason, info.metadata["field"]) == (
            "INVALID_FIELD",
            "tools[0].input_schema_json",
        )


async def _checkpointed(api: Stubs, sid: str, **ck: object) -> view_pb2.CompiledView:
    await _session(api, sid)
    await _append(
        api, sid, user("one"), assistant("first answer"), user("two"), assistant("second")
    )
    made = await api.compiles.CreateCheckpoint(
        cpb.CreateCheckpointRequest(
            checkpoint=checkpoint_pb2.Checkpoint(
                session_id=sid,
                covers_through_seq=2,
                summary="SUMMARY OF ONE",
                **ck,  # type: ignore[arg-type]
            )
        )
    )
    assert made.checkpoint.checkpoint_id
    return (await api.compiles.Compile(compile_request(sid))).view


async def test_valid_and_route_mismatched_checkpoints(api: Stubs) -> None:
    view = await _checkpointed(api, "ck", source_route=ROUTE)
    texts = [p.text for m in view.messages for p in m.parts]
    assert "SUMMARY OF ONE" in texts[0] and "one" not in texts and "first answer" not in texts
    assert texts[1:] == ["two", "second"]
    assert view.checkpoint_id and not view.fallback_reasons
    other = common_pb2.Route(model="gpt-4o")
    mismatch = await _checkpointed(api, "ck2", source_route=other)
    assert list(mismatch.fallback_reasons) == [view_pb2.FALLBACK_REASON_ROUTE_MISMATCH]
    assert [p.text for m in mismatch.messages for p in m.parts] == [
        "one",
        "first answer",
        "two",
        "second",
    ]
    portable = await _checkpointed(api, "ck3", source_route=other, portable=True)
    assert portable.checkpoint_id and not portable.fallback_reasons


async def test_a_checkpoint_naming_no_route_is_bound_to_the_last_compiles(api: Stubs) -> None:
    """The clients make a checkpoint from a view's compaction request, which names no
    route: a non-portable one is bound to the route the session last compiled for, so a
    switch passes over it (R-ROUTE-2); a portable one, or one made before any compile,
    holds on any route."""
    other = common_pb2.Route(connection="other", model="gpt-4o")
    for sid, portable, compiled in (
        ("nr", False, True),
        ("nr2", True, True),
        ("nr3", False, False),
    ):
        await _session(api, sid)
        await _append(
            api, sid, user("one"), assistant("first answer"), user("two"), assistant("second")
        )
        if compiled:
            await api.compiles.Compile(compile_request(sid))
        made = await api.compiles.CreateCheckpoint(
            cpb.CreateCheckpointRequest(
                checkpoint=checkpoint_pb2.Checkpoint(
                    session_id=sid, covers_through_seq=2, summary="SUMMARY", portable=portable
                )
            )
        )
        bound = not portable and compiled
        assert made.checkpoint.HasField("source_route") == bound
        if bound:
            assert made.checkpoint.source_route == ROUTE
        same = (await api.compiles.Compile(compile_request(sid))).view
        assert same.checkpoint_id == made.checkpoint.checkpoint_id
        switched = (
            await api.compiles.Compile(cpb.CompileRequest(session_id=sid, route=other))
        ).view
        if bound:
            assert not switched.checkpoint_id
            assert list(switched.fallback_reasons) == [view_pb2.FALLBACK_REASON_ROUTE_MISMATCH]
            assert "one" in [p.text for m in switched.messages for p in m.parts]
        else:
            assert switched.checkpoint_id == made.checkpoint.checkpoint_id
            assert not switched.fallback_reasons
    listed = await api.compiles.ListCheckpoints(cpb.ListCheckpointsRequest(session_id="nr"))
    assert [c.source_route for c in listed.checkpoints] == [ROUTE]


async def test_corrupted_checkpoint_falls_back_to_the_canonical_history(short_tmp: Path) -> None:
    cfg = make_config(short_tmp)
    d = Daemon(cfg)
    await d.start()
    api = stubs_for(f"unix:{d.endpoints.unix}")
    view = await _checkpointed(api, "bad", source_route=ROUTE)
    assert view.checkpoint_id
    await api.channel.close()
    await d.stop()
    # Damage the stored checkpoint's digest on disk, as a bit flip or a bad restore would.
    kv = open_rocks(cfg.db_path)
    key, raw = next(kv.scan("checkpoints", b"bad\x00", b"bad\x01"))
    ck = decode_value(raw, Checkpoint)
    b = Batch()
    b.put(
        "checkpoints",
        key,
        encode_value(
            Checkpoint(**{**{f: getattr(ck, f) for f in ck.__slots__}, "covered_digest": "0" * 64})
        ),
    )
    kv.write(b)
    kv.close()
    d = Daemon(cfg)
    await d.start()
    api = stubs_for(f"unix:{d.endpoints.unix}")
    try:
        after = (await api.compiles.Compile(compile_request("bad"))).view
        assert list(after.fallback_reasons) == [view_pb2.FALLBACK_REASON_CHECKPOINT_DIGEST_MISMATCH]
        assert after.checkpoint_id == ""
        assert [p.text for m in after.messages for p in m.parts] == [
            "one",
            "first answer",
            "two",
            "second",
        ]
    finally:
        await api.channel.close()
        await d.stop()


async def test_an_undecodable_checkpoint_record_falls_back_as_corrupt(short_tmp: Path) -> None:
    cfg = make_config(short_tmp)
    d = Daemon(cfg)
    await d.start()
    api = stubs_for(f"unix:{d.endpoints.unix}")
    assert (await _checkpointed(api, "torn", source_route=ROUTE)).checkpoint_id
    await api.channel.close()
    await d.stop()
    kv = open_rocks(cfg.db_path)
    key, raw = next(kv.scan("checkpoints", b"torn\x00", b"torn\x01"))
    b = Batch()
    b.put("checkpoints", key, raw[: len(raw) // 3])  # a torn write
    kv.write(b)
    kv.close()
    d = Daemon(cfg)
    await d.start()
    api = stubs_for(f"unix:{d.endpoints.unix}")
    try:
        after = (await api.compiles.Compile(compile_request("torn"))).view
        assert list(after.fallback_reasons) == [view_pb2.FALLBACK_REASON_PROJECTION_CORRUPT]
        assert [p.text for m in after.messages for p in m.parts] == [
            "one",
            "first answer",
            "two",
            "second",
        ]
    finally:
        await api.channel.close()
        await d.stop()
