"""The route model's math: priors, robustness, smoothing, the ratio and framing fit, and
bounds by counter kind."""

from __future__ import annotations

import pytest

from server.compiler.route_model import (
    BOUNDS,
    CounterKind,
    LearningConfig,
    counter_kind,
    learned,
    observe_delta,
    observe_full,
    predict_delta,
    predict_full,
)
from server.domain.catalog import ModelInfo
from server.domain.records import RouteModel

CFG = LearningConfig()
SCALED = BOUNDS[CounterKind.SCALED]


def test_before_any_report_the_estimate_is_the_local_count() -> None:
    assert not learned(None)
    assert predict_full(None, 1_234, SCALED) == 1_234
    assert predict_full(RouteModel("r"), 1_234, SCALED) == 1_234
    assert predict_delta(None, 10_000, 500, 2, SCALED) == 10_500


def test_overhead_is_learned_from_the_first_report_and_predicts_a_new_session() -> None:
    m = observe_full(RouteModel("r"), 400, 15_400, SCALED, CFG)
    assert learned(m) and m.full_samples == 1
    assert m.overhead == pytest.approx(15_000)
    assert predict_full(m, 1_000, SCALED) == 16_000


def test_one_odd_report_cannot_swing_the_overhead() -> None:
    m = RouteModel("r")
    for local, reported in ((400, 12_400), (500, 12_450), (300, 12_350), (450, 12_500)):
        m = observe_full(m, local, reported, SCALED, CFG)
    settled = m.overhead
    assert settled == pytest.approx(12_000, abs=100)
    odd = observe_full(m, 400, 80_400, SCALED, CFG)  # a glitch: 80K on the same request
    assert odd.overhead - settled < 0.2 * settled
    # A sustained change (the agent's prompt grew) is followed within a few reports.
    for _ in range(6):
        m = observe_full(m, 400, 18_400, SCALED, CFG)
    assert m.overhead == pytest.approx(18_000, rel=0.05)


def test_ratio_and_framing_are_fitted_from_changes() -> None:
    """Changes of a provider that counts 0.6x our tokens plus 15 tokens per message:
    a ratio alone cannot explain both small and large changes; the fit finds both."""
    m = RouteModel("r")
    sizes = (120, 3_000, 250, 1_800, 90, 6_000, 400, 2_200)
    for local in sizes:
        m = observe_delta(m, (local, round(0.6 * local + 15 * 2), 2), SCALED, CFG)
    assert m.ratio == pytest.approx(0.6, abs=0.01)
    assert m.framing == pytest.approx(15, abs=4)  # the prior (0) holds a little
    assert m.delta_samples == len(sizes) and len(m.changes) == len(sizes)
    assert predict_delta(m, 10_000, 1_000, 2, SCALED) == pytest.approx(10_630, abs=10)
    # The window keeps the latest changes only.
    assert len(observe_delta(m, (500, 330, 2), SCALED, LearningConfig(window=3)).changes) == 3


def test_one_odd_change_cannot_swing_a_learned_ratio() -> None:
    m = RouteModel("r")
    for _ in range(4):
        m = observe_delta(m, (3_000, 1_800, 2), SCALED, CFG)  # the provider counts 0.6x
    assert m.ratio == pytest.approx(0.6, abs=0.02)
    # A burst of JSON at 2.4x among 0.6x changes barely moves it (Huber weights).
    burst = observe_delta(m, (30_000, 72_000, 2), SCALED, CFG)
    assert burst.ratio == pytest.approx(0.6, abs=0.05)
    # Nothing entered, or a shrinking report: nothing to learn.
    assert observe_delta(m, (0, 10, 0), SCALED, CFG) == m
    assert observe_delta(m, (5_000, -20, 2), SCALED, CFG) == m


def test_the_prior_holds_a_small_first_change() -> None:
    """One small change says little about a tokenizer: the priors (ratio 1, framing 0)
    keep most of their hold; a large one is believed (within the kind's bounds)."""
    small = observe_delta(RouteModel("r"), (150, 300, 2), SCALED, CFG)
    assert 1.0 <= small.ratio < 1.5 and 0 <= small.framing < 40
    large = observe_delta(RouteModel("r"), (20_000, 100_000, 2), SCALED, CFG)
    assert large.ratio == SCALED.high


def test_models_learned_before_framing_seed_the_fit() -> None:
    """A stored model from before framing existed keeps what its ratio observations say."""
    old = RouteModel("r", ratio=0.7, ratio_observations=((0.7, 2_000.0),) * 8, delta_samples=8)
    m = observe_delta(old, (1_000, 700, 0), SCALED, CFG)
    assert m.ratio == pytest.approx(0.7, abs=0.01)
    assert m.ratio_observations == () and len(m.changes) == 9


def test_ratio_bounds_follow_the_counter_kind() -> None:
    exact, conservative = BOUNDS[CounterKind.EXACT], BOUNDS[CounterKind.CONSERVATIVE]
    m = RouteModel("r")
    for _ in range(5):
        m = observe_delta(m, (2_000, 1_000, 0), exact, CFG)
    assert m.ratio == pytest.approx(exact.low)  # an exact tokenizer stays near 1.0
    c = RouteModel("r")
    for _ in range(5):
        c = observe_delta(c, (2_000, 1_200, 0), conservative, CFG)
    # The conservative estimator runs high; once usage says so its ratio may fall far.
    assert c.ratio == pytest.approx(0.6, abs=0.01)
    assert conservative.low < 0.6 < exact.low


@pytest.mark.parametrize(
    ("info", "kind"),
    [
        (ModelInfo("gpt-4o", "openai", tokenizer="o200k"), CounterKind.EXACT),
        (ModelInfo("gpt-4", "openai", tokenizer="cl100k"), CounterKind.EXACT),
        (
            ModelInfo("claude", "anthropic", tokenizer="cl100k", token_factor=1.13),
            CounterKind.SCALED,
        ),
        (ModelInfo("llama", "llama", tokenizer="cl100k", token_factor=1.02), CounterKind.SCALED),
        (ModelInfo("mistral", "mistral", tokenizer="charclass"), CounterKind.CONSERVATIVE),
        (ModelInfo("", "other"), CounterKind.CONSERVATIVE),
    ],
)
def test_counter_kind(info: ModelInfo, kind: CounterKind) -> None:
    assert counter_kind(info) is kind
