"""Tool call/result pairing (R-HIST-3): every result directly follows its call, every
call gets exactly one result.

One pass: calls stay open until their result; a message that is not a result closes
the open calls with synthetic results (the call's id, so the pair is stable across
compiles). A result with no open call gets its call back, folded into the open
assistant message when there is one so results stay contiguous. A call id reused
after its pair closed is renamed `<id>~<n>` in the view, since providers require
unique ids within a request.

Two exceptions, from projection 8 (`deferred`, `imported_apart`):
- an attachment event logged while calls are open (a screenshot a tool took, shown
  before its result was logged) waits until the calls' results are in, instead of
  closing them: closing them sent every such call twice, once with no result and once
  restored, and a Claude turn with thinking then ended in a restored call that carries
  none;
- a tool message imported from another session has no call id: each one gets its own
  stand-in call (`~2`, `~3`... as for a reused id), where the second of two in a row
  was dropped as "a second result" of the empty id.

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


def _missing(call: ToolCall, layer: Layer) -> ViewMessage:
    return ViewMessage(
        Role.TOOL,
        (ViewPart(text=MISSING_RESULT),),
        layer,
        0,
        tool_call_id=call.call_id,
        tool_name=call.name,
        synthetic=True,
        is_error=True,
    )


class _Pass:
    """One pairing pass over a run of messages (see the module's docstring)."""

    def __init__(self, notes: list[str], state: PairState, imported_apart: bool) -> None:
        self.notes = notes
        self.state = state
        self.imported_apart = imported_apart
        self.out: list[ViewMessage] = []
        self.open_calls = list(state.open_calls)
        self.waiting: list[ViewMessage] = []  # deferred messages, shown once no call is open
        # This pass's own entries, read over the state's (which are never changed).
        self.used: dict[str, int] = {}
        self.seen: dict[str, ToolCall] = {}
        self.answered = set(state.answered)
        self.block_start = -1  # index in `out` of the assistant message whose calls are open

    def show(self, call: ToolCall) -> ToolCall:
        before = self.used.get(call.call_id)
        n = (before if before is not None else self.state.used.get(call.call_id) or 0) + 1
        self.used[call.call_id] = n
        return call if n == 1 else replaced(call, call_id=f"{call.call_id}~{n}")

    def close(self, layer: Layer) -> None:
        """Closes the open calls with synthetic results, then shows what waited."""
        self.out.extend(_missing(call, layer) for _, call in self.open_calls)
        self.open_calls.clear()
        self.out.extend(self.waiting)
        self.waiting.clear()

    def message(self, m: ViewMessage) -> None:
        """A message that is not a result: it closes the open calls and opens its own."""
        self.close(m.layer)
        self.answered.clear()
        self.seen.update((c.call_id, c) for c in m.tool_calls)
        shown = tuple(self.show(c) for c in m.tool_calls)
        self.open_calls.extend((c.call_id, s) for c, s in zip(m.tool_calls, shown, strict=True))
        if shown:
            self.block_start = len(self.out)
        self.out.append(m if shown == m.tool_calls else replaced(m, tool_calls=shown))

    def result(self, m: ViewMessage) -> None:
        opened = self.open_calls
        idx = next((i for i, (orig, _) in enumerate(opened) if orig == m.tool_call_id), None)
        call = opened.pop(idx)[1] if idx is not None else None
        if call is None:
            # An imported tool message has no call id: it answers no call twice.
            if m.tool_call_id in self.answered and (m.tool_call_id or not self.imported_apart):
                self.notes.append(f"dropped a second result for call {m.tool_call_id}")
                return
            call = self.restore(m)
        self.answered.add(m.tool_call_id)
        self.out.append(
            m if call.call_id == m.tool_call_id else replaced(m, tool_call_id=call.call_id)
        )
        if self.waiting and not opened:
            self.close(m.layer)  # nothing open to close: shows what waited for these results

    def restore(self, m: ViewMessage) -> ToolCall:
        """The call back for result `m`, whose call is not open: its pair was closed
        early, or the call is not in view (summarised away or never logged), with its
        arguments when they are known."""
        logged = self.seen.get(m.tool_call_id) or self.state.seen.get(m.tool_call_id)
        call = self.show(logged or ToolCall(m.tool_call_id, m.tool_name or "unknown_tool", "{}"))
        why = "its pair was closed early" if logged else "its call is not in the view"
        self.notes.append(f"restored a call for result {m.tool_call_id}: {why}")
        if self.open_calls and self.block_start >= 0:
            host = self.out[self.block_start]
            self.out[self.block_start] = replaced(host, tool_calls=(*host.tool_calls, call))
        else:
            synthetic = ViewMessage(Role.ASSISTANT, (), m.layer, 0, (call,), synthetic=True)
            self.out.append(synthetic)
            self.block_start = len(self.out) - 1
        return call

    def frozen(self) -> PairState:
        state = self.state
        return PairState(
            tuple(self.open_calls),
            state.used.plus(self.used),
            state.seen.plus(self.seen),
            tuple(sorted(self.answered)),
        )


def pair_tool_messages(
    messages: list[ViewMessage],
    notes: list[str],
    state: PairState = PairState(),
    *,
    final: bool = True,
    deferred: frozenset[int] = frozenset(),
    imported_apart: bool = True,
) -> tuple[list[ViewMessage], PairState]:
    """Pairs `messages`, continuing from `state`; `final` closes the calls left open.
    `deferred`: the seqs of messages that wait for open calls' results instead of
    closing them (attachment events). A run that is not `final` must not end with one
    waiting: the memo's cut never falls after an attachment (memo_cut.py)."""
    run = _Pass(notes, state, imported_apart)
    for m in messages:
        if m.role is Role.TOOL:
            run.result(m)
        elif run.open_calls and m.first_seq in deferred:
            run.waiting.append(m)
        else:
            run.message(m)
    if final:
        run.close(run.out[-1].layer if run.out else Layer.HISTORY)
    elif run.waiting:
        raise ValueError("a pairing run that is not final ended with a deferred message")
    return run.out, run.frozen()
