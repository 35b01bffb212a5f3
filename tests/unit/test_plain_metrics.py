"""Plain counters and histograms (server/adapters/plain_metrics.py) expose what
prometheus-client's own Counter and Histogram expose for the same observations, in both
exposition formats, and lose no update when threads record and scrape at once."""

from __future__ import annotations

import re
import sys
import threading
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from server.adapters.metrics import PrometheusTelemetry
from server.adapters.plain_metrics import PlainMetrics
from server.domain.errors import Reason

_BUCKETS = (0.5, 1, 256, 1024, 1048576)
# Bounds exactly, between them, below the first (negative too), above the last, infinity.
_VALUES = (0.5, 1, 0.2, -40, 256, 257, 1024.0, 3e6, float("inf"), 0, 1048576, 7)


def _masked(text: bytes) -> list[str]:
    """Lines in order, prometheus-client's `_created` samples (and their HELP and TYPE
    lines) left out: the plain metrics expose none."""
    return [line for line in text.decode().splitlines() if "_created" not in line]


@pytest.fixture
def twins() -> Iterator[tuple[CollectorRegistry, CollectorRegistry, PlainMetrics]]:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    plain = PlainMetrics()
    ours.register(plain)
    yield ours, theirs, plain


def test_the_exposition_is_prometheus_clients_for_the_same_observations(
    twins: tuple[CollectorRegistry, CollectorRegistry, PlainMetrics],
) -> None:
    ours, theirs, plain = twins
    h = plain.histogram("x_tokens", "Tokens.", ["layer"], _BUCKETS)
    h0 = plain.histogram("x_seconds", "Seconds.", (), _BUCKETS)
    c = plain.counter("x_events_total", "Events.", ["kind", "ok"])
    c0 = plain.counter("x_bytes_total", "Bytes.")
    ref_h = Histogram("x_tokens", "Tokens.", ["layer"], buckets=_BUCKETS, registry=theirs)
    ref_h0 = Histogram("x_seconds", "Seconds.", buckets=_BUCKETS, registry=theirs)
    ref_c = Counter("x_events_total", "Events.", ["kind", "ok"], registry=theirs)
    ref_c0 = Counter("x_bytes_total", "Bytes.", registry=theirs)
    for i, v in enumerate(_VALUES):
        layer = ("pinned", "history")[i % 2]
        with plain.lock:
            h.labels(layer).observe(v)
            h0.labels().observe(v / 1000)
            c.labels(layer, str(i % 3 == 0)).inc(i + 0.5)
            c0.labels().inc(i)
        ref_h.labels(layer).observe(v)
        ref_h0.observe(v / 1000)
        ref_c.labels(layer, str(i % 3 == 0)).inc(i + 0.5)
        ref_c0.inc(i)
    with plain.lock:
        h.labels("empty")  # a series made but never observed
    ref_h.labels("empty")
    assert b"_created" not in generate_latest(ours)
    assert b"_created" not in generate_openmetrics(ours)  # type: ignore[no-untyped-call]
    assert _masked(generate_latest(ours)) == _masked(generate_latest(theirs))
    assert _masked(generate_openmetrics(ours)) == _masked(generate_openmetrics(theirs))  # type: ignore[no-untyped-call]


def test_a_wrong_number_of_label_values_is_refused() -> None:
    plain = PlainMetrics()
    h = plain.histogram("x", "X.", ["a", "b"], _BUCKETS)
    with pytest.raises(ValueError, match="takes labels"):
        h.labels("only one")


def test_threads_recording_while_scraping_lose_no_update() -> None:
    """Steps record from the event loop and from storage and compute threads; Prometheus
    scrapes meanwhile. Every observation is counted once, in its bucket and its sum."""
    telemetry = PrometheusTelemetry("test")
    per_thread, threads = 4_000, 4
    errors: list[BaseException] = []

    def record(k: int) -> None:
        try:
            for i in range(per_thread):
                telemetry.storage_write(0.002 if (i + k) % 2 else 0.3)
                telemetry.memo_used("hit")
                telemetry.appended(1, 3)
                # New series while a scrape walks them (label values are bounded sets in
                # the daemon; here every thread adds its own).
                telemetry.rpc_done(f"m{k}-{i % 100}", "OK", 0.001)
        except BaseException as exc:  # re-raised below
            errors.append(exc)

    def scrape() -> None:
        try:
            for _ in range(50):
                generate_latest(telemetry.registry)
        except BaseException as exc:
            errors.append(exc)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # hand the GIL over as often as possible
    try:
        workers = [threading.Thread(target=record, args=(k,)) for k in range(threads)]
        workers.append(threading.Thread(target=scrape))
        for t in workers:
            t.start()
        for t in workers:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert not errors, errors
    text = generate_latest(telemetry.registry).decode()

    def value(series: str) -> float:
        found = re.search(rf"^{re.escape(series)} (\S+)$", text, re.M)
        assert found is not None, series
        return float(found.group(1))

    n = per_thread * threads
    assert value("ctxcc_storage_write_duration_seconds_count") == n
    assert value('ctxcc_storage_write_duration_seconds_bucket{le="0.0025"}') == n / 2
    assert value("ctxcc_storage_write_duration_seconds_sum") == pytest.approx(n / 2 * 0.302)
    assert value('ctxcc_compile_memo_lookups_total{outcome="hit"}') == n
    assert value("ctxcc_events_appended_total") == n
    assert value("ctxcc_appended_bytes_total") == 3 * n
    assert value('ctxcc_rpc_duration_seconds_count{code="OK",method="m3-99"}') == n / 4 / 100


def test_every_error_reason_has_a_series_at_zero_from_the_start() -> None:
    # rate() needs two samples: a series born at a failing disk's first error would keep
    # CtxccServerErrors quiet through it.
    telemetry = PrometheusTelemetry("test")
    text = generate_latest(telemetry.registry).decode()
    for reason in Reason:
        assert f'ctxcc_errors_total{{reason="{reason.value}"}} 0.0' in text, reason
    telemetry.error_answered("STORAGE_FAILURE")
    text = generate_latest(telemetry.registry).decode()
    assert 'ctxcc_errors_total{reason="STORAGE_FAILURE"} 1.0' in text
    assert 'ctxcc_errors_total{reason="SHUTTING_DOWN"} 0.0' in text
