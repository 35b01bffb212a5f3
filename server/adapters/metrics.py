"""Prometheus metrics on a registry of their own (never the global one), built by the
composition root and served by prometheus-client's HTTP server.

Labels are bounded: model family, layer, decision, method, RPC method and code. No
session ids ever become labels.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info

from server.compiler.view import CompiledView

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


class PrometheusTelemetry:
    def __init__(self, version: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        Info("ctxcc_build", "Build information of the ctxcc daemon.", registry=r).info(
            {"version": version}
        )
        self.compile_seconds = Histogram(
            "ctxcc_compile_duration_seconds",
            "Time to compile one view, storage reads included.",
            ["model_family"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.view_tokens = Histogram(
            "ctxcc_view_tokens",
            "Estimated tokens of compiled views per layer.",
            ["layer"],
            buckets=(256, 1024, 4096, 16384, 32768, 65536, 131072, 262144, 1048576),
            registry=r,
        )
        self.decisions = Counter(
            "ctxcc_compile_decisions_total", "Compile decisions.", ["decision"], registry=r
        )
        self.events_appended = Counter(
            "ctxcc_events_appended_total", "Events appended to session logs.", registry=r
        )
        self.bytes_appended = Counter(
            "ctxcc_appended_bytes_total", "Bytes of events appended.", registry=r
        )
        self.usage_reports = Counter(
            "ctxcc_usage_reports_total", "Usage reports matched to compiles.", registry=r
        )
        self.estimation_error = Histogram(
            "ctxcc_estimation_error_ratio",
            "Absolute relative estimation error |actual - estimate| / actual per usage report.",
            ["model_family", "method"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0),
            registry=r,
        )
        self.compactions = Counter(
            "ctxcc_compactions_total",
            "Compactions recommended (performed=false) and performed, by kind.",
            ["kind", "performed"],
            registry=r,
        )
        self.watchers = Gauge("ctxcc_watchers", "Open WatchSession streams.", registry=r)
        self.rpc_seconds = Histogram(
            "ctxcc_rpc_duration_seconds",
            "RPC latency by method and status code.",
            ["method", "code"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )

    def compiled(self, seconds: float, view: CompiledView, model_family: str) -> None:
        self.compile_seconds.labels(model_family).observe(seconds)
        for row in view.layers:
            self.view_tokens.labels(row.layer.name.lower()).observe(row.tokens)
        self.decisions.labels(view.decision.name.lower()).inc()

    def appended(self, events: int, size_bytes: int) -> None:
        self.events_appended.inc(events)
        self.bytes_appended.inc(size_bytes)

    def usage_reported(self, estimated: int, actual: int, model_family: str, method: str) -> None:
        self.usage_reports.inc()
        if actual > 0:
            err = abs(actual - estimated) / actual
            self.estimation_error.labels(model_family, method).observe(err)

    def compaction(self, kind: str, performed: bool) -> None:
        self.compactions.labels(kind, "true" if performed else "false").inc()

    def watchers_changed(self, delta: int) -> None:
        self.watchers.inc(delta)

    def rpc_done(self, method: str, code: str, seconds: float) -> None:
        self.rpc_seconds.labels(method, code).observe(seconds)
