"""A step's compile takes the events its append just wrote from the store's tail of them
(storage/tails.py) instead of reading them back: through a real daemon, those events are
the very values RocksDB holds (every kind of event, every field), and views compiled
while several streams and unary appends write one session at once equal the same
compiles rebuilt from scratch by the daemon restarted on its data directory."""

from __future__ import annotations

import asyncio
from pathlib import Path

from ctxcc.v1 import common_pb2, event_pb2, session_pb2, view_pb2
from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_service_pb2 as spb
from server.app import Daemon
from storage.tails import Tails
from tests.conftest import make_config, stubs_for
from tests.helpers import assistant, compile_request, tool_result, user
from tests.integration.delta_session import RawStream, _upload_image, encoded


def _every_kind(image: common_pb2.ArtifactRef) -> list[event_pb2.Event]:
    """One event of every payload kind, each field set to something not its default."""
    out = [user("look at src/a.py", event_id="u1")]
    picked = out[0].user_message.parts.add().browser_element
    picked.url, picked.selector, picked.tag, picked.text = "https://x.test/", "#go", "b", "Go"
    picked.attributes.update({"id": "go", "disabled": ""})
    out[0].user_message.parts.add(attachment=image)
    said = assistant("reading", ("c1", "read", '{"path": "a.py"}'), reasoning="think")
    said.assistant_message.native_state.route_id = "r1"
    said.assistant_message.native_state.kind = "opaque"
    said.assistant_message.native_state.data = b"\x00\x01state"
    said.assistant_message.route.model = "gpt-4o"
    said.assistant_message.route.protocol = "openai"
    out.append(said)
    out.append(tool_result("c1", "line\n" * 3))
    out.append(tool_result("c2", "big result line\n" * 2000))  # made a blob by the daemon
    call = event_pb2.Event()
    call.tool_call.call_id, call.tool_call.name, call.tool_call.arguments_json = "c3", "x", "{}"
    out.append(call)
    imported = event_pb2.Event()
    imported.imported_message.origin_session_id = "elsewhere"
    imported.imported_message.origin_seq = 4
    imported.imported_message.role = event_pb2.MESSAGE_ROLE_ASSISTANT
    imported.imported_message.parts.add(text="from another session")
    out.append(imported)
    attached = event_pb2.Event()
    attached.attachment.CopyFrom(image)
    out.append(attached)
    selected = event_pb2.Event()
    selected.browser_element.url = "https://y.test/"
    selected.browser_element.attributes.update({"href": "/z"})
    out.append(selected)
    started = event_pb2.Event()
    started.turn_started.turn_id = "t1"
    cancelled = event_pb2.Event()
    cancelled.turn_cancelled.reason, cancelled.turn_cancelled.keep_reasoning = "stop", True
    completed = event_pb2.Event()
    completed.turn_completed.SetInParent()
    return [*out, started, cancelled, completed]


async def test_kept_events_are_the_stored_values_of_every_kind(short_tmp: Path) -> None:
    d = Daemon(make_config(short_tmp, blob_threshold_bytes="4096"))
    await d.start()
    api = stubs_for(f"unix:{d.endpoints.unix}")
    try:
        await api.sessions.CreateSession(
            spb.CreateSessionRequest(session=session_pb2.Session(session_id="k"))
        )
        events = _every_kind(await _upload_image(api, "k"))
        await api.sessions.AppendEvents(spb.AppendEventsRequest(session_id="k", events=events))
        store = d._store
        assert store is not None
        n = len(events)
        kept = store._tails.read("k", 0, n)
        assert kept is not None and len(kept) == n
        tails, store._tails = store._tails, Tails()
        try:
            stored = store.read_events("k", 0, None, frozenset(), n)
        finally:
            store._tails = tails
        # repr names every type (an enum member, a tuple, bytes), not only the values.
        assert [repr(e) for e in kept] == [repr(e) for e in stored]
        assert kept == stored
    finally:
        await api.channel.close()
        await d.stop()


async def test_views_compiled_among_concurrent_appends_equal_their_rebuilds(
    short_tmp: Path,
) -> None:
    """Two streams step one session (each appending, with deltas) while unary appends
    land between and during their steps: a compile that missed an event another writer
    appended before its boundary, or took one twice, differs from its rebuild after a
    restart, which reads every event from RocksDB and remembers nothing."""
    config = make_config(short_tmp)
    d = Daemon(config)
    await d.start()
    api = stubs_for(f"unix:{d.endpoints.unix}")
    views: list[view_pb2.CompiledView] = []
    try:
        await api.sessions.CreateSession(
            spb.CreateSessionRequest(session=session_pb2.Session(session_id="c"))
        )
        await api.sessions.AppendEvents(
            spb.AppendEventsRequest(session_id="c", events=[user("fix the tests")])
        )
        streams = [RawStream(api), RawStream(api)]
        req = compile_request("c")

        async def stepping(k: int) -> None:
            s = streams[k]
            for i in range(12):
                call = (f"s{k}-{i}", "read", '{"path": "a.py"}')
                events = [assistant(f"stream {k} step {i}", call)]
                events.append(tool_result(call[0], f"result {k}.{i}"))
                views.append(await s.step(req, events))

        async def appending() -> None:
            for i in range(12):
                await api.sessions.AppendEvents(
                    spb.AppendEventsRequest(session_id="c", events=[user(f"note {i}")])
                )
                await asyncio.sleep(0)

        await asyncio.gather(stepping(0), stepping(1), appending())
        # More appends than the store keeps of a session's latest events, then a step:
        # its compile reads back further than the kept tail reaches.
        for i in range(40):
            await api.sessions.AppendEvents(
                spb.AppendEventsRequest(session_id="c", events=[tool_result(f"b{i}", "x")])
            )
        views.append(await streams[0].step(req, [user("and now?")]))
        for s in streams:
            await s._queue.put(None)
        assert len(views) == 25
        # Steps did interleave: some compile ran after the other writers' appends too.
        assert len({v.event_boundary for v in views}) > 12
    finally:
        await api.channel.close()
        await d.stop()
    again = Daemon(config)
    await again.start()
    api = stubs_for(f"unix:{again.endpoints.unix}")
    try:
        for view in views:
            rebuilt = await api.compiles.Compile(
                cpb.CompileRequest(rebuild_compile_id=view.compile_id)
            )
            assert encoded(rebuilt.view) == encoded(view), f"boundary {view.event_boundary}"
        last = max(views, key=lambda v: v.event_boundary)
        head = (
            await api.sessions.GetSession(spb.GetSessionRequest(session_id="c"))
        ).session.head_seq
        assert last.event_boundary == head == 1 + 24 * 2 + 12 + 40 + 1
    finally:
        await api.channel.close()
        await again.stop()
