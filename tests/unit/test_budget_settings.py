"""R-BUD-5: the budget's parameters are settings (flag, CTXCC_* variable, TOML key),
validated at start, and reach the compile."""

from __future__ import annotations

from pathlib import Path

import pytest

from server.compiler.budget import BudgetConfig, ModelLimits, input_budget, output_reserve
from server.config import ConfigError, resolve

WINDOW = ModelLimits(context_window=200_000, max_output_tokens=64_000)


def test_every_budget_parameter_comes_from_toml_env_and_flags(tmp_path: Path) -> None:
    f = tmp_path / "ctxcc.toml"
    f.write_text(
        "first_reserve_max = 4096\nfirst_reserve_fraction = 0.1\nreserve_min = 500\n"
        "reserve_max = 3000\nreserve_last_output_factor = 3\n"
        "unknown_window_watermark = 20000\nunknown_window_reserve = 7000\n"
    )
    budget = resolve({"config": str(f)}, env={}).budget
    assert budget == BudgetConfig(
        first_reserve_fraction=0.1,
        first_reserve_max=4096,
        dynamic_reserve_factor=3,
        dynamic_reserve_min=500,
        dynamic_reserve_max=3000,
        unknown_history_watermark=20_000,
        unknown_output_reserve=7000,
    )
    # first request: min(10% of 200K, 4096); after usage: 3 x 100 clamped up to 500
    assert output_reserve(WINDOW, None, budget) == 4096
    assert output_reserve(WINDOW, 100, budget) == 500
    assert output_reserve(WINDOW, 5000, budget) == 3000
    unknown = ModelLimits()
    assert output_reserve(unknown, None, budget) == 7000
    assert input_budget(unknown, 7000, budget) == 27_000
    env = {"CTXCC_CONFIG": str(f), "CTXCC_FIRST_RESERVE_MAX": "2048"}
    assert resolve({}, env=env).budget.first_reserve_max == 2048
    assert resolve({"first_reserve_max": "1000"}, env=env).budget.first_reserve_max == 1000


def test_defaults_are_the_spec_values() -> None:
    budget = resolve({}, env={}).budget
    assert output_reserve(WINDOW, None, budget) == 16_384  # a quarter, at most 16K
    assert output_reserve(WINDOW, 10, budget) == 1024
    assert output_reserve(WINDOW, 100_000, budget) == 8192
    assert budget.unknown_history_watermark == 32_768


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"first_reserve_fraction": "0"}, "first_reserve_fraction must be above 0"),
        ({"first_reserve_fraction": "1.5"}, "at most 1"),
        ({"first_reserve_fraction": "nan"}, "first_reserve_fraction"),
        ({"first_reserve_max": "-5"}, "first_reserve_max must be at least 1"),
        ({"reserve_min": "9000"}, "reserve_min \\(9000\\) is above reserve_max"),
        ({"unknown_window_watermark": "lots"}, "unknown_window_watermark must be a whole"),
        # Over what a budget states: every compile of an unknown model failed (INTERNAL).
        (
            {"unknown_window_watermark": "5000000000"},
            "unknown_window_watermark must be at most 268435456, got 5000000000",
        ),
        (
            {"unknown_window_watermark": "268435456"},
            "unknown_window_watermark \\+ unknown_window_reserve .* at most 268435456",
        ),
        # An unknown model's output cap in its bodies: Gemini's maxOutputTokens is an int32.
        (
            {"unknown_window_reserve": "4000000000"},
            "unknown_window_reserve must be at most 268435456, got 4000000000",
        ),
        ({"unknown_window_reserve": "4294967296"}, "unknown_window_reserve must be at most"),
        ({"first_reserve_max": "99999999999"}, "first_reserve_max must be at most"),
    ],
)
def test_bad_budget_settings_are_named(flags: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve(flags, env={})
