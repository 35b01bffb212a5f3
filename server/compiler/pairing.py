"""Tool call/result pairing (R-HIST-3): every result directly follows its call, every
call gets exactly one result.

One pass: calls stay open until their result; a message that is not a result closes
the open calls with synthetic results (the call's id, so the pair is stable across
compiles). A result with no open call gets its call back, folded into the open
assistant message when there is one so results stay contiguous. A call id reused
after its pair closed is renamed `<id>~<n>` in the view, since providers require
unique ids within a request.

The pass can stop between two messages and go on later from a frozen `PairState`
(incremental compilation). That is exact when the next run starts with a message that
is not a result (it closes the open calls at once), or with a result while no call is
open: either way nothing after it folds a call back into a message the earlier run
emitted.

The ids seen so far grow with the whole history, so the state keeps them in a persistent
map (`Ids`): a pass reads through it and adds only what it saw itself, and a continued
pass costs what its own messages cost, not a copy of every id logged before.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from server.compiler.view import Layer, ViewMessage, ViewPart
from server.domain.model import Role, ToolCall
from server.domain.replacing import replaced

MISSING_RESULT = "[no result was recorded for this call: it was interrupted or never finished]"


V = TypeVar("V")


@dataclass(frozen=True, slots=True)
class Ids(Generic[V]):
    """A persistent map of call ids: levels of dicts that are never changed once made,
    newest last. Each level is over twice the size of the next one (merging keeps it
    so), so a lookup tries at most ~log2(n) levels and each id is copied ~log2(n) times
    over its life, instead of every id on every pass."""

    levels: tuple[Mapping[str, V], ...] = ()

    def get(self, key: str) -> V | None:
        for level in reversed(self.levels):
            found = level.get(key)
            if found is not None:
                return found
        return None

    def plus(self, new: dict[str, V]) -> Ids[V]:
        """This map with `new`'s entries over it (`new` is not kept: copied)."""
        if not new:
            return self
        levels = [*self.levels, dict(new)]
        while len(levels) > 1 and len(levels[-2]) <= 2 * len(levels[-1]):
            newer = levels.pop()
            levels[-1] = {**levels[-1], **newer}
        return Ids(tuple(levels))

    def as_dict(self) -> dict[str, V]:
        """The whole map (for tests and inspection: O(n))."""
        out: dict[str, V] = {}
        for level in self.levels:
            out.update(level)
        return out


@dataclass(frozen=True, slots=True)
class PairState:
    """What a pairing pass carries from one run of messages to the next."""

    # (original id, call as shown), in order: calls still waiting for their result.
    open_calls: tuple[tuple[str, ToolCall], ...] = ()
    # original id -> how many calls have been shown with it.
    used: Ids[int] = Ids()
    # original id -> the latest call logged with it.
    seen: Ids[ToolCall] = Ids()
    # original ids answered since the last message that is not a result.
    answered: tuple[str, ...] = ()


def pair_tool_messages(
    messages: list[ViewMessage],
    notes: list[str],
    state: PairState = PairState(),
    *,
    final: bool = True,
) -> tuple[list[ViewMessage], PairState]:
    """Pairs `messages`, continuing from `state`; `final` closes the calls left open."""
    out: list[ViewMessage] = []
    open_calls = list(state.open_calls)
    # This pass's own entries, read over the state's (which are never changed).
    used: dict[str, int] = {}
    seen: dict[str, ToolCall] = {}
    block_start = -1  # index in `out` of the assistant message whose calls are open

    def show(call: ToolCall) -> ToolCall:
        before = used.get(call.call_id)
        n = (before if before is not None else state.used.get(call.call_id) or 0) + 1
        used[call.call_id] = n
        return call if n == 1 else replaced(call, call_id=f"{call.call_id}~{n}")

    def close(layer: Layer) -> None:
        for _, call in open_calls:
            out.append(
                ViewMessage(
                    Role.TOOL,
                    (ViewPart(text=MISSING_RESULT),),
                    layer,
                    0,
                    tool_call_id=call.call_id,
                    tool_name=call.name,
                    synthetic=True,
                    is_error=True,
                )
            )
        open_calls.clear()

    answered = set(state.answered)
    for m in messages:
        if m.role != Role.TOOL:
            close(m.layer)
            answered.clear()
            seen.update((c.call_id, c) for c in m.tool_calls)
            shown = tuple(show(c) for c in m.tool_calls)
            open_calls.extend((c.call_id, s) for c, s in zip(m.tool_calls, shown, strict=True))
            if shown:
                block_start = len(out)
            out.append(m if shown == m.tool_calls else replaced(m, tool_calls=shown))
            continue
        idx = next((i for i, (orig, _) in enumerate(open_calls) if orig == m.tool_call_id), None)
        call = open_calls.pop(idx)[1] if idx is not None else None
        if call is None:
            if m.tool_call_id in answered:
                notes.append(f"dropped a second result for call {m.tool_call_id}")
                continue
            # The call's pair was closed early, or the call is not in view (summarised
            # away or never logged): restore it, with its arguments when they are known.
            logged = seen.get(m.tool_call_id) or state.seen.get(m.tool_call_id)
            call = show(logged or ToolCall(m.tool_call_id, m.tool_name or "unknown_tool", "{}"))
            why = "its pair was closed early" if logged else "its call is not in the view"
            notes.append(f"restored a call for result {m.tool_call_id}: {why}")
            if open_calls and block_start >= 0:
                host = out[block_start]
                out[block_start] = replaced(host, tool_calls=(*host.tool_calls, call))
            else:
                out.append(
                    ViewMessage(Role.ASSISTANT, (), m.layer, 0, tool_calls=(call,), synthetic=True)
                )
                block_start = len(out) - 1
        answered.add(m.tool_call_id)
        out.append(m if call.call_id == m.tool_call_id else replaced(m, tool_call_id=call.call_id))
    if final:
        close(out[-1].layer if out else Layer.HISTORY)
    return out, PairState(
        tuple(open_calls), state.used.plus(used), state.seen.plus(seen), tuple(sorted(answered))
    )
