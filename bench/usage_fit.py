"""CPU of the route model's fit, which each usage report runs on the event loop: the fit
the daemon runs against the plain algorithm it must equal to the bit (six full passes,
every per-change figure recomputed in each; kept as the reference of
tests/unit/test_route_fit_equivalence.py), on a full window of 32 changes, in the same
process. Two windows: changes with noise only (the weights settle after a pass or two,
as in a session whose provider counts about what ctxcc counts), and 15% outliers (the
weights move on every pass: all six run)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from server.compiler.route_model import LearningConfig, fit_change
from tests.unit.test_route_fit_equivalence import Change, ref_fit_change

CFG = LearningConfig()


def windows(seed: int = 7) -> dict[str, tuple[Change, ...]]:
    rng = random.Random(seed)

    def change(outliers: bool) -> Change:
        local, messages = rng.randint(20, 4_000), rng.randint(1, 3)
        reported = 1.1 * local + 4 * messages + rng.gauss(0, 20)
        if outliers and rng.random() < 0.15:
            reported += rng.choice((-1, 1)) * rng.randint(500, 5_000)
        return local, max(1, round(reported)), messages

    return {
        "settled": tuple(change(False) for _ in range(CFG.window)),
        "outliers": tuple(change(True) for _ in range(CFG.window)),
    }


def _us_per_call(fit: Callable[..., object], changes: tuple[Change, ...], calls: int) -> float:
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(calls):
            fit(changes, CFG)
        best = min(best, (time.perf_counter() - started) / calls)
    return best * 1e6


def run(scale: float = 1.0) -> dict[str, float]:
    calls = max(20, int(2_000 * scale))
    out: dict[str, float] = {}
    for name, changes in windows().items():
        if fit_change(changes, CFG) != ref_fit_change(changes, CFG):
            raise AssertionError(f"the fit differs from the plain algorithm on {name}")
        fast = _us_per_call(fit_change, changes, calls)
        plain = _us_per_call(ref_fit_change, changes, calls)
        out[f"usage_fit_{name}_us"] = fast
        out[f"usage_fit_{name}_plain_us"] = plain
        out[f"usage_fit_{name}_vs_plain"] = fast / plain
    return out


if __name__ == "__main__":
    for key, value in run().items():
        print(f"{key:<40}{value:>10.3f}")
