"""The route model: what a provider counts on a route, learned online from usage reports.

    reported input tokens ~ ratio * local count + overhead

Rules this module keeps:
- The ratio (the provider's tokenizer against ours) is learned from in-session changes:
  reported change over local change between a baseline and the next report. A change
  is free of everything constant in a session (hidden system prompt, tool preamble,
  chat template), so it isolates the tokenizer. The ratio is the weighted median of
  the last `window` observations and the prior, each weighing the size of its change
  (capped at the prior's weight): a 2K-token change says more than a 300-token one,
  and no single change outweighs the prior.
- The overhead (what the provider counts that no local item explains) is learned from
  reports on requests that had no session baseline: reported - ratio * local count.
- Priors: ratio 1.0 worth `prior_weight` tokens of change; no overhead until a report.
  Before any feedback the estimate stays the local count (R-EST-2's conservatism).
- Robust: a median for the ratio (tokenizer ratios of single changes are skewed: a
  burst of code or JSON runs far above the rest); for the overhead, each report moves
  it by at most `clip` * its running spread (a Huber step). One odd report cannot
  swing either.
- Smoothed: the overhead is a running mean until `1 / alpha` reports, an exponential
  average after; the ratio forgets changes older than its window. Both follow an agent
  whose prompt or content changes over weeks.
- Bounded by counter kind: an exact tokenizer keeps the ratio near 1.0; a borrowed
  tokenizer may be off both ways; the conservative per-character estimator runs high
  on purpose, so its ratio may fall far below 1.0 once usage says so.

Pure: no I/O, no clock. The service loads the model, calls these functions, stores it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

from server.domain.catalog import ModelInfo
from server.domain.records import RouteModel


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
    # Weight of the ratio prior (1.0), in tokens of observed change; also the most a
    # single change may weigh.
    prior_weight: float = 2_000.0
    # Changes the ratio remembers.
    window: int = 32
    # Changes smaller than this (tokens) say too little about a tokenizer.
    min_delta: int = 200
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
    model: RouteModel | None, baseline: int, local_change: int, bounds: RatioBounds
) -> int:
    """A session baseline plus the local change since, in the provider's tokens."""
    return max(0, baseline + round(ratio_of(model, bounds) * local_change))


def _step(value: float, observed: float, spread: float, gain: float, clip: float) -> float:
    d = observed - value
    limit = clip * spread
    return value + gain * max(-limit, min(limit, d))


def _spread(spread: float, observed: float, value: float, cfg: LearningConfig) -> float:
    dev = min(abs(observed - value), cfg.clip * spread)
    return spread + cfg.spread_alpha * (dev - spread)


def weighted_median(pairs: tuple[tuple[float, float], ...]) -> float:
    """The lower weighted median of (value, weight) pairs."""
    ordered = sorted(pairs)
    half = sum(w for _, w in ordered) / 2
    acc = 0.0
    for value, weight in ordered:
        acc += weight
        if acc >= half:
            return value
    return 1.0


def observe_delta(
    model: RouteModel,
    local_change: int,
    reported_change: int,
    bounds: RatioBounds,
    cfg: LearningConfig,
) -> RouteModel:
    """One in-session change: reported change / local change updates the ratio."""
    if local_change < cfg.min_delta or reported_change <= 0:
        return model
    observed = bounds.clamp(reported_change / local_change)
    weight = float(min(local_change, cfg.prior_weight))
    kept = (*model.ratio_observations, (round(observed, 6), weight))[-cfg.window :]
    ratio = bounds.clamp(weighted_median(((1.0, cfg.prior_weight), *kept)))
    # The overhead was learned as reported - ratio * local: re-express it under the new
    # ratio at the typical local size of the requests it was learned from.
    shift = (ratio - ratio_of(model, bounds)) * model.full_local
    return replace(
        model,
        ratio=ratio,
        ratio_observations=kept,
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
        return replace(
            model, overhead=observed, overhead_spread=spread, full_samples=1, full_local=local
        )
    gain = max(cfg.alpha, 1.0 / (n + 1))
    spread = max(cfg.min_spread, model.overhead_spread)
    return replace(
        model,
        overhead=_step(model.overhead, observed, spread, gain, cfg.clip),
        overhead_spread=max(cfg.min_spread, _spread(spread, observed, model.overhead, cfg)),
        full_samples=n + 1,
        full_local=model.full_local + gain * (local - model.full_local),
    )
