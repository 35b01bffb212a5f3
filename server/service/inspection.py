"""Read-only use cases behind the web inspector: sessions at a glance, a session's
compiles over time, one step's view (time travel by `as_of_seq`), and the canonical
events a view came from.

Everything goes through the same paths the gRPC API uses: a step is a dry-run compile
(nothing recorded, published or compacted), so the page shows what `Compile` with
`as_of_seq` and `dry_run` answers.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass, replace

from server.compiler.render import RenderFormat
from server.compiler.view import CompiledView
from server.domain.errors import CtxccError, Reason, invalid
from server.domain.model import EventPage, Route, Session
from server.domain.records import Checkpoint, CompileRecord
from server.domain.tools import ToolSpec
from server.domain.validation import check_id
from server.service.blocking import Blocking
from server.service.compile_types import CompileOptions
from server.service.compiling import CompileUseCases
from server.service.ports import EventStore
from server.service.sessions import SessionUseCases
from server.service.watch import INSPECTOR, Update

MAX_SESSIONS = 500
# Sessions a filtered list looks at (in id order) to find its matches: the list page
# refreshes every few seconds, so a filter never scans an unbounded store.
MAX_FILTER_SCAN = 20_000
_SCAN_PAGE = 1_000
MAX_EVENTS_PAGE = 200
# Bytes of stored events one events page reads (at least one event: up to max_event_bytes).
MAX_EVENTS_PAGE_BYTES = 2 << 20


@dataclass(frozen=True, slots=True)
class SessionRow:
    session: Session
    model: str
    compiles: int
    last_compile: CompileRecord | None
    # Estimate ÷ input budget of the newest compile (None: not recorded).
    utilization: float | None
    # (reported - estimated) ÷ reported of the newest compile with a usage report.
    last_error: float | None
    fallbacks: int


@dataclass(frozen=True, slots=True)
class SessionList:
    rows: list[SessionRow]
    total: int  # sessions the daemon holds
    # More sessions match than the MAX_SESSIONS shown (the first ones in id order).
    more: bool
    # Sessions looked at: fewer than `total` when the filter stopped at MAX_FILTER_SCAN.
    examined: int


@dataclass(frozen=True, slots=True)
class Timeline:
    session: Session
    compiles: tuple[CompileRecord, ...]
    checkpoints: tuple[Checkpoint, ...]


@dataclass(frozen=True, slots=True)
class Step:
    session: Session
    seq: int
    view: CompiledView
    # The compile this step was recorded as (the one picked, or the newest at that seq).
    record: CompileRecord | None
    checkpoint: Checkpoint | None
    registry: tuple[ToolSpec, ...]
    # (format, body JSON, estimated input tokens of the body) when a format was asked for.
    rendering: tuple[RenderFormat, str, int] | None
    # Event boundaries of the session's recorded compiles, for stepping through time.
    boundaries: tuple[int, ...]
    # True: the recorded compile rebuilt byte for byte; False: compiled now as of `seq`.
    rebuilt: bool = False
    # The recorded compiles at the boundaries before and after `seq` (of this step's
    # route where there is one), for ◀ ▶: their views are the recorded ones.
    previous: CompileRecord | None = None
    next: CompileRecord | None = None


def relative_error(record: CompileRecord) -> float | None:
    if record.usage is None or not record.usage.input_tokens:
        return None
    actual = record.usage.input_tokens
    return (actual - record.estimated_input_tokens) / actual


def _newest_at(
    records: list[CompileRecord], seq: int, *, route_id: str | None = None, model: str | None = None
) -> CompileRecord | None:
    """The newest compile recorded at `seq`, of `route_id` and of `model` where given."""
    for r in reversed(records):
        if (
            r.event_boundary == seq
            and route_id in (None, r.route.route_id)
            and model in (None, r.route.model)
        ):
            return r
    return None


def _recorded_at(records: list[CompileRecord], route: Route, seq: int) -> CompileRecord | None:
    """The newest compile recorded at `seq`: of `route` if any, else of its model, else
    of any route (◀ ▶ step to a neighbour even where the route changed)."""
    return (
        _newest_at(records, seq, route_id=route.route_id)
        or _newest_at(records, seq, model=route.model)
        or _newest_at(records, seq)
    )


def summarize(session: Session, records: list[CompileRecord]) -> SessionRow:
    last = records[-1] if records else None
    reported = [r for r in records if r.usage is not None]
    model = session.current_route.model if session.current_route else ""
    if not model and last is not None:
        model = last.route.model
    utilization = None
    if last is not None and last.input_budget:
        utilization = last.estimated_input_tokens / last.input_budget
    return SessionRow(
        session=session,
        model=model,
        compiles=len(records),
        last_compile=last,
        utilization=utilization,
        last_error=relative_error(reported[-1]) if reported else None,
        fallbacks=sum(1 for r in records if r.fallback_reasons),
    )


class InspectUseCases:
    def __init__(
        self,
        store: EventStore,
        blocking: Blocking,
        sessions: SessionUseCases,
        compiles: CompileUseCases,
    ) -> None:
        self._store = store
        self._blocking = blocking
        self._sessions = sessions
        self._compiles = compiles

    async def session(self, session_id: str) -> Session:
        return await self._sessions.get(session_id)

    async def sessions(self, query: str = "") -> SessionList:
        """The first MAX_SESSIONS sessions in id order whose id or model holds `query`
        (any case; every session when empty), the filter applied before the cut."""
        return await self._blocking.run(self._rows, query.lower())

    def _rows(self, query: str) -> SessionList:
        total = self._store.count_sessions()
        picked: list[Session] = []
        examined, after, more = 0, "", False
        while not more and examined < MAX_FILTER_SCAN:
            batch = self._store.list_sessions(after, _SCAN_PAGE)
            for s in batch:
                examined += 1
                if query and not self._matches(s, query):
                    continue
                if len(picked) == MAX_SESSIONS:
                    more = True
                    break
                picked.append(s)
            if len(batch) < _SCAN_PAGE:
                break
            after = batch[-1].session_id
        # The records without their per-message tables, here and below: no page shows
        # them, and joining each record's (as long as its view) made a listing of a
        # session of 8,000 compiles take ~5 s.
        rows = [summarize(s, self._store.list_compile_heads(s.session_id)) for s in picked]
        return SessionList(rows, max(total, examined), more, examined)

    def _matches(self, session: Session, query: str) -> bool:
        """Whether `query` is in the session's id or its model (as `summarize` names it)."""
        if query in session.session_id.lower():
            return True
        if session.current_route is not None and session.current_route.model:
            return query in session.current_route.model.lower()
        last = self._store.get_last_compile(session.session_id)
        return last is not None and query in last.route.model.lower()

    async def timeline(self, session_id: str) -> Timeline:
        session = await self._sessions.get(session_id)
        records = await self._blocking.run(self._store.list_compile_heads, session_id)
        # Heads (no summaries): the page shows none, and they may take a gigabyte.
        heads = await self._blocking.run(self._store.list_checkpoint_heads, session_id)
        checkpoints = [c for c in heads if isinstance(c, Checkpoint)]
        ordered = sorted(checkpoints, key=lambda c: (c.create_time_ns, c.checkpoint_id))
        return Timeline(session, tuple(records), tuple(ordered))

    async def step(
        self,
        session_id: str,
        *,
        seq: int = 0,
        compile_id: str = "",
        model: str = "",
        render_format: RenderFormat | None = None,
    ) -> Step:
        session = await self._sessions.get(session_id)
        records = await self._blocking.run(self._store.list_compile_heads, session_id)
        record: CompileRecord | None = None
        if compile_id:
            record = next((r for r in records if r.compile_id == compile_id), None)
            if record is None:
                raise CtxccError(Reason.COMPILE_NOT_FOUND, f"compile {compile_id!r} does not exist")
            seq = record.event_boundary
        if seq < 0:
            raise invalid("seq", "seq must not be negative")
        seq = seq or session.head_seq
        route = self._route(session, records, record, model, seq)
        if record is None:
            record = _newest_at(records, seq, route_id=route.route_id)
        options = CompileOptions(
            session_id=session_id,
            route=route,
            as_of_seq=seq,
            dry_run=True,
            inline_images=False,
            render_formats=(render_format,) if render_format is not None else (),
        )
        rebuilt = record is not None
        result = None
        if rebuilt and record is not None:
            try:
                # Exactly the view that compile returned, from the versions it recorded.
                result = await self._compiles.compile(
                    replace(options, as_of_seq=0, rebuild_compile_id=record.compile_id)
                )
            except CtxccError as exc:
                if exc.reason is not Reason.COMPILE_NOT_FOUND:
                    raise
                rebuilt = False  # recorded before versions were kept: compile as of seq
        if result is None:
            result = await self._compiles.compile(options)
        view = result.view
        checkpoint = None
        if view.checkpoint_id:
            checkpoint = await self._blocking.run(
                self._store.find_checkpoint, session_id, view.checkpoint_id
            )
        registry = await self._blocking.run(self._store.list_tools, session_id)
        boundaries = tuple(sorted({r.event_boundary for r in records}))
        earlier = [b for b in boundaries if b < seq]
        later = [b for b in boundaries if b > seq]
        return Step(
            session=session,
            seq=seq,
            view=view,
            record=record,
            checkpoint=checkpoint,
            registry=tuple(registry),
            rendering=result.renderings[0] if result.renderings else None,
            boundaries=boundaries,
            rebuilt=rebuilt,
            previous=_recorded_at(records, route, earlier[-1]) if earlier else None,
            next=_recorded_at(records, route, later[0]) if later else None,
        )

    @staticmethod
    def _route(
        session: Session,
        records: list[CompileRecord],
        record: CompileRecord | None,
        model: str,
        seq: int,
    ) -> Route:
        """The route a step is compiled for: the chosen compile's; for a model named in
        the request, the route of a compile recorded at `seq` for that model, else the
        session's current route if it is that model's, else the route of the newest
        compile for that model, else that model alone (an agent's route names its
        connection, protocol and endpoint too: a route of the model alone is another
        route, with no recorded compile to show); with no model, the session's current
        route, or the route of its newest compile."""
        if record is not None:
            return record.route
        if model:
            at_seq = _newest_at(records, seq, model=model)
            if at_seq is not None:
                return at_seq.route
            current = session.current_route
            if current is not None and current.model == model:
                return current
            used = [r for r in records if r.route.model == model]
            return used[-1].route if used else Route(model=model)
        if session.current_route is not None:
            return session.current_route
        if records:
            return records[-1].route
        raise invalid(
            "model",
            f"session {session.session_id} has no compile yet, so its route is unknown; "
            "choose a model",
        )

    async def events(self, session_id: str, after_seq: int, through_seq: int) -> EventPage:
        """Up to MAX_EVENTS_PAGE events after `after_seq` (through `through_seq` when given),
        stopping once they hold MAX_EVENTS_PAGE_BYTES as stored (at least one event):
        `more` when events are left before `through_seq` (or the end)."""
        check_id("session_id", session_id)
        await self._sessions.get(session_id)
        limit = MAX_EVENTS_PAGE
        if through_seq:
            if through_seq <= after_seq:
                return EventPage((), False)  # an empty range (a read would give one event)
            limit = min(limit, through_seq - after_seq)
        page = await self._blocking.run(
            self._store.read_event_page,
            session_id,
            after_seq,
            limit,
            frozenset(),
            MAX_EVENTS_PAGE_BYTES,
        )
        if through_seq and page.events and page.events[-1].seq >= through_seq:
            return EventPage(page.events, False)  # stopped at `through_seq` by its count
        return page

    async def watch(self, session_id: str) -> AsyncGenerator[Update, None]:
        """Live updates of a session from now on (events, checkpoints, compiles), led by a
        Resync once subscribed."""
        session = await self._sessions.get(session_id)
        # In the inspector's pool of watchers: open pages never take the agent's watches.
        watch = self._sessions.watch(session_id, session.head_seq, announce=True, pool=INSPECTOR)
        async for update in watch:
            yield update
