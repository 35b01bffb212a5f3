"""A stateful test of the daemon's caches and fast paths against a daemon without them.

Hypothesis drives two real daemons (gRPC on Unix sockets, RocksDB in temp dirs, see
oracle_pair.py) through the same calls: sessions created, deleted and made again,
appends of every kind of event, images and a PDF uploaded (and uploads retried) and
shown by attachment events and message parts, unary compiles and CompileStream steps
(several streams, delta bases, both digests, usage on the step, compactions kept from
the base over a small window, images inline or by reference, for a model that takes
none, past the image limit, in rendered bodies), usage reports, checkpoints made and
imported from another session, memory of every scope (session, project, global), rules
and tools changed, route switches, time-travel compiles, rebuilds, resumes, concurrent
compiles of one session and restarts of the daemon under test. Every answer of the
daemon under test (the compile memo, the repeat of an unchanged view, the decoded
records, the converted requests, the lent answers, the delta views and their digests)
must equal the reference daemon's, which compiles every view from scratch from what its
store holds: the same view but for its compile id, the same usage answer, the same
error reason. A session may be watched (WatchSession) on both daemons: after every step
both watches got the same events, checkpoints and compile notices in the same order, and
ended alike (a session deleted, a watch of one that is not there), the watch of the
daemon under test resumed after its restarts as the clients resume one.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from ctxcc.v1 import (
    checkpoint_pb2,
    common_pb2,
    event_pb2,
    session_pb2,
    source_pb2,
    tool_pb2,
    view_pb2,
)
from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_service_pb2 as spb
from ctxcc.v1 import source_service_pb2 as rpb
from ctxcc.v1 import tool_service_pb2 as tpb
from server.transport.convert_events import route_in
from tests.integration.delta_session import encoded
from tests.integration.oracle_pair import (
    ARTIFACTS,
    EVENT_KINDS,
    VARIANTS,
    Compiled,
    Pair,
    SessionModel,
    Stream,
    Watch,
    barrier,
    diff,
    events_of,
    normalized,
    outcome,
    route_of,
    started_pair,
    upload,
)

_EXAMPLES = itertools.count()


class CacheMachine(RuleBasedStateMachine):
    def __init__(self, pair: Pair) -> None:
        super().__init__()
        self.p = pair
        self.n = next(_EXAMPLES)
        self.sids = [f"o{self.n}a", f"o{self.n}b"]
        self.project = f"p{self.n}"
        self.root = pair.workspace / self.project
        self.root.mkdir()
        self.models = {sid: SessionModel() for sid in self.sids}
        self.compiled: list[Compiled] = []
        self.streams: list[Stream | None] = [None, None]
        self.ids = itertools.count()
        # (session, life, boundary) where compiles of one session ran at once: which of
        # them a time-travel compile there takes its basis from (the one recorded last)
        # is a matter of timing, and so are that basis's previous sections.
        self.raced: set[tuple[str, int, int]] = set()
        # Checkpoint ids -> a name both daemons give them, per daemon.
        self.names: tuple[dict[str, str], dict[str, str]] = ({}, {})
        # Each session's last step (request id, events), which a step may resend.
        self.last_steps: dict[str, tuple[str, list[event_pb2.Event]]] = {}
        # Each session's last upload (request id, which artifact), which may be retried.
        self.uploads: dict[str, tuple[str, int]] = {}
        # A watch of each session on each daemon (under test, reference), and how many
        # of their updates were compared.
        self.watches: list[tuple[Watch, Watch] | None] = [None, None]
        self.compared: list[tuple[int, int]] = [(0, 0), (0, 0)]
        # Set by a rule whose calls the two daemons do not get alike (compiles at once,
        # a compile racing an append, a resumed view): its compile notices (and the
        # built-in checkpoints those compiles made), and where they fall among the
        # events, are the daemon under test's own.
        self.relaxed = False

    # -- helpers ---------------------------------------------------------------------

    def run(self, coro: Any) -> Any:
        return self.p.loop.run(coro)

    def both(self, call: Any) -> tuple[tuple[str, Any], tuple[str, Any]]:
        """`call(api)` on the daemon under test, then on the reference."""
        assert self.p.sut.api is not None and self.p.ref.api is not None
        sut, ref = self.p.sut.api, self.p.ref.api
        a = self.run(outcome(lambda: call(sut)))
        b = self.run(outcome(lambda: call(ref)))
        assert a[0] == b[0] and (a[0] == "ok" or a[1] == b[1]), f"{a!r} vs {b!r}"
        return a, b

    def request(self, sid: str, v: int, **kw: Any) -> cpb.CompileRequest:
        req = cpb.CompileRequest(session_id=sid, route=route_of(self.n, v % 2), **kw)
        if v == 2:
            req.limits.context_window = 4_000
            req.limits.max_output_tokens = 500
        if v == 3:
            req.exclude_sections.append(view_pb2.SECTION_KIND_MEMORY)
        if v == 4:
            req.render_formats.append(view_pb2.RENDER_FORMAT_ANTHROPIC_MESSAGES)
        if v == 5:  # over budget from the first steps: compaction recommended at each
            req.limits.context_window = 1_500
            req.limits.max_output_tokens = 200
        if v == 6:  # images by reference only
            req.image_mode = cpb.IMAGE_MODE_REFERENCE
        if v == 7:  # a model that takes no images: each becomes a note
            req.limits.accepts_images = False
            req.image_mode = cpb.IMAGE_MODE_INLINE
        if v == 8:  # images inline, in the bodies too, over a small window
            req.render_formats.extend(
                [view_pb2.RENDER_FORMAT_OPENAI_CHAT, view_pb2.RENDER_FORMAT_GEMINI]
            )
            req.limits.context_window = 6_000
            req.limits.max_output_tokens = 500
        return req

    def _names(self, side: int, view: view_pb2.CompiledView) -> dict[str, str]:
        names = self.names[side]
        if view.checkpoint_id and view.checkpoint_id not in names:
            api = (self.p.sut, self.p.ref)[side].api
            assert api is not None
            req = cpb.ListCheckpointsRequest(session_id=view.session_id, page_size=1000)

            async def listing() -> Any:
                return await api.compiles.ListCheckpoints(req)

            listed = self.run(listing())
            for i, c in enumerate(reversed(listed.checkpoints)):
                names[c.checkpoint_id] = f"{c.kind}:{c.covers_through_seq}:{i}"
        return names

    def same_view(
        self, a: view_pb2.CompiledView, b: view_pb2.CompiledView, what: str, raced: bool = False
    ) -> None:
        x = normalized(a, self._names(0, a), raced)
        y = normalized(b, self._names(1, b), raced)
        assert x == y, f"{what}: the view differs from a compile from scratch\n{diff(x, y)}"

    def keep(
        self, sid: str, sut: view_pb2.CompiledView, ref_id: str, req: cpb.CompileRequest
    ) -> None:
        life = self.models[sid].life
        self.compiled.append(Compiled(sut.compile_id, ref_id, sid, life, sut, req.image_mode))

    def events(self, sid: str, kinds: list[str]) -> list[event_pb2.Event]:
        routes = tuple(route_in(route_of(self.n, kind)).route_id for kind in (0, 1))
        return events_of(self.models[sid], kinds, f"e{self.n}-", self.ids, routes)

    def pick(self, i: int, sid: str | None = None) -> Compiled | None:
        found = [c for c in self.compiled if sid is None or c.sid == sid]
        return found[i % len(found)] if found else None

    # -- rules -----------------------------------------------------------------------

    @initialize(watched=st.tuples(st.booleans(), st.booleans()))
    def start(self, watched: tuple[bool, bool] = (False, False)) -> None:
        for s in (0, 1):
            self.create(s, False)
            if watched[s]:  # from its first event on
                self.watch(s, 0)

    @rule(s=st.integers(0, 1), then=st.booleans())
    def create(self, s: int, then: bool = False) -> None:
        sid = self.sids[s]
        # The second session reads its project's instruction files.
        root = str(self.root) if s else ""
        session = session_pb2.Session(session_id=sid, project_id=self.project, project_root=root)
        a, _ = self.both(
            lambda api: api.sessions.CreateSession(spb.CreateSessionRequest(session=session))
        )
        if a[0] == "ok":
            m = self.models[sid]
            m.exists, m.head, m.open_calls, m.life = True, 0, [], m.life + 1
            m.artifacts = []
            # An image to show from the start (more come with `upload`).
            self.upload(s, (self.n + m.life) % len(ARTIFACTS), False, False)
        self.follow(s, then)

    @rule(s=st.integers(0, 1), then=st.booleans())
    def delete(self, s: int, then: bool) -> None:
        sid = self.sids[s]
        a, b = self.both(
            lambda api: api.sessions.DeleteSession(spb.DeleteSessionRequest(session_id=sid))
        )
        if a[0] == "ok":
            assert a[1] == b[1]
            self.models[sid].exists = False
        self.follow(s, then)

    @rule(
        s=st.integers(0, 1),
        kinds=st.lists(st.sampled_from(EVENT_KINDS), min_size=1, max_size=3),
        then=st.booleans(),
    )
    def append(self, s: int, kinds: list[str], then: bool) -> None:
        sid = self.sids[s]
        req = spb.AppendEventsRequest(
            session_id=sid, events=self.events(sid, kinds), request_id=f"a{next(self.ids)}"
        )
        a, b = self.both(lambda api: api.sessions.AppendEvents(req))
        if a[0] == "ok":
            assert a[1] == b[1]
            self.models[sid].head = max(self.models[sid].head, a[1].last_seq)
        self.follow(s, then)

    def follow(self, s: int, then: bool) -> None:
        """After a write, maybe a compile as the session's agent asks for it."""
        if then:
            self.compile(s, None, False)

    @rule(s=st.integers(0, 1), v=st.sampled_from(VARIANTS))
    def switch(self, s: int, v: int) -> None:
        """The session's agent asks for another request from now on (a route switch...)."""
        self.models[self.sids[s]].variant = v
        self.compile(s, None, False)

    @rule(s=st.integers(0, 1), v=st.none() | st.sampled_from(VARIANTS), dry=st.booleans())
    def compile(self, s: int, v: int | None, dry: bool = False) -> None:
        sid = self.sids[s]
        v = self.models[sid].variant if v is None else v
        req = self.request(sid, v, dry_run=dry)
        a, b = self.both(lambda api: api.compiles.Compile(req))
        if a[0] == "ok":
            self.same_view(a[1].view, b[1].view, f"compile {sid} variant {v} dry {dry}")
            if not dry:
                self.keep(sid, a[1].view, b[1].view.compile_id, req)

    @rule(s=st.integers(0, 1), v=st.sampled_from(VARIANTS), n=st.integers(2, 3))
    def concurrent_compiles(self, s: int, v: int, n: int) -> None:
        """Compiles of one session at once, nothing written meanwhile: each is the view a
        compile makes before the others were recorded, or after one of them was (its
        changed sections are then counted from that one)."""
        sid = self.sids[s]
        req = self.request(sid, v)
        sut, ref = self.p.sut.api, self.p.ref.api
        assert sut is not None and ref is not None
        self.relaxed = True

        async def many() -> list[tuple[str, Any]]:
            calls = (outcome(lambda: sut.compiles.Compile(req)) for _ in range(n))
            return list(await asyncio.gather(*calls))

        got = self.run(many())
        first = self.run(outcome(lambda: ref.compiles.Compile(req)))
        later = self.run(outcome(lambda: ref.compiles.Compile(req)))
        for a in got:
            assert a[0] == first[0] and (a[0] == "ok" or a[1] == first[1]), f"{a!r} vs {first!r}"
            if a[0] == "ok":
                x = normalized(a[1].view, self._names(0, a[1].view))
                if x != normalized(later[1].view, self._names(1, later[1].view)):
                    self.same_view(a[1].view, first[1].view, f"concurrent compile {sid} {v}")
        if first[0] == "ok":
            self.keep(sid, got[-1][1].view, later[1].view.compile_id, req)
            self.raced.add((sid, self.models[sid].life, first[1].view.event_boundary))

    @rule(
        s=st.integers(0, 1),
        kinds=st.lists(st.sampled_from(EVENT_KINDS), min_size=1, max_size=2),
        stepped=st.booleans(),
    )
    def racing_append(self, s: int, kinds: list[str], stepped: bool) -> None:
        """A compile and an append of its session at once (or a stream step's compile,
        `stepped`): the compile is of the log before the append or after it, whichever its
        event boundary says, and then equal to that compile from scratch."""
        sid = self.sids[s]
        req = self.request(sid, self.models[sid].variant)
        append = spb.AppendEventsRequest(
            session_id=sid, events=self.events(sid, kinds), request_id=f"a{next(self.ids)}"
        )
        sut, ref = self.p.sut.api, self.p.ref.api
        assert sut is not None and ref is not None
        stream = self.stream(0) if stepped else None
        head = self.models[sid].head
        self.relaxed = True

        async def compiled() -> tuple[str, Any]:
            if stream is None:
                found: tuple[str, Any] = await outcome(lambda: sut.compiles.Compile(req))
                return found[0], found[1].view if found[0] == "ok" else found[1]
            step = cpb.StepRequest(step_id="r", compile=req, delta_base_compile_id=stream.last)
            resp, view = await stream.send(cpb.CompileStreamRequest(step=step), 0)
            return ("ok", view) if view is not None else ("error", resp.error.reason)

        async def race() -> tuple[tuple[str, Any], tuple[str, Any]]:
            got = await asyncio.gather(
                compiled(), outcome(lambda: sut.sessions.AppendEvents(append))
            )
            return got[0], got[1]

        made_before = self.builtin_checkpoints(sid)
        view, appended = self.run(race())
        first = view[0] == "ok" and view[1].event_boundary == head
        if view[0] == "ok" and not first and self.builtin_checkpoints(sid) - made_before:
            # The compile made its built-in compaction before the append landed and
            # compiled again after it (one compaction per request): a serialization the
            # reference cannot replay without recording a compile the daemon under test
            # did not. Both sessions start over instead.
            self.run(outcome(lambda: ref.sessions.AppendEvents(append)))
            self.delete(s, False)
            self.create(s, False)
            return
        b = self.run(outcome(lambda: ref.compiles.Compile(req))) if first else None
        a = self.run(outcome(lambda: ref.sessions.AppendEvents(append)))
        assert appended[0] == a[0] and (a[0] == "ok" or appended[1] == a[1]), (appended, a)
        if a[0] == "ok":
            assert appended[1] == a[1]
            self.models[sid].head = max(self.models[sid].head, a[1].last_seq)
        if b is None:
            b = self.run(outcome(lambda: ref.compiles.Compile(req)))
        assert view[0] == b[0] and (b[0] == "ok" or view[1] == b[1]), (view, b)
        if b[0] == "ok":
            self.same_view(view[1], b[1].view, f"compile racing an append of {sid}")
            self.keep(sid, view[1], b[1].view.compile_id, req)

    @rule(
        k=st.integers(0, 1),
        s=st.integers(0, 1),
        v=st.none() | st.sampled_from(VARIANTS),
        kinds=st.lists(st.sampled_from(EVENT_KINDS), max_size=2),
        usage=st.none() | st.integers(1, 30_000),
        base=st.sampled_from(["last", "none", "older"]),
        chain=st.booleans(),
        pick=st.integers(0, 50),
        replay=st.booleans(),
        expect=st.none() | st.booleans(),
        keep=st.booleans(),
    )
    def step(
        self,
        k: int,
        s: int,
        v: int | None,
        kinds: list[str],
        usage: int | None,
        base: str,
        chain: bool,
        pick: int,
        replay: bool,
        expect: bool | None,
        keep: bool = False,
    ) -> None:
        """A CompileStream step; with `replay`, the session's last step resent as is (a
        client reconnecting resends it: its append is replayed); `expect`: an
        expected_last_seq that holds (True) or not; `keep`: the client keeps its base's
        compaction request (keep_compaction), as the clients' stream helpers ask."""
        sid = self.sids[s]
        stream = self.stream(k)
        v = self.models[sid].variant if v is None else v
        req = self.request(sid, v)
        last = self.last_steps.get(sid)
        if replay and last is not None:
            request_id, events = last
        else:
            request_id, events = f"s{next(self.ids)}", self.events(sid, kinds)
            self.last_steps[sid] = (request_id, events)
        digest = cpb.DELTA_DIGEST_MESSAGE_CHAIN if chain else cpb.DELTA_DIGEST_UNSPECIFIED
        base_id = {"last": stream.last, "none": ""}.get(base)
        if base_id is None:
            older = list(stream.views)
            base_id = older[pick % len(older)] if older else ""
        step = cpb.StepRequest(
            step_id=request_id,
            events=events,
            request_id=request_id,
            compile=req,
            delta_base_compile_id=base_id,
            delta_digest=digest,
            keep_compaction=keep,
        )
        if expect is not None:
            step.expected_last_seq = self.models[sid].head + (0 if expect else 5)
        c = self.pick(pick, sid) if usage is not None else None
        if c is not None and usage is not None:
            step.usage.CopyFrom(
                cpb.ReportUsageRequest(compile_id=c.sut_id, input_tokens=usage, output_tokens=300)
            )
        resp, view = self.run(stream.send(cpb.CompileStreamRequest(step=step), digest))
        ref = self.p.ref.api
        assert ref is not None
        error = resp.error.reason if resp.WhichOneof("response") == "error" else None
        if c is not None and usage is not None:
            u = self.run(
                outcome(
                    lambda: ref.compiles.ReportUsage(
                        cpb.ReportUsageRequest(
                            compile_id=c.ref_id, input_tokens=usage, output_tokens=300
                        )
                    )
                )
            )
            if u[0] == "error":
                assert error == u[1], f"step usage: {resp} vs {u}"
                return
            assert resp.usage == u[1], "the step's usage answer"
        if events:
            append = spb.AppendEventsRequest(session_id=sid, events=events, request_id=request_id)
            if step.HasField("expected_last_seq"):
                append.expected_last_seq = step.expected_last_seq
            a = self.run(outcome(lambda: ref.sessions.AppendEvents(append)))
            if a[0] == "error":
                assert error == a[1], f"step append: {resp} vs {a}"
                return
            assert (resp.append.first_seq, resp.append.last_seq, resp.append.replayed) == (
                a[1].first_seq,
                a[1].last_seq,
                a[1].replayed,
            )
            self.models[sid].head = max(self.models[sid].head, a[1].last_seq)
        self.stepped(sid, req, resp, view, f"step {sid} variant {v} on stream {k}")

    def stepped(
        self,
        sid: str,
        req: cpb.CompileRequest,
        resp: cpb.CompileStreamResponse,
        view: view_pb2.CompiledView | None,
        what: str,
    ) -> None:
        """A step's answer (its usage and append already matched) against the reference's
        compile of the same request now."""
        ref = self.p.ref.api
        assert ref is not None
        error = resp.error.reason if resp.WhichOneof("response") == "error" else None
        b = self.run(outcome(lambda: ref.compiles.Compile(req)))
        if b[0] == "error":
            assert error == b[1], f"step compile: {resp} vs {b}"
            return
        assert error is None and view is not None, f"step: {resp} vs a view"
        self.same_view(view, b[1].view, what)
        self.keep(sid, view, b[1].view.compile_id, req)

    @precondition(lambda self: bool(self.compiled))
    @rule(
        k=st.integers(0, 1),
        pick=st.integers(0, 50),
        tokens=st.integers(1, 30_000),
        kinds=st.lists(st.sampled_from(EVENT_KINDS), max_size=2),
    )
    def racing_usage(self, k: int, pick: int, tokens: int, kinds: list[str]) -> None:
        """A step carrying the usage of a compile of its session while a unary report of
        the same usage arrives: one of them records it, the other is its replay, and the
        step's compile is estimated from it either way."""
        c = self.pick(pick)
        assert c is not None
        sid = c.sid
        stream = self.stream(k)
        req = self.request(sid, self.models[sid].variant)
        request_id, events = f"s{next(self.ids)}", self.events(sid, kinds)
        step = cpb.StepRequest(
            step_id=request_id,
            events=events,
            request_id=request_id,
            compile=req,
            delta_base_compile_id=stream.last,
            delta_digest=cpb.DELTA_DIGEST_MESSAGE_CHAIN,
            keep_compaction=True,
        )
        step.usage.CopyFrom(
            cpb.ReportUsageRequest(compile_id=c.sut_id, input_tokens=tokens, output_tokens=300)
        )
        unary = cpb.ReportUsageRequest(compile_id=c.sut_id, input_tokens=tokens, output_tokens=300)
        sut, ref = self.p.sut.api, self.p.ref.api
        assert sut is not None and ref is not None

        async def race() -> tuple[Any, tuple[str, Any]]:
            got = await asyncio.gather(
                stream.send(cpb.CompileStreamRequest(step=step), cpb.DELTA_DIGEST_MESSAGE_CHAIN),
                outcome(lambda: sut.compiles.ReportUsage(unary)),
            )
            return got[0], got[1]

        (resp, view), reported = self.run(race())
        u = self.run(
            outcome(
                lambda: ref.compiles.ReportUsage(
                    cpb.ReportUsageRequest(
                        compile_id=c.ref_id, input_tokens=tokens, output_tokens=300
                    )
                )
            )
        )
        assert reported[0] == u[0] and (u[0] == "ok" or reported[1] == u[1]), (reported, u)
        error = resp.error.reason if resp.WhichOneof("response") == "error" else None
        if u[0] == "error":
            assert error == u[1], f"step usage: {resp} vs {u}"
            return
        answers = [resp.usage, reported[1]]
        # Recorded once: the second to arrive is its replay, with the same figures.
        assert sorted(a.replayed for a in answers) == [u[1].replayed, True], answers
        for a in answers:
            a.replayed = u[1].replayed
            assert a == u[1], "a usage answer"
        if events:
            append = spb.AppendEventsRequest(session_id=sid, events=events, request_id=request_id)
            a = self.run(outcome(lambda: ref.sessions.AppendEvents(append)))
            if a[0] == "error":
                assert error == a[1], f"step append: {resp} vs {a}"
                return
            self.models[sid].head = max(self.models[sid].head, a[1].last_seq)
        self.stepped(sid, req, resp, view, f"step racing a usage report of {sid} on stream {k}")

    @rule(
        k=st.integers(0, 1),
        s=st.integers(0, 1),
        turn=st.lists(
            st.lists(st.sampled_from(["call", "result", "text", "big", "native"]), max_size=2),
            min_size=2,
            max_size=4,
        ),
        chain=st.booleans(),
        usage=st.none() | st.integers(1, 30_000),
    )
    def over_budget_turn(
        self, k: int, s: int, turn: list[list[str]], chain: bool, usage: int | None
    ) -> None:
        """Steps of one turn over a small window, each against the stream's last view and
        keeping its compaction request: the request stays the same from step to step (the
        delta keeps it) until a tool result or a usage report changes what it covers."""
        for i, kinds in enumerate(turn):
            self.step(
                k, s, 5, kinds, usage if i == 1 else None, "last", chain, 0, False, None, True
            )

    def builtin_checkpoints(self, sid: str) -> set[str]:
        """Ids of the built-in checkpoints the daemon under test holds for `sid`."""
        api = self.p.sut.api
        assert api is not None
        req = cpb.ListCheckpointsRequest(session_id=sid, page_size=1000)
        found = self.run(outcome(lambda: api.compiles.ListCheckpoints(req)))
        if found[0] != "ok":
            return set()
        builtin = checkpoint_pb2.CHECKPOINT_KIND_BUILTIN
        return {c.checkpoint_id for c in found[1].checkpoints if c.kind == builtin}

    def stream(self, k: int) -> Stream:
        found = self.streams[k]
        if found is None:
            api = self.p.sut.api

            async def opened() -> Stream:
                return Stream(api)

            found = self.streams[k] = self.run(opened())
        return found

    @precondition(lambda self: bool(self.compiled))
    @rule(k=st.integers(0, 1), pick=st.integers(0, 50), v=st.sampled_from(VARIANTS))
    def resume(self, k: int, pick: int, v: int) -> None:
        c = self.pick(pick)
        assert c is not None
        stream = self.stream(k)
        req = self.request(c.sid, v)
        self.relaxed = True  # a view resent is no compile: the reference compiles one
        msg = cpb.CompileStreamRequest(resume=cpb.ResumeRequest(compile_id=c.sut_id, compile=req))
        resp, view = self.run(stream.send(msg, cpb.DELTA_DIGEST_UNSPECIFIED))
        m = self.models[c.sid]
        if view is not None and view.compile_id == c.sut_id:
            assert encoded(view) == encoded(c.view), "a resumed view is the view it names"
            assert m.exists and m.life == c.life and m.head == c.view.event_boundary, (
                "a view resumed although its session moved on"
            )
            return
        ref = self.p.ref.api
        assert ref is not None
        b = self.run(outcome(lambda: ref.compiles.Compile(req)))
        if b[0] == "error":
            assert resp.error.reason == b[1], f"resume: {resp} vs {b}"
            return
        assert view is not None, f"resume: {resp} vs a view"
        self.same_view(view, b[1].view, f"resume of {c.sut_id}")
        self.keep(c.sid, view, b[1].view.compile_id, req)

    @precondition(lambda self: bool(self.compiled))
    @rule(
        pick=st.integers(0, 50),
        tokens=st.integers(1, 30_000),
        other_route=st.booleans(),
        then=st.booleans(),
    )
    def report(self, pick: int, tokens: int, other_route: bool, then: bool) -> None:
        c = self.pick(pick)
        assert c is not None
        route = route_of(
            self.n, (0 if c.view.route.model.startswith("claude") else 1) ^ other_route
        )

        def call(sut: bool) -> Any:
            return cpb.ReportUsageRequest(
                compile_id=c.sut_id if sut else c.ref_id,
                route=route,
                input_tokens=tokens,
                output_tokens=500,
                cached_input_tokens=tokens // 2,
            )

        sut, ref = self.p.sut.api, self.p.ref.api
        assert sut is not None and ref is not None
        a = self.run(outcome(lambda: sut.compiles.ReportUsage(call(True))))
        b = self.run(outcome(lambda: ref.compiles.ReportUsage(call(False))))
        assert a == b, f"usage report: {a!r} vs {b!r}"
        self.follow(self.sids.index(c.sid), then)

    @precondition(lambda self: bool(self.compiled))
    @rule(pick=st.integers(0, 50))
    def rebuild(self, pick: int) -> None:
        c = self.pick(pick)
        assert c is not None
        sut, ref = self.p.sut.api, self.p.ref.api
        assert sut is not None and ref is not None
        mode: Any = c.image_mode
        a = self.run(
            outcome(
                lambda: sut.compiles.Compile(
                    cpb.CompileRequest(rebuild_compile_id=c.sut_id, image_mode=mode)
                )
            )
        )
        b = self.run(
            outcome(
                lambda: ref.compiles.Compile(
                    cpb.CompileRequest(rebuild_compile_id=c.ref_id, image_mode=mode)
                )
            )
        )
        assert a[0] == b[0] and (a[0] == "ok" or a[1] == b[1]), f"rebuild: {a!r} vs {b!r}"
        if a[0] == "ok":
            # Renderings are the request's (a rebuild asks for none).
            sent = view_pb2.CompiledView()
            sent.CopyFrom(c.view)
            sent.ClearField("renderings")
            assert encoded(a[1].view) == encoded(sent), "a rebuild is the view sent"

    @rule(s=st.integers(0, 1), at=st.floats(0, 1), v=st.sampled_from(VARIANTS))
    def time_travel(self, s: int, at: float, v: int) -> None:
        sid = self.sids[s]
        seq = max(1, round(at * self.models[sid].head))
        req = self.request(sid, v, as_of_seq=seq)
        a, b = self.both(lambda api: api.compiles.Compile(req))
        if a[0] == "ok":
            raced = (sid, self.models[sid].life, seq) in self.raced
            self.same_view(a[1].view, b[1].view, f"time travel {sid} at {seq} {v}", raced)

    @rule(
        s=st.integers(0, 1),
        at=st.floats(0, 1),
        portable=st.booleans(),
        imported=st.booleans(),
        v=st.sampled_from(VARIANTS),
        then=st.booleans(),
    )
    def checkpoint(
        self, s: int, at: float, portable: bool, imported: bool, v: int, then: bool
    ) -> None:
        sid = self.sids[s]
        covers = max(1, round(at * self.models[sid].head))
        ck = checkpoint_pb2.Checkpoint(
            session_id=sid,
            covers_through_seq=covers,
            summary=f"Summary through {covers}.",
            portable=portable,
            source_route=route_of(self.n, v % 2),
            origin_session_id=self.sids[1 - s] if imported else "",
        )
        req = cpb.CreateCheckpointRequest(
            checkpoint=ck,
            request_id=f"k{next(self.ids)}",
            covered_digest_mode=cpb.COVERED_DIGEST_MODE_COMPUTE,
        )
        a, b = self.both(lambda api: api.compiles.CreateCheckpoint(req))
        if a[0] == "ok":
            for x in (a[1], b[1]):
                x.checkpoint.ClearField("create_time")
            assert a[1] == b[1]
        self.follow(s, then)

    @rule(
        s=st.integers(0, 1),
        scope=st.sampled_from(["session", "project", "global"]),
        text=st.sampled_from(["", "Tabs.", "Spaces."]),
        then=st.booleans(),
    )
    def memory(self, s: int, scope: str, text: str, then: bool) -> None:
        """Memory of the session, its project or every session (global: an entry of this
        example's own, which every session of both daemons reads)."""
        sid = self.sids[s]
        kind, scope_id = {
            "session": (common_pb2.SCOPE_SESSION, sid),
            "project": (common_pb2.SCOPE_PROJECT, self.project),
            "global": (common_pb2.SCOPE_GLOBAL, ""),
        }[scope]
        ident = f"g{self.n}" if scope == "global" else "m"
        if text:
            entry = source_pb2.MemoryEntry(
                memory_id=ident, scope=kind, scope_id=scope_id, text=text
            )
            self.both(lambda api: api.sources.PutMemory(rpb.PutMemoryRequest(memory=entry)))
        else:
            req = rpb.DeleteMemoryRequest(scope=kind, scope_id=scope_id, memory_id=ident)
            self.both(lambda api: api.sources.DeleteMemory(req))
        self.follow(s, then)

    @rule(
        activation=st.sampled_from([1, 2, 3]),
        glob=st.sampled_from(["src/mod1.py", "*.md"]),
        s=st.integers(0, 1),
        then=st.booleans(),
    )
    def put_rule(self, activation: int, glob: str, s: int, then: bool) -> None:
        r = source_pb2.Rule(
            rule_id="r",
            scope=common_pb2.SCOPE_PROJECT,
            scope_id=self.project,
            name="style",
            description="Code style",
            text=f"Keep lines short ({activation}, {glob}).",
            activation=activation,  # type: ignore[arg-type]
            path_globs=[glob] if activation == 3 else [],
        )
        self.both(lambda api: api.sources.PutRule(rpb.PutRuleRequest(rule=r)))
        self.follow(s, then)

    @rule(
        s=st.integers(0, 1),
        name=st.sampled_from(["read", "deploy", "grep"]),
        deferred=st.booleans(),
        replace_all=st.booleans(),
        then=st.booleans(),
    )
    def tools(self, s: int, name: str, deferred: bool, replace_all: bool, then: bool) -> None:
        tool = tool_pb2.ToolDefinition(
            name=name,
            description=f"The {name} tool",
            input_schema_json='{"type": "object"}',
            visibility=tool_pb2.TOOL_VISIBILITY_DEFERRED if deferred else 0,  # type: ignore[arg-type]
            search_keywords=["ship"] if deferred else [],
        )
        req = tpb.RegisterToolsRequest(
            session_id=self.sids[s], tools=[tool], replace_all=replace_all
        )
        self.both(lambda api: api.tools.RegisterTools(req))
        self.follow(s, then)

    @rule(text=st.sampled_from(["", "Run the tests first.", "Use tabs."]), then=st.booleans())
    def workspace_file(self, text: str, then: bool) -> None:
        """The project's AGENTS.md written or removed, outside both daemons."""
        path = self.root / "AGENTS.md"
        if text:
            path.write_text(text + "\n")
        else:
            path.unlink(missing_ok=True)
        self.follow(1, then)

    @rule(s=st.integers(0, 1), then=st.booleans())
    def search_tools(self, s: int, then: bool) -> None:
        """SearchTools activates the deferred tools it finds for the current turn."""
        req = tpb.SearchToolsRequest(session_id=self.sids[s], query="ship", max_results=5)
        a, b = self.both(lambda api: api.tools.SearchTools(req))
        if a[0] == "ok":
            assert a[1] == b[1]
        self.follow(s, then)

    @rule(dice=st.integers(0, 3))
    def restart(self, dice: int) -> None:
        """The daemon under test stops and starts again on its data: its caches are gone,
        what it answers must not change (one draw in four: a restart costs ~0.5 s)."""
        if dice:
            return
        self.close_streams()
        self.run(self.p.sut.stop())
        self.run(self.p.sut.start())
        for pair in self.watches:
            if pair is not None:
                self.run(pair[0].again(self.p.sut))
        self.compile(0, None, False)

    @rule(
        s=st.integers(0, 1),
        which=st.integers(0, len(ARTIFACTS) - 1),
        again=st.booleans(),
        then=st.booleans(),
    )
    def upload(self, s: int, which: int, again: bool, then: bool) -> None:
        """An image (or a PDF) uploaded to both daemons; `again`: the session's last
        upload retried with its request id (answered with the artifact it stored)."""
        sid = self.sids[s]
        m = self.models[sid]
        request_id = f"u{next(self.ids)}"
        if again and sid in self.uploads:
            request_id, which = self.uploads[sid]
        a, b = self.both(lambda api: upload(api, sid, which, request_id))
        if a[0] == "ok":
            assert a[1] == b[1], f"upload: {a[1]} vs {b[1]}"
            self.uploads[sid] = (request_id, which)
            if a[1].artifact.artifact_id not in m.artifacts:
                m.artifacts.append(a[1].artifact.artifact_id)
        self.follow(s, then)

    @rule(s=st.integers(0, 1), at=st.floats(0, 1.2))
    def watch(self, s: int, at: float) -> None:
        """A watch of the session on each daemon (instead of the one it had), resuming
        after a seq of its log (or past its head)."""
        sid = self.sids[s]
        after = round(at * self.models[sid].head)
        self.unwatch(s)
        sut, ref = self.p.sut, self.p.ref

        async def opened() -> tuple[Watch, Watch]:
            pair = Watch(sut, sid, after), Watch(ref, sid, after)
            await pair[0].started(sut)
            await pair[1].started(ref)
            return pair

        self.watches[s] = self.run(opened())
        self.compared[s] = (0, 0)

    def unwatch(self, s: int) -> None:
        pair = self.watches[s]
        if pair is not None:
            self.run(pair[0].close(self.p.sut))
            self.run(pair[1].close(self.p.ref))
            self.watches[s] = None

    @invariant()
    def watched_alike(self) -> None:
        """Both daemons' watches of a session got the same updates in the same order (only
        their events are compared after a relaxed rule), and ended alike."""
        relaxed, self.relaxed = self.relaxed, False
        live = [(s, pair) for s, pair in enumerate(self.watches) if pair is not None]
        if not live:
            return

        async def synced() -> None:
            await barrier(self.p.sut, [pair[0] for _, pair in live])
            await barrier(self.p.ref, [pair[1] for _, pair in live])

        self.run(synced())
        for s, (a, b) in live:
            i, j = self.compared[s]
            x, y = a.got[i:], b.got[j:]
            self.compared[s] = (len(a.got), len(b.got))
            if relaxed:
                x = [u for u in x if u[0] == "event"]
                y = [u for u in y if u[0] == "event"]
            assert x == y, f"watch of {self.sids[s]}: {x} vs {y}"
            assert a.ended == b.ended, f"watch of {self.sids[s]} ended: {a.ended!r} vs {b.ended!r}"

    def close_streams(self) -> None:
        for i, s in enumerate(self.streams):
            if s is not None:
                self.run(s.close())
                self.streams[i] = None

    def teardown(self) -> None:
        self.close_streams()
        for s in (0, 1):
            self.unwatch(s)


@pytest.fixture(scope="module")
def pair() -> Iterator[Pair]:
    with started_pair() as p:
        yield p


def test_caches_answer_as_a_compile_from_scratch(pair: Pair) -> None:
    # Hypothesis takes any factory of machines (its stubs say a class): this one shares
    # the daemons started once for the module.
    run_state_machine_as_test(
        lambda: CacheMachine(pair),  # type: ignore[arg-type]
        settings=settings(
            max_examples=int(os.environ.get("ORACLE_EXAMPLES", "25")),
            stateful_step_count=int(os.environ.get("ORACLE_STEPS", "50")),
            deadline=None,
            derandomize=not os.environ.get("ORACLE_RANDOM"),
            database=None,
            suppress_health_check=list(HealthCheck),
        ),
    )
