"""Two daemons fed the same calls, for the stateful cache test (test_cache_oracle.py): the
daemon under test, with every cache and fast path as shipped, and a reference daemon
that remembers nothing between calls (no compile memo, no repeats, no decoded records,
no converted requests, no lent answers), so its every answer is a compile from scratch
of what the store holds.

Both run on one event loop in a thread of their own, so a Hypothesis state machine (which
is synchronous) drives them call by call; they stay up across examples (each example
uses its own session ids, project and route connection, so examples do not share what a
compile reads)."""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import hashlib
import struct
import tempfile
import threading
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc
from ctxcc_client.deltas import HeldView
from google.protobuf import text_format

from ctxcc.v1 import artifact_service_pb2 as apb
from ctxcc.v1 import common_pb2, event_pb2, view_pb2
from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_service_pb2 as spb
from server.app import Daemon
from server.service.watch import Resync
from server.transport.convert_view import compile_options_in
from tests.conftest import Stubs, make_config, stubs_for
from tests.helpers import error_info
from tests.integration.delta_session import apply_delta, chained_digest, encoded

T = TypeVar("T")

# Time text constant for decades: the two daemons' clocks never disagree on it.
_SETTINGS = {"time_granularity": str(10**9), "blob_threshold_bytes": "4096"}


class Loop:
    """An event loop in a thread; `run` waits for a coroutine on it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 20) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


def _from_scratch(d: Daemon) -> None:
    """Turns off what the reference daemon would remember between calls."""
    store = d._store
    assert store is not None and d.compile_servicer is not None
    store._decoded_value = lambda cf, key, cls: None  # type: ignore[method-assign]
    store._tails.read = lambda session_id, after_seq, through_seq: None  # type: ignore[method-assign]
    servicer = d.compile_servicer
    servicer._options.options = compile_options_in  # type: ignore[method-assign,assignment]
    servicer._lent.repeated = lambda view: None  # type: ignore[method-assign]


class Side:
    """One daemon and its stubs."""

    def __init__(self, data_dir: Path, reference: bool, workspace: Path) -> None:
        self.data_dir = data_dir
        self.reference = reference
        self.workspace = workspace
        self.daemon: Daemon | None = None
        self.api: Stubs | None = None

    async def start(self) -> None:
        flags = {**_SETTINGS, "workspace_roots": str(self.workspace)}
        if self.reference:
            flags["compile_memo_bytes"] = "0"
        d = Daemon(make_config(self.data_dir, ui_listen="none", **flags))
        await d.start()
        if self.reference:
            _from_scratch(d)
        self.daemon = d
        self.api = stubs_for(f"unix:{d.endpoints.unix}")

    async def stop(self) -> None:
        # The daemon first: its watches end as a client sees them end when its daemon
        # stops (SHUTTING_DOWN), not cancelled by the client's channel closing.
        if self.daemon is not None:
            await self.daemon.stop()
        if self.api is not None:
            await self.api.channel.close()
        self.api = self.daemon = None


Outcome = tuple[str, Any]  # ("ok", response) or ("error", reason)


async def outcome(call: Callable[[], Awaitable[T]]) -> tuple[str, T | str]:
    """A call's response, or the ErrorInfo reason it failed with (never INTERNAL). The
    call is made here, on the daemons' loop (grpc.aio binds a call to its loop)."""
    try:
        return "ok", await call()
    except grpc.aio.AioRpcError as err:
        reason = error_info(err).reason
        assert err.code() != grpc.StatusCode.INTERNAL, f"INTERNAL: {err.details()}"
        return "error", reason


def normalized(
    view: view_pb2.CompiledView, checkpoints: dict[str, str], raced: bool = False
) -> bytes:
    """A view without what differs between two daemons fed the same calls: its compile
    id, and the ids of the checkpoints the daemon named itself (`checkpoints` maps them
    to a name both daemons give); with `raced`, its changed sections too."""
    copy = view_pb2.CompiledView()
    copy.CopyFrom(view)
    copy.compile_id = ""
    if raced:
        copy.ClearField("changed_sections")
    if copy.checkpoint_id:
        copy.checkpoint_id = checkpoints.get(copy.checkpoint_id, copy.checkpoint_id)
    return copy.SerializeToString(deterministic=True)


@dataclass
class Pair:
    loop: Loop
    sut: Side
    ref: Side
    # Project directories both daemons read (their files change outside either).
    workspace: Path


@contextlib.contextmanager
def started_pair() -> Iterator[Pair]:
    """Both daemons, up on their loop, in a temp dir (short: Unix socket paths)."""
    with tempfile.TemporaryDirectory(prefix="ctxcc-o-", dir="/tmp") as d:
        loop = Loop()
        workspace = Path(d) / "ws"
        workspace.mkdir()
        sut = Side(Path(d) / "sut", False, workspace)
        ref = Side(Path(d) / "ref", True, workspace)
        loop.run(sut.start())
        loop.run(ref.start())
        try:
            yield Pair(loop, sut, ref, workspace)
        finally:
            loop.run(sut.stop())
            loop.run(ref.stop())
            loop.close()


class Stream:
    """A CompileStream of the daemon under test: applies deltas against the views it was
    sent (any of them may be named as a base), checking the digest asked for, and applies
    each again as the Python client does (its HeldView: the head cut, the base's section
    records, prompt and compaction kept), which must rebuild the same bytes."""

    def __init__(self, api: Any) -> None:
        self._queue: asyncio.Queue[cpb.CompileStreamRequest | None] = asyncio.Queue()
        self._call = api.compiles.CompileStream(self._requests())
        self._it = self._call.__aiter__()
        self.views: dict[str, view_pb2.CompiledView] = {}
        self.last = ""
        # The client's held form of each view, as its stream keeps the last one.
        self.held: dict[str, HeldView] = {}

    async def _requests(self) -> AsyncIterator[cpb.CompileStreamRequest]:
        while (item := await self._queue.get()) is not None:
            yield item

    async def send(
        self, msg: cpb.CompileStreamRequest, digest: int
    ) -> tuple[cpb.CompileStreamResponse, view_pb2.CompiledView | None]:
        chained = digest == cpb.DELTA_DIGEST_MESSAGE_CHAIN
        base = msg.step.delta_base_compile_id if msg.HasField("step") else ""
        held = self.held.get(base)
        if held is not None and chained:
            held.prepare()  # as the client does while the step is on its way
        await self._queue.put(msg)
        resp: cpb.CompileStreamResponse = await self._it.__anext__()
        chunks = [resp]
        while resp.WhichOneof("response") == "chunk" and len(chunks) < resp.chunk.count:
            resp = await self._it.__anext__()
            chunks.append(resp)
        kind = chunks[0].WhichOneof("response")
        view: view_pb2.CompiledView | None = None
        if kind == "view":
            view = chunks[0].view
        elif kind == "chunk":
            data = b"".join(c.chunk.data for c in chunks)
            assert hashlib.sha256(data).hexdigest() == chunks[0].chunk.sha256
            view = view_pb2.CompiledView.FromString(data)
        elif kind == "delta":
            delta = chunks[0].delta
            assert delta.base_compile_id in self.views, "a delta against a view it sent"
            view = apply_delta(self.views[delta.base_compile_id], delta)
            if digest == cpb.DELTA_DIGEST_MESSAGE_CHAIN:
                assert delta.chain_sha256 == chained_digest(view), "chained digest"
            else:
                assert hashlib.sha256(encoded(view)).hexdigest() == delta.view_sha256
            self._client_applies(delta, view, chained)
        elif view is not None:
            self.held[view.compile_id] = HeldView.of(view, chained)
        if view is not None:
            self.views[view.compile_id] = view
            self.last = view.compile_id
        return chunks[0], view

    def _client_applies(
        self, delta: cpb.ViewDelta, view: view_pb2.CompiledView, chained: bool
    ) -> None:
        """The Python client's apply of `delta` rebuilds `view` exactly. Its base is held
        as the client held it when it is still usable (a chained base is used up by its
        first delta, as in the client), else as the client holds a whole view."""
        base = self.views[delta.base_compile_id]
        held = self.held.pop(delta.base_compile_id, None)
        usable = held is not None and (
            bool(held.own) or (not chained and held.messages is not None)
        )
        if held is None or not usable:
            held = HeldView.of(base, chained)
        applied = held.apply(delta)
        assert encoded(applied.view) == encoded(view), "the Python client's apply of a delta"
        self.held[view.compile_id] = applied

    async def close(self) -> None:
        await self._queue.put(None)
        self._call.cancel()


def route_of(n: int, kind: int) -> common_pb2.Route:
    """Example `n`'s Claude (0) or GPT (1) route: its own connection, so its own models."""
    if kind == 0:
        protocol, model = "anthropic-messages", "claude-sonnet-4"
    else:
        protocol, model = "openai-chat", "gpt-4o"
    return common_pb2.Route(connection=f"c{n}", protocol=protocol, endpoint="api", model=model)


# What a compile request may vary in (an agent sends the same one at every step, so a
# few kinds, drawn again and again, make repeats likely).
VARIANTS = range(9)


@dataclass
class SessionModel:
    exists: bool = False
    head: int = 0
    open_calls: list[str] = field(default_factory=list)
    # Times it was created: compiles of an earlier life are gone.
    life: int = 0
    # The compile request the session's agent sends (an agent sends the same one at
    # every step): what a compile after a write asks for.
    variant: int = 0
    # Artifacts uploaded to this life of the session, in upload order.
    artifacts: list[str] = field(default_factory=list)


@dataclass
class Compiled:
    sut_id: str
    ref_id: str
    sid: str
    life: int
    view: view_pb2.CompiledView
    # What the compile asked for its images (a rebuild asks the same to send the same).
    image_mode: int = 0


# Results that fill a small window come often (compaction), the rarer kinds once.
EVENT_KINDS = (
    *("user", "text", "call", "calls", "result", "big", "huge", "cancel", "reasoning", "done"),
    *("call", "big", "big", "result", "user", "search", "native", "native", "native"),
    # Attachments: a user message with an image, an attachment event, an assistant
    # message showing one, a user message with several (two pass the 20-image limit), one
    # naming an artifact the session does not have, a message imported with one.
    *("image", "image", "attach", "shown", "gallery", "gallery", "stray", "imported"),
    # A turn started without a user message, a browser element the user selected.
    *("turn", "browser"),
)


def diff(a: bytes, b: bytes) -> str:
    """Two encoded views' difference, as text."""

    def text(raw: bytes) -> list[str]:
        return text_format.MessageToString(view_pb2.CompiledView.FromString(raw)).splitlines()

    return "\n".join(difflib.unified_diff(text(a), text(b), "under test", "reference", lineterm=""))


def events_of(
    m: SessionModel,
    kinds: list[str],
    prefix: str,
    ids: Iterator[int],
    routes: tuple[str, ...] = ("",),
) -> list[event_pb2.Event]:
    """Events of these kinds for the session `m` models (ids: `prefix` and a number); an
    assistant message of kind "native" carries provider-native state bound to one of
    `routes` (route ids), which a view sends on that route only."""
    out = []
    for kind in kinds:
        k = next(ids)
        ev = event_pb2.Event(event_id=f"{prefix}{k}")
        if kind == "user":
            ev.user_message.parts.add(text=f"Step {k}: look at src/mod{k % 3}.py")
        elif kind == "text":
            ev.assistant_message.parts.add(text=f"Working on {k}")
        elif kind in ("call", "calls"):
            for j in range(1 if kind == "call" else 2):
                cid = f"call{k}-{j}"
                ev.assistant_message.tool_calls.add(
                    call_id=cid, name="read", arguments_json=f'{{"path": "src/mod{j}.py"}}'
                )
                m.open_calls.append(cid)
        elif kind in ("result", "big", "huge"):
            ev.tool_result.call_id = m.open_calls.pop(0) if m.open_calls else f"lost{k}"
            ev.tool_result.tool_name = "read"
            line = f"line of result {k}\n"
            ev.tool_result.text = line * {"big": 150, "huge": 400}.get(kind, 2)
        elif kind == "search":
            cid = f"search{k}"
            ev.assistant_message.tool_calls.add(
                call_id=cid, name="tool_search", arguments_json='{"query": "ship"}'
            )
            m.open_calls.append(cid)
        elif kind == "native":
            ev.assistant_message.parts.add(text=f"Answer {k}")
            state = ev.assistant_message.native_state
            state.route_id, state.kind, state.data = routes[k % len(routes)], "opaque", b"s%d" % k
        elif kind in ("image", "gallery"):
            msg = ev.user_message
            msg.parts.add(text=f"Step {k}: see the screenshot")
            for j in range(1 if kind == "image" else 11):
                # Ids are the stored artifact's: the rest of the reference is filled in
                # by the daemon (a wrong size claimed must not matter).
                msg.parts.add().attachment.CopyFrom(
                    common_pb2.ArtifactRef(artifact_id=artifact_of(m, k + j), size_bytes=1)
                )
        elif kind == "attach":
            ev.attachment.artifact_id = artifact_of(m, k)
        elif kind == "stray":  # never uploaded here: the append is refused whole
            ev.attachment.artifact_id = f"a-stray{k}"
        elif kind == "imported":
            imported = ev.imported_message
            imported.origin_session_id, imported.origin_seq = "elsewhere", k
            # Of either role: a user's starts a turn, both show their image.
            imported.role = (event_pb2.MESSAGE_ROLE_USER, event_pb2.MESSAGE_ROLE_ASSISTANT)[k % 2]
            imported.parts.add(text=f"From another session {k}")
            imported.parts.add().attachment.artifact_id = artifact_of(m, k)
        elif kind == "turn":
            ev.turn_started.turn_id = f"t{k}"
        elif kind == "browser":
            el = ev.browser_element
            el.url, el.selector, el.tag, el.text = f"https://x.test/{k}", "#go", "button", "Go"
            el.attributes["class"] = "primary"
        elif kind == "shown":
            ev.assistant_message.parts.add(text=f"Here is the diagram {k}")
            ev.assistant_message.parts.add().attachment.artifact_id = artifact_of(m, k)
        elif kind == "cancel":
            ev.turn_cancelled.reason = "stopped"
            ev.turn_cancelled.keep_reasoning = True
        elif kind == "reasoning":
            ev.assistant_message.parts.add(text=f"Answer {k}")
            ev.assistant_message.reasoning = f"Because {k}"
        else:
            ev.turn_completed.SetInParent()
        out.append(ev)
    return out


def artifact_of(m: SessionModel, k: int) -> str:
    """One of the session's artifacts (one it does not have when there is none: the
    append is refused whole, by both daemons alike)."""
    return m.artifacts[k % len(m.artifacts)] if m.artifacts else "a-none"


def png(width: int, height: int, seed: int) -> bytes:
    """A real PNG of `width` x `height` RGB pixels (a gradient shifted by `seed`)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    rows = b"".join(
        b"\x00" + bytes((x * 7 + y * 3 + seed) % 256 for x in range(width * 3))
        for y in range(height)
    )
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


# What an upload may hold: (MIME type, width, height, bytes); a PDF is stored like an
# image but never sent to a model.
ARTIFACTS = (
    ("image/png", 1, 1, png(1, 1, 0)),
    ("image/png", 16, 8, png(16, 8, 1)),
    ("image/png", 64, 64, png(64, 64, 2)),
    ("image/png", 200, 120, png(200, 120, 3)),
    ("application/pdf", 0, 0, b"%PDF-1.4\n" + bytes(range(256)) * 4),
)


async def upload(api: Stubs, sid: str, which: int, request_id: str) -> Any:
    """Uploads ARTIFACTS[which] to `sid` in two chunks; its id derives from request_id,
    so both daemons name it alike."""
    mime, width, height, data = ARTIFACTS[which]

    async def chunks() -> AsyncIterator[apb.UploadArtifactRequest]:
        header = apb.ArtifactHeader(
            session_id=sid,
            mime_type=mime,
            size_bytes=len(data),
            sha256=hashlib.sha256(data).hexdigest(),
            width=width,
            height=height,
            request_id=request_id,
        )
        yield apb.UploadArtifactRequest(header=header)
        half = len(data) // 2
        yield apb.UploadArtifactRequest(data=data[:half])
        yield apb.UploadArtifactRequest(data=data[half:])

    return await api.artifacts.UploadArtifact(chunks())


# A barrier in a watch: a Resync of head 0 changes nothing a watch does (it keeps the
# highest seq it sent) and never comes from the daemon itself (a resync carries a head
# past the backlog a full queue dropped).
_MARK = 0

Update = tuple[Any, ...]


def _update(r: spb.WatchSessionResponse) -> Update:
    """A watch's update as both daemons send it: no create times, no compile ids (each
    daemon names its compiles)."""
    kind = r.WhichOneof("update")
    if kind == "event":
        ev = event_pb2.Event()
        ev.CopyFrom(r.event)
        ev.ClearField("create_time")
        return ("event", ev.seq, ev.SerializeToString(deterministic=True))
    if kind == "checkpoint":
        ck = type(r.checkpoint)()
        ck.CopyFrom(r.checkpoint)
        ck.ClearField("create_time")
        return ("checkpoint", ck.SerializeToString(deterministic=True))
    if kind == "compile":
        return ("compile", r.compile.event_boundary, r.compile.estimated_input_tokens)
    return ("resync", r.resync.head_seq)


class Watch:
    """A client's WatchSession of one daemon, read as it arrives into `got`. `ended` is
    None while it runs, "" once it ended cleanly, else the reason it failed with
    (SHUTTING_DOWN when its daemon stopped: the client watches again after the last seq
    it got, as the clients do). Barriers (see `barrier`) are counted in `marks`, not
    kept."""

    def __init__(self, side: Side, sid: str, after_seq: int) -> None:
        self.sid = sid
        self.got: list[Update] = []
        self.ended: str | None = None
        self.last_seq = after_seq
        self.marks = 0
        self._arrived = asyncio.Event()
        self._call: Any = None
        self._task: asyncio.Task[None] | None = None
        self._open(side)

    def _open(self, side: Side) -> None:
        assert side.api is not None
        self.ended = None
        req = spb.WatchSessionRequest(session_id=self.sid, after_seq=self.last_seq)
        self._call = side.api.sessions.WatchSession(req)
        self._task = asyncio.ensure_future(self._read(self._call))

    async def _read(self, call: Any) -> None:
        try:
            async for r in call:
                if r.WhichOneof("update") == "resync" and r.resync.head_seq == _MARK:
                    self.marks += 1
                else:
                    update = _update(r)
                    if update[0] == "event":
                        self.last_seq = update[1]
                    self.got.append(update)
                self._arrived.set()
            ended = ""
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.CANCELLED:
                return  # closed by the test
            assert err.code() != grpc.StatusCode.INTERNAL, f"INTERNAL: {err.details()}"
            ended = error_info(err).reason
        if call is self._call:
            self.ended = ended
        self._arrived.set()

    async def started(self, side: Side) -> None:
        """Until the daemon has subscribed this watch (or refused it): updates published
        before then are not this watch's."""
        assert side.daemon is not None
        hub = side.daemon.hub
        # The hub has nothing to wait on; it subscribes on this very loop, soon.
        while self.ended is None and not hub.watched(self.sid):  # noqa: ASYNC110
            await asyncio.sleep(0.001)

    async def reached(self, marks: int) -> None:
        while self.marks < marks and self.ended is None:
            self._arrived.clear()
            await self._arrived.wait()

    async def again(self, side: Side) -> None:
        """After its daemon restarted: the watch resumed after the last seq it got, when
        it ended for the shutdown (the clients reconnect on UNAVAILABLE)."""
        if self._task is not None:
            await self._task
        if self.ended == "SHUTTING_DOWN":
            self._open(side)
            await self.started(side)

    async def close(self, side: Side) -> None:
        """Ends the watch, and waits until its daemon let it go (`started` of the next
        watch of the session waits for a subscription of its own)."""
        if self._call is not None and self.ended is None:
            self._call.cancel()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if side.daemon is not None:
            while side.daemon.hub.watched(self.sid):  # noqa: ASYNC110 (as in `started`)
                await asyncio.sleep(0.001)


async def barrier(side: Side, watches: list[Watch]) -> None:
    """Everything the daemon published to these watches so far has reached them: a
    barrier published to each session's watchers (the daemon publishes on its loop
    before it answers the call that made the update) comes after it."""
    assert side.daemon is not None
    targets = []
    for w in watches:
        if w.ended is None:
            side.daemon.hub.publish(w.sid, [Resync(_MARK)], 0)
            targets.append((w, w.marks + 1))
    for w, marks in targets:
        await w.reached(marks)
