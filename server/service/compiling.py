"""The compile use case: load everything, call the pure core, record, publish (usage
reports: server/service/usage.py; the request and result values: compile_types.py; the
request's checks and the compile's record: compile_records.py)."""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TypeVar

from server.compiler.compaction import working_set_start
from server.compiler.compile import CompileInputs, compile_incremental
from server.compiler.memo_cut import memo_usable
from server.compiler.projection import has_elidable
from server.compiler.prompt_memo import PromptInputs, any_prompt
from server.compiler.render import render
from server.compiler.tokens import TokenCounter
from server.compiler.view import (
    CompiledView,
    Decision,
    ViewMessage,
)
from server.domain.catalog import Catalog, ModelInfo
from server.domain.errors import CtxccError, Reason
from server.domain.families import family_of
from server.domain.generation import Generation
from server.domain.model import Event, Route, Session
from server.domain.records import (
    Checkpoint,
    CheckpointKind,
    CompileRecord,
    Usage,
)
from server.domain.table_chunks import Splitter
from server.service.basis import PartDigests
from server.service.blocking import Blocking
from server.service.checkpoints import CheckpointUseCases
from server.service.compile_records import checked, put_record, record_of
from server.service.compile_types import (
    CompileOptions,
    CompileResult,
    CompilerSettings,
    Prior,
    UsageResult,
)
from server.service.cpu_budget import CpuBudget, LaneExceeded
from server.service.inputs import (
    UNRECORDED_PREFIX,
    InputAssembler,
    is_recorded,
    unrebuildable,
)
from server.service.lanes import (
    LIGHT_CPU_MS,
    HeavySlots,
    PendingWork,
    images_are_light,
    is_light,
    prompt_is_light,
    renderings_are_light,
    sources_are_light,
    tail_is_light,
)
from server.service.loading import HistoryLoader, LoadedHistory
from server.service.memos import MemoCache
from server.service.ports import Clock, EventStore, IdSource, Telemetry, Tokenizers
from server.service.repeats import Busy, Repeats
from server.service.sources import SourceUseCases
from server.service.usage import UsageReports
from server.service.watch import CompileNotice, WatchHub

# What a compile prepared: the session, the history it loaded, the view, the counter, the
# inputs and model, and how many of the view's first messages are known to hold no image.
# Sessions whose events were found to hold nothing elidable, remembered.
_NOT_ELIDABLE = 1_024
# Sessions listed per read when the sessions over budget are restored at start.
_RESTORE_PAGE = 1_000


def _seq(e: Event) -> int:
    return e.seq


_Prepared = tuple[Session, LoadedHistory, CompiledView, TokenCounter, CompileInputs, ModelInfo, int]
# What the hop off the loop returns: see `_prepare_and_finish`.
_Outcome = tuple[_Prepared, CompileResult | None, int | None]


class CompileUseCases:
    def __init__(
        self,
        store: EventStore,
        blocking: Blocking,
        hub: WatchHub,
        clock: Clock,
        ids: IdSource,
        tokenizers: Tokenizers,
        catalog: Catalog,
        settings: CompilerSettings,
        telemetry: Telemetry,
        sources: SourceUseCases,
        checkpoints: CheckpointUseCases,
        splitter: Splitter | None = None,
        pending: PendingWork | None = None,
        on_delete: Callable[[Callable[[str, int], None]], None] | None = None,
    ) -> None:
        """`on_delete`: registers what to call with a deleted session's id (the
        sessions' `on_delete`), so that `forget` runs at every DeleteSession."""
        self._store = store
        self._blocking = blocking
        self._hub = hub
        self._clock = clock
        self._ids = ids
        self._tokenizers = tokenizers
        self._settings = settings
        self._telemetry = telemetry
        self._sources = sources
        self._loader = HistoryLoader(store)
        self._checkpoints = checkpoints
        self._assembler = InputAssembler(
            store, self._loader, sources, catalog, settings, clock, ids
        )
        self._memos = MemoCache(settings.memo_bytes, telemetry)
        # What each session's next compile has not seen, fed by its appends (lanes.py).
        self._pending = pending or PendingWork()
        self._heavy = HeavySlots()
        # Names the chunks of the route state's table in each compile's basis: the
        # store's splitter (`splitter`) has split that table already, when it wrote the
        # record whose table the route state names.
        self._splitter = splitter or Splitter()
        self._digests = PartDigests()
        # Per session (id, creation, first event loaded): the seq through which its
        # events hold nothing the built-in compaction could shorten.
        self._not_elidable: OrderedDict[tuple[str, int, int], int] = OrderedDict()
        self._not_elidable_lock = threading.Lock()
        self._usage = UsageReports(store, blocking, clock, catalog, settings, telemetry)
        # Repeated views get as much memory as the memos (they share most of it).
        self._repeats = Repeats(
            store,
            sources,
            settings.caps,
            self._assembler.time_text,
            ids,
            clock,
            settings.memo_bytes,
        )
        if on_delete is not None:
            on_delete(self.forget)

    async def compile(self, opts: CompileOptions, prior: Prior | None = None) -> CompileResult:
        """`prior`: storage work to do first, in the same hop off the event loop."""
        # A repeat neither loads nor compiles, so it needs no CPU budget; nor checks: the
        # options it matches were checked by the compile it repeats. After a write
        # (`prior`) nothing is a repeat: its generation moved (a replayed append that
        # wrote nothing just compiles, to the same view).
        if prior is None:
            repeated = await self._repeat(opts)
            if repeated is not None:
                return repeated
        # One budget for the whole request, a built-in compaction's second compile included.
        budget = CpuBudget(self._settings.cpu_budget_ms, self._telemetry.compile_abandoned)
        try:
            return await self._compile(opts, True, budget, prior)
        except asyncio.CancelledError:
            # The caller went away (deadline, cancel, closed stream, shutdown): this
            # coroutine stops here, the worker thread at its next budget check.
            budget.abandon()
            raise

    async def _compile(
        self, opts: CompileOptions, may_compact: bool, budget: CpuBudget, prior: Prior | None = None
    ) -> CompileResult:
        started = time.perf_counter()
        opts = checked(opts)
        # One hop to the compute pool for the loading, the pure compile, the record and
        # the rendering: thread handoffs, not the work, dominated small compiles.
        heavy = functools.partial(self._prepare_and_finish, opts, may_compact, budget)
        begun = self._pending.start(opts.session_id)
        compiled = False
        try:
            outcome = await self._compute(opts, heavy, begun.unseen, prior)
            compiled = True
        finally:
            self._pending.finish(begun, compiled=compiled)
        prepared, done, compact_through = outcome
        session, _, view, counter, inputs, info, plain = prepared
        if done is not None:
            if done.view.compaction is not None:
                self._telemetry.compaction("model_summary", performed=False)
            self._published(opts, session, done.view, started)
            return _of(session, done)
        rebuild = bool(opts.rebuild_compile_id)
        if compact_through is not None and await self._builtin_compaction(session, compact_through):
            return await self._compile(opts, False, budget)
        if view.compaction is not None:
            view = await self._blocking.run(self._covered, session, view)
            if not rebuild:
                self._telemetry.compaction("model_summary", performed=False)
        # No artifact sized, no image in the view: known without walking it.
        images = opts.inline_images and inputs.images.accepts_images and inputs.images.existing
        if rebuild:
            # A rebuild repeats a recorded compile: nothing new to record or publish. Its
            # images and renderings are compute work, never the storage threads'.
            if not opts.render_formats and not images:
                return CompileResult(view)
            return await self._blocking.compute(self._finish, None, (), view, opts, counter, budget)
        record, parts = self._record(opts, view, inputs, info)
        if record is None:
            if not opts.render_formats and not images:
                # Nothing left to do: a hop to the compute pool would queue a dry run
                # made on the light lane behind heavy compiles for nothing.
                return CompileResult(view, created_ns=session.create_time_ns)
            # Looking may still read images inline and render provider bodies; it
            # records nothing.
            looked = await self._blocking.compute(
                self._finish, None, (), view, opts, counter, budget, plain
            )
            return _of(session, looked)
        result = await self._blocking.compute(
            self._finish, record, parts, view, opts, counter, budget, plain
        )
        self._published(opts, session, view, started)
        return _of(session, result)

    async def _compute(
        self,
        opts: CompileOptions,
        heavy: Callable[..., _Outcome],
        unseen: int,
        prior: Prior | None,
    ) -> _Outcome:
        """`heavy` (the compile's one hop off the loop) after `prior`'s write, on the
        light lane when it continues a warm memo with little new text, else (or when the
        light lane finds its memo will not hold) on the compute pool."""
        light, fresh = self._light(opts, unseen, prior.size if prior is not None else 0)
        # On the light lane the compile checks, once loaded, that its memo holds: one
        # that does not (a checkpoint chosen since, a cancel keeping reasoning, a session
        # made again under the id) projects the whole log, which is heavy work.
        work = functools.partial(heavy, light=True, fresh=fresh) if light else heavy
        if prior is None:
            if not light:
                return await self._on_pool(opts.session_id, heavy)
            try:
                return await self._blocking.compute_light(
                    _then_synced, work, self._store.sync_reads
                )
            except _Stale as stale:
                return await self._on_pool(opts.session_id, stale.rest or heavy)
        # The append's fsync is made while its compile runs (the compile reads what was
        # written; the answer waits for both).
        _, outcome = await self._blocking.run_then_compute(
            prior.run, work, prior.landed, self._store.deferring_sync, light=light
        )
        if isinstance(outcome, _Stale):  # the append stands: only its compile moves
            return await self._on_pool(opts.session_id, outcome.rest or heavy)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    async def _on_pool(self, session_id: str, work: Callable[[], _Outcome]) -> _Outcome:
        """`work` on the compute pool, one of the session's at a time (HeavySlots)."""
        async with self._heavy.slot(session_id):
            return await self._blocking.compute(_then_synced, work, self._store.sync_reads)

    def forget(self, session_id: str, created: int = 0) -> None:
        """The session made at `created` (0: whichever) was deleted: its memos,
        repeatable views and kept reads (tool, checkpoint and source lists, artifact
        sizes, range digests), which nothing can use again, are dropped now instead of holding
        memory and evicting live sessions' until the LRUs reach them (a compile of it still
        running may store one more; that one is left to the LRU, as it always was), and it
        leaves the sessions over budget (ctxcc_sessions_over_budget) at once. Those of a
        session made again under its id since stay: a delete's result can reach the event
        loop after that one was made."""
        self._memos.forget(session_id, created)
        self._repeats.forget_session(session_id, created)
        self._loader.forget(session_id, created)
        self._assembler.forget(session_id, created)
        self._telemetry.session_deleted(session_id, created)

    def restore_over_budget(self) -> None:
        """Blocking, at start before calls are served: tells telemetry which sessions'
        latest recorded compile was over budget, and when (the gauge of sessions over
        budget is kept in memory; a restart emptied it until each compiled again). One
        read of the latest record per session. A damaged record answers RECORD_CORRUPT
        to the calls that read it; here it must not stop the daemon from starting, so
        the gauge goes without that session (a damaged session record: without the
        sessions listed after it)."""
        now = self._clock.now_ns()
        over: list[tuple[str, float]] = []
        after = ""
        while True:
            try:
                page = self._store.list_sessions(after, _RESTORE_PAGE)
            except CtxccError:
                break
            for session in page:
                try:
                    last = self._store.last_compile_outcome(session.session_id)
                except CtxccError:
                    continue
                if last is not None and last[0] == Decision.OVER_BUDGET_SEND_ANYWAY:
                    over.append((session.session_id, (now - last[1]) / 1e9))
            if len(page) < _RESTORE_PAGE:
                break
            after = page[-1].session_id
        self._telemetry.over_budget_restored(over)

    def kept(self) -> tuple[int, int]:
        """(memos, repeatable views) kept: for tests and inspection."""
        return len(self._memos), len(self._repeats)

    def kept_reads(self) -> int:
        """Values read from the store kept between compiles (checkpoint, tool and source
        lists, artifact sizes, range digests): for tests and inspection."""
        return self._loader.kept() + self._assembler.kept()

    def _light(self, opts: CompileOptions, unseen: int, step_bytes: int) -> tuple[bool, bool]:
        """Whether the compile goes on the light lane: at the head, it continues a kept
        memo or is the first of a session this daemon made (whose whole log is what
        landed since), and little text is new to it (see lanes.py); and whether it may
        go on without a memo (the latter)."""
        if opts.as_of_seq or opts.rebuild_compile_id:
            return False, False
        fresh = self._pending.whole(opts.session_id) and self._tokenizers.ready(
            self._assembler.model_of(opts.route.model)
        )
        known = fresh or self._memos.warm(opts.session_id, opts.route.route_id)
        return is_light(known, unseen, step_bytes), fresh

    async def _repeat(self, opts: CompileOptions) -> CompileResult | None:
        """The session's last view again when nothing it depends on changed (repeats.py):
        on the event loop (a read and an unsynced write) unless workspace files are read."""
        if not is_recorded(opts) or not self._settings.memo_bytes:
            return None
        entry = self._repeats.candidate(opts)
        if entry is None:
            return None
        started = time.perf_counter()
        if self._repeats.reads_files(entry):
            found = await self._blocking.run(self._repeats.repeat, entry)
        else:
            found = self._repeats.repeat(entry, False)
            if isinstance(found, Busy):
                found = await self._blocking.run(self._repeats.repeat, entry)
        result = _of(entry.session, found) if isinstance(found, CompileResult) else None
        if result is not None and not self._store.reads_synced():
            # The view repeated may be a step's whose append is still being synced.
            await self._blocking.run(self._store.sync_reads)
        if result is not None:
            self._telemetry.memo_used("repeat")
            self._published(opts, entry.session, result.view, started)
        return result

    def _prepare_and_finish(
        self,
        opts: CompileOptions,
        may_compact: bool,
        budget: CpuBudget,
        *,
        light: bool = False,
        fresh: bool = False,
    ) -> tuple[_Prepared, CompileResult | None, int | None]:
        """Blocking: the whole compile when it needs nothing from the event loop (no
        compaction to make or to digest, not a rebuild); else only the prepared parts,
        with the seq through which a built-in compaction would shorten the log (None:
        none to make), found here: it walks the view and, once, the log. With `light`
        (on the light lane), raises _Stale rather than compile without its memo (unless
        `fresh`: the first compile of a little session made here)."""
        # Taken before anything is read: see repeats.py.
        before = self._store.generation(opts.session_id, opts.route.route_id)
        prepared = self._prepare(opts, budget, light, fresh)
        session, history, view, _, _, _, plain = prepared
        recorded = is_recorded(opts)
        if opts.rebuild_compile_id or not recorded:
            return prepared, None, None
        wants = view.decision is not Decision.OK and may_compact
        through = self._builtin_through(session, history, view) if wants else None
        if through is not None:
            return prepared, None, through  # the loop makes the checkpoint, then compiles again
        finish = functools.partial(self._finish_recorded, opts, prepared, before, budget)
        # Over budget, every step's view carries the compaction request with the digest
        # of the range it covers. The digest is made here, in this hop: on the loop it
        # cost every such step two more hops and the record made on the loop. The first
        # one of a range reads and hashes the range: compute-pool work.
        undigested = view.compaction is not None and (
            self._loader.cached_range_digest(session, view.compaction.through_seq) is None
        )
        if light and (_heavy_finish(opts, view, plain) or undigested):
            # Reading and encoding megabytes of images, or rendering a long view, is heavy
            # work: the compute pool does it, with the compile made here.
            raise _Stale(finish)
        return finish()

    def _finish_recorded(
        self, opts: CompileOptions, prepared: _Prepared, before: Generation, budget: CpuBudget
    ) -> _Outcome:
        """Blocking: the rest of `_prepare_and_finish` for a view to record now: images,
        renderings, the record, and the repeat remembered."""
        session, history, view, counter, inputs, info, plain = prepared
        if view.compaction is not None:
            view = self._covered(session, view)
            prepared = (session, history, view, counter, inputs, info, plain)
        record, parts = self._record(opts, view, inputs, info)
        done = self._finish(None, (), view, opts, counter, budget, plain)
        # Only a record that was written may be remembered: one refused for a full disk
        # beside another write that landed meanwhile is also one write further. A view
        # recommending compaction is not (as before it was made in this hop): each of
        # its compiles is counted as a recommendation.
        if (
            record is not None
            and put_record(self._store, record, parts)
            and self._settings.memo_bytes
            and view.compaction is None
        ):
            self._repeats.remember(opts, before, inputs, done, record)
        return prepared, done, None

    def _covered(self, session: Session, view: CompiledView) -> CompiledView:
        """Blocking: `view` with its compaction request's covered digest (empty when the
        range cannot be digested: part of it is missing or damaged)."""
        assert view.compaction is not None
        digest = self._loader.range_digest(session, view.compaction.through_seq)
        return replace(view, compaction=replace(view.compaction, covered_digest=digest or ""))

    def _published(
        self, opts: CompileOptions, session: Session, view: CompiledView, started: float
    ) -> None:
        """A recorded compile at the head is announced to watchers and measured."""
        notice = CompileNotice(
            view.compile_id, view.event_boundary, view.budget.estimated_input_tokens
        )
        self._hub.publish(opts.session_id, [notice], session.head_seq, session.create_time_ns)
        self._telemetry.compiled(
            time.perf_counter() - started,
            view,
            family_of(opts.route.model),
            opts.session_id,
            session.create_time_ns,
        )

    def _record(
        self, opts: CompileOptions, view: CompiledView, inputs: CompileInputs, info: ModelInfo
    ) -> tuple[CompileRecord | None, tuple[tuple[str, object], ...]]:
        """See `record_of` (compile_records.py)."""
        return record_of(
            opts,
            view,
            inputs,
            info,
            self._assembler.settings_part,
            self._clock,
            self._splitter,
            self._digests,
        )

    def _finish(
        self,
        record: CompileRecord | None,
        parts: tuple[tuple[str, object], ...],
        view: CompiledView,
        opts: CompileOptions,
        counter: TokenCounter,
        budget: CpuBudget,
        plain: int = 0,
    ) -> CompileResult:
        """Blocking: read image bytes, render bodies, then record the compile (unless a dry
        run): last, so that a compile stopped by its CPU budget leaves no record. The
        view's first `plain` messages are known to hold no image."""
        with budget.running():
            attachments: tuple[tuple[str, bytes], ...] = ()
            if opts.inline_images or opts.render_formats:
                attachments = self._materialize(opts.session_id, view.messages[plain:])
            # Renderers add no content of their own, so the view's estimate is the body's.
            data = dict(attachments)
            renderings = []
            for fmt in opts.render_formats:
                budget.check()
                body = render(view, fmt, data)
                renderings.append((fmt, body, view.budget.estimated_input_tokens))
            budget.check()
        if record is not None:
            put_record(self._store, record, parts)
        shown = attachments if opts.inline_images else ()
        return CompileResult(view, shown, tuple(renderings))

    def _prepare(
        self, opts: CompileOptions, budget: CpuBudget, light: bool = False, fresh: bool = False
    ) -> _Prepared:
        """Blocking: load everything the compile needs, then run the pure compiler. On the
        light lane, work that uses more CPU than the lane allows (LIGHT_CPU_MS), whatever
        made it heavy, is left for the compute pool: the token counts it made are
        remembered, so the pool continues from there."""
        with budget.running():
            if not light:
                return self._prepare_within(opts, budget)
            budget.lane(LIGHT_CPU_MS)
            try:
                return self._prepare_within(opts, budget, light, fresh)
            except LaneExceeded:
                raise _Stale from None
            finally:
                budget.lane(0)

    def _prepare_within(
        self, opts: CompileOptions, budget: CpuBudget, light: bool = False, fresh: bool = False
    ) -> _Prepared:
        # Only compiles at the head continue from a memo (and leave one): time travel
        # compiles against another boundary and sources than the next step will.
        at_head = not opts.as_of_seq and not opts.rebuild_compile_id and self._settings.memo_bytes
        session = self._store.get_session(opts.session_id) if at_head else None
        key = (opts.session_id, session.create_time_ns if session else 0, opts.route.route_id)
        memo = self._memos.get(key) if session is not None else None
        if light and memo is None and not fresh:
            # Its memo was warm when the lane was chosen and is gone now (evicted while
            # this waited for the lane): loading the whole log to find that out would be
            # the heavy work itself (~0.12 s for 10 MB).
            raise _Stale
        session, inputs, info, history = self._assembler.assemble(opts, memo, session)
        if light and not (
            memo_usable(memo, inputs.events, inputs.checkpoint, inputs.current_user)
            and tail_is_light(inputs.events[memo.cut :])
            if memo is not None
            else self._fresh_is_light(inputs, info)
        ):
            # Loading read only what is new (after the memo's events) when the memo's
            # checkpoint is still the one chosen; the projection would redo much more.
            raise _Stale
        budget.check()
        counter = self._tokenizers.for_model(info, inputs.counting)
        view, new_memo, reused = compile_incremental(
            inputs,
            counter,
            memo,
            check=budget.check,
            before_prompt=_light_prompt if light else any_prompt,
        )
        if at_head:
            self._telemetry.memo_used("hit" if reused else "stale" if memo else "miss")
            self._memos.put(key, new_memo)
        # A memo's messages never hold an image (its cut stops before one), and they are
        # the view's first messages: their images need not be looked for.
        plain = len(new_memo.messages) if new_memo is not None else 0
        return session, history, view, counter, inputs, info, plain

    def _fresh_is_light(self, inputs: CompileInputs, info: ModelInfo) -> bool:
        """Whether a compile with no memo to continue (the first of a session made here,
        which the light lane takes when little has landed) is light work: its whole log
        little text behind no checkpoint, its sources too (it counts them all: workspace
        rule files and project entries can be megabytes), and its route's tokenizer table
        built (a build takes up to seconds)."""
        return (
            inputs.checkpoint is None
            and tail_is_light(inputs.events)
            and sources_are_light(inputs.sources)
            and self._tokenizers.ready(info)
        )

    def _builtin_through(
        self, session: Session, history: LoadedHistory, view: CompiledView
    ) -> int | None:
        """Blocking: the seq through which a built-in compaction would shorten older large
        tool results into references (None: nothing to shorten). Over budget this is
        asked at every step, and both walks grow with the session: off the event loop."""
        current = history.checkpoint
        if not self._settings.auto_compact or (
            current is not None and current.kind != CheckpointKind.BUILTIN
        ):
            return None  # a model-written summary is in use: ask for a new one instead
        # Nothing to shorten anywhere in the log (the usual case at every over-budget step
        # after the first): the walk over the view for the working set is not needed.
        if not self._elidable(session, history.events, view.event_boundary):
            return None
        ws = working_set_start(view.messages)
        through = ws - 1 if ws is not None else view.event_boundary
        done = current.covers_through_seq if current is not None else 0
        if through <= done or not self._elidable(session, history.events, through):
            return None
        return through

    async def _builtin_compaction(self, session: Session, through: int) -> bool:
        """Shorten older large tool results into references (through `through`, see
        `_builtin_through`), as a checkpoint; True if made."""
        template = Checkpoint(
            checkpoint_id="",
            session_id=session.session_id,
            covers_through_seq=through,
            summary="",
            source_route=None,
            portable=True,
            covered_digest="",
            kind=CheckpointKind.BUILTIN,
            create_time_ns=0,
        )
        try:
            _, created = await self._checkpoints.create_reporting(
                template, life=session.create_time_ns
            )
        except CtxccError as err:
            if err.reason is not Reason.DISK_FULL:
                raise
            return False  # the view is still compiled, uncompacted, until space is back
        if created:  # a compile racing this one may have stored it: counted once
            self._telemetry.compaction("builtin", performed=True)
        return True

    def _elidable(self, session: Session, events: Sequence[Event], through: int) -> bool:
        """has_elidable, looking only at the events after those found not elidable
        before: the log is append-only, so an over-budget session that has nothing to
        shorten is not walked again in full at every step."""
        key = (session.session_id, session.create_time_ns, events[0].seq if events else 0)
        with self._not_elidable_lock:  # compute threads ask concurrently
            seen = self._not_elidable.get(key, 0)
        found = has_elidable(events[bisect_right(events, seen, key=_seq) :], through)
        if not found:
            with self._not_elidable_lock:
                self._not_elidable[key] = max(seen, self._not_elidable.get(key, 0), through)
                self._not_elidable.move_to_end(key)
                while len(self._not_elidable) > _NOT_ELIDABLE:
                    self._not_elidable.popitem(last=False)
        return found

    def _materialize(
        self, session_id: str, messages: Sequence[ViewMessage]
    ) -> tuple[tuple[str, bytes], ...]:
        """Blocking: bytes of the images of these messages of a view, read only now
        (R-CTX-3, R-IMG-1)."""
        wanted = dict.fromkeys(
            p.attachment.artifact_id for m in messages for p in m.parts if p.attachment is not None
        )
        return tuple((aid, self._store.get_artifact(session_id, aid)[1]) for aid in wanted)

    async def report_usage(
        self, compile_id: str, route: Route | None, usage: Usage, session_id: str | None = None
    ) -> UsageResult:
        """See `UsageReports.report_usage` (server/service/usage.py)."""
        return await self._usage.report_usage(compile_id, route, usage, session_id)

    async def check_rebuildable(self, compile_id: str) -> None:
        """COMPILE_NOT_FOUND (or RECORD_CORRUPT) unless `compile_id` is recorded with the
        basis a rebuild reads: checked by a stream step before it writes anything, so a
        step naming a compile that was never made, went with its session (deleted, maybe
        made again under its id) or cannot be rebuilt writes nothing. (A deletion racing
        the step can still come between this and its append, which then fails.)"""
        record = await self._blocking.run(self._store.get_compile, compile_id)
        if not record.basis_digest:
            raise unrebuildable(compile_id)

    async def gone(self, compile_id: str) -> bool:
        """Whether this compile was recorded and its record is no longer stored (its
        session was deleted, maybe made again since) or no longer decodes. An unrecorded
        compile (a dry run, time travel) never had a record: not gone."""
        if compile_id.partition(":")[2].startswith(UNRECORDED_PREFIX):
            return False
        try:
            await self._blocking.run(self._store.get_compile, compile_id)
        except CtxccError as err:
            if err.reason not in (Reason.COMPILE_NOT_FOUND, Reason.RECORD_CORRUPT):
                raise
            return True
        return False


def _of(session: Session, result: CompileResult) -> CompileResult:
    """`result` marked as a view of this life of its session (CompileResult.created_ns)."""
    return replace(result, created_ns=session.create_time_ns)


T = TypeVar("T")


def _light_prompt(inputs: PromptInputs) -> None:
    """On the light lane, a system prompt is made anew (its memo's does not hold: a
    source was written, or the turn named a new path) only when that is little work:
    making it walks every source (~190 ms for 10 MB of rule files), and each rule matched
    by path scans every path the turn names (~0.7 s for 768 rules against 4,096 paths),
    which would hold up every other session's steps; the compile goes to the compute pool
    instead."""
    if not prompt_is_light(inputs.sources, inputs.paths):
        raise _Stale


def _heavy_finish(opts: CompileOptions, view: CompiledView, plain: int) -> bool:
    """Whether what is left of a compile once made (its images read and encoded, its
    provider bodies rendered) is heavy work; the view's first `plain` messages hold no
    image."""
    if (opts.inline_images or opts.render_formats) and not images_are_light(view.messages[plain:]):
        return True
    # The tokens the daemon counted, not the estimate alone: that follows the client's
    # usage reports, and one reporting 1 input token would make any view's bodies light.
    tokens = max(view.budget.estimated_input_tokens, view.budget.ledger_tokens)
    return not renderings_are_light(tokens, len(opts.render_formats))


class _Stale(Exception):
    """Work sent to the light lane found itself heavy. Without `rest`, the memo would not
    hold, or the system prompt would be made anew from much source text: the compile is
    redone on the compute pool; with it, the compile is made and
    `rest` (its images, renderings and record) runs there (see `_compute`)."""

    def __init__(self, rest: Callable[[], _Outcome] | None = None) -> None:
        super().__init__()
        self.rest = rest


def _then_synced(work: Callable[[], T], sync_reads: Callable[[], None]) -> T:
    """`work`, then the log synced if what it read may not be durable yet (a step's
    append is synced beside its compile): a view never shows events before they are."""
    result = work()
    sync_reads()
    return result
