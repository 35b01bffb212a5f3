"""Which thinking state a view's provider body sends back (see domain/thinking.py): that
of the assistant messages of the current tool loop, on the compile's route, that are in
the view: Anthropic's thinking blocks from rendering 2, Gemini's thought signatures from 3,
OpenAI's reasoning items from 8.

The loop is the providers' notion of the current turn: it begins after the latest user
turn that holds no tool result. Usually that is ctxcc's current turn (since the latest
user message); but a user message logged right after tool results (the user typed while
the tools ran) goes in the same user turn as those results in both bodies (tool results
lead it), so for the provider the loop goes on across it, and it still wants the state of
the assistant messages before it. Where the loop begins, and which of its messages carry
state, the current turn holds (projection_memo.ActiveTurn: loop, stated)."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence
from itertools import accumulate
from operator import itemgetter

from server.compiler import renderings
from server.compiler.projection_memo import (
    ActiveTurn,
    SentThinking,
    Stated,
    Thinking,
    loop_start,
)
from server.compiler.tokens import MESSAGE_OVERHEAD
from server.compiler.view import ViewMessage
from server.domain.grown import Grown
from server.domain.model import Event, Role
from server.domain.thinking import GEMINI_KIND, KIND, OPENAI_KIND

# The rendering version from which each kind is sent back (render.RENDERING).
SINCE = {
    KIND: renderings.THINKING_BLOCKS,
    GEMINI_KIND: renderings.THOUGHT_SIGNATURES,
    OPENAI_KIND: renderings.REASONING_ITEMS,
}


def sent_thinking(
    events: Sequence[Event],
    turn: ActiveTurn,
    route_id: str,
    messages: Sequence[ViewMessage],
    rendering: int,
    before: SentThinking | None = None,
) -> SentThinking | None:
    """The thinking state the view's body sends back, with its tokens (None: none, and
    nothing to carry). A Claude tool loop with thinking has state on every assistant
    message, all sent back at every step: going on from `before` (the previous compile
    of the loop), a step matches only the messages and states that are new, when the
    old ones are the same objects and nothing new reaches back among them."""
    kinds = {kind for kind, since in SINCE.items() if rendering >= since}
    if not kinds or not turn.stated:
        return None
    loop, stated = turn.loop, turn.stated
    if rendering < renderings.LOOPS_GO_ON:
        # As the compile was made: a walk over the turns, made only in its rebuild.
        if turn.start < 0:
            return None
        loop = loop_start(events, turn.start, unanswered=False)
        stated = tuple(s for s in stated if s.at >= loop)
        before = None
    first = events[loop].seq
    if (
        before is not None
        and before.route_id == route_id
        and before.rendering == rendering
        and before.first == first
        and isinstance(messages, Grown)
        and messages.shares(before.messages)
        and len(messages) >= len(before.messages)
        and isinstance(stated, Grown)
        and stated.starts_with(before.stated)
    ):
        went_on = _went_on(before, stated, messages, route_id, kinds, rendering)
        if went_on is not None:
            return went_on
    # The assistant messages of the view from the turn's start on (the working set).
    spans = _spans(reversed(messages), first, from_end=True) or []
    thinking = _sent(stated, spans, route_id, kinds, rendering)
    return SentThinking(
        route_id,
        rendering,
        first,
        stated,
        messages,
        max((b for _, b in spans), default=0),
        thinking,
        thinking_tokens(thinking),
    )


def _went_on(
    before: SentThinking,
    stated: Sequence[Stated],
    messages: Sequence[ViewMessage],
    route_id: str,
    kinds: set[str],
    rendering: int,
) -> SentThinking | None:
    """`before` gone on with the messages and states after its own; None when one of the
    new messages reaches back among the old states or ends before the loop (then each
    state is matched again)."""
    new = _spans(messages[len(before.messages) :], before.first, from_end=False)
    more = stated[len(before.stated) :]
    last = before.stated[-1].seq if before.stated else 0
    if new is None or any(a <= last for a, _ in new) or any(s.seq <= before.reach for s in more):
        return None
    added = _sent(more, new, route_id, kinds, rendering)
    return SentThinking(
        route_id,
        rendering,
        before.first,
        stated,
        messages,
        max(before.reach, *(b for _, b in new)) if new else before.reach,
        before.thinking + added,
        before.tokens + thinking_tokens(added),
    )


def _spans(
    messages: Iterable[ViewMessage], first: int, *, from_end: bool
) -> list[tuple[int, int]] | None:
    """The (first, last) seqs of the assistant messages the model sees of the loop that
    begins at seq `first`. Read `from_end` of the view, until a message that ends before
    the loop; read forward (a step's new messages), None if one does."""
    spans = []
    assistant = Role.ASSISTANT
    for m in messages:
        if 0 < m.last_seq < first:  # synthetic messages (a missing result) have no seq
            if not from_end:
                return None
            break
        if m.role is assistant and not m.synthetic:
            spans.append((m.first_seq, m.last_seq))
    return spans


def _sent(
    stated: Iterable[Stated],
    spans: list[tuple[int, int]],
    route_id: str,
    kinds: set[str],
    rendering: int,
) -> Thinking:
    """The states of `stated` that go back: of a kind the rendering sends, on the route,
    of a message the model sees something of that one of `spans` holds."""
    if not spans:
        return ()
    # Sorted by start, with the furthest end reached so far: whether a seq is in one of
    # them is a bisect.
    spans = sorted(spans)
    starts = [a for a, _ in spans]
    reach = list(accumulate((b for _, b in spans), max))
    # A response cut while the model reasoned (logged since appends take a message with
    # only native state) is merged into the next assistant message: from rendering 8 its
    # state is not sent with another response's, whatever its kind.
    shown_only = rendering >= renderings.REASONING_ITEMS
    out = []
    for _, seq, state, seen in stated:
        if state.kind not in kinds or state.route_id != route_id or (shown_only and not seen):
            continue
        # A message with nothing the model sees (reasoning only) is not in the view: its
        # state goes with nothing.
        j = bisect_right(starts, seq) - 1
        if j >= 0 and reach[j] >= seq:
            out.append((seq, state.kind, state.data))
    return tuple(out)


def thinking_tokens(thinking: Thinking) -> int:
    # As native state is counted (compile.native_state_tokens): ~4 bytes a token, which
    # over-counts signatures (base64) and is about right for thinking text (R-EST-3).
    return sum(MESSAGE_OVERHEAD + (len(data) + 3) // 4 for _, _, data in thinking)


def of_kind(thinking: Thinking, kind: str, first_seq: int, last_seq: int) -> list[bytes]:
    """The data of `kind` logged with the events an assistant message holds, in order
    (`thinking` is in seq order: the message's entries are found by bisection, since a
    body asks this of every assistant message of a loop that may be long)."""
    i = bisect_left(thinking, first_seq, key=_SEQ)
    j = bisect_right(thinking, last_seq, lo=i, key=_SEQ)
    return [d for _, k, d in thinking[i:j] if k == kind]


_SEQ = itemgetter(0)
