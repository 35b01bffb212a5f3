"""Estimating the next request (R-EST-1..5).

With a real baseline on the same route — the input tokens the provider reported for a
previous view — the estimate is that baseline plus the estimated change since, scaled
by the route's calibration: if the baseline view's messages are an unchanged prefix of
this view's messages, the change is the new messages plus the difference in fixed
parts (system prompt, tools, native state). Anything else (a compaction, an edited
prefix, another route) gets a full estimate of the whole payload. An estimate is
advice only: it never blocks a request (R-EST-4).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from server.compiler.estimate_basis import EstimateBasis
from server.compiler.view import EstimateMethod, Layer, LayerTokens, ViewMessage
from server.domain.records import RouteState


@dataclass(frozen=True, slots=True)
class CalibrationConfig:
    # Observed ratios are clamped around 1.0 (the family factor is already in the
    # counter), so one odd step (a hidden reminder, a cache quirk) cannot swing it.
    low: float = 0.85
    high: float = 1.2
    # Smoothing of the exponential moving average.
    alpha: float = 0.2
    # Deltas smaller than this say too little about the tokenizer to learn from.
    min_delta: int = 500


def _fingerprint(m: ViewMessage) -> bytes:
    """Content identity of a message; layer and token counts change as the conversation
    moves on, content does not. Length-prefixed fields keep boundaries unambiguous."""
    fields: list[str] = [
        str(int(m.role)),
        m.tool_call_id,
        m.tool_name,
        m.origin_session_id,
        str(int(m.synthetic)),
        str(int(m.is_error)),
    ]
    for p in m.parts:
        if p.text is not None:
            fields += ["t", str(int(p.authority)), p.text]
        elif p.attachment is not None:
            fields += ["a", p.attachment.artifact_id, p.attachment.sha256]
    for c in m.tool_calls:
        fields += ["c", c.call_id, c.name, c.arguments_json]
    return "".join(f"{len(f)}:{f}" for f in fields).encode()


def message_digests(messages: Sequence[ViewMessage]) -> list[bytes]:
    return [hashlib.sha256(_fingerprint(m)).digest() for m in messages]


def messages_digest(messages: Sequence[ViewMessage]) -> str:
    return _fold(message_digests(messages))


def _fold(digests: Sequence[bytes]) -> str:
    h = hashlib.sha256()
    for d in digests:
        h.update(d)
    return h.hexdigest()


def estimate(
    layers: Sequence[LayerTokens],
    messages: Sequence[ViewMessage],
    route_state: RouteState | None,
) -> tuple[int, EstimateMethod, EstimateBasis]:
    ledger = sum(row.tokens for row in layers)
    history = {Layer.HISTORY, Layer.WORKING_SET}
    fixed = sum(row.tokens for row in layers if row.layer not in history)
    rs = route_state
    digests = message_digests(messages)  # once: both the prefix check and the record use them
    full = _fold(digests)
    if (
        rs is not None
        and rs.messages_digest
        and rs.message_count <= len(messages)
        and _fold(digests[: rs.message_count]) == rs.messages_digest
    ):
        raw = sum(m.tokens for m in messages[rs.message_count :]) + fixed - rs.fixed_tokens
        value = max(0, rs.baseline_input_tokens + round(rs.calibration * raw))
        basis = EstimateBasis(len(messages), full, fixed, ledger, raw, rs.baseline_input_tokens)
        return value, EstimateMethod.BASELINE_DELTA, basis
    basis = EstimateBasis(len(messages), full, fixed, ledger)
    return ledger, EstimateMethod.FULL, basis


def calibrate(
    calibration: float,
    raw_delta: int | None,
    baseline_tokens: int,
    actual_input: int,
    cfg: CalibrationConfig,
) -> float:
    """One smoothing step of the route's ratio of reported to estimated change."""
    if raw_delta is None or raw_delta < cfg.min_delta:
        return calibration
    observed = (actual_input - baseline_tokens) / raw_delta
    observed = min(cfg.high, max(cfg.low, observed))
    return calibration + cfg.alpha * (observed - calibration)
