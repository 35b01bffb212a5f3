"""What one compile's projection leaves for the next: the memo, and the current turn it holds.

A memo is a frozen value, so the service keeps and shares it without copying
(server/service/memos.py); incremental.py makes it and continues from it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from server.compiler.compaction import CompactionMemo
from server.compiler.message_table import MessageTable
from server.compiler.pairing import PairState
from server.compiler.path_memo import TurnPaths
from server.compiler.projection import is_user_turn_start
from server.compiler.prompt_memo import RememberedPrompt
from server.compiler.view import Layer, ViewMessage
from server.domain.grown import Grown, grown
from server.domain.model import (
    AssistantMessage,
    Attachment,
    BrowserSelection,
    Event,
    NativeState,
    ToolCall,
    ToolResult,
    TurnCancelled,
    TurnCompleted,
    TurnStarted,
    UserMessage,
    starts_turn,
)
from server.domain.thinking import valid_state

# (layer, tokens, messages) for each layer that has messages, in layer order.
Tally = tuple[tuple[Layer, int, int], ...]


class Stated(NamedTuple):
    """An assistant message of the loop with native state its provider takes back."""

    at: int  # index in the events
    seq: int
    state: NativeState
    visible: bool  # visible(): the model sees something of the message


# (seq of the assistant message's event, the state's kind, its data as logged)
Thinking = tuple[tuple[int, str, bytes], ...]


@dataclass(frozen=True, slots=True)
class SentThinking:
    """The thinking state a compile's body sends back, with what it was found from, so
    that the next compile of the loop matches only its new messages (turn_thinking.py)."""

    route_id: str
    rendering: int
    first: int  # seq of the loop's first event
    stated: Sequence[Stated]  # the turn's, all looked at
    messages: Sequence[ViewMessage]  # the view's, which they were matched against
    # The furthest seq an assistant message of the loop in `messages` reaches (0: none).
    reach: int
    thinking: Thinking
    tokens: int


@dataclass(frozen=True, slots=True)
class ActiveTurn:
    """The current turn of a log: the index of its latest turn start (-1: none) and the
    texts of the events from there on (what rule globs are matched against)."""

    start: int
    texts: Sequence[str]
    # The tool loop the turn belongs to, the providers' current turn (turn_thinking.py):
    # the index where it begins (`start`, or an earlier turn's start when a user message
    # follows tool results), and its assistant messages that carry native state their
    # provider takes back (_stated). Both are carried from memo to memo, so
    # neither a long turn nor a log of such turns is walked again at every step. A log
    # without a turn start (after a checkpoint that covered it, or one opening mid-loop)
    # is a loop from its first event: loop 0.
    loop: int = -1
    stated: Sequence[Stated] = ()


NO_TURN = ActiveTurn(-1, ())

# Events a body shows in the user turn that follows them, or not at all: a user message
# after them still joins the tool results before them (the bodies put results first).
_USER_SIDE = (TurnCompleted, TurnCancelled, TurnStarted, Attachment, BrowserSelection)


def _stated(events: Sequence[Event], start: int) -> tuple[Stated, ...]:
    """The assistant messages from `start` on whose native state is what its provider
    takes back (state it would refuse is never sent). Found once per event, with what
    turn_thinking asks of each: a Claude tool loop has state to check on every assistant
    message, and all of it goes back at every step."""
    return tuple(
        Stated(i, e.seq, s, visible(p))
        for i, e in enumerate(events[start:], start)
        if isinstance(p := e.payload, AssistantMessage)
        and (s := p.native_state) is not None
        and valid_state(s.kind, s.data)
    )


def visible(m: AssistantMessage) -> bool:
    """Whether the model sees anything of the message (a response cut while the model
    reasoned holds native state only)."""
    return bool(m.tool_calls) or any(p.text or p.attachment for p in m.parts)


def _goes_on(payload: object, unanswered: bool) -> bool:
    """Whether a user message right after this event (as a body shows it) goes in a
    user turn that tool results lead: after a result, or (`unanswered`) after calls that
    have none (an interrupted tool: the view gives each call a synthetic result there)."""
    if unanswered and isinstance(payload, AssistantMessage):
        return bool(payload.tool_calls)
    return isinstance(payload, ToolResult) or (unanswered and isinstance(payload, ToolCall))


def loop_start(
    events: Sequence[Event],
    start: int,
    seen: int = 0,
    before: ActiveTurn = NO_TURN,
    *,
    unanswered: bool = True,
) -> int:
    """Index where the tool loop of the turn starting at `start` begins: `start`, or the
    start of an earlier turn's loop while the last event before a turn's start that a
    body shows apart is a tool result or a call left without one (not with `unanswered`
    off: as rendering versions before 5 saw loops, turn_thinking.py). Turns before `seen`
    are `before`'s (the memo's turn, whose loop is known): they are not walked."""
    while True:
        j = start - 1
        while j >= 0 and isinstance(events[j].payload, _USER_SIDE):
            j -= 1
        if j < 0 or not _goes_on(events[j].payload, unanswered):
            return start
        while j >= seen and not starts_turn(events[j].payload):
            j -= 1
        if j >= seen:
            start = j
        elif seen and before.loop >= 0:
            return before.loop
        else:
            # No turn start before (a log that opens mid-loop, or after a checkpoint).
            return 0


def event_texts(event: Event) -> list[str]:
    """What an event of the current turn names: user text, call arguments, result text."""
    p = event.payload
    if isinstance(p, UserMessage):
        return [part.text for part in p.parts if part.text]
    if isinstance(p, AssistantMessage):
        return [c.arguments_json for c in p.tool_calls]
    if isinstance(p, ToolCall):
        return [p.arguments_json]
    if isinstance(p, ToolResult):
        return [p.text if p.text is not None else (p.blob.preview if p.blob else "")]
    return []


def extends(memo: ProjectionMemo | None, events: Sequence[Event]) -> bool:
    """Whether `memo`'s events are the first of `events`: at once when `events` extends
    the memo's (grown.py: the loader reads only later events), else compared in C (the
    same objects, or equal ones)."""
    if memo is None:
        return False
    if isinstance(events, Grown):
        return events.starts_with(memo.events)
    n = len(memo.events)
    return n <= len(events) and tuple(events[:n]) == tuple(memo.events)


def active_turn(
    events: Sequence[Event], memo: ProjectionMemo | None = None, *, known: bool | None = None
) -> ActiveTurn:
    """The current turn of `events`. The turn grows at the log's end: when `memo`'s events
    are the first of `events` (`known`: `extends(memo, events)` if already found), only
    the events after them are looked at."""
    n = len(memo.events) if memo is not None else 0
    if not (extends(memo, events) if known is None else known):
        memo, n = None, 0
    before = memo.turn if memo is not None else NO_TURN
    for i in range(len(events) - 1, n - 1, -1):
        if is_user_turn_start(events[i]):
            texts = tuple(t for e in events[i:] for t in event_texts(e))
            loop = loop_start(events, i, n, before)
            if loop < n and before.loop >= 0:
                # The loop goes on from the memo's turn: its state so far, then the new.
                return ActiveTurn(i, texts, loop, grown(before.stated).extended(_stated(events, n)))
            return ActiveTurn(i, texts, loop, _stated(events, loop))
    if memo is None or before.loop < 0:
        # No turn start: the turn began before the first event (a checkpoint covered it,
        # or the log opens mid-loop), and so did its loop, whose state is still wanted.
        return ActiveTurn(-1, (), 0, _stated(events, 0)) if events else NO_TURN
    # A turn (or loop) that goes on: its texts and state so far, then the new ones,
    # carried as Grown so that a long turn is not copied at every step.
    stated = grown(before.stated).extended(_stated(events, n))
    if before.start < 0:
        return ActiveTurn(-1, (), 0, stated)
    added = (t for e in events[n:] for t in event_texts(e))
    return ActiveTurn(before.start, grown(before.texts).extended(added), before.loop, stated)


@dataclass(frozen=True, slots=True)
class ProjectionMemo:
    """What one compile's projection leaves for the next (a frozen value)."""

    checkpoint_id: str
    # Every event the compile saw, the log after its checkpoint (or all of it); the next
    # compile's loader extends it (grown.py).
    events: Grown[Event]
    # events[:cut] are done: `messages` is their final part of the view.
    cut: int
    messages: Grown[ViewMessage]
    # The working set's first seq then (None: no user message yet), and how many of
    # `messages` came before it (the rest are working set until the next turn starts).
    ws_seq: int | None
    ws_index: int
    # Fingerprints and tokens of `messages`, and their tokens and count per layer.
    table: MessageTable
    tally: Tally
    pair: PairState
    pair_notes: tuple[str, ...]
    form_notes: tuple[str, ...]
    elided: int
    blobs: bool
    size_bytes: int
    # The artifacts `events` name, each once, in order (the loader sizes them).
    artifact_ids: tuple[str, ...] = ()
    # The current turn in `events`: where it starts and the texts it names.
    turn: ActiveTurn = NO_TURN
    # The compaction request of an over-budget view, for the next (compaction.py).
    compaction: CompactionMemo | None = None
    # Index in `events` of the latest assistant message (-1: none), whose native state a
    # view sends: the next compile looks only at the events after `events` for a later one.
    last_assistant: int = -1
    # The system prompt and what it was made from, for the next (prompt_memo.py).
    prompt: RememberedPrompt | None = None
    # The paths the current turn names, for the next (path_memo.py).
    paths: TurnPaths | None = None
    # The thinking state the view sent back, for the next (turn_thinking.py).
    thinking: SentThinking | None = None
    # Whether its pairing deferred attachments and kept imported tool messages apart
    # (projection 8 on, pairing.py): a compile pairing the other way starts afresh.
    later_pairing: bool = True
