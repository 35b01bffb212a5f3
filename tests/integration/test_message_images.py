"""Images in any message's parts reach the view (R-IMG-1) through a real daemon: an image
an assistant message or an imported message (of either role) carries is sent as a user
message's is, by reference or inline, counts against the request's image limit, and keeps
being sent at every later step of a stream, whose compiles continue the session's memo."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import urllib.request
from pathlib import Path

from ctxcc.v1 import artifact_service_pb2 as apb
from ctxcc.v1 import common_pb2, event_pb2, session_pb2, view_pb2
from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_service_pb2 as spb
from server.app import Daemon
from tests.conformance.sdk_types import errors_for
from tests.conftest import Stubs, make_config, stubs_for
from tests.helpers import (
    assistant,
    compile_request,
    gif_bytes,
    jpeg_bytes,
    png_bytes,
    png_upload,
    tool_result,
    user,
    webp_bytes,
)
from tests.integration.delta_session import RawStream, encoded


def _png(n: int) -> bytes:
    return b"\x89PNG\r\n\x1a\n" + bytes([n % 256]) * 600 + n.to_bytes(4, "big")


async def _upload(api: Stubs, sid: str, n: int) -> common_pb2.ArtifactRef:
    uploaded = await api.artifacts.UploadArtifact(iter(png_upload(sid, _png(n), 16)))
    return uploaded.artifact


def _with_image(ev: event_pb2.Event, ref: common_pb2.ArtifactRef) -> event_pb2.Event:
    payload = ev.WhichOneof("payload")
    assert payload in ("user_message", "assistant_message", "imported_message")
    getattr(ev, payload).parts.add(attachment=ref)
    return ev


def _imported(text: str, role: int) -> event_pb2.Event:
    ev = event_pb2.Event()
    ev.imported_message.origin_session_id = "elsewhere"
    ev.imported_message.origin_seq = 7
    ev.imported_message.role = role  # type: ignore[assignment]
    ev.imported_message.parts.add(text=text)
    return ev


def _sent(view: view_pb2.CompiledView) -> dict[str, tuple[int, bytes]]:
    """artifact id -> (role of its message, bytes sent) for every image the view sends."""
    return {
        p.attachment.ref.artifact_id: (m.role, p.attachment.data)
        for m in view.messages
        for p in m.parts
        if p.HasField("attachment")
    }


def _unsent(view: view_pb2.CompiledView) -> list[str]:
    return [n for n in view.notes if " not sent: " in n]


async def _session(api: Stubs, sid: str) -> None:
    await api.sessions.CreateSession(
        spb.CreateSessionRequest(session=session_pb2.Session(session_id=sid))
    )


async def test_images_of_assistant_and_imported_messages_are_sent(api: Stubs) -> None:
    sid = "every-kind"
    await _session(api, sid)
    refs = [await _upload(api, sid, n) for n in range(5)]
    events = [
        _with_image(user("What is in this screenshot?"), refs[0]),
        _with_image(assistant("Here is the diagram I drew."), refs[1]),
        _with_image(_imported("Their screenshot", event_pb2.MESSAGE_ROLE_ASSISTANT), refs[2]),
        _with_image(_imported("My earlier photo", event_pb2.MESSAGE_ROLE_USER), refs[3]),
    ]
    shown = event_pb2.Event()
    shown.attachment.CopyFrom(refs[4])
    events.append(shown)
    await api.sessions.AppendEvents(spb.AppendEventsRequest(session_id=sid, events=events))

    view = (await api.compiles.Compile(compile_request(sid))).view
    assert _unsent(view) == []
    assert _sent(view) == {
        refs[0].artifact_id: (event_pb2.MESSAGE_ROLE_USER, _png(0)),
        refs[1].artifact_id: (event_pb2.MESSAGE_ROLE_ASSISTANT, _png(1)),
        refs[2].artifact_id: (event_pb2.MESSAGE_ROLE_ASSISTANT, _png(2)),
        refs[3].artifact_id: (event_pb2.MESSAGE_ROLE_USER, _png(3)),
        refs[4].artifact_id: (event_pb2.MESSAGE_ROLE_USER, _png(4)),
    }
    rebuilt = await api.compiles.Compile(cpb.CompileRequest(rebuild_compile_id=view.compile_id))
    assert encoded(rebuilt.view) == encoded(view)

    by_ref = (
        await api.compiles.Compile(compile_request(sid, image_mode=cpb.IMAGE_MODE_REFERENCE))
    ).view
    assert _unsent(by_ref) == []
    assert {aid: data for aid, (_, data) in _sent(by_ref).items()} == {
        r.artifact_id: b"" for r in refs
    }


async def test_message_images_count_against_the_request_limit(api: Stubs) -> None:
    """20 images a request, newest first: the assistant's and the imported message's
    images are newer than the user's 19, so the user's oldest one is the one left out."""
    sid = "limit"
    await _session(api, sid)
    refs = [await _upload(api, sid, n) for n in range(21)]
    first = user("Compare these")
    for ref in refs[:19]:
        _with_image(first, ref)
    events = [
        first,
        _with_image(assistant("Mine"), refs[19]),
        _with_image(_imported("Theirs", event_pb2.MESSAGE_ROLE_ASSISTANT), refs[20]),
    ]
    await api.sessions.AppendEvents(spb.AppendEventsRequest(session_id=sid, events=events))
    view = (await api.compiles.Compile(compile_request(sid))).view
    assert set(_sent(view)) == {r.artifact_id for r in refs[1:]}
    assert _unsent(view) == [
        f"image {refs[0].artifact_id} (image/png, {len(_png(0))} bytes) not sent: "
        "the request already holds 20 images (the limit)"
    ]


async def _memo_lookups(d: Daemon) -> dict[str, float]:
    url = f"http://{d.endpoints.metrics}/metrics"
    text = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=30).read().decode())
    found = re.findall(r'ctxcc_compile_memo_lookups_total\{outcome="(\w+)"\} (\S+)', text)
    return {k: float(v) for k, v in found}


async def test_a_stream_sends_message_images_at_every_later_step(short_tmp: Path) -> None:
    """Each step continues the memo of the step before, which must name the images of the
    events it saw: a step after the one that brought an image still sends it. Every view
    equals its compile rebuilt from scratch."""
    d = Daemon(make_config(short_tmp))
    await d.start()
    api = stubs_for(f"unix:{d.endpoints.unix}")
    stream = RawStream(api)
    sid = "streamed"
    try:
        await _session(api, sid)
        drawn, theirs = await _upload(api, sid, 1), await _upload(api, sid, 2)
        steps: list[list[event_pb2.Event]] = [
            [user("Draw the architecture")],
            [_with_image(assistant("Drawn:", ("c1", "shell", '{"cmd": "ls"}')), drawn)],
            [tool_result("c1", "a.py b.py")],
            [_with_image(_imported("Their take", event_pb2.MESSAGE_ROLE_ASSISTANT), theirs)],
            [assistant("Both diagrams agree.")],
            [user("Thanks. Now the tests?")],
            [assistant("", ("c2", "shell", '{"cmd": "pytest"}'))],
            [tool_result("c2", "12 passed")],
        ]
        for i, events in enumerate(steps):
            view = await stream.step(compile_request(sid), events)
            rebuilt = await api.compiles.Compile(
                cpb.CompileRequest(rebuild_compile_id=view.compile_id)
            )
            assert encoded(view) == encoded(rebuilt.view), f"step {i}"
            want = {}
            if i >= 1:
                want[drawn.artifact_id] = (event_pb2.MESSAGE_ROLE_ASSISTANT, _png(1))
            if i >= 3:
                want[theirs.artifact_id] = (event_pb2.MESSAGE_ROLE_ASSISTANT, _png(2))
            assert _sent(view) == want, f"step {i}"
            assert _unsent(view) == [], f"step {i}"
        assert len(stream.applied) >= len(steps) - 1  # later steps came as deltas
        counted = await _memo_lookups(d)
        assert counted["hit"] >= len(steps) - 1, counted  # steps continued the memo
        # A unary compile at the head continues the stream's memo too.
        await api.sessions.AppendEvents(
            spb.AppendEventsRequest(session_id=sid, events=[user("And a summary")])
        )
        unary = (await api.compiles.Compile(compile_request(sid))).view
        assert set(_sent(unary)) == {drawn.artifact_id, theirs.artifact_id}
        assert (await _memo_lookups(d))["hit"] > counted["hit"]
    finally:
        await stream.close()
        await api.channel.close()
        await d.stop()


async def test_a_dry_run_and_a_compile_as_of_a_step_send_inline_images_as_any_compile(
    api: Stubs,
) -> None:
    """IMAGE_MODE_INLINE carries the image's bytes in the view: a compile that records
    nothing (a dry run, one at an earlier step) sends them as the recorded compile does,
    not an empty attachment."""
    sid = "looking"
    await _session(api, sid)
    ref = await _upload(api, sid, 9)
    await api.sessions.AppendEvents(
        spb.AppendEventsRequest(
            session_id=sid, events=[_with_image(user("and this one?"), ref), assistant("a cat")]
        )
    )
    recorded = (await api.compiles.Compile(compile_request(sid))).view
    dry = (await api.compiles.Compile(compile_request(sid, dry_run=True))).view
    past = (await api.compiles.Compile(compile_request(sid, as_of_seq=1))).view
    expected = {ref.artifact_id: (event_pb2.MESSAGE_ROLE_USER, _png(9))}
    assert _sent(recorded) == _sent(dry) == _sent(past) == expected


async def test_an_image_anthropic_would_refuse_is_a_note_on_anthropic_routes_only(
    api: Stubs,
) -> None:
    """Anthropic refuses an image over 5 MiB as base64 ("image exceeds 5 MB maximum:
    8259148 bytes > 5242880 bytes"), and with it every later request that holds it. A 4
    MiB screenshot a tool returned is sent to OpenAI and left out of Anthropic bodies
    with a note; the 3 MiB one beside it goes to both."""
    sid = "big-screenshot"
    await _session(api, sid)
    big = b"\x89PNG\r\n\x1a\n" + b"\x01" * (4 << 20)
    small = b"\x89PNG\r\n\x1a\n" + b"\x02" * (3 << 20)
    refs = []
    for data in (big, small):
        up = await api.artifacts.UploadArtifact(iter(png_upload(sid, data, 4000)))
        refs.append(up.artifact)
    await api.sessions.AppendEvents(
        spb.AppendEventsRequest(
            session_id=sid,
            events=[
                _with_image(user("Why does the page render wrong? Full page:"), refs[0]),
                _with_image(user("And the header alone:"), refs[1]),
            ],
        )
    )
    anthropic = common_pb2.Route(
        connection="c", protocol="anthropic-messages", endpoint="api", model="claude-sonnet-4"
    )
    openai = common_pb2.Route(
        connection="c", protocol="openai-chat", endpoint="api", model="gpt-4o"
    )
    formats = {
        anthropic.protocol: view_pb2.RENDER_FORMAT_ANTHROPIC_MESSAGES,
        openai.protocol: view_pb2.RENDER_FORMAT_OPENAI_CHAT,
    }
    sent: dict[str, list[int]] = {}
    for route in (anthropic, openai):
        req = cpb.CompileRequest(
            session_id=sid, route=route, render_formats=[formats[route.protocol]]
        )
        view = (await api.compiles.Compile(req)).view
        body = view.renderings[0].body_json
        # The base64 of every image the body sends, by its length.
        sent[route.protocol] = sorted(
            len(b64)
            for b64 in re.findall(r'(?:"data"|base64,)[": ]*"?([A-Za-z0-9+/=]{1000,})', body)
        )
        if route is anthropic:
            assert set(_sent(view)) == {refs[1].artifact_id}
            assert [n for n in _unsent(view) if refs[0].artifact_id in n and "3932160" in n]
        else:
            assert set(_sent(view)) == {refs[0].artifact_id, refs[1].artifact_id}
            assert not _unsent(view)
    assert len(sent[anthropic.protocol]) == 1 and sent[anthropic.protocol][0] <= 5_242_880
    assert len(sent[openai.protocol]) == 2 and max(sent[openai.protocol]) > 5_242_880


async def test_image_dimensions_come_from_the_bytes_and_anthropic_gets_none_over_8000_px(
    api: Stubs,
) -> None:
    """The daemon measures each uploaded PNG, JPEG, GIF or WebP and stores its real width
    and height, whatever the client declared: a 640x480 screenshot declared as 9000x9000
    is sent, and a full-page capture 8001 px high declared as 100x100 is left out of
    Anthropic bodies with a note (Anthropic refuses it: "At least one of the image
    dimensions exceed max allowed size: 8000 pixels", and every later request holding
    it), yet sent to OpenAI. Bytes that do not read as their declared type keep the
    declared size. The recorded compile is rebuilt exactly."""
    sid = "dimensions"
    await _session(api, sid)
    uploads = {
        "screenshot": (png_bytes(640, 480), 9000, "image/png"),
        "page": (png_bytes(1280, 8001), 100, "image/png"),
        "wide": (
            gif_bytes(1, 1)[:6] + (8200).to_bytes(2, "little") + gif_bytes(1, 1)[8:],
            0,
            "image/gif",
        ),
        "icon": (gif_bytes(40, 30), 0, "image/gif"),
        "placeholder": (_png(1), 77, "image/png"),
    }
    refs: dict[str, common_pb2.ArtifactRef] = {}
    for name, (data, side, mime) in uploads.items():
        up = await api.artifacts.UploadArtifact(iter(png_upload(sid, data, side, mime)))
        refs[name] = up.artifact
    got = {n: (r.width, r.height) for n, r in refs.items()}
    assert got == {
        "screenshot": (640, 480),
        "page": (1280, 8001),
        "wide": (8200, 1),
        "icon": (40, 30),
        "placeholder": (77, 77),
    }
    message = user("Why does the page render wrong?")
    for ref in refs.values():
        _with_image(message, ref)
    await api.sessions.AppendEvents(spb.AppendEventsRequest(session_id=sid, events=[message]))

    anthropic = common_pb2.Route(
        connection="c", protocol="anthropic-messages", endpoint="api", model="claude-sonnet-4"
    )
    req = cpb.CompileRequest(
        session_id=sid,
        route=anthropic,
        render_formats=[view_pb2.RENDER_FORMAT_ANTHROPIC_MESSAGES],
    )
    view = (await api.compiles.Compile(req)).view
    kept = ("screenshot", "icon", "placeholder")
    assert _sent(view) == {
        refs[n].artifact_id: (event_pb2.MESSAGE_ROLE_USER, uploads[n][0]) for n in kept
    }
    # The view's references carry the measured sizes too.
    sizes = {
        p.attachment.ref.artifact_id: (p.attachment.ref.width, p.attachment.ref.height)
        for m in view.messages
        for p in m.parts
        if p.HasField("attachment")
    }
    assert sizes == {refs[n].artifact_id: got[n] for n in kept}
    unsent = _unsent(view)
    assert len(unsent) == 2
    assert [n for n in unsent if refs["page"].artifact_id in n and "1280x8001 pixels" in n]
    assert [n for n in unsent if refs["wide"].artifact_id in n and "8200x1 pixels" in n]
    body = json.loads(view.renderings[0].body_json)
    images = [
        base64.b64decode(c["source"]["data"])
        for m in body["messages"]
        for c in (m["content"] if isinstance(m["content"], list) else [])
        if c.get("type") == "image"
    ]
    assert sorted(images) == sorted(uploads[n][0] for n in kept)
    rebuilt = await api.compiles.Compile(
        cpb.CompileRequest(
            rebuild_compile_id=view.compile_id,
            render_formats=[view_pb2.RENDER_FORMAT_ANTHROPIC_MESSAGES],
        )
    )
    assert encoded(rebuilt.view) == encoded(view)

    openai = common_pb2.Route(
        connection="c", protocol="openai-chat", endpoint="api", model="gpt-4o"
    )
    other = (await api.compiles.Compile(cpb.CompileRequest(session_id=sid, route=openai))).view
    assert set(_sent(other)) == {r.artifact_id for r in refs.values()} and not _unsent(other)


async def test_twenty_images_on_anthropic_may_hold_one_over_2000_px(api: Stubs) -> None:
    """Anthropic refuses images over 2,000 px on a side only in a request of more than 20
    images ("exceed max allowed size for many-image requests: 2000 pixels"). The daemon
    sends at most 20 (the newest), so of 21 uploads the 2,001 px newest one is sent with
    19 others and the oldest is left out by the count limit, not for its size."""
    sid = "many-images"
    await _session(api, sid)
    refs = [await _upload(api, sid, n) for n in range(20)]
    big = png_bytes(2001, 3)
    up = await api.artifacts.UploadArtifact(iter(png_upload(sid, big, 16)))
    assert (up.artifact.width, up.artifact.height) == (2001, 3)
    refs.append(up.artifact)
    message = user("Compare these")
    for ref in refs:
        _with_image(message, ref)
    await api.sessions.AppendEvents(spb.AppendEventsRequest(session_id=sid, events=[message]))
    route = common_pb2.Route(
        connection="c", protocol="anthropic-messages", endpoint="api", model="claude-sonnet-4"
    )
    req = cpb.CompileRequest(
        session_id=sid, route=route, render_formats=[view_pb2.RENDER_FORMAT_ANTHROPIC_MESSAGES]
    )
    view = (await api.compiles.Compile(req)).view
    assert set(_sent(view)) == {r.artifact_id for r in refs[1:]}
    assert _sent(view)[up.artifact.artifact_id][1] == big
    assert _unsent(view) == [
        f"image {refs[0].artifact_id} (image/png, {len(_png(0))} bytes) not sent: "
        "the request already holds 20 images (the limit)"
    ]
    assert view.renderings[0].body_json.count('"type":"image"') == 20


async def test_gemini_bodies_hold_only_the_images_that_keep_the_request_within_its_limit(
    api: Stubs,
) -> None:
    """The Gemini API refuses a request whose size, inline base64 included, is over its
    limit ("Request payload size exceeds the limit: 20971520 bytes."; 20 MB in its image
    guide, kept as 20,000,000 bytes). Three 5.5 MB screenshots are 16.5 MB, within the
    request's 20 MiB of images, but 22 MB as base64: the Gemini body (valid for
    google-genai's own types) holds the newest two and stays within the limit, the
    oldest is a note; the OpenAI body holds all three, byte for byte."""
    sid = "gemini-request-size"
    await _session(api, sid)
    size = 5_500_000
    shots = [b"\x89PNG\r\n\x1a\n" + bytes([n]) * (size - 8) for n in (1, 2, 3)]
    refs = []
    for data in shots:
        header = png_upload(sid, data, 1600)[0]
        # In 1 MiB messages, as a client streams a large upload.
        chunks = [data[i : i + (1 << 20)] for i in range(0, len(data), 1 << 20)]
        stream = [header, *(apb.UploadArtifactRequest(data=c) for c in chunks)]
        refs.append((await api.artifacts.UploadArtifact(iter(stream))).artifact)
    await api.sessions.AppendEvents(
        spb.AppendEventsRequest(
            session_id=sid,
            events=[
                _with_image(user(f"Screenshot {i} of the failing page:"), ref)
                for i, ref in enumerate(refs)
            ],
        )
    )
    gemini = common_pb2.Route(
        connection="c", protocol="gemini", endpoint="api", model="gemini-2.5-pro"
    )
    openai = common_pb2.Route(
        connection="c", protocol="openai-chat", endpoint="api", model="gpt-4o"
    )
    bodies = {}
    for route, fmt in (
        (gemini, view_pb2.RENDER_FORMAT_GEMINI),
        (openai, view_pb2.RENDER_FORMAT_OPENAI_CHAT),
    ):
        req = cpb.CompileRequest(session_id=sid, route=route, render_formats=[fmt])
        view = (await api.compiles.Compile(req)).view
        bodies[route.protocol] = (view, view.renderings[0].body_json)

    view, text = bodies["gemini"]
    assert len(text.encode()) <= 20_000_000
    body = json.loads(text)
    assert errors_for("gemini", body) == []
    inline = [
        base64.b64decode(p["inlineData"]["data"])
        for c in body["contents"]
        for p in c["parts"]
        if "inlineData" in p
    ]
    assert inline == shots[1:]
    assert set(_sent(view)) == {refs[1].artifact_id, refs[2].artifact_id}
    (note,) = _unsent(view)
    assert note.startswith(f"image {refs[0].artifact_id} (image/png, {size} bytes) not sent")
    assert "the request would exceed 20000000 bytes as sent" in note
    assert f"[{note}]" in text  # the model is told in place

    view, text = bodies["openai-chat"]
    assert len(text.encode()) > 20_000_000
    urls = [
        p["image_url"]["url"]
        for m in json.loads(text)["messages"]
        if isinstance(m["content"], list)
        for p in m["content"]
        if p["type"] == "image_url"
    ]
    assert [base64.b64decode(u.split(",", 1)[1]) for u in urls] == shots
    assert not _unsent(view)


async def test_an_images_estimate_follows_its_size(api: Stubs) -> None:
    """R-EST-3: the estimate covers attachments. An image sent on an Anthropic route
    costs about width x height / 750 tokens (what Anthropic documents for its models),
    at least 85 and at most
    1,600 (a ~1,100 px square: providers scale larger images down): each view's ledger
    exceeds the same view without the image by exactly that, in its layer and in the
    message's own count."""
    plain_sid = "est-plain"
    await _session(api, plain_sid)
    await api.sessions.AppendEvents(
        spb.AppendEventsRequest(session_id=plain_sid, events=[user("What is in this image?")])
    )
    plain = (await api.compiles.Compile(compile_request(plain_sid))).view
    for side, cost in ((16, 85), (300, 120), (600, 480), (2_000, 1_600)):
        sid = f"est-{side}"
        await _session(api, sid)
        up = await api.artifacts.UploadArtifact(iter(png_upload(sid, _png(side), side)))
        asked = _with_image(user("What is in this image?"), up.artifact)
        await api.sessions.AppendEvents(spb.AppendEventsRequest(session_id=sid, events=[asked]))
        view = (await api.compiles.Compile(compile_request(sid))).view
        assert list(_sent(view)) == [up.artifact.artifact_id]
        assert view.budget.ledger_tokens - plain.budget.ledger_tokens == cost, side
        assert view.messages[-1].tokens - plain.messages[-1].tokens == cost
        layers = {r.layer: r.tokens for r in view.layers}
        plain_layers = {r.layer: r.tokens for r in plain.layers}
        assert layers[view_pb2.LAYER_WORKING_SET] - plain_layers[view_pb2.LAYER_WORKING_SET] == (
            cost
        )


async def test_an_images_estimate_is_what_the_routes_provider_counts(api: Stubs) -> None:
    """R-EST-3 per provider: on an OpenAI route an image costs OpenAI's high-detail tiles
    (170 tokens a 512-pixel tile plus 85), on a Gemini route at least the 258 tokens
    Gemini counts for any image. The area rule on every route counted a 64x2048 strip
    at 175 tokens (OpenAI: 765) and a 16x16 icon at 85 (Gemini: 258), so a request of
    such images was estimated well under what its provider read."""
    cases = (
        ("openai-chat", "gpt-4o", 64, 2_048, 765),
        ("openai-responses", "gpt-4.1", 16, 16, 255),
        ("gemini", "gemini-2.5-pro", 16, 16, 258),
        ("anthropic-messages", "claude-sonnet-4", 64, 2_048, 175),
    )
    for protocol, model, width, height, cost in cases:
        plain, view = await _with_and_without_image(api, protocol, model, width, height)
        assert view.messages[-1].tokens - plain.messages[-1].tokens == cost, protocol
        assert view.budget.ledger_tokens - plain.budget.ledger_tokens == cost, protocol


async def _with_and_without_image(
    api: Stubs, protocol: str, model: str, width: int, height: int
) -> tuple[view_pb2.CompiledView, view_pb2.CompiledView]:
    """The views of two new sessions on a route of `protocol` and `model` whose one user
    message is the same but for a width x height PNG in the second (which is sent)."""
    route = common_pb2.Route(connection="c", protocol=protocol, endpoint="e", model=model)
    views = []
    for with_image in (False, True):
        sid = f"image-cost-{protocol}-{model.replace('/', '.')}-{with_image}"
        await _session(api, sid)
        asked = user("What is in this image?")
        if with_image:
            data = png_bytes(width, height)
            up = await api.artifacts.UploadArtifact(iter(png_upload(sid, data, 1)))
            assert (up.artifact.width, up.artifact.height) == (width, height)
            asked = _with_image(asked, up.artifact)
        await api.sessions.AppendEvents(spb.AppendEventsRequest(session_id=sid, events=[asked]))
        req = cpb.CompileRequest(session_id=sid, route=route)
        views.append((await api.compiles.Compile(req)).view)
    plain, view = views
    assert list(_sent(view)) == [up.artifact.artifact_id], model
    return plain, view


async def test_an_images_estimate_is_what_the_provider_counts_for_the_routes_model(
    api: Stubs,
) -> None:
    """R-EST-3 per model: OpenAI's vision guide gives each model its own rule, Gemini's
    docs each generation its own. GPT-4o's tiles on every OpenAI route counted a 64x2048
    strip at 765 tokens where GPT-4o mini counts 2,833 + 4 tiles of 5,667 = 25,501, and a
    1024x1024 image at 765 where gpt-4.1-mini counts 1,024 patches times 1.62 = 1,659;
    at least 258 on Gemini routes counted a 16x16 icon at 258 where Gemini 3 counts its
    default media resolution, 1,120. The image's message, its layer and the view's
    ledger all carry the provider's figure."""
    cases = (
        ("openai-chat", "gpt-4o-mini", 64, 2_048, 25_501),
        ("openai-responses", "gpt-4.1-mini-2025-04-14", 1_024, 1_024, 1_659),
        ("gemini", "gemini-3-pro-preview", 16, 16, 1_120),
        ("gemini", "gemini-2.5-flash", 64, 2_048, 774),
        # A gateway's OpenAI-compatible endpoint serving Claude: Claude's area rule
        # (1024 * 1024 / 750), not GPT-4o's 765.
        ("openai-chat", "anthropic/claude-sonnet-4-5", 1_024, 1_024, 1_399),
    )
    for protocol, model, width, height, cost in cases:
        plain, view = await _with_and_without_image(api, protocol, model, width, height)
        assert view.messages[-1].tokens - plain.messages[-1].tokens == cost, model
        assert view.budget.ledger_tokens - plain.budget.ledger_tokens == cost, model
        layers = {r.layer: r.tokens for r in view.layers}
        plain_layers = {r.layer: r.tokens for r in plain.layers}
        working = view_pb2.LAYER_WORKING_SET
        assert layers[working] - plain_layers[working] == cost, model


# The first bytes of each image type the daemon reads.
_MAGIC = {
    b"\x89PNG": "image/png",
    b"\xff\xd8\xff": "image/jpeg",
    b"GIF8": "image/gif",
    b"RIFF": "image/webp",
}


def _bytes_type(data: bytes) -> str:
    return next(mime for magic, mime in _MAGIC.items() if data.startswith(magic))


def _inline_images(fmt: str, body: dict[str, object]) -> list[tuple[str, bytes]]:
    """(declared type, bytes) of every image a body sends inline."""
    out: list[tuple[str, bytes]] = []

    def walk(v: object) -> None:
        if isinstance(v, dict):
            if v.get("type") == "base64" and "media_type" in v:  # Anthropic
                out.append((v["media_type"], base64.b64decode(v["data"])))
            elif "mimeType" in v and "data" in v:  # Gemini inlineData
                out.append((v["mimeType"], base64.b64decode(v["data"])))
            for x in v.values():
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)
        elif isinstance(v, str) and v.startswith("data:image/"):  # OpenAI data URLs
            head, data = v.split(",", 1)
            out.append((head[5 : head.index(";")], base64.b64decode(data)))

    walk(body)
    return out


async def test_an_image_declared_as_another_type_is_stored_and_sent_as_its_bytes(
    api: Stubs,
) -> None:
    """Agents label images by file name (a screenshot tool that saves JPEGs as `.png`),
    and Anthropic refuses an image whose bytes are not its media_type ("Image does not
    match the provided media type image/png"), and every later request holding it. An
    upload declared as one of the types the daemon reads (PNG, JPEG, GIF, WebP) whose
    bytes are a well-formed image of another is stored as what its bytes are, measured
    as that: every body declares each image as its bytes, Gemini gets the GIF as a note,
    and a JPEG 8,001 px high declared as a 100x100 PNG is left out of Anthropic bodies.
    Other declared types are kept as declared."""
    sid = "mislabelled"
    await _session(api, sid)
    uploads = {
        "screenshot": (jpeg_bytes(640, 480), "image/png", "image/jpeg", (640, 480)),
        "photo": (png_bytes(3, 2), "image/jpeg", "image/png", (3, 2)),
        "spinner": (gif_bytes(4, 4), "image/png", "image/gif", (4, 4)),
        "sticker": (webp_bytes(30, 20), "image/jpg", "image/webp", (30, 20)),
        "page": (jpeg_bytes(100, 8001), "image/png", "image/jpeg", (100, 8001)),
        "vector": (png_bytes(1, 1), "image/svg+xml", "image/svg+xml", (16, 16)),
    }
    refs: dict[str, common_pb2.ArtifactRef] = {}
    for name, (data, declared, _, _) in uploads.items():
        up = await api.artifacts.UploadArtifact(iter(png_upload(sid, data, 16, declared)))
        refs[name] = up.artifact
    assert {n: (r.mime_type, (r.width, r.height)) for n, r in refs.items()} == {
        n: (stored, size) for n, (_, _, stored, size) in uploads.items()
    }
    message = user("What do these show?")
    for ref in refs.values():
        _with_image(message, ref)
    await api.sessions.AppendEvents(spb.AppendEventsRequest(session_id=sid, events=[message]))
    formats = [
        view_pb2.RENDER_FORMAT_OPENAI_CHAT,
        view_pb2.RENDER_FORMAT_OPENAI_RESPONSES,
        view_pb2.RENDER_FORMAT_ANTHROPIC_MESSAGES,
        view_pb2.RENDER_FORMAT_GEMINI,
    ]
    kinds = ["openai_chat", "openai_responses", "anthropic_messages", "gemini"]
    routes = {
        "anthropic": ("anthropic-messages", "claude-sonnet-4"),
        "gemini": ("gemini", "gemini-2.5-pro"),
    }
    for route, (protocol, model) in routes.items():
        req = cpb.CompileRequest(
            session_id=sid,
            route=common_pb2.Route(connection="c", protocol=protocol, endpoint="api", model=model),
            render_formats=formats,
        )
        view = (await api.compiles.Compile(req)).view
        page_sent = route != "anthropic"
        for kind, rendering in zip(kinds, view.renderings, strict=True):
            body = json.loads(rendering.body_json)
            assert errors_for(kind, body) == [], (route, kind)
            images = _inline_images(kind, body)
            assert images, (route, kind)
            assert all(mime == _bytes_type(data) for mime, data in images), (route, kind)
            sent = {data for _, data in images}
            takes_gif = kind != "gemini"
            assert (uploads["spinner"][0] in sent) == takes_gif, (route, kind)
            assert (uploads["page"][0] in sent) == page_sent, (route, kind)
            assert {uploads[n][0] for n in ("screenshot", "photo", "sticker")} <= sent
            assert uploads["vector"][0] not in sent


async def test_an_image_stated_beyond_any_header_compiles_on_gemini_2(api: Stubs) -> None:
    """Bytes that read as no image keep the client's stated size, here 4,000,000,000
    pixels a side: Gemini 2.x counts 768-pixel tiles at an image's own size, and that many
    were 7e15 tokens, past the view's 32-bit counts. The compile failed to encode
    (INTERNAL) at every step of the session on the route; a side now counts at most at
    65,535 pixels, the most a JPEG, GIF or WebP header can state."""
    sid = "stated-huge"
    await _session(api, sid)
    data = b"these bytes are not a PNG" * 4
    ref = (await api.artifacts.UploadArtifact(iter(png_upload(sid, data, 4_000_000_000)))).artifact
    assert ref.width == ref.height == 4_000_000_000
    await api.sessions.AppendEvents(
        spb.AppendEventsRequest(session_id=sid, events=[_with_image(user("look:"), ref)])
    )
    route = common_pb2.Route(
        connection="c", protocol="gemini", endpoint="api", model="gemini-2.5-pro"
    )
    view = (await api.compiles.Compile(cpb.CompileRequest(session_id=sid, route=route))).view
    assert 1_908_168 < view.budget.ledger_tokens < 1_908_168 + 1_000
    assert view.decision == view_pb2.DECISION_OVER_BUDGET_SEND_ANYWAY
