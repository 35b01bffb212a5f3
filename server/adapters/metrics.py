"""Prometheus metrics on a registry of their own (never the global one), built by the
composition root and served by prometheus-client's HTTP server.

Names carry the `ctxcc_` prefix and base units; counters end in `_total`. Labels are
bounded: model family, catalog model key, tokenizer, layer, decision, reason, section, method, kind,
RPC method and status code. No session id ever becomes a label.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, Info
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from server.adapters.plain_metrics import PlainMetrics
from server.compiler.view import (
    VOLATILE_SECTIONS,
    CompiledView,
    Decision,
    FallbackReason,
    Layer,
    SectionKind,
)
from server.domain.errors import Reason
from server.domain.model import of_deleted
from storage.kv import Footprint

_LATENCY = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
_TOKENS = (256, 1024, 4096, 16384, 32768, 65536, 131072, 262144, 1048576)
_RATIO = (0.1, 0.25, 0.5, 0.7, 0.8, 0.85, 0.9, 0.95, 1.0, 1.1, 1.5, 2.0)
# Past 1.0 only an over-estimate (more than twice the reported count) can land.
_ERROR = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
# A shortfall (reported - estimate) / reported is at most 1.0: the whole count missed.
_SHORTFALL = tuple(b for b in _ERROR if b <= 1.0)
# A session counts as over budget while its latest compile was over budget and came at
# most this long ago: an agent that stopped (or compacted, or was deleted) is not one that
# keeps sending requests over budget.
OVER_BUDGET_RECENT_SECONDS = 300.0
# Sessions kept in that tally before the stale ones are dropped outside a scrape.
_OVER_BUDGET_KEPT = 1024


class _OverBudgetSessions(Collector):
    """Sessions whose latest recorded compile was over its input budget, recently: the
    gauge CtxccSessionsOverBudget watches. A counter of such compiles cannot tell a
    session that compacted a step later from one stuck over budget: its rate stays above
    zero for the whole window after the last one."""

    def __init__(self, lock: Any, clock: Callable[[], float] = time.monotonic) -> None:
        self._lock = lock
        self._clock = clock
        # session id -> when its over-budget compile came, and the session's create time
        self._last: dict[str, tuple[float, int]] = {}
        # session id -> (when, create time) of a deleted session: a compile of it that
        # was running at the delete finishes after it and must not count it again.
        self._deleted: dict[str, tuple[float, int]] = {}

    def decided(self, session_id: str, over: bool, created_ns: int = 0) -> None:
        """Called under the lock. `created_ns`: the compiled session's create time."""
        if not over:
            # Only the counted session's own compile ends its count: one of an earlier
            # session under the id (running at its delete) leaves the one made again.
            last = self._last.get(session_id)
            if last is not None and of_deleted(last[1], created_ns):
                del self._last[session_id]
            return
        gone = self._deleted.get(session_id)
        if gone is not None and created_ns and created_ns == gone[1]:
            return  # the deleted session's own compile, finishing after its delete
        now = self._clock()
        self._last[session_id] = (now, created_ns)
        if len(self._last) > _OVER_BUDGET_KEPT or len(self._deleted) > _OVER_BUDGET_KEPT:
            self._prune(now)

    def forget(self, session_id: str, created_ns: int = 0) -> None:
        """DeleteSession of the session made at `created_ns` (0: unknown, whichever). One
        made again under the id since keeps its place (the delete's result can reach the
        loop after it compiled)."""
        with self._lock:
            now = self._clock()
            last = self._last.get(session_id)
            if last is not None and of_deleted(last[1], created_ns):
                del self._last[session_id]
            if created_ns:
                self._deleted[session_id] = (now, created_ns)
            if len(self._deleted) > _OVER_BUDGET_KEPT:
                self._prune(now)

    def restored(self, ages: Iterable[tuple[str, float]]) -> None:
        """At start, before any call is served: sessions whose latest recorded compile was
        over budget, `age` seconds ago (by the wall clock that stamped the record). The
        tally lives in memory: without this a restarted daemon read 0 until each such
        session compiled again, and CtxccSessionsOverBudget's 10 minutes began anew."""
        with self._lock:
            now = self._clock()
            for session_id, age in ages:
                # A record stamped ahead of this clock (the wall clock stepped back)
                # counts as just made.
                self._last[session_id] = (now - max(age, 0.0), 0)
            self._prune(now)  # those older than the window, at once

    def _prune(self, now: float) -> None:
        # A delete is remembered as long as an over-budget compile counts: a compile
        # running at the delete ends long before (its CPU budget stops it).
        for kept in (self._last, self._deleted):
            old = [s for s, (t, _) in kept.items() if now - t > OVER_BUDGET_RECENT_SECONDS]
            for sid in old:
                del kept[sid]

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self._lock:
            self._prune(self._clock())
            n = len(self._last)
        yield GaugeMetricFamily(
            "ctxcc_sessions_over_budget",
            "Sessions whose latest compile was over its input budget, in the last "
            f"{OVER_BUDGET_RECENT_SECONDS:.0f} s (dropped at a compile within budget and "
            "at DeleteSession; read back from the compile records at start).",
            n,
        )


class _StoreCollector(Collector):
    """Read at scrape time: session count, RocksDB size and the room left, and the
    compiles the store recorded without their basis."""

    def __init__(
        self,
        sessions: Callable[[], int],
        footprint: Callable[[], Footprint],
        bases_dropped: Mapping[str, int],
    ) -> None:
        self._sessions = sessions
        self._footprint = footprint
        self._bases_dropped = bases_dropped

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        yield GaugeMetricFamily("ctxcc_sessions", "Sessions held by the daemon.", self._sessions())
        dropped = CounterMetricFamily(
            "ctxcc_compiles_without_basis",
            "Compiles answered and recorded without their basis (they cannot be rebuilt), "
            "by reason: quota (its new basis parts would pass --max-session-basis-bytes, "
            "or it repeats such a compile), missing (the basis it names is not stored).",
            labels=["reason"],
        )
        for reason in ("quota", "missing"):
            dropped.add_metric([reason], self._bases_dropped.get(reason, 0))
        yield dropped
        now = self._footprint()
        # Table files alone miss what is still in the write-ahead log and memtables,
        # which is everything a young daemon holds: the parts sum to the data held.
        size = GaugeMetricFamily(
            "ctxcc_rocksdb_size_bytes",
            "RocksDB data by part: live table files, write-ahead log, memtables.",
            labels=["part"],
        )
        size.add_metric(["live_sst"], now.live_sst_bytes)
        size.add_metric(["wal"], now.wal_bytes)
        size.add_metric(["memtable"], now.memtable_bytes)
        yield size
        yield GaugeMetricFamily(
            "ctxcc_data_dir_free_bytes",
            "Bytes available to the daemon on the data directory's filesystem.",
            now.disk_free_bytes,
        )
        yield GaugeMetricFamily(
            "ctxcc_data_dir_capacity_bytes",
            "Size of the data directory's filesystem.",
            now.disk_capacity_bytes,
        )
        # The free share alone misses a daemon that refuses writes with room to spare:
        # restarted on a full disk it gives its reserve back (a quarter of a 256 MiB
        # volume) and takes writes again only once twice the reserve is free.
        yield GaugeMetricFamily(
            "ctxcc_data_dir_full",
            "1 while writes are refused for lack of space on the data directory's "
            "filesystem (health NOT_SERVING), else 0.",
            1.0 if now.writes_refused else 0.0,
        )


class _TokenizerCollector(Collector):
    """1 for each tokenizer whose table is built, 0 for the others, read at scrape time."""

    def __init__(self, names: Iterable[str], loaded: Callable[[], Collection[str]]) -> None:
        self._names = tuple(names)
        self._loaded = loaded

    def collect(self) -> Iterator[GaugeMetricFamily]:
        loaded = self._loaded()
        gauge = GaugeMetricFamily(
            "ctxcc_tokenizer_loaded",
            "1 when the tokenizer's table is built (on first use or preloaded), else 0.",
            labels=["tokenizer"],
        )
        for name in self._names:
            gauge.add_metric([name], 1.0 if name in loaded else 0.0)
        yield gauge


class PrometheusTelemetry:
    """Counters and histograms are plain numbers changed under one lock, taken once per
    call, and read at scrape time (plain_metrics.py); gauges are prometheus-client's."""

    def __init__(self, version: str) -> None:
        self._gauges: dict[str, Any] = {}
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        Info("ctxcc_build", "Build information of the ctxcc daemon.", registry=r).info(
            {"version": version}
        )
        plain = self._plain = PlainMetrics()
        self._lock = plain.lock
        self.compile_seconds = plain.histogram(
            "ctxcc_compile_duration_seconds",
            "Time to compile one view, storage reads included.",
            ["model_family"],
            _LATENCY,
        )

        self.view_tokens = plain.histogram(
            "ctxcc_view_tokens",
            "Estimated tokens of compiled views per layer, and the provider overhead.",
            ["layer"],
            _TOKENS,
        )

        self.utilization = plain.histogram(
            "ctxcc_budget_utilization_ratio",
            "Estimated input tokens / input budget per compile.",
            ["model_family"],
            _RATIO,
        )

        self.decisions = plain.counter(
            "ctxcc_compile_decisions_total", "Compile decisions.", ["decision"]
        )
        self.fallbacks = plain.counter(
            "ctxcc_projection_fallbacks_total",
            "Checkpoints passed over by projections, by reason.",
            ["reason"],
        )
        self.prefix_changes = plain.counter(
            "ctxcc_prefix_changes_total",
            "Parts of the cached prompt prefix (stable system sections, tools) that changed "
            "since the session's previous compile: provider prompt-cache busts, by section. "
            "The volatile environment section is never counted.",
            ["section"],
        )
        self.compactions = plain.counter(
            "ctxcc_compactions_total",
            "Compactions recommended (performed=false) and performed, by kind.",
            ["kind", "performed"],
        )
        self.memo_lookups = plain.counter(
            "ctxcc_compile_memo_lookups_total",
            "Compiles by what their session's memo gave: hit (only new events compiled), "
            "miss (no memo kept), stale (a memo that did not verify: compiled from scratch) or "
            "repeat (nothing written since the last compile: its view sent again).",
            ["outcome"],
        )
        self.memo_evictions = plain.counter(
            "ctxcc_compile_memo_evictions_total",
            "Memos dropped to keep the cache within compile_memo_bytes.",
        )
        self.tools_deferred_by_cap = plain.counter(
            "ctxcc_tools_deferred_by_cap_total",
            "Tools left out of compiled views because the route's provider takes no more "
            "(OpenAI 128, Gemini 512): offered through tool_search instead.",
        )
        self.abandoned = plain.counter(
            "ctxcc_compiles_abandoned_total",
            "Compiles stopped mid-work because their caller went away (client deadline or "
            "cancel, stream closed, shutdown after the grace period): the CPU not spent.",
        )
        self.expired = plain.counter(
            "ctxcc_sessions_expired_total",
            "Sessions deleted by the retention sweep (--session-retention): nothing appended "
            "to them or compiled of them for that long.",
        )
        self.memo_bytes = Gauge(
            "ctxcc_compile_memo_bytes", "Approximate bytes held by compile memos.", registry=r
        )
        self.events_appended = plain.counter(
            "ctxcc_events_appended_total", "Events appended to session logs."
        )
        self.bytes_appended = plain.counter(
            "ctxcc_appended_bytes_total", "Bytes of events appended."
        )
        self.usage_reports = plain.counter(
            "ctxcc_usage_reports_total",
            "Usage reports matched to compiles.",
            ["model_family", "model", "method"],
        )
        self.estimation_error = plain.histogram(
            "ctxcc_estimation_error_ratio",
            "Relative estimation error |reported - estimate| / reported per usage report.",
            ["model_family", "model", "method"],
            _ERROR,
        )
        # The error's direction: an estimate under the provider's count is the one that
        # lets a request past the window (the error histograms hold only its size). Its
        # _count over ctxcc_estimation_error_ratio_count is the share estimated under.
        self.estimation_under = plain.histogram(
            "ctxcc_estimation_under_ratio",
            "Relative shortfall (reported - estimate) / reported of usage reports whose "
            "estimate was under the reported count.",
            ["model_family", "model", "method"],
            _SHORTFALL,
        )
        self.estimation_error_tokens = plain.histogram(
            "ctxcc_estimation_error_tokens",
            "Absolute estimation error |reported - estimate| in tokens per usage report.",
            ["model_family", "model", "method"],
            (10, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 25000),
        )

        self.watchers = Gauge("ctxcc_watchers", "Open WatchSession streams.", registry=r)
        self.rpc_seconds = plain.histogram(
            "ctxcc_rpc_duration_seconds",
            "RPC latency by method and status code.",
            ["method", "code"],
            _LATENCY,
        )

        self.rpcs_in_flight = Gauge(
            "ctxcc_rpcs_in_flight",
            "Calls in a handler now (taken, not yet answered), by method; a graceful "
            "shutdown waits for these.",
            ["method"],
            registry=r,
        )
        self.rpc_errors = plain.counter(
            "ctxcc_rpc_errors_total",
            "RPCs that ended with a status other than OK, by method and code.",
            ["method", "code"],
        )
        # By reason, across methods and the ways an error is answered (a call's status, a
        # CompileStream step's StepError, which no status code ever shows): gRPC codes
        # cannot tell a failing disk (STORAGE_FAILURE) from a drain (SHUTTING_DOWN), both
        # UNAVAILABLE.
        self.errors = plain.counter(
            "ctxcc_errors_total",
            "Errors answered, by their ErrorInfo reason: calls' statuses and CompileStream "
            "steps' StepErrors, each once.",
            ["reason"],
        )
        self.write_seconds = plain.histogram(
            "ctxcc_storage_write_duration_seconds",
            "Time of one atomic storage write (RocksDB WriteBatch, fsync included in sync mode).",
            (),
            _LATENCY,
        )

        # Bounded label sets start at zero, so dashboards and alert ratios see the series
        # before the first event of each kind.
        # The series every compile records, looked up once.
        self._decided = {d: self.decisions.labels(d.name.lower()) for d in Decision}
        self._layer_tokens = {layer: self.view_tokens.labels(layer.name.lower()) for layer in Layer}
        self._overhead_tokens = self.view_tokens.labels("provider_overhead")
        self._overhead_below = self.view_tokens.labels("provider_overhead_negative")
        for reason in FallbackReason:
            self.fallbacks.labels(reason.name.lower())
        # Every reason at zero (rate() needs two samples: a series born at the first
        # failing disk's error would not show it), each child looked up once.
        self._errors = {r.value: self.errors.labels(r.value) for r in Reason}
        for section in SectionKind:
            if section not in VOLATILE_SECTIONS:
                self.prefix_changes.labels(section.name.lower())
        for kind in ("builtin", "model_summary"):
            for performed in ("true", "false"):
                self.compactions.labels(kind, performed)
        for outcome in ("hit", "miss", "stale", "repeat"):
            self.memo_lookups.labels(outcome)
        self._events_appended = self.events_appended.labels()
        self._bytes_appended = self.bytes_appended.labels()
        self._write_seconds = self.write_seconds.labels()
        r.register(plain)
        self._over_budget = _OverBudgetSessions(self._lock)
        r.register(self._over_budget)

    def watch_store(
        self,
        sessions: Callable[[], int],
        footprint: Callable[[], Footprint],
        bases_dropped: Mapping[str, int] | None = None,
    ) -> None:
        self.registry.register(_StoreCollector(sessions, footprint, bases_dropped or {}))

    def watch_requests(self, held: Callable[[], int]) -> None:
        """`held`: bytes of large requests calls in progress hold now (read at a scrape)."""
        self._read_at_scrape(
            "ctxcc_request_bytes_in_memory",
            "Bytes of requests of 64 KiB or more that calls in progress hold (decoded and "
            "worked on), against --max-request-bytes-in-memory.",
            held,
        )

    def watch_watch_bytes(self, held: Callable[[], int]) -> None:
        """`held`: bytes WatchSession calls hold in flight now."""
        self._read_at_scrape(
            "ctxcc_watch_bytes_in_memory",
            "Bytes WatchSession calls hold in flight (backlog pages read, messages gRPC has "
            "not yet sent), against --max-watch-bytes-in-memory.",
            held,
        )

    def watch_stream_views(self, held: Callable[[], int]) -> None:
        """`held`: bytes of the last views open CompileStreams keep now."""
        self._read_at_scrape(
            "ctxcc_stream_view_bytes",
            "Bytes of the last views open CompileStreams keep between steps (each its next "
            "step's delta base), counted whole; bounded together.",
            held,
        )

    def _read_at_scrape(self, name: str, doc: str, value: Callable[[], int]) -> None:
        Gauge(name, doc, registry=self.registry).set_function(value)

    def watch_tokenizers(self, names: Iterable[str], loaded: Callable[[], Collection[str]]) -> None:
        self.registry.register(_TokenizerCollector(names, loaded))

    def compiled(
        self,
        seconds: float,
        view: CompiledView,
        model_family: str,
        session_id: str,
        created_ns: int = 0,
    ) -> None:
        budget = view.budget
        over = view.decision is Decision.OVER_BUDGET_SEND_ANYWAY
        with self._lock:
            self._over_budget.decided(session_id, over, created_ns)
            self.compile_seconds.labels(model_family).observe(seconds)
            layers = self._layer_tokens
            for row in view.layers:
                layers[row.layer].observe(row.tokens)
            # With the layers it adds up to the estimate; negative when the provider counts
            # fewer tokens than the ledger. A histogram's _sum must only grow (Prometheus
            # takes a drop for a counter reset, and rate() of it turned an average of
            # -8,551 into +478,548): the overhead is observed as two non-negative
            # halves at every compile, so overhead - negative is its average.
            overhead = budget.provider_overhead_tokens
            self._overhead_tokens.observe(max(overhead, 0))
            self._overhead_below.observe(max(-overhead, 0))
            if budget.input_budget:
                self.utilization.labels(model_family).observe(budget.utilization)
            self._decided[view.decision].inc()
            for reason in view.fallback_reasons:
                self.fallbacks.labels(reason.name.lower()).inc()
            for section in view.changed_sections:
                self.prefix_changes.labels(section.name.lower()).inc()
            if view.tools_deferred_by_cap:
                self.tools_deferred_by_cap.labels().inc(view.tools_deferred_by_cap)

    def session_deleted(self, session_id: str, created_ns: int = 0) -> None:
        self._over_budget.forget(session_id, created_ns)

    def over_budget_restored(self, ages: Sequence[tuple[str, float]]) -> None:
        self._over_budget.restored(ages)

    def appended(self, events: int, size_bytes: int) -> None:
        with self._lock:
            self._events_appended.inc(events)
            self._bytes_appended.inc(size_bytes)

    def usage_reported(
        self, estimated: int, actual: int, model_family: str, method: str, model: str
    ) -> None:
        with self._lock:
            self.usage_reports.labels(model_family, model, method).inc()
            if actual > 0:
                err = abs(actual - estimated)
                self.estimation_error.labels(model_family, model, method).observe(err / actual)
                self.estimation_error_tokens.labels(model_family, model, method).observe(err)
                # The series exists from a label set's first report on, at zero: the
                # dashboard's share under is then 0 where no estimate fell short (not
                # absent), and rate() sees a first shortfall (a series born with it
                # would show a rate of 0).
                under = self.estimation_under.labels(model_family, model, method)
                if estimated < actual:
                    under.observe(err / actual)

    def compaction(self, kind: str, performed: bool) -> None:
        with self._lock:
            self.compactions.labels(kind, "true" if performed else "false").inc()

    def memo_used(self, outcome: str) -> None:
        with self._lock:
            self.memo_lookups.labels(outcome).inc()

    def memo_changed(self, evicted: int, size_bytes: int) -> None:
        if evicted:
            with self._lock:
                self.memo_evictions.labels().inc(evicted)
        self.memo_bytes.set(size_bytes)

    def compile_abandoned(self) -> None:
        with self._lock:
            self.abandoned.labels().inc()

    def session_expired(self) -> None:
        with self._lock:
            self.expired.labels().inc()

    def watchers_changed(self, delta: int) -> None:
        self.watchers.inc(delta)

    def expect_rpcs(self, methods: Iterable[str], codes: Iterable[str]) -> None:
        """Error series born at their first error are invisible to `rate` (it needs two
        samples); every method and code that can occur starts at zero instead."""
        codes = tuple(codes)
        for method in methods:
            self.rpcs_in_flight.labels(method)
            with self._lock:
                for code in codes:
                    self.rpc_errors.labels(method, code)

    def rpc_started(self, method: str) -> None:
        self._in_flight(method).inc()

    def rpc_done(self, method: str, code: str, seconds: float) -> None:
        self._in_flight(method).dec()
        with self._lock:
            self.rpc_seconds.labels(method, code).observe(seconds)
            if code != "OK":
                self.rpc_errors.labels(method, code).inc()

    def error_answered(self, reason: str) -> None:
        child = self._errors.get(reason)
        with self._lock:
            # Reasons come from the Reason enum; one that does not would still be counted.
            (child or self.errors.labels(reason)).inc()

    def _in_flight(self, method: str) -> Any:
        """The gauge's child, remembered: the client's lookup validates and locks each
        time. Methods are a bounded set, so is this."""
        child = self._gauges.get(method)
        if child is None:
            child = self._gauges[method] = self.rpcs_in_flight.labels(method)
        return child

    def storage_write(self, seconds: float) -> None:
        with self._lock:
            self._write_seconds.observe(seconds)
