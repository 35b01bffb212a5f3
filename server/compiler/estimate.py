"""Estimating the next request (R-EST-1..5).

With a real baseline on the same route — the input tokens the provider reported for a
previous view of this session — the estimate is that baseline plus the change since,
in the provider's tokens (the route model's ratio times the local change, plus its
framing per message that entered, minus per message that left): the
messages that entered the view, minus those that left it (a checkpoint, a compaction,
an edited message), plus the change in fixed parts (system prompt, tools, native
state). Tokens of what left are the counts recorded at the baseline compile, so a
compaction keeps everything the provider measured on top of the local count.
Without a baseline, a route model that usage has taught (compiler/route_model.py)
estimates the whole payload; on a route nothing has been reported for, the estimate
is the local count. An estimate is advice only: it never blocks a request (R-EST-4).
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Sequence

from server.compiler.estimate_basis import EstimateBasis
from server.compiler.message_table import DIGEST_PREFIX, MessageTable, message_table
from server.compiler.route_model import RatioBounds, learned, predict_delta, predict_full
from server.compiler.view import EstimateMethod, Layer, LayerTokens, ViewMessage
from server.domain.records import RouteModel, RouteState


def fingerprint(m: ViewMessage) -> bytes:
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
    return [hashlib.sha256(fingerprint(m)).digest() for m in messages]


def messages_digest(messages: Sequence[ViewMessage]) -> str:
    return _fold(message_digests(messages))


def _fold(digests: Sequence[bytes]) -> str:
    # One update of the joined digests: the same hash as one update per digest.
    return hashlib.sha256(b"".join(digests)).hexdigest()


def removal_change(
    baseline_digests: bytes,
    baseline_tokens: Sequence[int],
    digests: Sequence[bytes],
    messages: Sequence[ViewMessage],
) -> tuple[int, int, int]:
    """Tokens of messages that entered the view and of those that left it, and the
    change in the number of messages, matching messages by content (a multiset: a
    message repeated twice counts twice)."""
    kept: dict[bytes, list[int]] = defaultdict(list)
    for i, tokens in enumerate(baseline_tokens):
        kept[baseline_digests[i * DIGEST_PREFIX : (i + 1) * DIGEST_PREFIX]].append(tokens)
    added = entered = 0
    for d, m in zip(digests, messages, strict=True):
        left = kept.get(d[:DIGEST_PREFIX])
        if left:
            left.pop()
        else:
            added += m.tokens
            entered += 1
    rest = [t for tokens in kept.values() for t in tokens]
    return added, sum(rest), entered - len(rest)


def estimate(
    layers: Sequence[LayerTokens],
    messages: Sequence[ViewMessage],
    route_state: RouteState | None,
    route_model: RouteModel | None,
    bounds: RatioBounds,
    digests: Sequence[bytes] | None = None,
    known: MessageTable | None = None,
    *,
    plausible_only: bool = False,
) -> tuple[int, EstimateMethod, EstimateBasis]:
    """`digests` are the messages' fingerprints when the caller already has them, `known`
    their table (with the messages' tokens: what an incremental compile carries over).
    `plausible_only` (projection 15 on): a baseline plus its change that no provider can
    count for this view (under half the lowest ratio times the local count, as a usage
    report is judged) is no estimate: the full one is made instead, and the local count
    when the route model's is no more plausible. A baseline the
    provider counted low (a report at 60 % of the local count, which is plausible), then a
    checkpoint that took most of the history out, gave 0 for a view of 316 local tokens
    until the next report."""
    ledger = sum(row.tokens for row in layers)
    history = {Layer.HISTORY, Layer.WORKING_SET}
    fixed = sum(row.tokens for row in layers if row.layer not in history)
    rs = route_state
    if known is None:
        # Once: both the prefix check and the record use them.
        found = digests if digests is not None else message_digests(messages)
        known = message_table(found, [m.tokens for m in messages])
    digests = known.digests
    full = known.fold()
    table = known.table
    tokens = known.tokens
    added: int | None = None
    removed = count_change = 0
    if rs is not None and rs.messages_digest:
        if rs.message_count <= len(messages) and (
            known.fold(rs.message_count) == rs.messages_digest
        ):
            added = sum(tokens[rs.message_count :])
            count_change = len(messages) - rs.message_count
        elif len(rs.message_tokens) == rs.message_count and rs.message_digests:
            added, removed, count_change = removal_change(
                rs.message_digests, rs.message_tokens, digests, messages
            )
    if rs is not None and added is not None:
        raw = added - removed + fixed - rs.fixed_tokens
        value = predict_delta(route_model, rs.baseline_input_tokens, raw, count_change, bounds)
        if plausible_only and 2 * value < bounds.low * ledger:
            added = None
    if rs is not None and added is not None:
        basis = EstimateBasis(
            len(messages),
            full,
            fixed,
            ledger,
            raw,
            rs.baseline_input_tokens,
            table,
            tokens,
            removed,
            count_change,
        )
        return value, EstimateMethod.BASELINE_DELTA, basis
    basis = EstimateBasis(len(messages), full, fixed, ledger, None, 0, table, tokens)
    if learned(route_model):
        value = predict_full(route_model, ledger, bounds)
        # The route's overhead, learned from such a low report, is as far below: the
        # local count is the estimate then (R-EST-2's conservatism).
        if not (plausible_only and 2 * value < bounds.low * ledger):
            return value, EstimateMethod.ROUTE_MODEL, basis
    return ledger, EstimateMethod.FULL, basis
