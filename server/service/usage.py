"""The usage use case: check a provider's report, record it, and let the route learn."""

from __future__ import annotations

import logging

from server.compiler.budget import ModelLimits, output_reserve
from server.compiler.route_model import (
    BOUNDS,
    RatioBounds,
    counter_kind,
    observe_delta,
    observe_full,
)
from server.compiler.view import EstimateMethod
from server.domain.catalog import Catalog
from server.domain.errors import CtxccError, Reason, invalid
from server.domain.families import family_of
from server.domain.model import Route
from server.domain.records import CompileRecord, Learn, RouteModel, RouteState, Usage
from server.domain.replacing import replaced
from server.domain.validation import check_route_fields
from server.service.blocking import Blocking
from server.service.compile_types import CompilerSettings, UsageResult, route_fields
from server.service.inputs import MAX_USAGE_TOKENS, UNRECORDED_PREFIX, effective_limits
from server.service.ports import Clock, EventStore, Telemetry

log = logging.getLogger("ctxcc.usage")
# Routes whose partial usage reports are logged (once each) before the log stays quiet.
_WARNED_ROUTES = 256


class UsageReports:
    def __init__(
        self,
        store: EventStore,
        blocking: Blocking,
        clock: Clock,
        catalog: Catalog,
        settings: CompilerSettings,
        telemetry: Telemetry,
    ) -> None:
        self._store = store
        self._blocking = blocking
        self._clock = clock
        self._catalog = catalog
        self._settings = settings
        self._telemetry = telemetry
        self._warned: set[str] = set()  # routes a partial report was logged for
        self._warned_over: set[str] = set()  # routes an over-window report was logged for

    async def report_usage(
        self, compile_id: str, route: Route | None, usage: Usage, session_id: str | None = None
    ) -> UsageResult:
        """`session_id`: the session the report arrived for (a step's), which the compile
        must belong to; None when the report names only its compile (ReportUsage)."""
        if not compile_id:
            raise invalid("compile_id", "compile_id is required")
        if session_id is not None and compile_id.partition(":")[0] != session_id:
            raise CtxccError(
                Reason.COMPILE_NOT_FOUND,
                f"compile {compile_id!r} is not a compile of session {session_id!r}: a step "
                "carries the usage of its own session's compiles only",
                compile_id=compile_id,
            )
        if route is not None:
            check_route_fields(route_fields(route))
        for field in ("input_tokens", "output_tokens", "cached_input_tokens", "reasoning_tokens"):
            if getattr(usage, field) > MAX_USAGE_TOKENS:
                raise invalid(
                    field, f"{field} is over {MAX_USAGE_TOKENS}, more than any model reads"
                )
        check_usage(usage)
        if compile_id.partition(":")[2].startswith(UNRECORDED_PREFIX):
            raise CtxccError(
                Reason.COMPILE_NOT_FOUND,
                f"compile {compile_id!r} was a dry run or a time-travel (as_of_seq) compile: "
                "neither is recorded, so no usage can be reported for it; report the usage "
                "of the compile at the session head that the request was sent from",
                compile_id=compile_id,
            )
        # A read and an unsynced write: on the event loop (a thread hop costs about as
        # much CPU as both), unless it would wait for a lock an append may hold through
        # its fsync or for a RocksDB write stall; then on the I/O pool.
        done = self._report(compile_id, route, usage, wait=False)
        if done is None:
            done = await self._blocking.run(self._report, compile_id, route, usage)
        assert done is not None  # waiting, it always gets its locks
        stored, replayed = done
        actual = stored.usage.input_tokens if stored.usage else usage.input_tokens
        # The next request's reserve follows the session's baseline on the route, which a
        # late report of an older compile leaves at a newer one's (usage_records.py), and
        # a report of part of the input leaves as it was: none at all when it is the
        # route's first report, and the next compile reserves a first request's share.
        state = self._baseline(compile_id.partition(":")[0], stored.route.route_id)
        output = state.last_output_tokens if state is not None else None
        # The limits the compile had (a request's `limits` may set what the catalog lacks).
        limits = effective_limits(self._catalog.lookup(stored.route.model), ModelLimits(), False)
        if stored.context_window:
            limits = replaced(limits, context_window=stored.context_window)
        if stored.max_output_tokens:
            limits = replaced(limits, max_output_tokens=stored.max_output_tokens)
        estimated = stored.estimated_input_tokens
        if not replayed:
            method = EstimateMethod(stored.estimate_method).name.lower()
            model = stored.route.model
            key = self._catalog.lookup(model).key or "other"
            self._telemetry.usage_reported(estimated, actual, family_of(model), method, key)
        return UsageResult(
            estimated_input_tokens=estimated,
            error_tokens=actual - estimated,
            relative_error=(actual - estimated) / actual if actual else 0.0,
            replayed=replayed,
            next_output_reserve=output_reserve(limits, output, self._settings.budget),
        )

    def _baseline(self, session_id: str, route_id: str) -> RouteState | None:
        """The session's baseline on the route; None when there is none or it is damaged
        (as a compile takes it: the next estimate is a full one)."""
        try:
            return self._store.get_route_state(session_id, route_id)
        except CtxccError as err:
            if err.reason is not Reason.RECORD_CORRUPT:
                raise
            return None

    def _report(
        self, compile_id: str, route: Route | None, usage: Usage, wait: bool = True
    ) -> tuple[CompileRecord, bool] | None:
        """Blocking when `wait`: the usage, the session's new baseline and what the route
        learns; without `wait`, None (nothing written) when the store would wait for a
        lock or a write stall."""
        now = self._clock.now_ns()

        def plan(record: CompileRecord) -> tuple[RouteState | None, Learn]:
            """From the record the store reads under the session's lock (once)."""
            if route is not None and route.route_id != record.route.route_id:
                raise CtxccError(
                    Reason.ROUTE_MISMATCH,
                    "the usage report's route differs from the route the view was compiled for",
                    compile_id=compile_id,
                )
            learn = self._learner(record, usage, now)
            if self._over_window(record, usage):
                # More than the model's window: no provider answers such a request, so
                # the count is no count of it (a session's running total, another
                # request's usage). As a baseline it made every later estimate of the
                # session over budget; taught as the route's first overhead, every new
                # session's first estimate on the route too, for a dozen sessions.
                self._over_window_report(record, usage)
                return None, learn
            if not self._plausible(record, usage):
                # Part of the input: as a baseline it made every later estimate of the
                # session that part plus the change (4 tokens for a 20,000-token request,
                # and compaction never recommended). The session's baseline stays as it
                # was; the report is still kept and its error measured.
                self._partial_report(record, usage)
                return None, learn
            state = RouteState(
                route_id=record.route.route_id,
                baseline_input_tokens=usage.input_tokens,
                baseline_compile_id=compile_id,
                last_output_tokens=usage.output_tokens,
                update_time_ns=now,
                message_count=record.message_count,
                messages_digest=record.messages_digest,
                fixed_tokens=record.fixed_tokens,
                message_digests=record.message_digests,
                message_tokens=record.message_tokens,
                baseline_seq=record.event_boundary,
                baseline_create_ns=record.create_time_ns,
            )
            return state, learn

        if wait:
            return self._store.record_usage(compile_id, usage, plan)
        return self._store.try_record_usage(compile_id, usage, plan)

    def _plausible(self, record: CompileRecord, usage: Usage) -> bool:
        """Whether the report can be the whole input of the compile's request (see
        `plausible`)."""
        return plausible(usage.input_tokens, _ledger(record), self._bounds(record))

    def _partial_report(self, record: CompileRecord, usage: Usage) -> None:
        """Logged once per route (an agent that reports part of its input does so at
        every step)."""
        if not _first_for_route(self._warned, record):
            return
        log.warning(
            "usage report for compile %s: input_tokens %d is less than any provider counts "
            "for that request (%d tokens by ctxcc's count); it is kept and measured but is "
            "not the session's baseline. Report the whole input: Anthropic's input_tokens "
            "+ cache_creation_input_tokens + cache_read_input_tokens (the clients' usage "
            "helpers do). Logged once per route.",
            record.compile_id,
            usage.input_tokens,
            _ledger(record),
        )

    def _window(self, record: CompileRecord) -> int:
        """The catalog's window for the compile's model (0: unknown)."""
        return self._catalog.lookup(record.route.model).context_window

    def _bounds(self, record: CompileRecord) -> RatioBounds:
        """The ratios a provider's count can have to the local one, for the model's
        counter kind."""
        return BOUNDS[counter_kind(self._catalog.lookup(record.route.model))]

    def _over_window(self, record: CompileRecord, usage: Usage) -> bool:
        return over_window(usage.input_tokens, record, self._window(record), self._bounds(record))

    def _over_window_report(self, record: CompileRecord, usage: Usage) -> None:
        """Logged once per route, like a partial report."""
        if not _first_for_route(self._warned_over, record):
            return
        log.warning(
            "usage report for compile %s: input_tokens %d is more than the model's context "
            "window (%d tokens, %d in the compile); it is kept and measured but is not the "
            "session's baseline and teaches the route nothing. Report the input of this one "
            "request; a model with a larger window than ctxcc's catalog knows needs the "
            "compile's limits.context_window (or --model-catalog). Logged once per route.",
            record.compile_id,
            usage.input_tokens,
            self._window(record),
            record.context_window,
        )

    def _learner(self, record: CompileRecord, usage: Usage, now_ns: int) -> Learn:
        """What this report teaches the route model (run once, inside the store's write)."""
        bounds = self._bounds(record)
        window = self._window(record)
        cfg = self._settings.learning
        delta = record.estimate_method == int(EstimateMethod.BASELINE_DELTA)
        local = _ledger(record)

        def learn(model: RouteModel | None) -> RouteModel:
            m = model or RouteModel(route_id=record.route.route_id)
            if not plausible(usage.input_tokens, local, bounds) or over_window(
                usage.input_tokens, record, window, bounds
            ):
                pass  # part of the input, or no count of this request: teaches nothing
            elif delta and record.raw_delta is not None:
                # Only a pure append isolates the tokenizer: with removals the net
                # change can be small beside large gross changes. A change from a
                # baseline that was part of its input is no change of the payload.
                base_local = local - record.raw_delta
                if record.removed_tokens == 0 and plausible(
                    record.baseline_tokens, base_local, bounds
                ):
                    reported = usage.input_tokens - record.baseline_tokens
                    change = (record.raw_delta, reported, record.message_change or 0)
                    m = observe_delta(m, change, bounds, cfg)
            elif not delta:
                m = observe_full(m, local, usage.input_tokens, bounds, cfg)
            return replaced(m, update_time_ns=now_ns)

        return learn


def _first_for_route(warned: set[str], record: CompileRecord) -> bool:
    """Whether a warning about the record's route is the first (then noted in `warned`,
    which holds at most _WARNED_ROUTES routes: later ones are not logged)."""
    route_id = record.route.route_id
    if route_id in warned or len(warned) >= _WARNED_ROUTES:
        return False
    warned.add(route_id)
    return True


def _ledger(record: CompileRecord) -> int:
    """The compile's local count of its request. Records written before the ledger was
    kept: a FULL estimate was the ledger."""
    return record.ledger_tokens or record.estimated_input_tokens


def over_window(
    reported: int, record: CompileRecord, catalog_window: int, bounds: RatioBounds
) -> bool:
    """Whether `reported` input tokens exceed every window known for the request: the
    catalog's for its model and the one the compile had (its request's
    `limits.context_window` may set a larger one, or a smaller one as a local budget that
    an agent may send beyond, R-EST-4). A provider refuses a request over its model's
    window rather than counting it. No bound when either window is unknown (0; records
    written before the window was kept have 0).

    Nor is a report over them that the request's own local count explains (at most the
    highest ratio of the route's counter kind times it): a request over budget is still
    sent (R-EST-4), and a provider whose window is larger than the catalog's (Anthropic's
    1M-token context option on claude-sonnet-4) counts it honestly; dropping that count
    left the session without a baseline."""
    if catalog_window <= 0 or record.context_window <= 0:
        return False
    if reported <= max(catalog_window, record.context_window):
        return False
    return reported > bounds.high * _ledger(record)


def plausible(reported: int, local: int, bounds: RatioBounds) -> bool:
    """Whether a provider can have counted `reported` input tokens for a request whose
    local count is `local`: at least half the lowest ratio the route's counter kind
    allows (half: a provider may count parts for less than the local count does, tool
    schemas, images of unknown size, and a first request is mostly such parts). Below
    it is part of the input (Anthropic's `input_tokens` without its cache reads and
    writes); the route model learns nothing from it, or from a change since it: one
    such report made a daemon-wide overhead of minus the whole request, and every new
    session's first estimate on the route 0."""
    return 2 * reported >= bounds.low * local


def check_usage(usage: Usage) -> None:
    """A report the provider cannot have made is refused before it teaches anything."""
    if usage.input_tokens <= 0:
        raise CtxccError(
            Reason.USAGE_INVALID,
            "input_tokens must be positive: every provider request has input",
            field="input_tokens",
        )
    if usage.cached_input_tokens > usage.input_tokens:
        raise CtxccError(
            Reason.USAGE_INVALID,
            "cached_input_tokens cannot exceed input_tokens: input_tokens counts cached tokens "
            "too (Anthropic: input_tokens + cache_creation_input_tokens + "
            "cache_read_input_tokens)",
            field="cached_input_tokens",
        )
    if usage.reasoning_tokens > usage.output_tokens:
        raise CtxccError(
            Reason.USAGE_INVALID,
            "reasoning_tokens cannot exceed output_tokens: output_tokens counts reasoning "
            "tokens too (Gemini: candidates_token_count + thoughts_token_count)",
            field="reasoning_tokens",
        )
