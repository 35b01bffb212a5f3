"""Chains of ViewDeltas applied by the Python client's HeldView, each delta applied to
the view the one before rebuilt (as a stream does): every view handed out is the new
view's exact encoding, and none handed out earlier changes as later deltas apply. The
sections stay, change, swap places, shrink or grow from step to step, the first view's
prompt may be other than its sections joined (the next view's is their join, as the rule
rebuilds it), the head grows (notes) or carries a compaction request (or keeps the
base's, compaction_kept): a reader that keeps
a base's sections, prompt or head where the delta changed them fails here."""

from __future__ import annotations

from typing import Any

import pytest
from ctxcc_client.deltas import DeltaMismatch, HeldView
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxcc.v1 import compile_service_pb2, view_pb2
from tests.unit.test_view_delta import _delta, _encoded_delta, _view

_TEXTS = ["kernel", "memory", "rules", "memory 2", ""]
_KINDS = {text: view_pb2.SectionKind.ValueType(i + 1) for i, text in enumerate(_TEXTS)}
_SECTIONS = st.lists(st.sampled_from(_TEXTS), max_size=4)
_STEP = st.tuples(
    st.integers(0, 3),  # messages appended
    st.booleans(),  # the last message rewritten
    _SECTIONS,
    st.lists(st.sampled_from(["t", "u"]), max_size=2),  # tools
    st.integers(0, 3),  # notes added
    st.sampled_from(["", "summarize a", "summarize b"]),  # the compaction request's prompt
)


def _views(steps: list[Any], odd_prompt: bool) -> list[view_pb2.CompiledView]:
    views, messages, notes = [], ["m0"], 0
    for i, (appended, rewrite, sections, tools, more_notes, compaction) in enumerate(steps):
        messages = messages + [f"m{i}.{k}" for k in range(appended)]
        if rewrite and messages:
            messages[-1] += " (rewritten)"
        notes += more_notes
        view = _view(f"c{i}", messages, sections, tools)
        for section in view.system_sections:  # the same record wherever it is: kept by index
            section.kind = _KINDS[section.text]
        view.notes.extend(f"note {k}" for k in range(notes))
        if compaction:
            view.compaction.prompt = compaction
            view.compaction.through_seq = 3
        views.append(view)
    if odd_prompt:  # a whole view may hold any prompt; a delta's is the sections joined
        views[0].system_prompt = "a prompt of its own"
    return views


@settings(max_examples=200, deadline=None)
@given(
    st.lists(_STEP, min_size=2, max_size=7),
    st.booleans(),
    st.booleans(),
    st.lists(st.booleans(), min_size=7, max_size=7),
    st.booleans(),
    st.booleans(),
)
def test_a_chain_of_deltas_rebuilds_every_view_and_keeps_the_ones_handed_out(
    steps: list[Any],
    chained: bool,
    odd_prompt: bool,
    prepared: list[bool],
    keep: bool,
    apart: bool,
) -> None:
    """`keep`: the steps ask to keep a compaction request equal to the base's; `apart`:
    the chained digest with the compaction hashed apart."""
    apart = apart and chained
    views = _views(steps, odd_prompt)
    held = HeldView.of(views[0], chained, apart=apart)
    handed = [(held.view, views[0].SerializeToString(deterministic=True))]
    for i in range(1, len(views)):
        if prepared[i]:
            held.prepare()
        encoded = _encoded_delta(views[i - 1], views[i], chained, keep, apart)
        held = held.apply(compile_service_pb2.ViewDelta.FromString(encoded))
        want = views[i].SerializeToString(deterministic=True)
        assert held.view.SerializeToString(deterministic=True) == want
        handed.append((held.view, want))
    assert [v.SerializeToString(deterministic=True) for v, _ in handed] == [w for _, w in handed]


@pytest.mark.parametrize("chained", [False, True])
def test_a_base_prompt_that_is_not_its_sections_joined_is_not_kept(chained: bool) -> None:
    """Every slot keeps the base's section at its place, but the base's prompt was its own:
    the rebuilt prompt is the sections joined (kept as is, it fails the digest)."""
    base = _view("a", ["x"], ["k", "m"], [])
    base.system_prompt = "k\nm"
    new = _view("b", ["x", "y"], ["k", "m"], [])
    delta = _delta(base, new, chained)
    assert [s.WhichOneof("slot") for s in delta.sections] == ["base_index", "base_index"]
    rebuilt = HeldView.of(base, chained).apply(delta)
    assert rebuilt.view.system_prompt == "k\n\nm"
    assert rebuilt.view.SerializeToString(deterministic=True) == new.SerializeToString(
        deterministic=True
    )


@pytest.mark.parametrize("chained", [False, True])
def test_a_section_sent_whole_at_index_zero_replaces_the_base_one(chained: bool) -> None:
    """A slot holding a section (its base_index reads 0) at place 0 is no kept section."""
    base = _view("a", ["x"], ["k"], [])
    new = _view("b", ["x", "y"], ["k2"], [])
    delta = _delta(base, new, chained)
    assert delta.sections[0].WhichOneof("slot") == "section"
    assert delta.sections[0].base_index == 0
    rebuilt = HeldView.of(base, chained).apply(delta)
    assert rebuilt.view.system_sections[0].text == "k2" and rebuilt.view.system_prompt == "k2"


@pytest.mark.parametrize("chained", [False, True])
def test_a_damaged_note_past_the_walked_head_fails_the_digest(chained: bool) -> None:
    """The head's fields after the tools are hashed as one slice, not walked: a note
    changed there is still caught by the digest."""
    base = _view("a", ["x"], ["k"], [])
    new = _view("b", ["x", "y"], ["k"], [])
    new.notes.extend(["one", "two"])
    delta = _delta(base, new, chained)
    delta.head.notes[1] = "tw0"
    with pytest.raises(DeltaMismatch):
        HeldView.of(base, chained).apply(delta)


@pytest.mark.parametrize(("chained", "apart"), [(False, False), (True, False), (True, True)])
def test_a_kept_compaction_is_the_latest_one_the_chain_received(chained: bool, apart: bool) -> None:
    """A turn keeps compaction a, the next turn's request b comes in a head, then b is
    kept: the view rebuilt has b (a kept from an earlier view fails the digest; with the
    compaction apart, so does Q of a held past the step that brought b)."""
    kinds: list[Any] = [(1, False, ["kernel"], [], 0, p) for p in ("a", "a", "b", "b", "b")]
    views = _views(kinds, odd_prompt=False)
    held = HeldView.of(views[0], chained, apart=apart)
    for i in range(1, len(views)):
        encoded = _encoded_delta(views[i - 1], views[i], chained, True, apart)
        delta = compile_service_pb2.ViewDelta.FromString(encoded)
        assert delta.compaction_kept == (i != 2)
        held = held.apply(delta)
        assert held.view.compaction.prompt == views[i].compaction.prompt
