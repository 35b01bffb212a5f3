"""Delta views on CompileStream, daemon side, read with the generated stub and the
proto's own rebuild rule (tests/integration/delta_session.py): every step of a scripted
session rebuilds to the recorded compile byte for byte with the digest the daemon sent,
deltas are the smallest ones (kept_messages is the longest common prefix), sections and
tools are sent only when they changed; a base this stream did not send gets a whole view;
a resume quoting a delta's compile returns it whole; a delta over the chunk size goes as a
chunked whole view; a compaction recommended again is kept from the base when the
stream asks."""

from __future__ import annotations

from pathlib import Path

import pytest

from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import event_pb2, session_pb2, view_pb2
from ctxcc.v1 import session_service_pb2 as spb
from server.app import Daemon
from tests.conftest import Stubs, make_config, stubs_for
from tests.helpers import assistant, compile_request, user
from tests.integration.delta_session import (
    RawStream,
    _upload_image,
    common_prefix,
    encoded,
    over_budget_session,
    scripted_session,
)

DIGESTS = pytest.mark.parametrize(
    "digest",
    [
        cpb.DELTA_DIGEST_UNSPECIFIED,
        cpb.DELTA_DIGEST_MESSAGE_CHAIN,
        cpb.DELTA_DIGEST_MESSAGE_CHAIN_COMPACTION_APART,
    ],
)


@DIGESTS
async def test_every_step_rebuilds_from_a_minimal_delta(api: Stubs, digest: int) -> None:
    stream = RawStream(api, digest=digest)
    try:
        out = await scripted_session(api, "ds", stream.step)
    finally:
        await stream.close()
    kinds = [a.WhichOneof("response") for a in stream.answers]
    assert kinds[0] == "view" and kinds[1:] == ["delta"] * (len(out.views) - 1), kinds
    whole_sizes = [v.ByteSize() for v in out.views]
    shrunk = False
    for (base, delta), view in zip(stream.applied, out.views[1:], strict=True):
        assert delta.kept_messages == common_prefix(base, view), "the smallest delta"
        assert len(delta.appended_messages) == len(view.messages) - delta.kept_messages
        shrunk |= delta.kept_messages < len(base.messages)
        base_sections = [encoded_section(s) for s in base.system_sections]
        for slot, section in zip(delta.sections, view.system_sections, strict=True):
            if encoded_section(section) in base_sections:
                assert slot.WhichOneof("slot") == "base_index"
            else:
                assert slot.WhichOneof("slot") == "section"
        assert delta.tools_changed == (list(base.tools) != list(view.tools))
        assert not delta.head.messages and not delta.head.system_sections
        assert not delta.head.system_prompt and not delta.head.tools
    assert shrunk, "the checkpoint and the new user turns must drop kept messages"
    changed_tools = [d.tools_changed for _, d in stream.applied]
    assert any(changed_tools) and not all(changed_tools)
    new_sections = [
        sum(s.WhichOneof("slot") == "section" for s in d.sections) for _, d in stream.applied
    ]
    # The clock's environment section is volatile; memory and rule changes add more.
    assert max(new_sections) >= 2 and min(new_sections) <= 1
    # Once the history is long, a step sends far less than its whole view.
    late = [d.ByteSize() for _, d in stream.applied[-3:]]
    assert all(size * 3 < whole for size, whole in zip(late, whole_sizes[-3:], strict=True))


def encoded_section(section: view_pb2.SystemSection) -> bytes:
    return section.SerializeToString(deterministic=True)


async def _session(api: Stubs, sid: str) -> None:
    await api.sessions.CreateSession(
        spb.CreateSessionRequest(session=session_pb2.Session(session_id=sid))
    )


async def test_a_base_this_stream_did_not_send_gets_a_whole_view(api: Stubs) -> None:
    await _session(api, "fb")
    first, second = RawStream(api), RawStream(api)
    try:
        a = await first.step(compile_request("fb"), [user("one")])
        await first.step(compile_request("fb"), [user("two")])
        assert first.answers[-1].WhichOneof("response") == "delta"
        # Another stream's view, an unknown id: whole views.
        await second.step(compile_request("fb"), [user("three")], base=a.compile_id)
        await second.step(compile_request("fb"), [user("four")], base="k-unknown")
        assert [r.WhichOneof("response") for r in second.answers] == ["view", "view"]
        # No base named (deltas off): whole views.
        await second.step(compile_request("fb"), [user("five")], base="")
        assert second.answers[-1].WhichOneof("response") == "view"
        # Its own last view: a delta again.
        await second.step(compile_request("fb"), [user("six")])
        assert second.answers[-1].WhichOneof("response") == "delta"
    finally:
        await first.close()
        await second.close()


async def test_resume_after_a_delta_sends_that_view_whole(api: Stubs) -> None:
    await _session(api, "rd")
    stream = RawStream(api)
    try:
        await stream.step(compile_request("rd"), [user("one")])
        view = await stream.step(compile_request("rd"), [user("two")])
        assert stream.answers[-1].WhichOneof("response") == "delta"
        # What a client does when the digest does not match: ask for the view whole.
        again = await stream.send(
            cpb.CompileStreamRequest(
                resume=cpb.ResumeRequest(
                    compile_id=stream.answers[-1].delta.head.compile_id,
                    compile=compile_request("rd"),
                )
            )
        )
        assert again.step_id == "" and again.WhichOneof("response") == "view"
        assert encoded(again.view) == encoded(view)
        # The resent view is a base for the next step's delta.
        stream.view = again.view
        await stream.step(compile_request("rd"), [user("three")])
        assert stream.answers[-1].WhichOneof("response") == "delta"
    finally:
        await stream.close()


async def test_a_delta_over_the_chunk_size_goes_whole_in_chunks(short_tmp: Path) -> None:
    d = Daemon(make_config(short_tmp, stream_chunk_bytes="4096"))
    await d.start()
    api = stubs_for(f"unix:{d.endpoints.unix}")
    stream = RawStream(api)
    try:
        await _session(api, "big")
        await stream.step(compile_request("big"), [user("short")])
        await stream.step(compile_request("big"), [user("still short")])
        assert stream.answers[-1].WhichOneof("response") == "delta"
        before = len(stream.answers)
        view = await stream.step(compile_request("big"), [user("long " * 2000)])
        kinds = {a.WhichOneof("response") for a in stream.answers[before:]}
        assert kinds == {"chunk"}
        rebuilt = await api.compiles.Compile(cpb.CompileRequest(rebuild_compile_id=view.compile_id))
        assert encoded(view) == encoded(rebuilt.view)
        # And the chunked view is a base like any other (the same turn goes on: the long
        # message stays as it is).
        await stream.step(compile_request("big"), [assistant("a short answer")])
        assert stream.answers[-1].WhichOneof("response") == "delta"
    finally:
        await stream.close()
        await api.channel.close()
        await d.stop()


async def test_a_view_too_large_to_keep_is_still_its_streams_base(api: Stubs) -> None:
    """A view over a quarter of the recent views' bytes (16 MiB) is not kept among them,
    but the stream that sent it still answers its next step with a delta against it;
    another stream naming it gets a whole view."""
    await _session(api, "huge")
    text = "word " * 12_000  # 60,000 characters a message
    for k in range(10):  # ~17 MiB of history, appended in batches under the size caps
        batch = [user(f"{k}.{i} {text}") for i in range(29)]
        await api.sessions.AppendEvents(spb.AppendEventsRequest(session_id="huge", events=batch))
    stream, other = RawStream(api), RawStream(api)
    try:
        first = await stream.step(compile_request("huge"), [user("and now?")])
        assert first.ByteSize() > 16 << 20
        assert {a.WhichOneof("response") for a in stream.answers} == {"chunk"}
        before = len(stream.answers)
        view = await stream.step(compile_request("huge"), [assistant("a short answer")])
        assert [a.WhichOneof("response") for a in stream.answers[before:]] == ["delta"]
        # RawStream.step checked the delta's digest and rebuilt the view from it.
        rebuilt = await api.compiles.Compile(cpb.CompileRequest(rebuild_compile_id=view.compile_id))
        assert encoded(view) == encoded(rebuilt.view)
        # Still a base at the step after (the stream now holds the delta's view).
        last = await stream.step(compile_request("huge"), [user("one more")])
        assert stream.answers[-1].WhichOneof("response") == "delta"
        # Another stream's view is no base, however large.
        await other.step(compile_request("huge"), [], base=last.compile_id)
        assert {a.WhichOneof("response") for a in other.answers} == {"chunk"}
    finally:
        await stream.close()
        await other.close()


def _with_element() -> event_pb2.Event:
    ev = event_pb2.Event()
    el = ev.user_message.parts.add().browser_element
    el.url, el.tag = "https://x.test/", "a"
    el.attributes.update({"href": "/z", "class": "k", "id": "q", "title": "t", "rel": "r"})
    return ev


@DIGESTS
async def test_digest_is_the_deterministic_encoding_of_the_parsed_view(
    api: Stubs, digest: int
) -> None:
    """The daemon's digest is over its spliced encoding; it must equal the digest of the
    view decoded and encoded again by protobuf, attributes map and image included."""
    await _session(api, "dg")
    stream = RawStream(api, digest=digest)
    try:
        await stream.step(compile_request("dg"), [user("one")])
        view = await stream.step(compile_request("dg"), [_with_element()])
        # RawStream.step checked the delta's digest against encoded(view).
        assert stream.answers[-1].WhichOneof("response") == "delta"
        text = view.messages[-1].parts[0].text
        assert all(f"{k}: " in text for k in ("class", "href", "id", "rel", "title"))
    finally:
        await stream.close()


@DIGESTS
async def test_a_compaction_recommended_again_is_not_sent_again(api: Stubs, digest: int) -> None:
    """Over budget every step of a turn recommends the same compaction, whose prompt holds
    as much history as the window takes: a stream that asks (keep_compaction) gets it once,
    then deltas that keep it until it changes (here after a checkpoint); one that does not
    ask gets it in every delta's head, as before."""
    kept = RawStream(api, digest=digest, keep_compaction=True)
    plain = RawStream(api, digest=digest)
    try:
        out = await over_budget_session(api, "obk", kept.step)
        await over_budget_session(api, "obp", plain.step)
    finally:
        await kept.close()
        await plain.close()
    flags = [d.compaction_kept for _, d in kept.applied]
    assert len(flags) == len(out.views) - 1
    for (base, delta), view in zip(kept.applied, out.views[1:], strict=True):
        same = encoded_compaction(base) == encoded_compaction(view)
        assert delta.compaction_kept == same
        assert delta.head.HasField("compaction") != same
        if same:  # the delta is smaller than the prompt it no longer carries
            assert delta.ByteSize() < view.compaction.ByteSize()
    # The checkpoint moved the range to summarise: sent once, then kept again.
    assert flags == [True, True, False, True, True, True], flags
    assert all(not d.compaction_kept and d.head.HasField("compaction") for _, d in plain.applied)


def encoded_compaction(view: view_pb2.CompiledView) -> bytes:
    return view.compaction.SerializeToString(deterministic=True)


async def test_a_rebuild_under_a_sent_views_id_is_neither_a_base_nor_a_resumes_answer(
    api: Stubs,
) -> None:
    """A rebuild is sent under its compile's id; with another image mode it is another
    view. A stream that holds the view first sent under that id must get deltas against
    that one (and a resume of it must send that one), whatever another stream rebuilt; the
    stream that received the rebuild holds the rebuild, so the id is no base there."""
    await _session(api, "rb")
    image = user("look at this")
    image.user_message.parts.add(attachment=await _upload_image(api, "rb"))
    inline, by_ref = compile_request("rb"), compile_request("rb")
    inline.image_mode, by_ref.image_mode = cpb.IMAGE_MODE_INLINE, cpb.IMAGE_MODE_REFERENCE
    chain = cpb.DELTA_DIGEST_MESSAGE_CHAIN
    agent, other = RawStream(api, digest=chain), RawStream(api, digest=chain)
    try:
        await agent.step(inline, [image])
        held = await agent.step(inline, [assistant("a reply " * 30), user("second turn")])
        assert agent.answers[-1].WhichOneof("response") == "delta"
        rebuild = cpb.CompileRequest(
            rebuild_compile_id=held.compile_id, image_mode=cpb.IMAGE_MODE_REFERENCE
        )
        variant = await other.step(rebuild, [], base="")
        assert variant.compile_id == held.compile_id and encoded(variant) != encoded(held)
        # A resume of the agent's view sends the view it was sent.
        again = await agent.send(
            cpb.CompileStreamRequest(
                resume=cpb.ResumeRequest(compile_id=held.compile_id, compile=inline)
            )
        )
        assert again.WhichOneof("response") == "view" and encoded(again.view) == encoded(held)
        # The agent's next step, against the view it holds, rebuilds to the daemon's view
        # (RawStream checks the digest; the rebuild says what the daemon recorded).
        nxt = await agent.step(by_ref, [assistant("an answer in the same turn")])
        truth = await api.compiles.Compile(
            cpb.CompileRequest(rebuild_compile_id=nxt.compile_id, image_mode=by_ref.image_mode)
        )
        assert encoded(nxt) == encoded(truth.view)
        # On the stream that received the rebuild, its id is no base: a whole view, which
        # is the daemon's.
        mine = await other.step(by_ref, [assistant("and another")], base=variant.compile_id)
        assert other.answers[-1].WhichOneof("response") == "view"
        truth = await api.compiles.Compile(
            cpb.CompileRequest(rebuild_compile_id=mine.compile_id, image_mode=by_ref.image_mode)
        )
        assert encoded(mine) == encoded(truth.view)
    finally:
        await agent.close()
        await other.close()
