"""The route model's fit gives bit-for-bit the (ratio, framing) of the plain algorithm:
`cfg.passes` full passes of iteratively reweighted least squares, every per-change
figure recomputed in every pass. That algorithm is frozen below as the reference; the
fit the daemon runs (constants once, a stop at a fixed point) must agree with it on
every input, in every bit, and raise what it raises."""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from dataclasses import replace

from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from server.compiler.route_model import (
    BOUNDS,
    CounterKind,
    LearningConfig,
    RatioBounds,
    fit_change,
    observe_delta,
    ratio_of,
)
from server.domain.records import RouteModel

Change = tuple[int, int, int]
CFG = LearningConfig()


# The reference: the fit and the delta learner as they were before they were made cheap.
def _ref_solve(a: list[list[float]], b: list[float]) -> tuple[float, float]:
    det = a[0][0] * a[1][1] - a[0][1] * a[1][0]
    return (
        (b[0] * a[1][1] - a[0][1] * b[1]) / det,
        (a[0][0] * b[1] - a[1][0] * b[0]) / det,
    )


def ref_fit_change(changes: tuple[Change, ...], cfg: LearningConfig) -> tuple[float, float]:
    ratio, framing = 1.0, 0.0
    for _ in range(cfg.passes):
        a = [[cfg.ratio_prior_sd**-2, 0.0], [0.0, cfg.framing_prior_sd**-2]]
        b = [cfg.ratio_prior_sd**-2, 0.0]
        for local, reported, messages in changes:
            sd = math.hypot(cfg.change_noise_tokens, cfg.change_noise_share * local)
            off = abs(reported - ratio * local - framing * messages) / sd
            w = (1.0 if off <= cfg.huber else cfg.huber / off) / (sd * sd)
            a[0][0] += w * local * local
            a[0][1] += w * local * messages
            a[1][1] += w * messages * messages
            b[0] += w * local * reported
            b[1] += w * messages * reported
        a[1][0] = a[0][1]
        ratio, framing = _ref_solve(a, b)
    return ratio, framing


def _ref_changes_of(model: RouteModel, cfg: LearningConfig) -> tuple[Change, ...]:
    if model.changes or not model.ratio_observations:
        return model.changes
    out = []
    for ratio, weight in model.ratio_observations:
        local = round(min(weight, cfg.legacy_weight_cap))
        out.append((local, round(ratio * local), 0))
    return tuple(out)


def ref_observe_delta(
    model: RouteModel, change: Change, bounds: RatioBounds, cfg: LearningConfig
) -> RouteModel:
    local, reported, messages = change
    if local <= 0 or reported <= 0 or messages < 0:
        return model
    kept = (*_ref_changes_of(model, cfg), (local, reported, messages))[-cfg.window :]
    raw_ratio, raw_framing = ref_fit_change(kept, cfg)
    ratio = bounds.clamp(raw_ratio)
    framing = min(cfg.framing_high, max(cfg.framing_low, raw_framing))
    shift = (ratio - ratio_of(model, bounds)) * model.full_local
    return replace(
        model,
        ratio=ratio,
        framing=framing,
        changes=kept,
        ratio_observations=(),
        delta_samples=model.delta_samples + 1,
        overhead=model.overhead - shift,
    )


def bits(*figures: float) -> bytes:
    """Every bit of the figures: stricter than == (it tells -0.0 from 0.0, and a NaN
    equals only the same NaN)."""
    return struct.pack(f"<{len(figures)}d", *figures)


def outcome(
    fit: Callable[[tuple[Change, ...], LearningConfig], tuple[float, float]],
    changes: tuple[Change, ...],
    cfg: LearningConfig,
) -> bytes | type[Exception]:
    """Every bit of what a fit returns, or the type of what it raises."""
    try:
        return bits(*fit(changes, cfg))
    except (ArithmeticError, ValueError) as exc:
        return type(exc)


# Changes as sessions make them: the provider counts about ratio * local + framing per
# message, with noise; some are outliers (a burst of another content kind, a glitch).
@st.composite
def session_change(draw: st.DrawFn) -> Change:
    local = draw(st.integers(1, 200_000))
    messages = draw(st.integers(0, 6))
    ratio = draw(st.floats(0.2, 3.0))
    framing = draw(st.floats(-20.0, 60.0))
    noise = draw(st.integers(-60, 60))
    outlier = draw(st.sampled_from([0, 0, 0, 0, 1])) * draw(st.integers(-200_000, 400_000))
    return local, max(1, round(ratio * local + framing * messages) + noise + outlier), messages


int64 = st.integers(-(2**63), 2**63 - 1)
wild_change = st.tuples(
    st.one_of(int64, st.integers(-(10**200), 10**200), st.integers(-3, 3)),
    st.one_of(int64, st.integers(-(10**200), 10**200), st.integers(-3, 3)),
    st.one_of(st.integers(0, 3), int64),
)
# Past a float's range: the int does not convert, both must raise the same.
unconvertible = st.integers(10**309, 10**330) | st.integers(-(10**330), -(10**309))


@st.composite
def change_lists(draw: st.DrawFn) -> list[Change]:
    """Mostly sessions' changes, some wild ones; one in eight lists has a change with
    a figure no float holds, somewhere."""
    out = draw(st.lists(session_change() | session_change() | wild_change, max_size=40))
    if draw(st.integers(0, 7)) == 0:
        bad = list(draw(session_change()))
        bad[draw(st.integers(0, 2))] = draw(unconvertible)
        out.insert(draw(st.integers(0, len(out))), (bad[0], bad[1], bad[2]))
    return out


configs = st.builds(
    LearningConfig,
    ratio_prior_sd=st.sampled_from([0.3, 0.05, 1.0]),
    framing_prior_sd=st.sampled_from([20.0, 1.0, 1e6]),
    change_noise_tokens=st.sampled_from([30.0, 30.0, 1.0, 0.0]),
    change_noise_share=st.sampled_from([0.05, 0.0, 0.5]),
    window=st.integers(1, 40),
    huber=st.sampled_from([2.5, 0.5, 1.0, 10.0, 1e-9]),
    passes=st.integers(0, 12),
)
big = settings(max_examples=1_000, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@big
@given(change_lists(), st.one_of(st.just(CFG), configs))
@example([], CFG)
@example([(150, 300, 2)], CFG)  # a single change
@example([(2_000, 1_000, 0)] * 32, CFG)  # zero messages throughout: framing has its prior only
@example([(3_000, 1_800, 2)] * 31 + [(30_000, 72_000, 2)], CFG)  # an outlier at the window's end
@example([(2**63 - 1, 2**63 - 1, 2**63 - 1)] * 32, CFG)
@example([(10**200, 1, 0), (1, 10**200, 3)], CFG)  # squares past a float's range: NaN
@example([(0, 0, 0)], replace(CFG, change_noise_tokens=0.0))  # zero noise: division by zero
@example([(5, 1, 0)], replace(CFG, ratio_prior_sd=1e-160))  # a prior weight past a float's range
# No float holds the report, and the noise is zero: the conversion raises first.
@example([(1, 10**309, 0)], replace(CFG, change_noise_tokens=0.0, change_noise_share=0.0))
def test_fit_is_bit_for_bit_the_reference(changes: list[Change], cfg: LearningConfig) -> None:
    kept = tuple(changes)[-cfg.window :]
    want = outcome(ref_fit_change, kept, cfg)
    assert outcome(fit_change, kept, cfg) == want
    # Both ways to the answer are met: a fixed point before the last pass, and none.
    shorter = outcome(ref_fit_change, kept, replace(cfg, passes=max(0, cfg.passes - 1)))
    if not isinstance(want, bytes):
        event("raises")
    else:
        event("settles before the last pass" if shorter == want else "moves in the last pass")


legacy = st.lists(
    st.tuples(st.floats(0.01, 4.0), st.floats(1.0, 10_000.0)), min_size=1, max_size=40
)


@big
@given(
    st.one_of(
        st.builds(
            lambda c: RouteModel("r", changes=tuple(c)), st.lists(session_change(), max_size=40)
        ),
        st.builds(lambda o: RouteModel("r", ratio=0.7, ratio_observations=tuple(o)), legacy),
    ),
    # Now and then a change that teaches nothing (nothing entered, the report shrank).
    st.lists(session_change() | st.tuples(*[st.integers(-3, 3)] * 3), min_size=1, max_size=40),
    st.sampled_from(list(CounterKind)),
    st.sampled_from([CFG, replace(CFG, window=1), replace(CFG, window=5)]),
    st.floats(0.0, 50_000.0),
)
def test_learning_from_changes_is_bit_for_bit_the_reference(
    start: RouteModel,
    steps: list[Change],
    kind: CounterKind,
    cfg: LearningConfig,
    full_local: float,
) -> None:
    """Report after report, over a full window and past it, from a fresh model or one
    whose changes are seeded from ratio observations stored before framing existed."""
    bounds = BOUNDS[kind]
    new = ref = replace(start, full_local=full_local, overhead=1_000.0)
    for step in steps:
        new = observe_delta(new, step, bounds, cfg)
        ref = ref_observe_delta(ref, step, bounds, cfg)
        assert new.changes == ref.changes and new.delta_samples == ref.delta_samples
        assert new.ratio_observations == ref.ratio_observations
        assert bits(new.ratio, new.framing, new.overhead) == bits(
            ref.ratio, ref.framing, ref.overhead
        )
        assert new == ref
