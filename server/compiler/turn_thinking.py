"""Which thinking blocks a view's Anthropic body replays (see domain/thinking.py): those
of the current turn's assistant messages, on the compile's route, that are in the view."""

from __future__ import annotations

from collections.abc import Sequence

from server.compiler.projection_memo import ActiveTurn
from server.compiler.tokens import MESSAGE_OVERHEAD
from server.compiler.view import ViewMessage
from server.domain.model import AssistantMessage, Event, Role
from server.domain.thinking import KIND, thinking_blocks

# (seq of the assistant message's event, the blocks' JSON as logged)
Thinking = tuple[tuple[int, bytes], ...]


def turn_thinking(
    events: Sequence[Event], turn: ActiveTurn, route_id: str, messages: Sequence[ViewMessage]
) -> Thinking:
    if not turn.stated:
        return ()
    first = events[turn.start].seq
    # The assistant messages of the view from the turn's start on (the working set).
    spans = []
    for m in reversed(messages):
        if m.last_seq < first:
            break
        if m.role is Role.ASSISTANT and not m.synthetic:
            spans.append((m.first_seq, m.last_seq))
    out = []
    for i in turn.stated:
        e = events[i]
        assert isinstance(e.payload, AssistantMessage) and e.payload.native_state is not None
        state = e.payload.native_state
        if state.kind != KIND or state.route_id != route_id:
            continue
        # A message with nothing the model sees (reasoning only) is not in the view: its
        # blocks have no turn to lead, and the blocks of one that is must be valid.
        if any(a <= e.seq <= b for a, b in spans) and thinking_blocks(state.data) is not None:
            out.append((e.seq, state.data))
    return tuple(out)


def thinking_tokens(thinking: Thinking) -> int:
    # As native state is counted (compile.native_state_tokens): ~4 bytes a token, which
    # over-counts signatures (base64) and is about right for the text (R-EST-3).
    return sum(MESSAGE_OVERHEAD + (len(data) + 3) // 4 for _, data in thinking)
