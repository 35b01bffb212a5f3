"""Token budget (R-BUD-1..5). Local scheduling parameters, not provider claims.

- Known window, no usage yet: reserve a quarter of the window for output, at most 16K.
- Known window, after real usage: reserve twice the last output, clamped to 1K..8K.
- Whatever the last output, the reserve after usage never takes more than half of a
  known window: below 16K windows the 1K..8K clamp alone could reserve all of it (an 8K
  window after a 4K reply), leaving the input a budget of 0 (projection 7 on).
- A configured max-input cap smaller than window - reserve is the stricter cap.
- Unknown window: history high watermark 32K, output reserve 16K, usage or not (the
  source text gives the dynamic reserve for a known window only: with the window a
  guess, 8K at most would leave the model less room than the guess assumed).
- Never reject on an estimate (R-EST-4): the decision only advises.
"""

from __future__ import annotations

from dataclasses import dataclass

from server.compiler.view import Budget, Decision, EstimateMethod


@dataclass(frozen=True, slots=True)
class BudgetConfig:
    first_reserve_fraction: float = 0.25
    first_reserve_max: int = 16_384
    dynamic_reserve_factor: int = 2
    dynamic_reserve_min: int = 1_024
    dynamic_reserve_max: int = 8_192
    unknown_history_watermark: int = 32_768
    unknown_output_reserve: int = 16_384
    # History above this share of the input budget recommends compaction.
    history_watermark_fraction: float = 0.8
    # An estimate above this share of the input budget recommends compaction.
    compact_threshold: float = 0.85


@dataclass(frozen=True, slots=True)
class ModelLimits:
    """What is known of the model: 0 means unknown / none."""

    context_window: int = 0
    max_output_tokens: int = 0
    max_input_tokens: int = 0
    accepts_images: bool = True


def output_reserve(
    limits: ModelLimits,
    last_output_tokens: int | None,
    cfg: BudgetConfig,
    *,
    dynamic_when_unknown: bool = False,
    half_window: bool = True,
) -> int:
    """`dynamic_when_unknown`: the reserve of an unknown window follows the last output
    too, as compiles recorded before projection 5 had it (rebuilt so). `half_window`
    False: the reserve after usage may take a whole small window, as compiles recorded
    before projection 7 had it (rebuilt so)."""
    known = limits.context_window > 0
    if last_output_tokens is not None and (known or dynamic_when_unknown):
        wanted = cfg.dynamic_reserve_factor * last_output_tokens
        reserve = max(cfg.dynamic_reserve_min, min(cfg.dynamic_reserve_max, wanted))
        if known and half_window:
            reserve = min(reserve, limits.context_window // 2)
    elif known:
        reserve = min(
            int(limits.context_window * cfg.first_reserve_fraction), cfg.first_reserve_max
        )
    else:
        reserve = cfg.unknown_output_reserve
    if limits.max_output_tokens > 0:
        # Reserving more than the model can ever write wastes window.
        reserve = min(reserve, limits.max_output_tokens)
    return reserve


def input_budget(limits: ModelLimits, reserve: int, cfg: BudgetConfig) -> int:
    if limits.context_window > 0:
        budget = max(0, limits.context_window - reserve)
    else:
        budget = cfg.unknown_history_watermark + reserve
    if limits.max_input_tokens > 0:
        budget = min(budget, limits.max_input_tokens)
    return budget


def history_watermark(limits: ModelLimits, budget: int, cfg: BudgetConfig) -> int:
    if limits.context_window <= 0:
        return cfg.unknown_history_watermark
    return int(budget * cfg.history_watermark_fraction)


def judge(
    limits: ModelLimits,
    last_output_tokens: int | None,
    estimate: int,
    method: EstimateMethod,
    history_tokens: int,
    cfg: BudgetConfig,
    baseline_tokens: int = 0,
    ledger_tokens: int | None = None,
    *,
    dynamic_when_unknown: bool = False,
    half_window: bool = True,
) -> tuple[Budget, Decision]:
    reserve = output_reserve(
        limits,
        last_output_tokens,
        cfg,
        dynamic_when_unknown=dynamic_when_unknown,
        half_window=half_window,
    )
    budget = input_budget(limits, reserve, cfg)
    watermark = history_watermark(limits, budget, cfg)
    utilization = estimate / budget if budget else 0.0
    if budget and estimate > budget:
        decision = Decision.OVER_BUDGET_SEND_ANYWAY
    elif history_tokens > watermark or utilization > cfg.compact_threshold:
        decision = Decision.COMPACT_RECOMMENDED
    else:
        decision = Decision.OK
    return (
        Budget(
            context_window=limits.context_window,
            output_reserve=reserve,
            input_budget=budget,
            history_high_watermark=watermark,
            estimated_input_tokens=estimate,
            estimate_method=method,
            utilization=round(utilization, 6),
            baseline_tokens=baseline_tokens,
            window_unknown=limits.context_window <= 0,
            ledger_tokens=estimate if ledger_tokens is None else ledger_tokens,
        ),
        decision,
    )
