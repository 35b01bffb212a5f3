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
import tempfile
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc
from ctxcc_client.deltas import HeldView
from google.protobuf import text_format

from ctxcc.v1 import common_pb2, event_pb2, view_pb2
from ctxcc.v1 import compile_service_pb2 as cpb
from server.app import Daemon
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
        if self.api is not None:
            await self.api.channel.close()
        if self.daemon is not None:
            await self.daemon.stop()
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
VARIANTS = range(6)


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


@dataclass
class Compiled:
    sut_id: str
    ref_id: str
    sid: str
    life: int
    view: view_pb2.CompiledView


# Results that fill a small window come often (compaction), the rarer kinds once.
EVENT_KINDS = (
    *("user", "text", "call", "calls", "result", "big", "huge", "cancel", "reasoning", "done"),
    *("call", "big", "big", "result", "user", "search", "native", "native", "native"),
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
