# ruff: noqa: S311 - seeded randomness for a reproducible stress run, not for secrets
"""A seeded randomized stress driver for the event log's durability and concurrency promises,
from outside: a real daemon process (tests/e2e/proc.py), the real Python client.

Several sessions at once, many concurrent workers: appends with and without a request id
and with and without `expected_last_seq` (the client's `append`, and a raw stub that never
retries), `CompileStream` steps through the client's stream helper (usage on the step,
deltas, chunked views: `--stream-chunk-bytes 2048`), raw `ResumeRequest`s, unary
`Compile`, checkpoints, `DeleteSession` then `CreateSession` under the same id, and
`WatchSession` readers through the client's reconnecting `watch`. At random moments the
daemon is killed with SIGKILL (sometimes SIGTERM) and restarted on the same data directory.

A model keeps what was acknowledged. After every restart, per session:
- every acknowledged append is in the log once, at the seqs it was acknowledged at, its
  payload byte-identical; seqs are contiguous; no text appears twice (every event's text
  is unique in the run); an append refused (SEQUENCE_MISMATCH) left nothing;
- a sample of acknowledged request ids sent again is answered `replayed`, same seqs;
- every acknowledged checkpoint is listed;
- a sample of views received (stream steps, unary compiles, resumes) equals byte for byte
  its rebuild (`rebuild_compile_id`, always a compile from scratch).
Watchers check that what they receive is contiguous per session incarnation (a `resync`
marker announces a jump), and at the end that it matches the log. No call may end with
INTERNAL or UNKNOWN; the daemon's log may hold no traceback. At the end the data
directory is copied and a second daemon with `--compile-memo-bytes 0` rebuilds a sample
of the views from the copy: byte for byte what the daemon under test sent.

    .venv/bin/python scripts/stress_durability.py --seed 1 --seconds 120

Exit code 0 when every invariant held; the failures are printed otherwise."""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import random
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import grpc  # noqa: E402
from ctxcc_client import AsyncClient, CtxccError  # noqa: E402
from ctxcc_client.errors import lost_write  # noqa: E402
from ctxcc_client.stream import ViewAssembler  # noqa: E402

from ctxcc.v1 import (  # noqa: E402  # noqa: E402
    checkpoint_pb2,
    common_pb2,
    compile_service_pb2_grpc,
    event_pb2,
    session_service_pb2_grpc,
)
from ctxcc.v1 import compile_service_pb2 as cpb  # noqa: E402
from ctxcc.v1 import session_service_pb2 as spb  # noqa: E402
from ctxcc.v1 import tool_service_pb2 as tpb  # noqa: E402
from tests.e2e.proc import FAST_RECONNECT, DaemonProcess  # noqa: E402

T = TypeVar("T")

ROUTE = common_pb2.Route(
    connection="default", protocol="anthropic-messages", endpoint="api", model="claude-sonnet-4"
)
CHUNK = 16384
# Tool results over the 16 KiB blob threshold, shared by every session.
SHARED_RESULTS = [
    "".join(f"line {n} of shared result {k}\n" for n in range(1200)) for k in range(3)
]
BAD_CODES = (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN)


def payload(ev: event_pb2.Event) -> bytes:
    kind = ev.WhichOneof("payload")
    assert kind is not None
    return bytes(kind.encode()) + b":" + getattr(ev, kind).SerializeToString(deterministic=True)


def text_of(ev: event_pb2.Event) -> str:
    kind = ev.WhichOneof("payload")
    if kind == "user_message":
        return ev.user_message.parts[0].text
    if kind == "assistant_message":
        return ev.assistant_message.parts[0].text
    return ""


def tag_of(text: str) -> str:
    """'<sid>/g<gen>' of an event text made by `make_events`."""
    return "/".join(text.split("/", 2)[:2])


def encoded(view: Any) -> bytes:
    return bytes(view.SerializeToString(deterministic=True))


class RWLock:
    """Many holders of the shared side (appends, steps, checks), or one exclusive holder
    (a delete and re-create), so an acknowledgement is never ambiguous between two
    incarnations of a session."""

    def __init__(self) -> None:
        self._readers = 0
        self._writer = False
        self._cond = asyncio.Condition()

    async def acquire_shared(self) -> None:
        async with self._cond:
            await self._cond.wait_for(lambda: not self._writer)
            self._readers += 1

    async def release_shared(self) -> None:
        async with self._cond:
            self._readers -= 1
            self._cond.notify_all()

    async def acquire_exclusive(self) -> None:
        async with self._cond:
            await self._cond.wait_for(lambda: not self._writer)
            self._writer = True
            try:
                await self._cond.wait_for(lambda: self._readers == 0)
            except BaseException:
                self._writer = False  # cancelled while waiting: readers may go on
                self._cond.notify_all()
                raise

    async def release_exclusive(self) -> None:
        async with self._cond:
            self._writer = False
            self._cond.notify_all()


class Shared:
    def __init__(self, lock: RWLock) -> None:
        self.lock = lock

    async def __aenter__(self) -> None:
        await self.lock.acquire_shared()

    async def __aexit__(self, *exc: object) -> None:
        await self.lock.release_shared()


@dataclass
class Ack:
    rid: str
    first: int
    last: int
    payloads: list[bytes]
    how: str
    expected: int | None = None


@dataclass
class SessionModel:
    sid: str
    # Deleted and made again without waiting for the calls in flight on it: acknowledgements
    # are ambiguous between incarnations, so only what holds whatever the interleaving is
    # checked (contiguous seqs, no text twice, no INTERNAL, views equal to their rebuilds).
    chaos: bool = False
    gen: int = 0
    lock: RWLock = field(default_factory=RWLock)
    acks: list[Ack] = field(default_factory=list)
    refused: set[str] = field(default_factory=set)  # texts of refused appends
    checkpoints: dict[str, int] = field(default_factory=dict)
    views: dict[str, bytes] = field(default_factory=dict)  # compile id -> encoded view
    view_order: list[str] = field(default_factory=list)

    @property
    def tag(self) -> str:
        return f"{self.sid}/g{self.gen}"

    def keep_view(self, view: Any) -> None:
        if view.compile_id in self.views:
            return
        self.views[view.compile_id] = encoded(view)
        self.view_order.append(view.compile_id)
        while len(self.view_order) > 40:
            self.views.pop(self.view_order.pop(0), None)

    def reset(self) -> None:
        self.gen += 1
        self.acks.clear()
        self.refused.clear()
        self.checkpoints.clear()
        self.views.clear()
        self.view_order.clear()


@dataclass
class Stats:
    counts: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    failures: list[str] = field(default_factory=list)

    last_signal: str = ""

    def fail(self, what: str) -> None:
        stamp = time.strftime("%H:%M:%S")
        print(f"FAILURE {stamp} (last signal: {self.last_signal}): {what}", flush=True)
        self.failures.append(what)


class Driver:
    def __init__(
        self,
        seed: int,
        seconds: float,
        sessions: int,
        workdir: Path,
        sigterm_share: float = 0.25,
        durability: str = "sync",
    ) -> None:
        self.rng = random.Random(seed)
        self.sigterm_share = sigterm_share
        self.seconds = seconds
        self.workdir = workdir
        self.data = workdir / "data"
        self.daemon = DaemonProcess(
            self.data,
            "--durability",
            durability,
            "--stream-chunk-bytes",
            str(CHUNK),
            "--time-granularity",
            "1000000000",
            "--grace-period",
            "3",
            log_path=workdir / "daemon.log",
        )
        self.models = [SessionModel(f"fz{i}") for i in range(sessions)]
        self.models.append(SessionModel("fzchaos", chaos=True))
        self.stats = Stats()
        self.counter = 0
        self.stop = asyncio.Event()
        self.up = asyncio.Event()  # set while the daemon serves
        self.watch_log: dict[str, list[tuple[int, str]]] = defaultdict(list)
        self.restarts = 0

    # --- helpers ------------------------------------------------------------------------

    def tool_events(
        self, m: SessionModel, worker: str, rng: random.Random
    ) -> list[event_pb2.Event]:
        """A tool call and its result, the result over the blob threshold and drawn from a
        pool shared by every session: its blob is shared, and a DeleteSession of one
        session must leave it to the others."""
        self.counter += 1
        call_id = f"call-{self.counter}"
        call = event_pb2.Event()
        call.assistant_message.parts.add(text=f"{m.tag}/{worker}/{self.counter}/tool")
        call.assistant_message.tool_calls.add(call_id=call_id, name="shell", arguments_json="{}")
        result = event_pb2.Event()
        result.tool_result.call_id = call_id
        result.tool_result.tool_name = "shell"
        result.tool_result.text = rng.choice(SHARED_RESULTS)
        return [call, result]

    def make_events(
        self, m: SessionModel, worker: str, rng: random.Random
    ) -> list[event_pb2.Event]:
        events = []
        for _ in range(rng.choice((1, 1, 1, 2, 3))):
            self.counter += 1
            size = rng.choice((0, 10, 200, 1500, 3000))
            text = f"{m.tag}/{worker}/{self.counter}/" + "x" * size
            ev = event_pb2.Event()
            if rng.random() < 0.7:
                ev.user_message.parts.add(text=text)
            else:
                ev.assistant_message.parts.add(text=text)
            events.append(ev)
        return events

    def check_error(self, where: str, err: BaseException) -> None:
        if isinstance(err, CtxccError):
            self.stats.counts[
                f"err {where.split(maxsplit=1)[0]}: {err.code.name} {err.reason}"
            ] += 1
            if err.code in BAD_CODES or (
                err.code == grpc.StatusCode.CANCELLED and not self.stop.is_set()
            ):
                self.stats.fail(f"{where}: {err.code.name} {err.reason}: {err.message}")
            return
        if isinstance(err, grpc.RpcError):
            code = err.code()  # type: ignore[attr-defined]
            if lost_write(err):
                # grpc.aio's own INTERNAL for a request it could not write to a call the
                # daemon had ended (documented in ctxcc_client.errors): UNAVAILABLE.
                code = grpc.StatusCode.UNAVAILABLE
            self.stats.counts[f"err {where.split(maxsplit=1)[0]}: raw {code.name}"] += 1
            if code in BAD_CODES:
                self.stats.fail(f"{where}: raw {code.name}: {err.details()}")  # type: ignore[attr-defined]
            return
        self.stats.fail(f"{where}: {type(err).__name__}: {err}\n{traceback.format_exc()}")

    def ack(
        self,
        m: SessionModel,
        rid: str,
        first: int,
        last: int,
        events: list[Any],
        how: str,
        expected: int | None = None,
    ) -> None:
        if last - first + 1 != len(events):
            self.stats.fail(
                f"{how} {rid}: acknowledged seqs {first}..{last} for {len(events)} events"
            )
        if not m.chaos:
            m.acks.append(Ack(rid, first, last, [payload(e) for e in events], how, expected))
        self.stats.counts[f"ack {how}"] += 1

    # --- workers ------------------------------------------------------------------------

    async def appender(self, n: int, client: AsyncClient) -> None:
        rng = random.Random(self.rng.random())
        raw: Any = session_service_pb2_grpc.SessionServiceStub(client._channel)
        while not self.stop.is_set():
            m = rng.choice(self.models)
            async with Shared(m.lock):
                events = (
                    self.tool_events(m, f"a{n}", rng)
                    if rng.random() < 0.15
                    else self.make_events(m, f"a{n}", rng)
                )
                mode = rng.choice(("rid", "rid", "rid+expected", "raw", "raw+expected"))
                expected = None
                if "expected" in mode:
                    try:
                        expected = (await client.get_session(m.sid)).head_seq
                    except CtxccError as err:
                        self.check_error("get_session", err)
                        continue
                    if rng.random() < 0.2:
                        expected = max(0, expected + rng.choice((-1, 1)))
                if mode.startswith("rid"):
                    rid = f"rid-{self.counter}-{n}"
                    try:
                        resp = await client.append(
                            m.sid, events, request_id=rid, expected_last_seq=expected
                        )
                    except CtxccError as err:
                        self.check_error(f"append {rid}", err)
                        if err.reason == "SEQUENCE_MISMATCH":
                            m.refused.update(text_of(e) for e in events)
                        continue
                    self.ack(m, rid, resp.first_seq, resp.last_seq, events, mode, expected)
                    if resp.replayed:
                        self.stats.counts["append replayed (client retry)"] += 1
                else:
                    req = spb.AppendEventsRequest(session_id=m.sid, events=events)
                    if expected is not None:
                        req.expected_last_seq = expected
                    try:
                        resp = await raw.AppendEvents(req, timeout=20)
                    except grpc.aio.AioRpcError as err:
                        self.check_error("raw append", err)
                        if err.code() == grpc.StatusCode.FAILED_PRECONDITION:
                            m.refused.update(text_of(e) for e in events)
                        continue
                    self.ack(m, "", resp.first_seq, resp.last_seq, events, mode)
            await asyncio.sleep(rng.uniform(0, 0.05))

    async def streamer(self, n: int, client: AsyncClient) -> None:
        rng = random.Random(self.rng.random())
        while not self.stop.is_set():
            m = rng.choice(self.models)
            stream = client.stream(deltas=rng.random() < 0.8)
            damage(stream, rng, self.stats)
            try:
                for _ in range(rng.randrange(3, 15)):
                    if self.stop.is_set():
                        break
                    async with Shared(m.lock):
                        await self.one_step(n, client, stream, m, rng)
                    await asyncio.sleep(rng.uniform(0, 0.03))
            finally:
                try:
                    stream._drop()
                except Exception as err:
                    self.check_error("stream close", err)

    async def one_step(
        self, n: int, client: AsyncClient, stream: Any, m: SessionModel, rng: random.Random
    ) -> None:
        events = self.make_events(m, f"s{n}", rng) if rng.random() < 0.85 else []
        expected = None
        if events and rng.random() < 0.2:
            try:
                expected = (await client.get_session(m.sid)).head_seq
            except CtxccError as err:
                self.check_error("get_session", err)
                return
        rid = f"step-{self.counter}-{n}" if events and rng.random() < 0.5 else ""
        usage = stream._usage is not None
        deltas_before = stream.stats.deltas
        resumed_before = stream.stats.resumed
        req = cpb.CompileRequest(session_id=m.sid, route=ROUTE)
        try:
            view, append = await stream.step(
                req, events, request_id=rid, expected_last_seq=expected
            )
        except CtxccError as err:
            self.check_error(f"step {rid}", err)
            if err.reason == "SEQUENCE_MISMATCH":
                m.refused.update(text_of(e) for e in events)
            elif err.reason == "SESSION_NOT_FOUND" and not m.chaos:
                self.stats.fail(f"step on {m.sid} (held) answered SESSION_NOT_FOUND")
            return
        if stream.stats.resumed > resumed_before:
            shape = "+resumed"
        elif stream.stats.deltas > deltas_before:
            shape = "+delta"
        elif view.ByteSize() > CHUNK:
            shape = "+chunked"
        else:
            shape = "+whole"
        path = ("usage" if usage else "plain") + shape
        self.stats.counts[f"step {path}"] += 1
        if append is not None and events:
            self.ack(m, rid, append.first_seq, append.last_seq, events, "step", expected)
            if append.replayed:
                self.stats.counts[f"step replayed ({path})"] += 1
        m.keep_view(view)
        if rng.random() < 0.6:
            await stream.report_usage(
                view.compile_id,
                input_tokens=rng.randrange(100, 5000),
                output_tokens=rng.randrange(1, 500),
            )
        if rng.random() < 0.1:
            await self.rebuild_check(client, m, view, "stream view")

    async def rebuild_check(
        self, client: AsyncClient, m: SessionModel, view: Any, what: str
    ) -> None:
        try:
            again = await client.compiles.Compile(
                cpb.CompileRequest(rebuild_compile_id=view.compile_id)
            )
        except CtxccError as err:
            self.check_error(f"rebuild {what}", err)
            if err.code == grpc.StatusCode.NOT_FOUND and not m.chaos:
                # The compile record is not fsynced: a SIGKILL keeps it (page cache).
                self.stats.fail(f"rebuild of {what} {view.compile_id}: {err.reason}")
            return
        self.stats.counts["rebuild checked"] += 1
        if encoded(again.view) != encoded(view):
            self.stats.fail(f"{what} {view.compile_id} differs from its rebuild")

    async def compiler(self, n: int, client: AsyncClient) -> None:
        rng = random.Random(self.rng.random())
        while not self.stop.is_set():
            m = rng.choice(self.models)
            async with Shared(m.lock):
                try:
                    view = await client.compile(m.sid, route=ROUTE)
                except CtxccError as err:
                    self.check_error("compile", err)
                    continue
                self.stats.counts["unary compile"] += 1
                m.keep_view(view)
                if rng.random() < 0.3:
                    await self.rebuild_check(client, m, view, "unary view")
            await asyncio.sleep(rng.uniform(0.05, 0.3))

    async def resumer(self, client: AsyncClient) -> None:
        """Raw ResumeRequests naming views sent earlier: an answer under the named id is
        byte for byte the view first sent under it."""
        rng = random.Random(self.rng.random())
        stub: Any = compile_service_pb2_grpc.CompileServiceStub(client._channel)
        while not self.stop.is_set():
            await asyncio.sleep(rng.uniform(0.1, 0.5))
            m = rng.choice(self.models)
            if rng.random() < 0.5:
                await self.quiet_resume(client, stub, m, rng)
                continue
            async with Shared(m.lock):
                if not m.views:
                    continue
                cid = rng.choice(list(m.views))
                want = m.views[cid]
                req = cpb.CompileStreamRequest(
                    resume=cpb.ResumeRequest(
                        compile_id=cid, compile=cpb.CompileRequest(session_id=m.sid, route=ROUTE)
                    )
                )
                try:
                    view = await self.one_resume(stub, req)
                except grpc.aio.AioRpcError as err:
                    self.check_error("resume", err)
                    continue
                except ValueError as err:
                    self.stats.fail(f"resume {cid}: {err}")
                    continue
                if view is None:
                    continue
                self.stats.counts["resume"] += 1
                if view.compile_id == cid:
                    self.stats.counts["resume same view"] += 1
                    if encoded(view) != want:
                        self.stats.fail(f"resume of {cid} answered another view under its id")
                else:
                    m.keep_view(view)

    async def quiet_resume(
        self, client: AsyncClient, stub: Any, m: SessionModel, rng: random.Random
    ) -> None:
        """With nothing else touching the session: a step through the stream helper, then a
        ResumeRequest naming its view on a new stream; the same view comes back byte for
        byte (or, after a restart in between, a fresh compile under another id)."""
        await m.lock.acquire_exclusive()
        try:
            stream = client.stream()
            req = cpb.CompileRequest(session_id=m.sid, route=ROUTE)
            try:
                events = self.make_events(m, "q", rng) if rng.random() < 0.5 else []
                view, append = await stream.step(req, events)
            except CtxccError as err:
                self.check_error("quiet step", err)
                return
            finally:
                stream._drop()
            if append is not None and events:
                self.ack(m, "", append.first_seq, append.last_seq, events, "quiet step")
            m.keep_view(view)
            resume = cpb.CompileStreamRequest(
                resume=cpb.ResumeRequest(compile_id=view.compile_id, compile=req)
            )
            try:
                again = await self.one_resume(stub, resume)
            except grpc.aio.AioRpcError as err:
                self.check_error("resume", err)
                return
            if again is None:
                return
            self.stats.counts["quiet resume"] += 1
            if again.compile_id == view.compile_id:
                self.stats.counts["quiet resume same view"] += 1
                if encoded(again) != encoded(view):
                    self.stats.fail(
                        f"resume of {view.compile_id} answered another view under its id"
                    )
            else:
                m.keep_view(again)
        finally:
            await m.lock.release_exclusive()

    async def one_resume(self, stub: Any, req: Any) -> Any:
        call = stub.CompileStream(iter([req]), timeout=20)
        assembler = ViewAssembler()
        async for resp in call:
            kind = resp.WhichOneof("response")
            if kind == "view":
                return resp.view
            if kind == "chunk":
                view = assembler.add(resp.chunk)
                if view is not None:
                    return view
            elif kind == "error":
                self.stats.counts[f"resume error {resp.error.reason}"] += 1
                if resp.error.code in (13, 2):
                    self.stats.fail(f"resume: {resp.error.reason} {resp.error.message}")
                return None
            else:
                self.stats.fail(f"resume answered a {kind}")
                return None
        return None

    async def checkpointer(self, client: AsyncClient) -> None:
        rng = random.Random(self.rng.random())
        while not self.stop.is_set():
            await asyncio.sleep(rng.uniform(0.2, 0.8))
            m = rng.choice(self.models)
            async with Shared(m.lock):
                try:
                    head = (await client.get_session(m.sid)).head_seq
                    if head == 0:
                        continue
                    self.counter += 1
                    made = await client.compiles.CreateCheckpoint(
                        cpb.CreateCheckpointRequest(
                            request_id=f"ck-{self.counter}",
                            checkpoint=checkpoint_pb2.Checkpoint(
                                session_id=m.sid,
                                covers_through_seq=rng.randrange(1, head + 1),
                                summary=f"summary {self.counter}",
                            ),
                            covered_digest_mode=cpb.COVERED_DIGEST_MODE_COMPUTE,
                        )
                    )
                except CtxccError as err:
                    self.check_error("checkpoint", err)
                    continue
                if not m.chaos:
                    m.checkpoints[made.checkpoint.checkpoint_id] = (
                        made.checkpoint.covers_through_seq
                    )
                self.stats.counts["checkpoint"] += 1

    async def deleter(self, client: AsyncClient) -> None:
        rng = random.Random(self.rng.random())
        while not self.stop.is_set():
            await asyncio.sleep(rng.uniform(2, 5))
            m = rng.choice(self.models)
            if m.chaos:
                await self.recreate(client, m)
                continue
            await m.lock.acquire_exclusive()
            try:
                await self.recreate(client, m)
            finally:
                await m.lock.release_exclusive()

    async def recreate(self, client: AsyncClient, m: SessionModel) -> None:
        deadline = time.monotonic() + 60
        while True:  # DeleteSession is not retried by the client: do it here, checking
            try:
                await client.sessions.DeleteSession(spb.DeleteSessionRequest(session_id=m.sid))
                break
            except CtxccError as err:
                self.check_error("delete", err)
                if err.reason == "SESSION_NOT_FOUND":
                    break  # an earlier attempt deleted it
                if err.code != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                    self.stats.fail(f"delete {m.sid}: {err}")
                    return
                await asyncio.sleep(0.1)
        m.reset()
        while True:
            try:
                await client.create_session(m.sid)
                break
            except CtxccError as err:
                self.check_error("create", err)
                if err.reason == "SESSION_ALREADY_EXISTS":
                    break
                if err.code != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                    self.stats.fail(f"create {m.sid}: {err}")
                    return
                await asyncio.sleep(0.1)
        self.stats.counts["delete+recreate"] += 1
        try:
            events = await self.list_events(client, m.sid)
            cks = await client.compiles.ListCheckpoints(spb_list_ck(m.sid))
        except CtxccError as err:
            self.check_error("read after recreate", err)
            return
        if (events or cks.checkpoints) and not m.chaos:
            self.stats.fail(
                f"{m.sid} made again holds {len(events)} events, {len(cks.checkpoints)} checkpoints"
            )

    async def watcher(self, client: AsyncClient, m: SessionModel) -> None:
        """Follows one session through the client's reconnecting watch: within an
        incarnation, seqs come one by one (a resync marker announces a jump)."""
        log = self.watch_log[m.sid]
        while not self.stop.is_set():
            after = 0
            tag = None
            try:
                async for msg in client.watch(m.sid, after_seq=0):
                    if self.stop.is_set():
                        return
                    if msg.HasField("resync"):
                        self.stats.counts["watch resync"] += 1
                        after = -1  # any next seq
                        continue
                    if not msg.HasField("event"):
                        continue
                    ev = msg.event
                    text = text_of(ev)
                    if not text or m.chaos:  # a tool result; or any incarnation may hold any
                        pass
                    elif tag is None:
                        tag = tag_of(text)
                    elif tag_of(text) != tag:
                        self.stats.fail(
                            f"watch of {m.sid} went on into another incarnation: "
                            f"{tag} then seq {ev.seq} of {tag_of(text)}"
                        )
                        tag = tag_of(text)
                    if after >= 0 and ev.seq != after + 1:
                        self.stats.fail(f"watch of {m.sid}: seq {ev.seq} after {after}")
                    after = ev.seq
                    log.append((ev.seq, text))
                    self.stats.counts["watched events"] += 1
            except CtxccError as err:
                self.check_error("watch", err)
                if err.code not in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE):
                    self.stats.fail(f"watch of {m.sid} ended {err}")
                await asyncio.sleep(0.1)

    # --- checks -------------------------------------------------------------------------

    async def list_events(self, client: AsyncClient, sid: str) -> list[event_pb2.Event]:
        events: list[event_pb2.Event] = []
        token = ""
        while True:
            page = await client.sessions.ListEvents(
                spb.ListEventsRequest(session_id=sid, page_size=1000, page_token=token)
            )
            events.extend(page.events)
            token = page.next_page_token
            if not token:
                return events

    async def check_session(  # noqa: PLR0915 - one check after another
        self, client: AsyncClient, m: SessionModel, replays: int
    ) -> None:
        acks = list(m.acks)
        refused = set() if m.chaos else set(m.refused) - {""}
        checkpoints = dict(m.checkpoints)
        try:
            events = await self.list_events(client, m.sid)
        except CtxccError as err:
            self.check_error("check list", err)
            return
        seqs = [e.seq for e in events]
        if seqs != list(range(1, len(events) + 1)):
            self.stats.fail(f"{m.sid}: seqs not contiguous: {seqs[:5]}...")
        texts = [text_of(e) for e in events]
        dup = {t for t in texts if t and texts.count(t) > 1}
        if dup:
            self.stats.fail(f"{m.sid}: stored twice: {sorted(dup)[:3]}")
        foreign = set() if m.chaos else {tag_of(t) for t in texts if t} - {m.tag}
        if foreign:
            self.stats.fail(f"{m.sid}: events of another incarnation: {foreign}")
        bad_refused = refused & set(texts)
        if bad_refused:
            self.stats.fail(f"{m.sid}: refused appends are in the log: {sorted(bad_refused)[:3]}")
        by_seq = {e.seq: e for e in events}
        blobs: list[tuple[str, str]] = []  # (call id, text) of results stored as blobs
        for a in acks:
            got = [
                stored_as_sent(by_seq[s], sent, blobs) if s in by_seq else b"<missing>"
                for s, sent in zip(range(a.first, a.last + 1), a.payloads, strict=False)
            ]
            if got != a.payloads:
                self.stats.fail(
                    f"{m.sid}: acknowledged {a.how} {a.rid} at {a.first}..{a.last} "
                    "is not there as sent"
                )
        self.stats.counts["acks checked"] += len(acks)
        for call_id, text in random.Random(len(blobs)).sample(blobs, min(3, len(blobs))):
            try:
                whole = await read_result(client, m.sid, call_id)
            except CtxccError as err:
                self.check_error("read result", err)
                self.stats.fail(f"{m.sid}: tool result {call_id} (a shared blob): {err}")
                continue
            self.stats.counts["blob results read back"] += 1
            if whole != text:
                self.stats.fail(f"{m.sid}: tool result {call_id} reads back otherwise")
        with_rid = [a for a in acks if a.rid and a.how != "raw"]
        for a in random.Random(len(acks)).sample(with_rid, min(replays, len(with_rid))):
            events_again = [event_from_payload(p) for p in a.payloads]
            try:
                resp = await client.append(
                    m.sid, events_again, request_id=a.rid, expected_last_seq=a.expected
                )
            except CtxccError as err:
                self.check_error(f"replay {a.rid}", err)
                self.stats.fail(f"{m.sid}: request id {a.rid} sent again: {err}")
                continue
            if not resp.replayed or (resp.first_seq, resp.last_seq) != (a.first, a.last):
                self.stats.fail(
                    f"{m.sid}: request id {a.rid} sent again: replayed={resp.replayed} "
                    f"{resp.first_seq}..{resp.last_seq}, acked {a.first}..{a.last}"
                )
            self.stats.counts["replays checked"] += 1
        try:
            listed = await client.compiles.ListCheckpoints(spb_list_ck(m.sid))
        except CtxccError as err:
            self.check_error("check checkpoints", err)
            return
        have = {c.checkpoint_id for c in listed.checkpoints}
        missing = set(checkpoints) - have
        if missing:
            self.stats.fail(f"{m.sid}: acknowledged checkpoints missing: {sorted(missing)[:3]}")
        self.stats.counts["checkpoints checked"] += len(checkpoints)

    async def check_all(self, client: AsyncClient, replays: int = 5) -> None:
        for m in self.models:
            async with Shared(m.lock):
                await self.check_session(client, m, replays)
                for data in list(m.views.values())[-3:]:
                    view = type_view().FromString(data)
                    await self.rebuild_check(client, m, view, "kept view")

    # --- the run ------------------------------------------------------------------------

    async def killer(self, client: AsyncClient) -> None:
        rng = random.Random(self.rng.random())
        end = time.monotonic() + self.seconds
        while time.monotonic() < end:
            await asyncio.sleep(rng.uniform(0.5, 3.0))
            how = "SIGTERM" if rng.random() < self.sigterm_share else "SIGKILL"
            assert self.daemon.proc is not None
            self.stats.last_signal = f"{how} at {time.strftime('%H:%M:%S')}"
            if how == "SIGKILL":
                self.daemon.kill()
            else:
                self.daemon.proc.send_signal(signal.SIGTERM)
                rc = await asyncio.to_thread(self.daemon.proc.wait, 60)
                if rc != 0:
                    self.stats.fail(f"SIGTERM: exit code {rc}")
            self.restarts += 1
            self.stats.counts[how] += 1
            self.stats.last_signal += ", restarted at " + time.strftime("%H:%M:%S")
            self.daemon.start()
            await asyncio.to_thread(self.daemon.wait_ready, 120)
            await self.check_all(client)
        self.stop.set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGUSR1, dump_tasks)
        self.daemon.start()
        self.daemon.wait_ready()
        target = self.daemon.target
        clients = [AsyncClient(target, options=FAST_RECONNECT, retry_seconds=60) for _ in range(4)]
        for m in self.models:
            await clients[0].create_session(m.sid)
        tasks: list[asyncio.Task[None]] = []
        spawn: list[Callable[[], Awaitable[None]]] = []
        for n in range(3):
            spawn.append(lambda n=n: self.appender(n, clients[n % 4]))
        for n in range(4):
            spawn.append(lambda n=n: self.streamer(n, clients[(n + 1) % 4]))
        spawn.append(lambda: self.compiler(0, clients[2]))
        spawn.append(lambda: self.resumer(clients[3]))
        spawn.append(lambda: self.checkpointer(clients[0]))
        spawn.append(lambda: self.deleter(clients[1]))
        for m in self.models:
            spawn.append(lambda m=m: self.watcher(clients[3], m))
        for fn in spawn:
            tasks.append(asyncio.create_task(self.guard(fn)))
        dog = asyncio.create_task(self.watchdog())
        await self.guard(lambda: self.killer(clients[0]))
        self.stop.set()
        n_watch = len(self.models)
        workers, watchers = tasks[:-n_watch], tasks[-n_watch:]
        _, late = await asyncio.wait(workers, timeout=90)
        if late:
            self.stats.fail(f"{len(late)} workers did not finish within 90 s of the end")
            dump_tasks()
        for t in [*late, *watchers]:
            t.cancel()
        await asyncio.gather(*late, *watchers, return_exceptions=True)
        dog.cancel()
        del watchers
        await self.check_all(clients[0], replays=20)
        await self.check_watchers(clients[0])
        await self.check_reference(clients[0])
        for c in clients:
            await c.close()
        rc = self.daemon.terminate(60)
        if rc != 0:
            self.stats.fail(f"final SIGTERM: exit code {rc}")
        log = self.daemon.log()
        for marker in ("Traceback", "incident", "CRITICAL"):
            if marker in log:
                line = next(ln for ln in log.splitlines() if marker in ln)
                self.stats.fail(f"daemon log holds {marker!r}: {line[:300]}")

    async def watchdog(self) -> None:
        """A run that makes no progress for 120 s prints every task's stack and fails."""
        seen, still = -1, 0
        while True:
            await asyncio.sleep(10)
            now = sum(self.stats.counts.values())
            still = still + 10 if now == seen else 0
            seen = now
            if still >= 120:
                self.stats.fail("no progress for 120 s; the tasks' stacks follow")
                dump_tasks()
                still = -100_000

    async def guard(self, fn: Callable[[], Awaitable[None]]) -> None:
        try:
            await fn()
        except asyncio.CancelledError:
            pass
        except Exception as err:
            self.stats.fail(
                f"worker crashed: {type(err).__name__}: {err}\n{traceback.format_exc()}"
            )

    async def check_watchers(self, client: AsyncClient) -> None:
        for m in self.models:
            if m.chaos:
                continue
            events = await self.list_events(client, m.sid)
            log_text = {e.seq: text_of(e) for e in events}
            seen = [(s, t) for s, t in self.watch_log[m.sid] if tag_of(t) == m.tag]
            for s, t in seen:
                if log_text.get(s) != t:
                    self.stats.fail(
                        f"watch of {m.sid} delivered seq {s} as {t[:40]}, "
                        f"log has {log_text.get(s, '')[:40]}"
                    )
                    break
            self.stats.counts["watched events checked"] += len(seen)

    async def check_reference(self, client: AsyncClient) -> None:
        """Copies the data directory (the daemon stopped), starts a daemon that compiles
        everything from scratch on the copy, and rebuilds kept views there."""
        self.daemon.terminate(60)
        copy = self.workdir / "refdata"
        shutil.copytree(self.data, copy, ignore=shutil.ignore_patterns("*.sock", "*.lock", "LOCK"))
        ref = DaemonProcess(copy, "--compile-memo-bytes", "0", log_path=self.workdir / "ref.log")
        ref.start()
        await asyncio.to_thread(ref.wait_ready, 120)
        self.daemon.start()
        await asyncio.to_thread(self.daemon.wait_ready, 120)
        async with AsyncClient(ref.target) as rc:
            for m in self.models:
                for cid, data in list(m.views.items())[-10:]:
                    try:
                        again = await rc.compiles.Compile(
                            cpb.CompileRequest(rebuild_compile_id=cid)
                        )
                    except CtxccError as err:
                        self.check_error("reference rebuild", err)
                        if not (m.chaos and err.code == grpc.StatusCode.NOT_FOUND):
                            self.stats.fail(f"reference rebuild of {cid}: {err}")
                        continue
                    self.stats.counts["reference rebuilds"] += 1
                    if encoded(again.view) != data:
                        self.stats.fail(
                            f"{m.sid}: view {cid} differs from the reference daemon's rebuild"
                        )
        if ref.terminate(60) != 0:
            self.stats.fail("reference daemon: SIGTERM exit code non-zero")


def damage(stream: Any, rng: random.Random, stats: Stats) -> None:
    """One delta in ten is taken as not matching its base (as a client holding a spoiled
    base would), so the stream helper asks for that view whole by a ResumeRequest: the
    resume path of a step, which a kill may interrupt like any other."""
    apply = stream._apply

    def spoiled(held: Any, delta: Any, *, last_try: bool) -> Any:
        if not last_try and rng.random() < 0.1:
            stats.counts["delta spoiled (resume)"] += 1
            return apply(None, delta, last_try=last_try)
        return apply(held, delta, last_try=last_try)

    stream._apply = spoiled


def stored_as_sent(ev: event_pb2.Event, sent: bytes, blobs: list[tuple[str, str]]) -> bytes:
    """The stored event's payload as it was sent: a tool result stored as a blob counts as
    sent when its reference names the sent text (sha256, size); it is read back later."""
    if ev.WhichOneof("payload") == "tool_result" and ev.tool_result.HasField("blob"):
        want = event_from_payload(sent).tool_result
        ref = ev.tool_result.blob
        data = want.text.encode()
        if ref.sha256 == hashlib.sha256(data).hexdigest() and ref.size_bytes == len(data):
            blobs.append((want.call_id, want.text))
            return sent
        return b"<blob " + ref.sha256.encode() + b">"
    return payload(ev)


async def read_result(client: AsyncClient, sid: str, call_id: str) -> str:
    parts: list[bytes] = []
    offset = 0
    while True:
        resp = await client.tools.ReadToolResult(
            tpb.ReadToolResultRequest(
                session_id=sid, call_id=call_id, bytes=tpb.ByteRange(offset=offset, limit=16384)
            )
        )
        chunk = resp.slice.text.encode()
        parts.append(chunk)
        offset += len(chunk)
        if not resp.slice.has_more or not chunk:
            return b"".join(parts).decode()


def dump_tasks() -> None:
    """SIGUSR1: every task's stack, to see what a stuck run waits for."""
    for task in asyncio.all_tasks():
        print(f"--- {task.get_name()}", flush=True)
        task.print_stack(file=sys.stdout)
    sys.stdout.flush()


def type_view() -> Any:
    from ctxcc.v1 import view_pb2

    return view_pb2.CompiledView


def event_from_payload(p: bytes) -> event_pb2.Event:
    kind, _, data = p.partition(b":")
    ev = event_pb2.Event()
    getattr(ev, kind.decode()).ParseFromString(data)
    return ev


def spb_list_ck(sid: str) -> cpb.ListCheckpointsRequest:
    return cpb.ListCheckpointsRequest(session_id=sid, page_size=1000)


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--sessions", type=int, default=3)
    ap.add_argument("--sigterm-share", type=float, default=0.25, help="restarts by SIGTERM")
    ap.add_argument("--durability", default="sync", choices=("sync", "buffered"))
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="ctxcc-fz-", dir="/tmp"))
    driver = Driver(
        args.seed,
        args.seconds,
        args.sessions,
        workdir,
        sigterm_share=args.sigterm_share,
        durability=args.durability,
    )
    try:
        asyncio.run(driver.run())
    finally:
        driver.daemon.ensure_stopped()
        counts = dict(sorted(driver.stats.counts.items()))
        for k, v in counts.items():
            print(f"  {k}: {v}")
        print(
            f"restarts: {driver.restarts}; failures: {len(driver.stats.failures)}; "
            f"workdir {workdir}"
        )
        if not args.keep and not driver.stats.failures:
            shutil.rmtree(workdir, ignore_errors=True)
    for f in driver.stats.failures:
        print("FAIL", f.splitlines()[0])
    return 1 if driver.stats.failures else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
