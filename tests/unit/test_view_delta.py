"""The daemon's ViewDelta encoder (server/transport/view_delta.py) against the Python
client's reader (ctxcc_client/deltas.py) on the edges a session rarely reaches: the first
message differs (nothing kept), the base has more messages than the new view, the tools
change to none, a section kept at index 0 (a oneof field sent although it is 0), a
system prompt that is not the joined sections (no delta); each with the whole view's
sha256 and with the chained digest, whose value is checked against the proto's rule
computed from the whole view in one go; a damaged base, kept count, head, section or
tools flag is refused with either digest. Views are built as protobuf messages and cut
into ViewBytes with protobuf itself, so neither side's splitting is trusted."""

from __future__ import annotations

import hashlib
import itertools
from pathlib import Path
from typing import Any

import pytest
from ctxcc_client.deltas import DeltaMismatch, HeldView
from hypothesis import example, given, settings
from hypothesis import strategies as st

from ctxcc.v1 import common_pb2, compile_service_pb2, tool_pb2, view_pb2
from server.transport.view_bytes import ViewBytes
from server.transport.view_delta import chained_delta_record, common_prefix, delta_record
from tests.integration.delta_session import apart_digest, apply_delta, chained_digest

_FRONT, _MIDDLE = (1, 2, 3, 4, 5), (8, 9)


def _only(view: view_pb2.CompiledView, numbers: tuple[int, ...]) -> bytes:
    part = view_pb2.CompiledView()
    part.CopyFrom(view)
    for f in view_pb2.CompiledView.DESCRIPTOR.fields:
        if f.number not in numbers:
            part.ClearField(f.name)  # type: ignore[arg-type]
    return part.SerializeToString(deterministic=True)


def _records(number: int, items: list[bytes]) -> tuple[bytes, ...]:
    out = []
    for data in items:
        one = view_pb2.CompiledView()
        field = view_pb2.CompiledView.DESCRIPTOR.fields_by_number[number].name
        getattr(one, field).add().MergeFromString(data)
        out.append(one.SerializeToString(deterministic=True))
    return tuple(out)


def cut(view: view_pb2.CompiledView) -> ViewBytes:
    det = [
        _records(6, [s.SerializeToString(deterministic=True) for s in view.system_sections]),
        _records(10, [m.SerializeToString(deterministic=True) for m in view.messages]),
        _records(11, [t.SerializeToString(deterministic=True) for t in view.tools]),
    ]
    back = tuple(f.number for f in view_pb2.CompiledView.DESCRIPTOR.fields if f.number > 11)
    # The compaction request's record (field 19) and where it starts within `back`.
    before = _only(view, tuple(n for n in back if n < 19))
    compaction = _only(view, (19,))
    vb = ViewBytes(
        compile_id=view.compile_id,
        session_id=view.session_id,
        event_boundary=view.event_boundary,
        front=_only(view, _FRONT),
        sections=det[0],
        prompt=_only(view, (7,)),
        middle=_only(view, _MIDDLE),
        messages=det[1],
        tools=det[2],
        back=_only(view, back),
        prompt_is_joined=view.system_prompt == "\n\n".join(s.text for s in view.system_sections),
        size=view.ByteSize(),
        compaction=compaction,
        compaction_at=len(before),
    )
    assert vb.whole() == view.SerializeToString(deterministic=True)
    return vb


def _view(
    cid: str, messages: list[str], sections: list[str], tools: list[str]
) -> view_pb2.CompiledView:
    v = view_pb2.CompiledView(
        compile_id=cid,
        session_id="s",
        event_boundary=len(messages),
        route=common_pb2.Route(model="m"),
        prefix_digest="ab" * 32,
        changed_sections=[view_pb2.SECTION_KIND_MEMORY],
        notes=["n"],
    )
    for text in messages:
        m = v.messages.add(first_seq=1)
        m.parts.add(text=text)
    for i, text in enumerate(sections):
        v.system_sections.add(kind=view_pb2.SectionKind.ValueType(i + 1), text=text)
    v.system_prompt = "\n\n".join(sections)
    for name in tools:
        v.tools.add(definition=tool_pb2.ToolDefinition(name=name, input_schema_json="{}"))
    v.layers.add(layer=view_pb2.LAYER_HISTORY, tokens=len(messages))
    return v


def roundtrip(
    base: view_pb2.CompiledView, new: view_pb2.CompiledView
) -> compile_service_pb2.ViewDelta:
    encoded = delta_record(cut(base), cut(new))
    assert encoded is not None
    delta = compile_service_pb2.ViewDelta.FromString(encoded)
    want = new.SerializeToString(deterministic=True)
    assert delta.view_sha256 == hashlib.sha256(want).hexdigest()
    rebuilt = HeldView.of(base).apply(delta)
    assert rebuilt.view.SerializeToString(deterministic=True) == want
    chained = chained_roundtrip(base, new)
    assert chained.SerializeToString() == delta.SerializeToString().replace(
        _digest_field(8, delta.view_sha256), b""
    ) + _digest_field(9, chained.chain_sha256)
    return delta


def _digest_field(number: int, hexdigest: str) -> bytes:
    return bytes([number << 3 | 2, 64]) + hexdigest.encode()


def chained_roundtrip(
    base: view_pb2.CompiledView, new: view_pb2.CompiledView
) -> compile_service_pb2.ViewDelta:
    """The delta with the chained digest, from the base's chain values kept and not."""
    found = chained_delta_record(cut(base), cut(new), None)
    assert found is not None
    encoded, values = found
    base_values = chained_delta_record(cut(_view("z", [], [], [])), cut(base), None)
    assert base_values is not None
    assert chained_delta_record(cut(base), cut(new), base_values[1]) == found
    delta = compile_service_pb2.ViewDelta.FromString(encoded)
    assert not delta.view_sha256 and delta.chain_sha256 == chained_digest(new)
    assert len(values) == len(new.messages)
    for prepared in (False, True):  # the view handed out copied after the answer, or before
        held = HeldView.of(base, chained=True)
        if prepared:
            held.prepare()
        rebuilt = held.apply(delta)
        assert rebuilt.view.SerializeToString(deterministic=True) == new.SerializeToString(
            deterministic=True
        )
        assert rebuilt.chain == values, "the client's chain values are the daemon's"
        assert rebuilt.own[0] is not rebuilt.view
        assert rebuilt.own[0].SerializeToString() == rebuilt.view.SerializeToString()
    return delta


def test_nothing_kept_when_the_first_message_differs() -> None:
    delta = roundtrip(
        _view("a", ["x", "y"], ["k"], ["t"]), _view("b", ["summary", "y"], ["k"], ["t"])
    )
    assert (delta.kept_messages, len(delta.appended_messages)) == (0, 2)


def test_a_shorter_view_keeps_a_prefix() -> None:
    delta = roundtrip(_view("a", ["x", "y", "z"], ["k"], []), _view("b", ["x"], ["k"], []))
    assert (delta.kept_messages, len(delta.appended_messages)) == (1, 0)


def test_tools_that_change_to_none_are_sent_as_changed() -> None:
    delta = roundtrip(_view("a", ["x"], ["k"], ["t", "u"]), _view("b", ["x", "y"], ["k"], []))
    assert delta.tools_changed and not delta.tools
    same = roundtrip(_view("a", ["x"], ["k"], ["t"]), _view("b", ["x"], ["k"], ["t"]))
    assert not same.tools_changed


def test_sections_by_index_zero_and_whole() -> None:
    delta = roundtrip(
        _view("a", ["x"], ["kernel", "memory"], []),
        _view("b", ["x"], ["kernel", "memory changed"], []),
    )
    kinds = [s.WhichOneof("slot") for s in delta.sections]
    assert kinds == ["base_index", "section"] and delta.sections[0].base_index == 0


def test_no_delta_when_the_prompt_is_not_the_joined_sections() -> None:
    new = _view("b", ["x"], ["k", "m"], [])
    new.system_prompt = "k\nm"
    assert delta_record(cut(_view("a", ["x"], ["k"], [])), cut(new)) is None


def test_the_reader_refuses_a_delta_for_another_base_or_too_many_kept() -> None:
    base, new = _view("a", ["x"], ["k"], []), _view("b", ["x", "y"], ["k"], [])
    encoded = delta_record(cut(base), cut(new))
    assert encoded is not None
    delta = compile_service_pb2.ViewDelta.FromString(encoded)
    with pytest.raises(DeltaMismatch):
        HeldView.of(_view("other", ["x"], ["k"], [])).apply(delta)
    delta.kept_messages = 5
    with pytest.raises(DeltaMismatch):
        HeldView.of(base).apply(delta)


def _delta(
    base: view_pb2.CompiledView, new: view_pb2.CompiledView, chained: bool, apart: bool = False
) -> Any:
    if chained:
        found = chained_delta_record(cut(base), cut(new), None, compaction_apart=apart)
        assert found is not None
        return compile_service_pb2.ViewDelta.FromString(found[0])
    encoded = delta_record(cut(base), cut(new))
    assert encoded is not None
    return compile_service_pb2.ViewDelta.FromString(encoded)


def _damage_base(base: view_pb2.CompiledView, delta: Any) -> view_pb2.CompiledView:
    # The client's base differs from the daemon's in a kept message (its chain values
    # are of the damaged one: as if it had been received so).
    damaged = view_pb2.CompiledView()
    damaged.CopyFrom(base)
    damaged.messages[1].parts[0].text = "y!"
    return damaged


def _damage_kept(base: view_pb2.CompiledView, delta: Any) -> view_pb2.CompiledView:
    delta.kept_messages -= 1
    return base


def _damage_head(base: view_pb2.CompiledView, delta: Any) -> view_pb2.CompiledView:
    delta.head.notes.append("x")
    return base


def _damage_section(base: view_pb2.CompiledView, delta: Any) -> view_pb2.CompiledView:
    delta.sections[0].base_index = 1
    return base


def _damage_tools(base: view_pb2.CompiledView, delta: Any) -> view_pb2.CompiledView:
    delta.tools_changed = True  # and no tools: the base's are dropped
    return base


# The three digests a step may ask for: (chained, compaction apart).
DIGESTS = pytest.mark.parametrize(
    ("chained", "apart"), [(False, False), (True, False), (True, True)]
)


@DIGESTS
@pytest.mark.parametrize(
    "damage", [_damage_base, _damage_kept, _damage_head, _damage_section, _damage_tools]
)
def test_a_damaged_rebuild_fails_its_digest(chained: bool, apart: bool, damage: Any) -> None:
    base = _view("a", ["x", "y", "z"], ["k", "m"], ["t"])
    new = _view("b", ["x", "y", "z", "w"], ["k", "m"], ["t"])
    delta = _delta(base, new, chained, apart)
    assert delta.kept_messages == 3
    HeldView.of(base, chained, apart=apart).apply(delta)  # undamaged, it checks
    held = damage(base, delta)
    with pytest.raises(DeltaMismatch):
        HeldView.of(held, chained, apart=apart).apply(delta)


@pytest.mark.parametrize("prepared", [False, True])
@pytest.mark.parametrize("caller_edits", [False, True])
def test_views_handed_out_are_never_changed_and_changing_them_changes_nothing(
    caller_edits: bool, prepared: bool
) -> None:
    """Also when each next view is a copy made ahead of its delta (`prepare`, which the
    stream calls while the step is on its way)."""
    views = [_view(str(i), ["x"] * i, ["k", f"m{i}"], ["t"] * (i % 2)) for i in range(1, 6)]
    held = HeldView.of(views[0], chained=True)
    handed = [(held.view, views[0].SerializeToString(deterministic=True))]
    for base, new in itertools.pairwise(views):
        if caller_edits:  # the next rebuild must not see what the caller did to its view
            held.view.messages[0].parts[0].text = "the caller's"
            held.view.notes.append("the caller's")
        if prepared:
            held.prepare()
            held.prepare()  # once is what it keeps
            if caller_edits:
                held.view.notes.append("after the copy")
        held = held.apply(_delta(base, new, chained=True))
        want = new.SerializeToString(deterministic=True)
        assert held.view.SerializeToString(deterministic=True) == want
        handed.append((held.view, want))
    if not caller_edits:  # later steps did not change the views handed out before
        assert [v.SerializeToString(deterministic=True) for v, _ in handed] == [
            w for _, w in handed
        ]


def test_a_held_view_rebuilds_once_and_takes_a_whole_view_digest_too() -> None:
    base = _view("a", ["x"], ["k"], [])
    new = _view("b", ["x", "y"], ["k"], [])
    held = HeldView.of(base, chained=True)
    held.apply(_delta(base, new, chained=True))
    with pytest.raises(DeltaMismatch):  # its internal copy became the new view's
        held.apply(_delta(base, new, chained=True))
    # A daemon that ignores the chained digest answers with view_sha256: still checked.
    again = HeldView.of(base, chained=True).apply(_delta(base, new, chained=False))
    assert again.view.SerializeToString(deterministic=True) == new.SerializeToString(
        deterministic=True
    )


def test_the_client_fixtures_chained_digests_follow_the_proto() -> None:
    """tests/fixtures/client-views/chain_sha256.txt, which the Go and TypeScript clients'
    tests check their digests against, holds the daemon's digests of the fixture views and
    they are the proto's rule computed from the whole views."""
    folder = Path(__file__).resolve().parents[1] / "fixtures" / "client-views"
    lines = (folder / "chain_sha256.txt").read_text().split()
    stated = dict(zip(lines[::2], lines[1::2], strict=True))
    assert sorted(stated) == ["view1", "view2", "view3", "view6"]
    for name, digest in stated.items():
        view = view_pb2.CompiledView.FromString((folder / f"{name}.binpb").read_bytes())
        assert chained_digest(view) == digest
        found = chained_delta_record(cut(_view("z", [], [], [])), cut(view), None)
        assert found is not None
        assert compile_service_pb2.ViewDelta.FromString(found[0]).chain_sha256 == digest


def test_the_client_fixtures_apart_digests_follow_the_proto() -> None:
    """tests/fixtures/client-views/apart_sha256.txt (the digests with the compaction apart
    that the Go and TypeScript clients' tests check theirs against) holds the daemon's
    digests of the fixture views, and they are the proto's rule; views 4 and 5 carry one
    compaction request, which a delta from 4 to 5 keeps."""
    folder = Path(__file__).resolve().parents[1] / "fixtures" / "client-views"
    lines = (folder / "apart_sha256.txt").read_text().split()
    stated = dict(zip(lines[::2], lines[1::2], strict=True))
    assert sorted(stated) == [f"view{i}" for i in range(1, 7)]
    views = {
        name: view_pb2.CompiledView.FromString((folder / f"{name}.binpb").read_bytes())
        for name in stated
    }
    for name, digest in stated.items():
        assert apart_digest(views[name]) == digest
        found = chained_delta_record(
            cut(_view("z", [], [], [])), cut(views[name]), None, True, True
        )
        assert found is not None
        assert compile_service_pb2.ViewDelta.FromString(found[0]).chain_sha256 == digest
    assert views["view4"].compaction == views["view5"].compaction
    assert len(views["view4"].compaction.prompt) > 20_000
    kept = chained_delta_record(cut(views["view4"]), cut(views["view5"]), None, True, True)
    assert kept is not None
    delta = compile_service_pb2.ViewDelta.FromString(kept[0])
    assert delta.compaction_kept and delta.chain_sha256 == stated["view5"]


@pytest.mark.parametrize("chained", [False, True])
def test_what_a_head_should_leave_empty_is_rebuilt_from_the_base(chained: bool) -> None:
    """The rule rebuilds messages, sections, prompt and tools; a head that carries some
    anyway does not add them to the view (the Python client merges the head into its
    own copy of the view)."""
    base = _view("a", ["x"], ["k"], ["t"])
    new = _view("b", ["x", "y"], ["k"], ["t"])
    delta = _delta(base, new, chained)
    delta.head.tools.add().definition.name = "extra"
    delta.head.messages.add().parts.add(text="extra")
    delta.head.system_sections.add(text="extra")
    delta.head.system_prompt = "extra"
    rebuilt = HeldView.of(base, chained).apply(delta)
    assert rebuilt.view.SerializeToString(deterministic=True) == new.SerializeToString(
        deterministic=True
    )


_RECORD = st.sampled_from([b"a", b"b", b"ab", b""])


@settings(max_examples=400, deadline=None)
@example([b"a"] * 40, [b"a"] * 39 + [b"b"], 0)  # differs only at the end
@example([b"a"] * 40, [b"b"] + [b"a"] * 39, 0)  # differs first, equal after
@example([b"a"] * 40, [b"a"] * 5 + [b"b"] + [b"a"] * 34, 0)  # one in the middle
@given(st.lists(_RECORD, max_size=50), st.lists(_RECORD, max_size=50), st.integers(0, 50))
def test_the_kept_count_is_the_first_unequal_record(
    a: list[bytes], b: list[bytes], shared: int
) -> None:
    """common_prefix looks for the first unequal record from the end: it is still the
    first index where the records differ, wherever the differences are (equal bytes
    that are other objects count as equal)."""
    old = tuple(a)
    new = tuple(bytes(bytearray(x)) for x in a[:shared] + b)  # a prefix in common
    want = next(
        (i for i, (x, y) in enumerate(zip(old, new, strict=False)) if x != y),
        min(len(old), len(new)),
    )
    assert common_prefix(old, new) == want


_COMPACTION = view_pb2.CompactionRequest(
    from_seq=1, through_seq=2, prompt="Summarise the conversation. " * 2_000
)


def _with_compaction(
    view: view_pb2.CompiledView, request: view_pb2.CompactionRequest | None = _COMPACTION
) -> view_pb2.CompiledView:
    if request is not None:
        view.compaction.CopyFrom(request)
    return view


def _encoded_delta(
    base: view_pb2.CompiledView,
    new: view_pb2.CompiledView,
    chained: bool,
    keep: bool,
    apart: bool = False,
) -> bytes:
    if chained:
        found = chained_delta_record(cut(base), cut(new), None, keep, apart)
        assert found is not None
        return found[0]
    encoded = delta_record(cut(base), cut(new), keep)
    assert encoded is not None
    return encoded


@DIGESTS
def test_a_compaction_the_base_has_is_kept_when_asked(chained: bool, apart: bool) -> None:
    """Over budget every step of a turn recommends the same compaction: a step that asks
    (keep_compaction) gets a delta without its prompt, which the client and the reference
    reader of the proto take from the base; the digest still covers it."""
    base = _with_compaction(_view("a", ["x", "y"], ["k"], ["t"]))
    new = _with_compaction(_view("b", ["x", "y", "z"], ["k"], ["t"]))
    want = new.SerializeToString(deterministic=True)
    encoded = _encoded_delta(base, new, chained, keep=True, apart=apart)
    delta = compile_service_pb2.ViewDelta.FromString(encoded)
    assert delta.compaction_kept and not delta.head.HasField("compaction")
    assert len(encoded) < len(_COMPACTION.prompt) // 50
    held = HeldView.of(base, chained=chained, apart=apart)
    assert held.apply(delta).view.SerializeToString(deterministic=True) == want
    assert apply_delta(base, delta).SerializeToString(deterministic=True) == want
    # A client that did not ask gets the prompt in the head, as before the field existed.
    plain = compile_service_pb2.ViewDelta.FromString(
        _encoded_delta(base, new, chained, False, apart)
    )
    assert not plain.compaction_kept and plain.head.compaction == _COMPACTION
    assert len(plain.SerializeToString()) > len(encoded) + len(_COMPACTION.prompt)
    assert (
        HeldView.of(base, chained=chained, apart=apart)
        .apply(plain)
        .view.SerializeToString(deterministic=True)
        == want
    )


@DIGESTS
def test_a_compaction_that_changed_or_is_new_is_sent(chained: bool, apart: bool) -> None:
    """Kept only when the new view's compaction is the base's, field for field: a new turn
    (another range), a base without one, or a view without one get no compaction_kept."""
    moved = view_pb2.CompactionRequest()
    moved.CopyFrom(_COMPACTION)
    moved.through_seq += 1
    cases = [
        (_with_compaction(_view("a", ["x"], ["k"], [])), moved),
        (_with_compaction(_view("a", ["x"], ["k"], []), None), _COMPACTION),
        (_with_compaction(_view("a", ["x"], ["k"], [])), None),
    ]
    for base, request in cases:
        new = _with_compaction(_view("b", ["x", "y"], ["k"], []), request)
        delta = compile_service_pb2.ViewDelta.FromString(
            _encoded_delta(base, new, chained, keep=True, apart=apart)
        )
        assert not delta.compaction_kept
        assert delta.head.HasField("compaction") == (request is not None)
        if request is not None:
            assert delta.head.compaction == request
        rebuilt = HeldView.of(base, chained=chained, apart=apart).apply(delta).view
        assert rebuilt.SerializeToString(deterministic=True) == new.SerializeToString(
            deterministic=True
        )


@DIGESTS
def test_a_kept_compaction_the_client_cannot_take_is_a_mismatch(chained: bool, apart: bool) -> None:
    base = _with_compaction(_view("a", ["x"], ["k"], []))
    new = _with_compaction(_view("b", ["x", "y"], ["k"], []))
    delta = compile_service_pb2.ViewDelta.FromString(
        _encoded_delta(base, new, chained, True, apart)
    )
    bare = _with_compaction(_view("a", ["x"], ["k"], []), None)
    with pytest.raises(DeltaMismatch):
        HeldView.of(bare, chained=chained, apart=apart).apply(delta)
    both = compile_service_pb2.ViewDelta()
    both.CopyFrom(delta)
    both.head.compaction.CopyFrom(_COMPACTION)
    with pytest.raises(DeltaMismatch):
        HeldView.of(base, chained=chained, apart=apart).apply(both)
    # The base's compaction differs from the new view's: the digest catches it.
    other = _with_compaction(_view("a", ["x"], ["k"], []), view_pb2.CompactionRequest(prompt="o"))
    with pytest.raises(DeltaMismatch):
        HeldView.of(other, chained=chained, apart=apart).apply(delta)


@pytest.mark.parametrize("keep", [False, True])
def test_the_digest_with_the_compaction_apart_follows_the_proto(keep: bool) -> None:
    """chain_sha256 asked for with the compaction apart is the proto's rule computed from
    the whole new view (sha256(R' || C || Q)), with a compaction kept, new, changed or
    absent (never the plain chained digest: Q is there without one too). The
    client holds Q of a kept request across steps: a request changed under the same
    kept record is still caught."""
    moved = view_pb2.CompactionRequest()
    moved.CopyFrom(_COMPACTION)
    moved.through_seq += 1
    requests = [None, _COMPACTION, _COMPACTION, _COMPACTION, moved, moved, None]
    views = [
        _with_compaction(_view(f"v{i}", ["x"] * (i + 1), ["k"], []), r)
        for i, r in enumerate(requests)
    ]
    held = HeldView.of(views[0], chained=True, apart=True)
    for base, new in itertools.pairwise(views):
        found = chained_delta_record(cut(base), cut(new), None, keep, compaction_apart=True)
        assert found is not None
        delta = compile_service_pb2.ViewDelta.FromString(found[0])
        assert delta.chain_sha256 == apart_digest(new)
        assert delta.chain_sha256 != chained_digest(new)
        held = held.apply(delta)
        want = new.SerializeToString(deterministic=True)
        assert held.view.SerializeToString(deterministic=True) == want
        # Q is part of the digest: the same delta against a base whose request differs
        # (kept from it, or stated by it) does not check.
        if new.HasField("compaction"):
            other = view_pb2.CompactionRequest()
            other.CopyFrom(new.compaction)
            other.prompt += "!"
            if delta.compaction_kept:
                wrong = view_pb2.CompiledView()
                wrong.CopyFrom(base)
                wrong.compaction.CopyFrom(other)
                with pytest.raises(DeltaMismatch):
                    HeldView.of(wrong, chained=True, apart=True).apply(delta)
            else:
                delta.head.compaction.CopyFrom(other)
                with pytest.raises(DeltaMismatch):
                    HeldView.of(base, chained=True, apart=True).apply(delta)
