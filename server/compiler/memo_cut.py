"""When a memo may be continued, and where the next memo is cut.

Rules this module keeps:
- a memo is used only when every input it depends on is verifiably the same: the same
  checkpoint, the same events before its boundary (the very objects, or equal ones), a
  cut that is still a turn start, and no current user re-injected from behind a
  checkpoint. Anything else projects from scratch, so both ways give the same view
  byte for byte (the property tests check it);
- images are chosen newest first across the whole view, so a part holding an
  attachment never enters the memo: the cut stops before it.
"""

from __future__ import annotations

from collections.abc import Sequence

from server.compiler.projection import _message
from server.compiler.projection_memo import ProjectionMemo, extends
from server.domain.model import Attachment, ContentPart, Event, Role, TurnCancelled
from server.domain.records import Checkpoint


def memo_usable(
    memo: ProjectionMemo | None,
    events: Sequence[Event],
    checkpoint: Checkpoint | None,
    current_user: Event | None,
    known: bool | None = None,
) -> bool:
    """`known`: whether memo's events are the first of `events`, if already found
    (projection_memo.extends)."""
    if memo is None or current_user is not None:
        return False
    ck_id = checkpoint.checkpoint_id if checkpoint is not None else ""
    n = len(memo.events)
    return (
        memo.checkpoint_id == ck_id
        and n <= len(events)
        and memo.cut <= n
        and (extends(memo, events) if known is None else known)
        # Reasoning kept by a cancel reaches back to the turn's start, before the cut.
        and not any(
            isinstance(e.payload, TurnCancelled) and e.payload.keep_reasoning
            for e in events[memo.cut :]
        )
    )


def clean_cut(events: Sequence[Event], start: int, *, results: bool) -> int:
    """The latest clean place to stop, after `start`: an event whose message survives
    as a non-empty user or assistant message that does not merge into the one before
    (parallel calls), or with `results` a tool result (clean only when no call is open
    there, which the caller checks). Either way the part after it never reaches back
    into the part before (see pairing.py). Nothing before it in the tail may carry an
    attachment."""
    clean: int | None = None  # the latest clean candidate seen so far, scanning back
    for i in range(len(events) - 1, -1, -1):
        msg = _message(events[i], False)
        if msg is None:
            continue
        if clean is not None:
            # `msg` is the message before the candidate: a call-only assistant message
            # after an assistant message would merge into it.
            later = _message(events[clean], False)
            merges = (
                later is not None
                and later.role is Role.ASSISTANT
                and not later.parts
                and msg.role is Role.ASSISTANT
            )
            if not merges and not any(has_attachment(e) for e in events[start:clean]):
                return clean
            clean = None
        if i <= start:
            break
        if (msg.role is Role.TOOL and results) or (
            msg.role is not Role.TOOL
            and (msg.parts or msg.tool_calls)
            # An attachment does not close the calls open before it (it waits for their
            # results, pairing.py): a run starting there could reach back.
            and not isinstance(events[i].payload, Attachment)
        ):
            clean = i
    if clean is not None and not any(has_attachment(e) for e in events[start:clean]):
        return clean  # nothing before it: nothing to merge into
    return start


def has_attachment(event: Event) -> bool:
    p = event.payload
    if isinstance(p, Attachment):
        return True
    parts: Sequence[ContentPart] = getattr(p, "parts", ())
    return any(part.attachment is not None for part in parts)
