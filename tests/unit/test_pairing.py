"""Tool-call pairing continued from a frozen state: the call ids seen so far live in a
persistent map (`Ids`) so a continued pass does not copy every id of the history."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from server.compiler.pairing import Ids, PairState, pair_tool_messages
from server.compiler.view import Layer, ViewMessage, ViewPart
from server.domain.model import Role, ToolCall

keys = st.sampled_from([f"c{i}" for i in range(40)])
batches = st.lists(st.dictionaries(keys, st.integers(1, 9), max_size=12), max_size=30)


@settings(max_examples=200, deadline=None)
@given(batches)
def test_ids_behave_as_a_dict_and_older_maps_never_change(batches: list[dict[str, int]]) -> None:
    ids: Ids[int] = Ids()
    model: dict[str, int] = {}
    history: list[tuple[Ids[int], dict[str, int]]] = []
    for batch in batches:
        ids = ids.plus(batch)
        model = model | batch
        history.append((ids, dict(model)))
        sizes = [len(level) for level in ids.levels]
        # Each level is over twice the next: lookups try ~log2(n) levels.
        assert all(a > 2 * b for a, b in itertools.pairwise(sizes)), sizes
    for snapshot, expected in history:
        assert snapshot.as_dict() == expected
        for i in range(42):
            assert snapshot.get(f"c{i}") == expected.get(f"c{i}")


def _assistant(ids: list[str]) -> ViewMessage:
    calls = tuple(ToolCall(c, "shell", "{}") for c in ids)
    return ViewMessage(Role.ASSISTANT, (ViewPart(text="go"),), Layer.HISTORY, 0, tool_calls=calls)


def _result(call: str) -> ViewMessage:
    return ViewMessage(
        Role.TOOL, (ViewPart(text="ok"),), Layer.HISTORY, 0, tool_call_id=call, tool_name="shell"
    )


USER = ViewMessage(Role.USER, (ViewPart(text="next"),), Layer.HISTORY, 0)
few_ids = st.sampled_from([f"c{i}" for i in range(25)])
messages = st.one_of(
    st.lists(few_ids, max_size=3).map(_assistant),
    few_ids.map(_result),
    st.just(USER),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(messages, max_size=60), st.lists(st.integers(0, 60), max_size=12))
def test_pairing_in_pieces_equals_one_pass(msgs: list[ViewMessage], cuts: list[int]) -> None:
    """Cut before messages that are not results (where a continued pass is exact), the
    pieces paired one after another from the state give the one pass's messages and
    notes: reused ids renamed `<id>~<n>` across pieces, calls restored from earlier ones."""
    notes: list[str] = []
    whole, _ = pair_tool_messages(list(msgs), notes)
    at = sorted({c for c in cuts if c < len(msgs) and msgs[c].role is not Role.TOOL} | {0})
    bounds = [*at, len(msgs)]
    state, out, piece_notes = PairState(), list[ViewMessage](), list[str]()
    for i, (a, b) in enumerate(itertools.pairwise(bounds)):
        done, state = pair_tool_messages(
            list(msgs[a:b]), piece_notes, state, final=i == len(bounds) - 2
        )
        out += done
    assert out == whole
    assert piece_notes == notes


def test_a_reused_id_is_renamed_after_many_pieces() -> None:
    state, notes = PairState(), list[str]()
    shown = []
    for _ in range(50):
        out, state = pair_tool_messages([_assistant(["c"]), _result("c"), USER], notes, state)
        shown.append(out[0].tool_calls[0].call_id)
    assert shown == ["c"] + [f"c~{n}" for n in range(2, 51)]
    assert state.used.get("c") == 50
    assert len(state.used.levels) == 1
