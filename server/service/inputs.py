"""What one compile reads, assembled into the core's inputs (blocking, on the I/O pool).

Three ways: a compile at the head reads every source as it is now; a compile with
`as_of_seq` at a recorded step takes that step's stored sources, settings, route state,
activations, checkpoint choice and clock, with the request's own parameters (route,
limits, approval, environment); a rebuild takes everything from the recorded compile's
basis, so its view comes back byte for byte (see basis.py).
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import TYPE_CHECKING

from server.compiler.budget import ModelLimits
from server.compiler.compile import CompileInputs
from server.compiler.projection import PROJECTION, ImagePolicy
from server.compiler.projection_memo import ProjectionMemo
from server.compiler.render import RENDERING
from server.compiler.route_model import counter_kind
from server.compiler.sources import SourceInputs
from server.compiler.system import EnvironmentInfo
from server.compiler.tokens import BEFORE_CALL_IDS, COUNTING
from server.compiler.tool_cap import TOOL_CAPPING
from server.compiler.view import SectionKind
from server.domain.catalog import MAX_LIMIT_TOKENS, Catalog, ModelInfo
from server.domain.errors import CtxccError, Reason
from server.domain.model import Session
from server.domain.records import CompileRecord, RouteState
from server.service.basis import Recalled, SettingsPart, recall
from server.service.kept import KeptReads
from server.service.loading import HistoryLoader, LoadedHistory
from server.service.ports import Clock, EventStore, IdSource
from server.service.sources import SourceUseCases

if TYPE_CHECKING:
    from server.service.compile_types import CompileOptions, CompilerSettings

log = logging.getLogger("ctxcc.inputs")

# Reported token counts above this are refused: no model reads that much, and a
# baseline this large would overflow the 32-bit estimates of every later compile.
MAX_USAGE_TOKENS = MAX_LIMIT_TOKENS


# Ids of compiles that are not recorded start with this (recorded ones are plain hex), so
# a usage report against one is refused saying why rather than only "not found".
UNRECORDED_PREFIX = "unrecorded-"


def is_recorded(opts: CompileOptions) -> bool:
    """Only compiles at the head are recorded: a dry run or a time-travel (`as_of_seq`)
    compile must never become the session's latest compile or its route's baseline."""
    return not (opts.dry_run or opts.as_of_seq or opts.rebuild_compile_id)


def id_prefix(opts: CompileOptions) -> str:
    return "" if is_recorded(opts) else UNRECORDED_PREFIX


def effective_limits(info: ModelInfo, request: ModelLimits, images_given: bool) -> ModelLimits:
    """Catalog values, overridden by the request's non-zero fields (R-BUD-5)."""
    return ModelLimits(
        context_window=request.context_window or info.context_window,
        max_output_tokens=request.max_output_tokens or info.max_output_tokens,
        max_input_tokens=request.max_input_tokens or info.max_input_tokens,
        accepts_images=request.accepts_images if images_given else info.accepts_images,
    )


def counting_of(old: Recalled | None, record: CompileRecord | None) -> int:
    """How a compile counts tool calls (tokens.COUNTING): as the recorded step it takes
    its versions from did, else today's way."""
    if old is None or record is None:
        return COUNTING
    return BEFORE_CALL_IDS if record.before_call_ids else old.basis.counting


def unrebuildable(compile_id: str) -> CtxccError:
    """A rebuild of a compile recorded without its basis (by a daemon before exact time
    travel): nothing to rebuild it from."""
    return CtxccError(
        Reason.COMPILE_NOT_FOUND,
        f"compile {compile_id!r} was recorded without its basis and cannot be rebuilt",
        compile_id=compile_id,
    )


class InputAssembler:
    def __init__(
        self,
        store: EventStore,
        loader: HistoryLoader,
        sources: SourceUseCases,
        catalog: Catalog,
        settings: CompilerSettings,
        clock: Clock,
        ids: IdSource,
    ) -> None:
        self._store = store
        self._loader = loader
        self._sources = sources
        self._catalog = catalog
        self._settings = settings
        self._clock = clock
        self._ids = ids
        # (the granule's first second, its text): one pair, replaced whole.
        self._time_texts: tuple[int, str] = (-1, "")
        # Source writes have no session: their count is the daemon-wide one (kept.py).
        self._kept_sources = KeptReads("sources", store)
        self._settings_part: SettingsPart | None = None

    def forget(self, session_id: str, created_ns: int = 0) -> None:
        """The session made at `created_ns` (0: whichever) was deleted: the sources read
        for it go (see `KeptReads.forget`)."""
        self._kept_sources.forget(session_id, created_ns)

    def kept(self) -> int:
        """Source lists kept (for tests: a deleted session's are not)."""
        return len(self._kept_sources)

    def _recalled(
        self, opts: CompileOptions, session: Session
    ) -> tuple[Recalled, CompileRecord] | None:
        """The stored basis a time-travel compile reuses: the rebuilt compile's, or that of
        the latest compile recorded at `as_of_seq`."""
        record: CompileRecord | None
        if opts.rebuild_compile_id:
            record = self._store.get_compile(opts.rebuild_compile_id)
        elif opts.as_of_seq:
            record = self._store.compile_at(session.session_id, opts.as_of_seq)
        else:
            return None
        if record is None or not record.basis_digest:
            if opts.rebuild_compile_id:
                raise unrebuildable(opts.rebuild_compile_id)
            return None
        return recall(self._store, session.session_id, record.basis_digest), record

    def assemble(
        self,
        opts: CompileOptions,
        memo: ProjectionMemo | None = None,
        session: Session | None = None,
    ) -> tuple[Session, CompileInputs, ModelInfo, LoadedHistory]:
        """`memo`: the previous compile's, whose events need not be read again; `session`:
        the session as the memo was found for it (the memo is of that session only: read
        again, it may be another one made under the same id since)."""
        if session is None:
            session = self._session(opts)
        if opts.as_of_seq > session.head_seq:
            raise CtxccError(
                Reason.SEQ_OUT_OF_RANGE,
                f"as_of_seq {opts.as_of_seq} is beyond the session head {session.head_seq}",
                head_seq=str(session.head_seq),
            )
        found = self._recalled(opts, session)
        if found is not None and opts.rebuild_compile_id:
            return session, *self._rebuilt_inputs(session, *found)
        return session, *self._inputs(opts, session, found, memo)

    def _session(self, opts: CompileOptions) -> Session:
        try:
            return self._store.get_session(opts.session_id)
        except CtxccError as err:
            if err.reason is not Reason.SESSION_NOT_FOUND or not opts.rebuild_compile_id:
                raise
            # A rebuild names its compile, not a session (proto: COMPILE_NOT_FOUND).
            raise CtxccError(
                Reason.COMPILE_NOT_FOUND,
                f"compile {opts.rebuild_compile_id!r} is not found: its session is not",
                compile_id=opts.rebuild_compile_id,
            ) from None

    def _rebuilt_inputs(
        self, session: Session, old: Recalled, record: CompileRecord
    ) -> tuple[CompileInputs, ModelInfo, LoadedHistory]:
        """Exactly the inputs a recorded compile had, from its basis and the log."""
        b = old.basis
        history = self._loader.load(
            session,
            record.event_boundary,
            b.route,
            recorded=(b.checkpoint_id, b.fallback_reasons),
            projection=b.projection,
        )
        inputs = CompileInputs(
            compile_id=record.compile_id,
            session=session,
            events=history.events,
            event_boundary=record.event_boundary,
            route=b.route,
            limits=b.limits,
            route_state=b.route_state,
            route_model=b.route_model,
            counter_kind=counter_kind(b.model),
            kernel_text=old.settings.kernel_text,
            approval_mode=b.approval_mode,
            environment=b.environment,
            exclude_sections=frozenset(b.exclude_sections),
            budget_config=old.settings.budget,
            sources=old.sources,
            previous_sections=b.previous_sections,
            requested_max_output=b.requested_max_output,
            counting=counting_of(old, record),
            projection=b.projection,
            rendering=b.rendering,
            tool_capping=b.tool_capping,
            tools=old.tools,
            activated_tools=b.activated_tools,
            checkpoint=history.checkpoint,
            current_user=history.current_user,
            fallback_reasons=history.fallback_reasons,
            images=ImagePolicy(
                accepts_images=b.limits.accepts_images,
                existing=history.artifacts,
                max_images=old.settings.max_images,
                max_image_bytes=old.settings.max_image_bytes,
            ),
        )
        return inputs, b.model, history

    def model_of(self, model: str) -> ModelInfo:
        """What the catalog knows of `model` (no I/O: a step's compile asks on the loop)."""
        return self._catalog.lookup(model)

    def _inputs(
        self,
        opts: CompileOptions,
        session: Session,
        found: tuple[Recalled, CompileRecord] | None,
        memo: ProjectionMemo | None = None,
    ) -> tuple[CompileInputs, ModelInfo, LoadedHistory]:
        """A compile's inputs: the request's own parameters, with the sources and state read
        now, or, for `as_of_seq` at a recorded step, as that step read them."""
        boundary = opts.as_of_seq or session.head_seq
        old, record = found if found is not None else (None, None)
        same_route = old is not None and old.basis.route == opts.route
        # The catalog entry is one of the recorded step's versions (the catalog may have
        # changed since: an upgrade, another --model-catalog): on its route, the same
        # request is sized and counted as that step was.
        if old is not None and same_route:
            info = old.basis.model
        else:
            info = self._catalog.lookup(opts.route.model)
        limits = effective_limits(info, opts.limits, opts.images_given)
        working_directory = opts.working_directory or session.working_directory
        if old is not None and record is not None:
            b = old.basis
            history = self._loader.load(
                session,
                boundary,
                opts.route,
                until_ns=record.create_time_ns,
                recorded=(b.checkpoint_id, b.fallback_reasons) if same_route else None,
                projection=b.projection,
            )
            history = replace(history, tools=old.tools, activated=b.activated_tools)
            route_state = b.route_state if same_route else self._route_state(opts)
            route_model = (
                b.route_model if same_route else self._store.get_route_model(opts.route.route_id)
            )
            sources, settings = old.sources, old.settings
            previous: tuple[tuple[int, str], ...] | None = b.previous_sections
            time_text = b.environment.time_text
        else:
            history = self._loader.load(session, boundary, opts.route, known=memo)
            route_state = self._route_state(opts)
            route_model = self._store.get_route_model(opts.route.route_id)
            sources = self._session_sources(session, working_directory, opts.exclude_sections)
            settings = self.settings_part()
            last = self._store.get_last_compile(opts.session_id)
            previous = last.section_digests if last else None
            time_text = self.time_text()
        inputs = CompileInputs(
            compile_id=f"{opts.session_id}:{self._ids.new_id(id_prefix(opts))}",
            session=session,
            events=history.events,
            event_boundary=boundary,
            route=opts.route,
            limits=limits,
            route_state=route_state,
            route_model=route_model,
            counter_kind=counter_kind(info),
            kernel_text=settings.kernel_text,
            approval_mode=opts.approval_mode or self._settings.default_approval,
            environment=EnvironmentInfo(
                working_directory=working_directory,
                platform=opts.platform,
                shell=opts.shell,
                time_text=time_text,
            ),
            exclude_sections=opts.exclude_sections,
            budget_config=settings.budget,
            sources=sources,
            previous_sections=previous,
            requested_max_output=opts.limits.max_output_tokens,
            # A recorded step's view again: counted as the daemon that recorded it did.
            counting=counting_of(old, record),
            projection=old.basis.projection if old is not None else PROJECTION,
            rendering=old.basis.rendering if old is not None else RENDERING,
            tool_capping=old.basis.tool_capping if old is not None else TOOL_CAPPING,
            tools=history.tools,
            activated_tools=history.activated,
            checkpoint=history.checkpoint,
            current_user=history.current_user,
            fallback_reasons=history.fallback_reasons,
            images=ImagePolicy(
                accepts_images=limits.accepts_images,
                existing=history.artifacts,
                max_images=settings.max_images,
                max_image_bytes=settings.max_image_bytes,
            ),
        )
        return inputs, info, history

    def _session_sources(
        self, session: Session, working_directory: str, exclude: frozenset[SectionKind]
    ) -> SourceInputs:
        """The sources a compile at the head sees: kept while no source was written (nor
        any session deleted) when they are the store's entries alone; read every time
        when they include workspace files, which change outside the daemon."""
        caps = self._settings.caps

        def read() -> SourceInputs:
            return self._sources.session_sources(session, working_directory, caps, exclude)

        if self._sources.reads_files(session):
            return read()
        key = (session.project_id, working_directory, caps, exclude)
        return self._kept_sources.get(session, key, read)

    def _route_state(self, opts: CompileOptions) -> RouteState | None:
        try:
            state = self._store.get_route_state(opts.session_id, opts.route.route_id)
        except CtxccError as err:
            if err.reason is not Reason.RECORD_CORRUPT:
                raise
            # A baseline is learned from a usage report, like the route model: a damaged
            # one (or one whose compile record is gone) is as good as none. The compile
            # estimates afresh and the next report writes a new one, instead of every
            # compile of the session on the route failing DATA_LOSS.
            log.warning(
                "route state of %s on %s ignored: %s",
                opts.session_id,
                opts.route.route_id,
                getattr(err, "detail", err.message),
            )
            return None
        if state is not None and state.baseline_input_tokens > MAX_USAGE_TOKENS:
            return None  # stored before reports were bounded: estimate afresh
        return state

    def settings_part(self) -> SettingsPart:
        """One value for the daemon's life (its settings do not change), so the basis
        digest of it is remembered (basis.PartDigests)."""
        part = self._settings_part
        if part is None:
            s = self._settings
            part = SettingsPart(s.kernel_text, s.budget, s.max_images, s.max_image_bytes)
            self._settings_part = part
        return part

    def time_text(self) -> str:
        g = max(1, self._settings.time_granularity_s)
        seconds = self._clock.now_ns() // 1_000_000_000 // g * g
        # Formatted once per granule: every compile and every repeat asks for it.
        last = self._time_texts
        if last[0] != seconds:
            last = self._time_texts = (
                seconds,
                time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds)),
            )
        return last[1]
