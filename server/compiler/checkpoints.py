"""Which checkpoint a projection may stand on (R-HIST-3, R-ROUTE-2).

A checkpoint is valid only if its boundary lies inside the view, its digest matches the
events it covers, it belongs to this session (or is portable and its origin verified),
and its route matches unless it is portable. The newest valid one wins; every newer
one that was passed over is reported with its reason, and with none valid the view
uses the canonical history.

A checkpoint an agent makes may end inside a block of tool calls: after an assistant
message's calls, before the results of some of them. From projection 13 (projection.CALL_BLOCKS)
a view standing on it shows that block whole, from its assistant message on, when the
first thing after the boundary answers one of those calls: the call comes back as it was
logged (arguments, and the message's thinking state that the provider wants back before
it), where a view that started after the boundary restored it from its result alone,
with empty arguments and no thinking (`split_block`, `answered_after`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from server.compiler.projection import _message
from server.compiler.view import FallbackReason
from server.domain.model import (
    Attachment,
    Event,
    Role,
    Route,
    ToolResult,
)
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


@dataclass(frozen=True, slots=True)
class CallBlock:
    """The tool-call block a checkpoint's boundary splits: the seq of its first event
    (the assistant message, or the first call logged on its own) and the ids of its calls
    whose results the checkpoint does not cover."""

    start: int
    open_ids: frozenset[str]


def split_block(covered: Sequence[Event], *, whole: bool) -> tuple[bool, CallBlock | None]:
    """(decided, the block): the call block the last of the `covered` events (in order,
    ending at the checkpoint's boundary) leaves with calls unanswered, as the projection
    pairs them: an assistant message with calls, with the calls logged after it on their
    own or in messages of calls alone (they join it, projection._merge_calls), then
    results, attachments (they wait for the results) and markers. None: the boundary
    splits no block (it ends after a user message, or every call of the block is
    answered). Not decided when `covered` ends before telling and does not start at the
    log's first event (`whole`): ask again with more of them."""
    answered: set[str] = set()
    calls: list[str] = []
    start = 0
    for e in reversed(covered):
        p = e.payload
        m = _message(e, False)
        if m is None:
            continue  # a marker (TurnStarted too): no message, nothing closed
        if m.role is Role.TOOL or isinstance(p, Attachment):
            if calls:
                break  # calls logged after a result (or an image) begin a block there
            if isinstance(p, ToolResult):
                answered.add(p.call_id)
            continue
        if m.role is not Role.ASSISTANT:
            break
        if not m.parts and m.tool_calls:
            # Calls alone: they join the assistant message before them, if one is.
            calls += (c.call_id for c in m.tool_calls)
            start = e.seq
            continue
        if not m.parts and not calls:
            continue  # reasoning alone, no message in the view
        calls += (c.call_id for c in m.tool_calls)
        start = e.seq
        break
    else:
        if not whole:
            return False, None
    open_ids = frozenset(calls) - answered
    return True, CallBlock(start, open_ids) if open_ids and start else None


def answered_after(following: Sequence[Event], block: CallBlock) -> tuple[bool, int | None]:
    """(decided, seq): the seq of the result that answers one of `block`'s open calls
    first thing after the boundary (`following`: the events after it, in order), before
    any message that would close them; None when another message comes first. Not
    decided when `following` ends before telling (ask again when the log has grown)."""
    for e in following:
        p = e.payload
        if isinstance(p, ToolResult) and p.call_id in block.open_ids:
            return True, e.seq
        m = _message(e, False)
        if (
            m is None
            or m.role is Role.TOOL
            or isinstance(p, Attachment)
            or (m.role is Role.ASSISTANT and not m.parts and not m.tool_calls)
        ):
            continue  # a marker, another result, an image that waits, reasoning alone
        return True, None
    return False, None
