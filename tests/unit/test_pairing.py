"""Tool-call pairing continued from a frozen state: the call ids seen so far live in a
persistent map (`Ids`) so a continued pass does not copy every id of the history."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from server.compiler.pairing import Ids, PairState, pair_tool_messages
from server.compiler.view import Layer, ViewMessage, ViewPart
from server.domain.model import ArtifactRef, Role, ToolCall

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


def _at(m: ViewMessage, seq: int) -> ViewMessage:
    return replace(m, first_seq=seq, last_seq=seq)


SHOT = ViewMessage(
    Role.USER, (ViewPart(attachment=ArtifactRef("a-1", "image/png", 70, "ff")),), Layer.HISTORY, 0
)


def _shape(out: list[ViewMessage]) -> list[str]:
    """Each message as role, call ids and whether pairing made it up."""
    shapes = []
    for m in out:
        ids = ",".join(c.call_id for c in m.tool_calls) or m.tool_call_id
        shapes.append(f"{m.role.name.lower()}{'*' if m.synthetic else ''}:{ids}")
    return shapes


def test_an_attachment_logged_while_a_call_runs_waits_for_its_result() -> None:
    """A screenshot an agent logs before the result of the call that took it: the call
    keeps its own result and the image follows it. Before projection 8 the attachment
    closed the call with a made-up failure, and the real result came back under a
    restored call `c1~2` (two calls for one, and a Claude turn with thinking ending in a
    call that carries none)."""
    msgs = [_at(_assistant(["c1"]), 2), _at(SHOT, 3), _at(_result("c1"), 4)]
    notes: list[str] = []
    out, state = pair_tool_messages(list(msgs), notes, deferred=frozenset({3}))
    assert _shape(out) == ["assistant:c1", "tool:c1", "user:"]
    assert out[2] is msgs[1] and notes == [] and state.open_calls == ()
    then, _ = pair_tool_messages(list(msgs), notes)
    assert _shape(then) == ["assistant:c1", "tool*:c1", "user:", "assistant*:c1~2", "tool:c1~2"]


def test_a_waiting_attachment_follows_the_last_result_of_parallel_calls() -> None:
    msgs = [
        _at(_assistant(["c1", "c2"]), 2),
        _at(_result("c2"), 3),
        _at(SHOT, 4),
        _at(
            replace(SHOT, parts=(ViewPart(attachment=ArtifactRef("a-2", "image/png", 70, "ee")),)),
            5,
        ),
        _at(_result("c1"), 6),
        _at(USER, 7),
    ]
    out, _ = pair_tool_messages(list(msgs), [], deferred=frozenset({4, 5}))
    assert _shape(out) == ["assistant:c1,c2", "tool:c2", "tool:c1", "user:", "user:", "user:"]
    assert [m.first_seq for m in out[3:]] == [4, 5, 7]  # in their own order


def test_a_waiting_attachment_follows_the_results_made_up_for_calls_never_answered() -> None:
    """Closed by the next message or by the end of the view: the calls' synthetic
    results first (results follow their calls at once), then what waited."""
    calls, shot = _at(_assistant(["c1"]), 2), _at(SHOT, 3)
    for end in ([_at(USER, 4)], []):
        out, _ = pair_tool_messages([calls, shot, *end], [], deferred=frozenset({3}))
        assert _shape(out) == ["assistant:c1", "tool*:c1", "user:", *(["user:"] if end else [])]
        assert out[2] is shot


def test_an_attachment_with_no_call_open_is_an_ordinary_message() -> None:
    msgs = [_at(_assistant(["c1"]), 2), _at(_result("c1"), 3), _at(SHOT, 4), _at(_result("c1"), 5)]
    notes: list[str] = []
    out, _ = pair_tool_messages(list(msgs), notes, deferred=frozenset({4}))
    # The later result is the same call's second: after a message, it gets its call back.
    assert _shape(out) == ["assistant:c1", "tool:c1", "user:", "assistant*:c1~2", "tool:c1~2"]


def test_a_run_that_stops_with_an_attachment_waiting_is_refused() -> None:
    """The memo's cut never falls after an attachment (memo_cut.py); were it to, the
    waiting message would be lost from the memo: the pass says so instead."""
    msgs = [_at(_assistant(["c1"]), 2), _at(SHOT, 3)]
    with pytest.raises(ValueError, match="deferred"):
        pair_tool_messages(list(msgs), [], final=False, deferred=frozenset({3}))


def test_each_imported_tool_message_gets_a_stand_in_call_of_its_own() -> None:
    """A tool message imported from another session carries no call id. The second of
    two in a row was dropped as a second result of the empty id, its text lost."""
    imported = [
        ViewMessage(Role.TOOL, (ViewPart(text=t),), Layer.HISTORY, 0, origin_session_id="o")
        for t in ("42 rows", "3 files")
    ]
    notes: list[str] = []
    out, _ = pair_tool_messages([USER, *imported], notes)
    assert _shape(out) == ["user:", "assistant*:", "tool:", "assistant*:~2", "tool:~2"]
    assert [out[2].parts[0].text, out[4].parts[0].text] == ["42 rows", "3 files"]
    assert not any("dropped" in n for n in notes)
    then, _ = pair_tool_messages([USER, *imported], notes, imported_apart=False)
    assert [m.parts[0].text for m in then if m.role is Role.TOOL] == ["42 rows"]
