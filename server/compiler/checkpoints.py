"""Which checkpoint a projection may stand on (R-HIST-3, R-ROUTE-2).

A checkpoint is valid only if its boundary lies inside the view, its digest matches the
events it covers, it belongs to this session (or is portable and its origin verified),
and its route matches unless it is portable. The newest valid one wins; every newer
one that was passed over is reported with its reason, and with none valid the view
uses the canonical history.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from server.compiler.view import FallbackReason
from server.domain.model import Route
from server.domain.records import Checkpoint


@dataclass(frozen=True, slots=True)
class CheckpointCandidate:
    checkpoint: Checkpoint
    # sha256 of the covered events as found in the log (or, for a foreign checkpoint,
    # in its origin session); None when the covered range is not all there.
    actual_digest: str | None


def choose_checkpoint(
    candidates: Sequence[CheckpointCandidate],
    session_id: str,
    route: Route,
    boundary: int,
) -> tuple[Checkpoint | None, tuple[FallbackReason, ...]]:
    """Candidates newest first. Returns the checkpoint to use and the reasons of the
    newer ones that could not be used."""
    reasons: list[FallbackReason] = []
    for cand in candidates:
        ck = cand.checkpoint
        foreign = bool(ck.origin_session_id) and ck.origin_session_id != session_id
        if ck.covers_through_seq > boundary or cand.actual_digest is None:
            reason = FallbackReason.CHECKPOINT_BOUNDARY_MISSING
        elif foreign and not ck.portable:
            reason = FallbackReason.CHECKPOINT_FOREIGN
        elif cand.actual_digest != ck.covered_digest:
            reason = (
                FallbackReason.CHECKPOINT_FOREIGN
                if foreign
                else FallbackReason.CHECKPOINT_DIGEST_MISMATCH
            )
        elif (
            not ck.portable
            and ck.source_route is not None
            and ck.source_route.route_id != route.route_id
        ):
            reason = FallbackReason.ROUTE_MISMATCH
        else:
            return ck, tuple(dict.fromkeys(reasons))
        reasons.append(reason)
    return None, tuple(dict.fromkeys(reasons))
