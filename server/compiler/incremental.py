"""The history projection, run from scratch or continued from the previous compile's memo.

Rules this module keeps:
- the log is append-only, so what the projection made of the events before the latest
  turn start is final: those messages are history (the working set starts at the
  latest user message), their pairs are closed by that user message, and reasoning is
  kept or dropped per turn. The memo holds them, sized and fingerprinted, with the
  pairing state at that point; the next compile processes only the events from there.

The memo is a value of its own (projection_memo.py); whether one may be continued and
where the next one is cut is memo_cut.py.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from server.compiler.estimate import fingerprint
from server.compiler.memo_cut import clean_cut, has_attachment, memo_usable
from server.compiler.message_table import EMPTY, MessageTable
from server.compiler.pairing import PairState, pair_tool_messages
from server.compiler.projection import (
    DEFERRED_ATTACHMENTS,
    PROJECTION,
    ImagePolicy,
    Projection,
    _apply_images,
    _kept_reasoning_seqs,
    _merge_calls,
    _message,
    _native_state,
    artifact_ids,
    elide_result,
    is_user_turn_start,
    message_tokens,
    render_summary,
    with_tokens,
)
from server.compiler.projection_memo import (
    NO_TURN,
    ActiveTurn,
    ProjectionMemo,
    Tally,
)
from server.compiler.provider_rules import non_empty, opened, well_formed_calls
from server.compiler.tokens import TokenCounter
from server.compiler.view import Authority, Layer, ViewMessage, ViewPart
from server.domain.grown import Grown, grown
from server.domain.model import (
    AssistantMessage,
    Attachment,
    Event,
    Role,
    ToolResult,
    UserMessage,
)
from server.domain.records import Checkpoint, CheckpointKind
from server.domain.replacing import replaced

# The default image policy (a shared frozen value).
NO_LIMITS = ImagePolicy()
# Rough bytes a memo holds beyond its texts, per message and per event.
_OVERHEAD_BYTES = 400
# Events after a memo's cut that a compile tries to take into its memo whole (see
# `_whole_tail`): a step's few. A longer tail (a first compile) is cut as before, so that
# a tail that turns out not to end clean is never projected twice at length.
_WHOLE_TAIL_EVENTS = 64


@dataclass(frozen=True, slots=True)
class IncrementalProjection:
    projection: Projection
    # sha256 fingerprints and tokens of projection.messages, in order.
    table: MessageTable
    # Their tokens and count per layer.
    tally: Tally
    memo: ProjectionMemo | None
    # True when the previous memo was verified and used.
    reused: bool


@dataclass(slots=True)
class _Run:
    """Accumulates one projection: the part taken from a memo, then fresh segments."""

    # The part taken from the memo and the final messages after it: a Grown that shares
    # the memo's list, so carrying a long history over copies nothing.
    messages: Grown[ViewMessage]
    table: MessageTable
    tally: dict[Layer, list[int]]
    pair: PairState
    pair_notes: list[str]
    form_notes: list[str]
    elided: int
    # projection.PROJECTION the view is projected with (pairing changed at 8).
    projection: int = PROJECTION


def _segment(
    run: _Run,
    events: Sequence[Event],
    head: list[ViewMessage],
    ws_seq: int | None,
    kept: set[int],
    checkpoint: Checkpoint | None,
    *,
    final: bool,
) -> list[ViewMessage]:
    """Projects `events` (from a clean cut, or the log's first event) up to pairing and
    well-formed calls, continuing `run`'s pairing state."""
    builtin = checkpoint is not None and checkpoint.kind == CheckpointKind.BUILTIN
    raw = list(head)
    for event in events:
        msg = _message(event, event.seq in kept)
        if msg is None:
            continue
        if builtin and checkpoint is not None and event.seq <= checkpoint.covers_through_seq:
            shorter = elide_result(event)
            if shorter is not None:
                msg, run.elided = replaced(msg, parts=(ViewPart(text=shorter),)), run.elided + 1
        raw.append(msg)
    layered = [
        replaced(m, layer=Layer.WORKING_SET) if ws_seq is not None and m.first_seq >= ws_seq else m
        for m in _merge_calls(raw)
    ]
    later = run.projection >= DEFERRED_ATTACHMENTS
    paired, run.pair = pair_tool_messages(
        non_empty(layered),
        run.pair_notes,
        run.pair,
        final=final,
        deferred=frozenset(e.seq for e in events if isinstance(e.payload, Attachment))
        if later
        else frozenset(),
        imported_apart=later,
    )
    formed = well_formed_calls(paired, run.form_notes)
    return opened(formed) if not run.messages else formed


def _head(checkpoint: Checkpoint | None, current_user: Event | None) -> list[ViewMessage]:
    """The summary, and the current user's request when the checkpoint covers it."""
    if checkpoint is None or checkpoint.kind == CheckpointKind.BUILTIN:
        return []
    out = [
        ViewMessage(
            Role.USER,
            (ViewPart(text=render_summary(checkpoint), authority=Authority.OPERATOR),),
            Layer.HISTORY,
            0,
            synthetic=True,
        )
    ]
    if current_user is not None and current_user.seq <= checkpoint.covers_through_seq:
        msg = _message(current_user, False)
        if msg is not None:
            out.append(msg)
    return out


def _sized(
    messages: Sequence[ViewMessage], counter: TokenCounter, protocol: str = "", model: str = ""
) -> list[ViewMessage]:
    return [with_tokens(m, message_tokens(m, counter, protocol, model)) for m in messages]


def _extended(table: MessageTable, messages: Sequence[ViewMessage]) -> MessageTable:
    digests = [hashlib.sha256(fingerprint(m)).digest() for m in messages]
    return table.extend(digests, [m.tokens for m in messages])


def _started(memo: ProjectionMemo | None, ws_seq: int | None, projection: int) -> tuple[int, _Run]:
    """Where the projection starts and what it starts with: from the verified `memo`'s
    cut with its messages, or from the first event with nothing."""
    if memo is None:
        return 0, _Run(Grown(), EMPTY, {}, PairState(), [], [], 0, projection)
    kept_messages = memo.messages
    tally = {layer: [tokens, n] for layer, tokens, n in memo.tally}
    if ws_seq != memo.ws_seq and memo.ws_index < len(kept_messages):
        # A new turn began: the old working set is history now (layers only; token
        # counts and fingerprints do not depend on them).
        old = kept_messages[memo.ws_index :]
        history = [replaced(m, layer=Layer.HISTORY) for m in old]
        _count(tally, old, -1)
        _count(tally, history)
        kept_messages = kept_messages.prefix(memo.ws_index).extended(history)
    run = _Run(
        kept_messages,
        memo.table,
        tally,
        memo.pair,
        list(memo.pair_notes),
        list(memo.form_notes),
        memo.elided,
        projection,
    )
    return memo.cut, run


def _count(tally: dict[Layer, list[int]], messages: Sequence[ViewMessage], sign: int = 1) -> None:
    for m in messages:
        row = tally.setdefault(m.layer, [0, 0])
        row[0] += sign * m.tokens
        row[1] += sign


def _frozen(tally: dict[Layer, list[int]]) -> Tally:
    return tuple((layer, t, n) for layer, (t, n) in sorted(tally.items()) if n)


def _size(messages: Sequence[ViewMessage], events: Sequence[Event]) -> int:
    text = sum(len(p.text or "") for m in messages for p in m.parts) + sum(
        len(c.arguments_json) for m in messages for c in m.tool_calls
    )
    return 2 * text + _OVERHEAD_BYTES * (len(messages) + len(events))


def _advance(
    run: _Run,
    events: Sequence[Event],
    start: int,
    cut: int,
    head: list[ViewMessage],
    ws_seq: int | None,
    kept: set[int],
    checkpoint: Checkpoint | None,
) -> tuple[int, list[ViewMessage]]:
    """Projects events[start:cut] into `run`, moving the cut back to the last message
    that is not a result when a result there would find calls open."""
    if cut <= start:
        return start, []
    if _answers_a_call(events[cut].payload, events[start:cut], run.pair):
        # Its call is open at the cut, so the check below would fold back: go there at
        # once instead of projecting the part first (in a turn of tool calls, every step).
        cut = clean_cut(events, start, results=False)
        if cut <= start:
            return start, []
    before = (run.pair, list(run.pair_notes), list(run.form_notes), run.elided)
    done = _segment(run, events[start:cut], head, ws_seq, kept, checkpoint, final=False)
    if run.pair.open_calls and _a_result(events[cut]):
        # A result while calls are open may fold a call back into the part before.
        run.pair, run.pair_notes, run.form_notes, run.elided = before
        cut = clean_cut(events, start, results=False)
        if cut <= start:
            return start, []
        done = _segment(run, events[start:cut], head, ws_seq, kept, checkpoint, final=False)
    return cut, done


def _a_result(event: Event) -> bool:
    """Whether pairing takes the event's message for a result: a tool result, or a
    message imported with the tool role (a result with no call id, whose call pairing
    restores like any other's)."""
    msg = _message(event, False)
    return msg is not None and msg.role is Role.TOOL


def _whole_tail(
    run: _Run,
    events: Sequence[Event],
    start: int,
    head: list[ViewMessage],
    ws_seq: int | None,
    kept: set[int],
    checkpoint: Checkpoint | None,
) -> list[ViewMessage] | None:
    """The tail events[start:] projected into `run` in one piece, when all of it may go
    into the memo; else None, with `run` as it was.

    The end of the log is a clean cut when the last event's message is a result or a
    user message and no call is open after it: nothing that can follow reaches back
    (a call-only message merges only into an assistant message before it, and a result
    folds a call back only into a block whose calls are open; pairing.py). So a step of
    a tool loop, which ends with the result of its call, leaves a memo of everything:
    the next step projects, sizes and fingerprints its own new events only, instead of
    the previous step's call and result again (the cut at `clean_cut` stops before the
    call, whose result may still be followed by more). The tail may hold no attachment
    (the images are chosen over the part after the memo)."""
    tail = events[start:]
    if (
        not tail
        or len(tail) > _WHOLE_TAIL_EVENTS
        or not isinstance(tail[-1].payload, ToolResult | UserMessage)
        or any(has_attachment(e) for e in tail)
    ):
        return None
    before = (run.pair, list(run.pair_notes), list(run.form_notes), run.elided)
    done = _segment(run, tail, head, ws_seq, kept, checkpoint, final=False)
    if not run.pair.open_calls:
        return done
    # A result while calls of the same message are still open (parallel calls).
    run.pair, run.pair_notes, run.form_notes, run.elided = before
    return None


def _answers_a_call(payload: object, before: Sequence[Event], pair: PairState) -> bool:
    """Whether `payload` is a result of a call made in `before` or still open in `pair`:
    then that call is open at a cut made at the result. (A result found here that is not
    open after all only makes the cut an earlier clean one: the view is the same.)"""
    if not isinstance(payload, ToolResult):
        return False
    wanted = payload.call_id
    if any(original == wanted for original, _ in pair.open_calls):
        return True
    return any(
        isinstance(e.payload, AssistantMessage)
        and any(c.call_id == wanted for c in e.payload.tool_calls)
        for e in reversed(before)
    )


def project_incremental(
    events: Sequence[Event],
    counter: TokenCounter,
    *,
    checkpoint: Checkpoint | None = None,
    current_user: Event | None = None,
    route_id: str = "",
    images: ImagePolicy = NO_LIMITS,
    memo: ProjectionMemo | None = None,
    remember: bool = True,
    turn: ActiveTurn = NO_TURN,
    known: bool | None = None,
    projection_version: int = PROJECTION,
) -> IncrementalProjection:
    """`events` are the whole log (no checkpoint) or the events after the checkpoint;
    `current_user` is the latest user message when the checkpoint covers it. Without
    `remember` the events are projected in one piece and no memo is made: the plain
    from-scratch projection the incremental one is held to. `turn` is the current turn of
    `events`, kept in the memo for the next compile; `known`: whether `memo`'s events are
    the first of `events`, if already found (projection_memo.extends)."""
    reused = memo_usable(memo, events, checkpoint, current_user, known) and (
        memo is not None and memo.later_pairing == (projection_version >= DEFERRED_ATTACHMENTS)
    )
    tail_start = 0 if not (reused and memo is not None) else memo.cut
    tail_users = [e.seq for e in events[tail_start:] if is_user_turn_start(e)]
    if current_user is not None:
        ws_seq: int | None = current_user.seq
    elif tail_users:
        ws_seq = tail_users[-1]
    else:
        ws_seq = memo.ws_seq if (reused and memo is not None) else None
    start, run = _started(memo if reused else None, ws_seq, projection_version)
    head = _head(checkpoint, current_user) if start == 0 else []
    # Reasoning kept by a cancel is decided per turn, over the whole tail at once.
    kept = _kept_reasoning_seqs(events[start:])
    whole = (
        _whole_tail(run, events, start, head, ws_seq, kept, checkpoint)
        if remember and current_user is None
        else None
    )
    if whole is not None:
        cut, done = len(events), whole
    else:
        cut = clean_cut(events, start, results=True) if remember and current_user is None else start
        cut, done = _advance(run, events, start, cut, head, ws_seq, kept, checkpoint)
    if cut > start:
        head = []
    done_sized = _sized(done, counter)
    run.messages = run.messages.extended(done_sized)
    run.table = _extended(run.table, done_sized)
    _count(run.tally, done_sized)
    memo_tally = _frozen(run.tally)
    kept_state = (run.pair, len(run.pair_notes), len(run.form_notes), run.elided)
    # Nothing to do after a memo of the whole log (no call is open there to close).
    tail = events[cut:]
    rest = (
        _segment(run, tail, head, ws_seq, kept, checkpoint, final=True)
        if tail or head or run.pair.open_calls
        else []
    )
    notes: list[str] = []
    rest_notes: list[str] = []
    imaged = _apply_images(rest, images, rest_notes, run.messages)
    rest_sized = _sized(imaged, counter, images.token_protocol, images.token_model)
    messages = run.messages.extended(rest_sized)
    table = _extended(run.table, rest_sized)
    _count(run.tally, rest_sized)
    if run.elided:
        notes.append(f"built-in compaction: {run.elided} older tool result(s) shown by reference")
    notes += _block_note(checkpoint, events) + run.pair_notes + run.form_notes + rest_notes
    pre_blobs = memo.blobs if (reused and memo is not None) else False
    done_blobs = pre_blobs or any(
        isinstance(e.payload, ToolResult) and e.payload.blob is not None for e in events[start:cut]
    )
    blobs = (
        run.elided > 0
        or done_blobs
        or any(
            isinstance(e.payload, ToolResult) and e.payload.blob is not None for e in events[cut:]
        )
    )
    # The latest assistant message: among the events after the memo's, else the memo's.
    verified = memo if reused else None
    last_assistant = _last_assistant(
        events,
        len(verified.events) if verified is not None else 0,
        verified.last_assistant if verified is not None else -1,
    )
    latest = (events[last_assistant],) if last_assistant >= 0 else ()
    native = _native_state(latest, route_id)
    projection = Projection(messages, tuple(notes), native, blobs)
    new_memo = None
    if remember and current_user is None:
        new_memo = _next_memo(
            memo if reused else None,
            run,
            kept_state,
            events,
            cut,
            ws_seq,
            checkpoint,
            done_blobs,
            memo_tally,
            turn,
            _size(done_sized, events[len(memo.events) if reused and memo is not None else 0 :]),
            last_assistant,
        )
    return IncrementalProjection(projection, table, _frozen(run.tally), new_memo, reused)


def _block_note(checkpoint: Checkpoint | None, events: Sequence[Event]) -> list[str]:
    """A note when the events start before the end of the model-written checkpoint: the
    loader read back the call block its boundary splits (projection 13 on)."""
    if (
        checkpoint is None
        or checkpoint.kind == CheckpointKind.BUILTIN
        or not events
        or events[0].seq > checkpoint.covers_through_seq
    ):
        return []
    return [
        f"checkpoint {checkpoint.checkpoint_id} ends inside a block of tool calls: "
        f"shown whole from seq {events[0].seq}"
    ]


def _last_assistant(events: Sequence[Event], seen: int, known: int) -> int:
    """Index of the latest assistant message in `events`: looked for among those after
    the first `seen` (a verified memo's), else `known` (the memo's, -1 for none)."""
    for i in range(len(events) - 1, seen - 1, -1):
        if isinstance(events[i].payload, AssistantMessage):
            return i
    return known


def _next_memo(
    memo: ProjectionMemo | None,
    run: _Run,
    kept_state: tuple[PairState, int, int, int],
    events: Sequence[Event],
    cut: int,
    ws_seq: int | None,
    checkpoint: Checkpoint | None,
    blobs: bool,
    tally: Tally,
    turn: ActiveTurn,
    added_bytes: int,
    last_assistant: int,
) -> ProjectionMemo:
    """The memo this compile leaves; `memo` is the one it continued (None: from scratch).
    What the memo already knew is carried over, so it costs only the new messages."""
    pair, n_pair, n_form, elided = kept_state
    prefix = run.messages
    # Only messages that were not working set in the old memo can have become it.
    known = 0
    if memo is not None:
        same_turn = ws_seq == memo.ws_seq and memo.ws_index < len(memo.messages)
        known = memo.ws_index if same_turn else len(memo.messages)
    ws_index = next(
        (i for i in range(known, len(prefix)) if prefix[i].layer is Layer.WORKING_SET),
        len(prefix),
    )
    seen_before = len(memo.events) if memo is not None else 0
    ids_before = memo.artifact_ids if memo is not None else ()
    return ProjectionMemo(
        checkpoint_id=checkpoint.checkpoint_id if checkpoint is not None else "",
        events=grown(events),
        cut=cut,
        messages=prefix,
        ws_seq=ws_seq,
        ws_index=ws_index,
        table=run.table,
        tally=tally,
        pair=pair,
        pair_notes=tuple(run.pair_notes[:n_pair]),
        form_notes=tuple(run.form_notes[:n_form]),
        elided=elided,
        blobs=blobs,
        # What this compile added to the memo's size (the rest was counted before).
        size_bytes=(memo.size_bytes if memo is not None else 0) + added_bytes,
        artifact_ids=tuple(dict.fromkeys((*ids_before, *artifact_ids(events[seen_before:])))),
        turn=turn,
        last_assistant=last_assistant,
        later_pairing=run.projection >= DEFERRED_ATTACHMENTS,
    )


def project(
    events: Sequence[Event],
    counter: TokenCounter,
    *,
    checkpoint: Checkpoint | None = None,
    current_user: Event | None = None,
    route_id: str = "",
    images: ImagePolicy = NO_LIMITS,
    projection_version: int = PROJECTION,
) -> Projection:
    """The projection from scratch."""
    return project_incremental(
        events,
        counter,
        checkpoint=checkpoint,
        current_user=current_user,
        route_id=route_id,
        images=images,
        remember=False,
        projection_version=projection_version,
    ).projection
