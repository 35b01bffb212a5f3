"""The route model: what a provider counts on a route, learned online from usage reports.

    reported input tokens ~ ratio * local count + overhead

Rules this module keeps:
- Ratio and framing (the provider's tokenizer against ours, and what it counts per
  message beyond our framing: chat-template tokens, tool-call blocks) are learned from
  in-session changes: between a baseline and the next report, reported change ~
  ratio * local change + framing * messages added. A change is free of everything
  constant in a session (hidden system prompt, tool preamble), so it isolates them.
- Both come from one fit over the last `window` changes: least squares with priors
  (ratio 1.0, framing 0), each change weighed by how noisy a change of its size is (a
  fixed part for what no count sees, plus a share of the change: content kinds
  tokenize differently), and Huber weights so that one odd change cannot swing them.
- The overhead (what the provider counts that no local item explains) is learned from
  reports on requests that had no session baseline: reported - ratio * local count.
- Priors: ratio 1.0, framing 0; no overhead until a report. Before any feedback the
  estimate stays the local count (R-EST-2's conservatism).
- Robust: Huber weights for the fit; for the overhead, each report moves it by at most
  `clip` * its running spread (a Huber step).
- Smoothed: the overhead is a running mean until `1 / alpha` reports, an exponential
  average after; the fit forgets changes older than its window. Both follow an agent
  whose prompt or content changes over weeks.
- Bounded by counter kind: an exact tokenizer keeps the ratio near 1.0; a borrowed
  tokenizer may be off both ways; the conservative per-character estimator runs high
  on purpose, so its ratio may fall far below 1.0 once usage says so.

Pure: no I/O, no clock. The service loads the model, calls these functions, stores it.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from server.domain.catalog import ModelInfo
from server.domain.records import RouteModel
from server.domain.replacing import replaced


class CounterKind(enum.Enum):
    # The provider's own tokenizer (o200k_base for GPT-4o/o-series/GPT-4.1/GPT-5).
    EXACT = "exact"
    # Another family's tokenizer times a catalog factor.
    SCALED = "scaled"
    # The conservative per-character estimator (R-EST-2).
    CONSERVATIVE = "conservative"


@dataclass(frozen=True, slots=True)
class RatioBounds:
    low: float
    high: float

    def clamp(self, value: float) -> float:
        return min(self.high, max(self.low, value))


BOUNDS = {
    # Message framing and provider-side normalisation still differ a little.
    CounterKind.EXACT: RatioBounds(0.9, 1.1),
    # Borrowed tokenizers disagree with the real one by up to about 2* on some content.
    CounterKind.SCALED: RatioBounds(0.4, 2.5),
    # Leans high by design (up to ~2* on English prose); never learn it below a third.
    CounterKind.CONSERVATIVE: RatioBounds(0.3, 1.5),
}


def counter_kind(info: ModelInfo) -> CounterKind:
    """o200k_base and cl100k_base are OpenAI's own tokenizers; for any other family
    they stand in for a tokenizer we do not have, and so does the Claude vocabulary
    Anthropic published (it predates Claude 3)."""
    if info.tokenizer not in {"o200k", "cl100k", "claude"}:
        return CounterKind.CONSERVATIVE
    if info.family == "openai" and info.token_factor == 1.0:
        return CounterKind.EXACT
    return CounterKind.SCALED


@dataclass(frozen=True, slots=True)
class LearningConfig:
    # Prior spread of the ratio around 1.0, and of the framing around 0 (tokens/message).
    ratio_prior_sd: float = 0.3
    framing_prior_sd: float = 20.0
    # Noise of one change: tokens no local count sees, plus this share of the change.
    change_noise_tokens: float = 30.0
    change_noise_share: float = 0.05
    # Changes the fit remembers, and the Huber cut (in noise units) and passes.
    window: int = 32
    huber: float = 2.5
    passes: int = 6
    # Framing is kept within these bounds (tokens per message).
    framing_low: float = -50.0
    framing_high: float = 200.0
    # Weight, in tokens of change, of one pre-framing observation (reported / local).
    legacy_weight_cap: float = 2_000.0
    # Smoothing of the overhead once 1 / alpha reports have been seen.
    alpha: float = 0.5
    # An overhead step is cut to this many running spreads (Huber); spread smoothing.
    clip: float = 2.5
    spread_alpha: float = 0.2
    # The overhead's first spread: this share of its first value, at least min_spread.
    overhead_spread_share: float = 0.25
    min_spread: float = 32.0


def learned(model: RouteModel | None) -> bool:
    """True when usage on the route taught the model anything."""
    return model is not None and (model.full_samples > 0 or model.delta_samples > 0)


def ratio_of(model: RouteModel | None, bounds: RatioBounds) -> float:
    return 1.0 if model is None else bounds.clamp(model.ratio)


def predict_full(model: RouteModel | None, local: int, bounds: RatioBounds) -> int:
    """The whole request from the route model: ratio * local count + overhead."""
    if not learned(model) or model is None:
        return local
    return max(0, round(ratio_of(model, bounds) * local + model.overhead))


def predict_delta(
    model: RouteModel | None,
    baseline: int,
    local_change: int,
    message_change: int,
    bounds: RatioBounds,
) -> int:
    """A session baseline plus the change since, in the provider's tokens."""
    framing = 0.0 if model is None else model.framing
    change = ratio_of(model, bounds) * local_change + framing * message_change
    return max(0, baseline + round(change))


def _step(value: float, observed: float, spread: float, gain: float, clip: float) -> float:
    d = observed - value
    limit = clip * spread
    return value + gain * max(-limit, min(limit, d))


def _spread(spread: float, observed: float, value: float, cfg: LearningConfig) -> float:
    dev = min(abs(observed - value), cfg.clip * spread)
    return spread + cfg.spread_alpha * (dev - spread)


def _solve(a00: float, a01: float, a11: float, b0: float, b1: float) -> tuple[float, float]:
    """The symmetric 2x2 normal equations [[a00, a01], [a01, a11]] x = [b0, b1]."""
    det = a00 * a11 - a01 * a01
    return (b0 * a11 - a01 * b1) / det, (a00 * b1 - a01 * b0) / det


def fit_change(
    changes: tuple[tuple[int, int, int], ...], cfg: LearningConfig
) -> tuple[float, float]:
    """(ratio, framing) from (local, reported, messages) changes: iteratively reweighted
    least squares with the priors as two extra observations.

    It runs on the event loop for every usage report, so it costs what it must and no
    more, with bit-for-bit the answer of `cfg.passes` full passes:
    - what a change contributes that no pass changes (its floats, its noise) is computed
      once, in the order the first pass meets it, so that a figure no float holds, or a
      zero noise, raises what a pass would;
    - a product is reused where the left-to-right order of w * local * x makes it the
      same: (w * local) * x;
    - a pass whose weights all equal (==) the previous pass's sums the same products in
      the same order as that pass did, so it would return the same solution, and so
      would every pass after it: the fit stops there. == holds for 0.0 and -0.0, but
      their products add the same to a sum that starts at +0.0 or a positive prior
      (such a sum never becomes -0.0), so == weights give identical sums; a NaN weight
      never equals, so it runs on.
    """
    ratio, framing = 1.0, 0.0
    if cfg.passes <= 0:
        return ratio, framing
    huber, noise, share = cfg.huber, cfg.change_noise_tokens, cfg.change_noise_share
    # Normal equations start from the priors, which keep them regular with one change.
    prior_ratio = cfg.ratio_prior_sd**-2
    prior_framing = cfg.framing_prior_sd**-2
    # Per change: local, reported, messages as the arithmetic converts them, the noise
    # sd and its square, and the weight of a change within the Huber cut.
    rows = []
    for local, reported, messages in changes:
        sd = math.hypot(noise, share * local)
        x, y, m = float(local), float(reported), float(messages)
        sd2 = sd * sd
        rows.append((x, y, m, sd, sd2, 1.0 / sd2))
    last: list[float] | None = None
    for _ in range(cfg.passes):
        weights = [
            full if (off := abs(y - ratio * x - framing * m) / sd) <= huber else huber / off / sd2
            for x, y, m, sd, sd2, full in rows
        ]
        if weights == last:
            break
        last = weights
        a00, a01, a11, b0, b1 = prior_ratio, 0.0, prior_framing, prior_ratio, 0.0
        for w, (x, y, m, _, _, _) in zip(weights, rows, strict=True):
            wx, wm = w * x, w * m
            a00 += wx * x
            a01 += wx * m
            a11 += wm * m
            b0 += wx * y
            b1 += wm * y
        ratio, framing = _solve(a00, a01, a11, b0, b1)
    return ratio, framing


def _changes_of(model: RouteModel, cfg: LearningConfig) -> tuple[tuple[int, int, int], ...]:
    """The model's changes; a model learned before framing existed seeds them with its
    ratio observations (no message counts)."""
    if model.changes or not model.ratio_observations:
        return model.changes
    out = []
    for ratio, weight in model.ratio_observations:
        local = round(min(weight, cfg.legacy_weight_cap))
        out.append((local, round(ratio * local), 0))
    return tuple(out)


def observe_delta(
    model: RouteModel,
    change: tuple[int, int, int],
    bounds: RatioBounds,
    cfg: LearningConfig,
) -> RouteModel:
    """One in-session change (local change, reported change, messages added) refits
    ratio and framing."""
    local, reported, messages = change
    if local <= 0 or reported <= 0 or messages < 0:
        return model  # nothing entered, or the report shrank: no tokenizer to learn
    kept = (*_changes_of(model, cfg), (local, reported, messages))[-cfg.window :]
    raw_ratio, raw_framing = fit_change(kept, cfg)
    ratio = bounds.clamp(raw_ratio)
    framing = min(cfg.framing_high, max(cfg.framing_low, raw_framing))
    # The overhead was learned as reported - ratio * local: re-express it under the new
    # ratio at the typical local size of the requests it was learned from.
    shift = (ratio - ratio_of(model, bounds)) * model.full_local
    return replaced(
        model,
        ratio=ratio,
        framing=framing,
        changes=kept,
        ratio_observations=(),
        delta_samples=model.delta_samples + 1,
        overhead=model.overhead - shift,
    )


def observe_full(
    model: RouteModel, local: int, reported: int, bounds: RatioBounds, cfg: LearningConfig
) -> RouteModel:
    """A report on a request without a session baseline updates the overhead."""
    observed = reported - ratio_of(model, bounds) * local
    n = model.full_samples
    if n == 0:
        spread = max(cfg.min_spread, cfg.overhead_spread_share * abs(observed))
        return replaced(
            model, overhead=observed, overhead_spread=spread, full_samples=1, full_local=local
        )
    gain = max(cfg.alpha, 1.0 / (n + 1))
    spread = max(cfg.min_spread, model.overhead_spread)
    return replaced(
        model,
        overhead=_step(model.overhead, observed, spread, gain, cfg.clip),
        overhead_spread=max(cfg.min_spread, _spread(spread, observed, model.overhead, cfg)),
        full_samples=n + 1,
        full_local=model.full_local + gain * (local - model.full_local),
    )
