"""The output cap written into provider bodies (`max_tokens`, `max_output_tokens`, ...).

It is not the output reserve of R-BUD-1/2: that reserve is a local scheduling figure
(R-BUD-5) that shrinks to twice the last reply, and a provider cap that small would
truncate the next, longer answer. The cap is:
- the caller's explicit `max_output_tokens`, if it gave one (CALLER);
- else the model's maximum output from the catalog (MODEL_MAX);
- else, the maximum unknown, the unknown-window output reserve (DEFAULT);
lowered only when the window is known and estimated input + cap would not fit in it
(FITTED_TO_WINDOW), never below FLOOR: a request that far over is the provider's call
(R-EST-4), and a tiny cap would only hide that.

Fitted, the cap leaves a margin for the estimate's error (from rendering 7, with_margin):
the estimate is an estimate (R-MISC-1), and the provider counts input + cap against the
window exactly ("input length and max_tokens exceed context limit: 178959 + 64000 >
200000"): fitted to the last token, an estimate one token low made every long step a 400.
"""

from __future__ import annotations

from server.compiler.budget import BudgetConfig, ModelLimits
from server.compiler.view import OutputCapSource

FLOOR = 1_024
# The margin a fitted cap leaves: a twentieth (5%) of the estimate, at least MARGIN_MIN
# tokens (the estimate's error grows with it; replay on real traces: 1.6% mean).
MARGIN_DIVISOR = 20
MARGIN_MIN = 256


def output_cap(
    limits: ModelLimits,
    requested: int,
    estimate: int,
    cfg: BudgetConfig,
    *,
    with_margin: bool = True,
    true_notes: bool = True,
) -> tuple[int, OutputCapSource, str]:
    """(cap, where it came from, a note when it was lowered or cannot fit). `true_notes`
    (from rendering 13): when even the floor does not fit, the note says so (before, it
    said the input and the output fit, with an estimate over the window: an image whose
    header claims 60,000 x 60,000 pixels is counted as such), and a cap at or under the
    floor is left as it is, not "lowered" to itself."""
    if requested > 0:
        cap, source = requested, OutputCapSource.CALLER
    elif limits.max_output_tokens > 0:
        cap, source = limits.max_output_tokens, OutputCapSource.MODEL_MAX
    else:
        cap, source = cfg.unknown_output_reserve, OutputCapSource.DEFAULT
    window = limits.context_window
    margin = max(MARGIN_MIN, estimate // MARGIN_DIVISOR) if with_margin else 0
    if window > 0 and estimate + margin + cap > window:
        room = window - estimate - margin
        fitted = max(min(cap, FLOOR), room)
        if true_notes and fitted > room:
            left = f"leaves {max(room, 0)} tokens of the {window}-token window"
            if fitted == cap:
                return (
                    cap,
                    source,
                    (
                        f"output cap {cap} ({source.name.lower()}) kept: the estimated input "
                        f"({estimate}) {left} after the estimate's margin; the provider's count "
                        "decides"
                    ),
                )
            return (
                fitted,
                OutputCapSource.FITTED_TO_WINDOW,
                (
                    f"output cap lowered from {cap} ({source.name.lower()}) to {fitted}, the "
                    f"least it is lowered to: the estimated input ({estimate}) {left} after the "
                    "estimate's margin; the provider's count decides"
                ),
            )
        note = (
            f"output cap lowered from {cap} ({source.name.lower()}) to {fitted} so the "
            f"estimated input ({estimate}) and the output fit the {window}-token window"
        )
        return fitted, OutputCapSource.FITTED_TO_WINDOW, note
    return cap, source, ""
