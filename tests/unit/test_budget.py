"""R-BUD-1..5 with numbers."""

from __future__ import annotations

import pytest

from server.compiler.budget import BudgetConfig, ModelLimits, input_budget, judge, output_reserve
from server.compiler.view import Decision, EstimateMethod

CFG = BudgetConfig()


@pytest.mark.parametrize(
    ("window", "last_output", "expected"),
    [
        (200_000, None, 16_384),  # R-BUD-1: a quarter, capped at 16K
        (32_768, None, 8_192),  # a quarter of 32K
        (8_000, None, 2_000),
        (200_000, 300, 1_024),  # R-BUD-2: 2 x 300 = 600, clamped up to 1K
        (200_000, 3_000, 6_000),
        (200_000, 6_000, 8_192),  # 12K clamped down to 8K
        (0, None, 16_384),  # R-BUD-4: unknown window
    ],
)
def test_output_reserve(window: int, last_output: int | None, expected: int) -> None:
    assert output_reserve(ModelLimits(context_window=window), last_output, CFG) == expected


@pytest.mark.parametrize("last_output", [300, 3_000, 6_000])
def test_unknown_window_keeps_its_reserve_after_usage(last_output: int) -> None:  # R-BUD-4
    """The dynamic reserve (R-BUD-2) is a known window's: an unknown one keeps ~16K, and
    with it the input budget its 32K watermark implies, whatever the model last wrote."""
    budget, _ = judge(ModelLimits(), last_output, 10_000, EstimateMethod.BASELINE_DELTA, 100, CFG)
    first, _ = judge(ModelLimits(), None, 10_000, EstimateMethod.FULL, 100, CFG)
    assert budget.output_reserve == first.output_reserve == 16_384
    assert budget.input_budget == first.input_budget == 32_768 + 16_384
    # The model's own output limit still bounds it.
    small = ModelLimits(max_output_tokens=4_096)
    assert output_reserve(small, last_output, CFG) == 4_096


def test_unknown_window_reserve_of_compiles_before_projection_5() -> None:
    """Compiles recorded at projection 4 or before followed the last output there too,
    and are rebuilt so."""
    old, _ = judge(
        ModelLimits(),
        300,
        10_000,
        EstimateMethod.BASELINE_DELTA,
        100,
        CFG,
        dynamic_when_unknown=True,
    )
    assert old.output_reserve == 1_024
    assert old.input_budget == 32_768 + 1_024
    # A known window is the same in either version.
    known = ModelLimits(context_window=200_000)
    assert output_reserve(known, 3_000, CFG) == 6_000
    assert output_reserve(known, 3_000, CFG, dynamic_when_unknown=True) == 6_000


@pytest.mark.parametrize(
    ("window", "last_output", "expected"),
    [
        (8_192, 5_000, 4_096),  # 2 x 5,000 clamped to 8K would be the whole window
        (8_192, 1_500, 3_000),  # under half: twice the last output, as R-BUD-2 says
        (12_000, 4_000, 6_000),
        (1_500, 100, 750),  # the 1K floor would leave 476 of 1,500 for input
        (16_384, 6_000, 8_192),  # from 16K on the 8K clamp is at most half anyway
        (200_000, 6_000, 8_192),
    ],
)
def test_the_reserve_after_usage_leaves_half_of_a_small_window(
    window: int, last_output: int, expected: int
) -> None:  # R-BUD-2
    """The window holds input and output: below 16K the 1K..8K clamp alone could reserve
    all of it for output (an 8K window after a 5K reply), the input budget 0, the
    compaction prompt room for two characters of one message, and every decision
    COMPACT_RECOMMENDED or even OK whatever the estimate. Compiles recorded before
    projection 7 are rebuilt with the reserve they had."""
    limits = ModelLimits(context_window=window)
    assert output_reserve(limits, last_output, CFG) == expected
    budget, decision = judge(limits, last_output, 100, EstimateMethod.BASELINE_DELTA, 0, CFG)
    assert budget.input_budget == window - expected > 0
    assert decision is Decision.OK
    over, decision = judge(limits, last_output, window, EstimateMethod.BASELINE_DELTA, 0, CFG)
    assert decision is Decision.OVER_BUDGET_SEND_ANYWAY and over.utilization > 1
    old = output_reserve(limits, last_output, CFG, half_window=False)
    assert old == max(1_024, min(8_192, 2 * last_output))


def test_max_input_cap_wins_when_stricter() -> None:  # R-BUD-3
    limits = ModelLimits(context_window=200_000, max_input_tokens=100_000)
    assert input_budget(limits, 16_384, CFG) == 100_000
    loose = ModelLimits(context_window=200_000, max_input_tokens=190_000)
    assert input_budget(loose, 16_384, CFG) == 183_616


def test_unknown_window_uses_32k_watermark() -> None:  # R-BUD-4
    budget, decision = judge(ModelLimits(), None, 10_000, EstimateMethod.FULL, 33_000, CFG)
    assert budget.window_unknown
    assert budget.history_high_watermark == 32_768
    assert budget.output_reserve == 16_384
    assert decision is Decision.COMPACT_RECOMMENDED  # history over the 32K watermark


def test_over_budget_is_advice_never_refusal() -> None:  # R-EST-4
    limits = ModelLimits(context_window=10_000)
    budget, decision = judge(limits, None, 50_000, EstimateMethod.FULL, 100, CFG)
    assert decision is Decision.OVER_BUDGET_SEND_ANYWAY
    assert budget.input_budget == 7_500
    assert budget.utilization == pytest.approx(50_000 / 7_500, rel=1e-6)


def test_configurable_parameters() -> None:  # R-BUD-5
    cfg = BudgetConfig(first_reserve_max=4_096, dynamic_reserve_max=2_048)
    assert output_reserve(ModelLimits(context_window=200_000), None, cfg) == 4_096
    assert output_reserve(ModelLimits(context_window=200_000), 5_000, cfg) == 2_048


def test_reserve_never_exceeds_model_max_output() -> None:
    limits = ModelLimits(context_window=200_000, max_output_tokens=4_096)
    assert output_reserve(limits, None, CFG) == 4_096
