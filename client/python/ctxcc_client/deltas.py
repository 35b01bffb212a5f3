"""Delta views: a CompileStream step may be answered with a ViewDelta against the last
view this client applied; `HeldView.apply` rebuilds the whole view from it and checks the
digest the daemon sent.

With the chained digest (DELTA_DIGEST_MESSAGE_CHAIN, what the stream asks for) a view is
held as an internal copy that is never handed out, the chain values of its messages and
the records of its sections and tools: a delta is checked by hashing only its appended
messages and the view without messages, the internal copy is then changed in place (kept
messages are neither encoded nor parsed again) and the caller gets a copy of it (one
copy in C, cheaper than parsing the view's bytes). With the whole view's sha256
(view_sha256) a view is held as the records of its deterministic encoding (one per
system section, message and tool): the kept messages are a slice of the base's records,
and the joined bytes are both what the digest is checked on and what the view handed out
is decoded from."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import view_pb2

# CompiledView field numbers held as records; the others are the head's.
_SECTIONS, _PROMPT, _MESSAGES, _TOOLS = 6, 7, 10, 11
# The compaction request's, which a delta may keep from its base (compaction_kept).
_COMPACTION = 19


class DeltaMismatch(ValueError):
    """A ViewDelta that does not rebuild to its digest (or names parts the base lacks).
    The stream fetches the view whole instead; raised to the caller only if that whole
    view's answer is a mismatching delta again."""


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _record(field: int, data: bytes) -> bytes:
    return _varint((field << 3) | 2) + _varint(len(data)) + data


def _skip(data: bytes, pos: int, wire: int) -> int:
    """The position after the value of wire type `wire` at `pos`."""
    if wire == 0:
        return _read_varint(data, pos)[1]
    if wire == 1:
        return pos + 8
    if wire == 2:
        size, pos = _read_varint(data, pos)
        return pos + size
    if wire == 5:
        return pos + 4
    raise DeltaMismatch(f"unexpected wire type {wire}")


def _split(data: bytes) -> dict[int, list[bytes]]:
    """The top-level fields of an encoded message, each field number's records (key,
    length and value bytes as they stand) in order."""
    out: dict[int, list[bytes]] = {}
    pos, end = 0, len(data)
    while pos < end:
        start = pos
        key, pos = _read_varint(data, pos)
        pos = _skip(data, pos, key & 7)
        out.setdefault(key >> 3, []).append(data[start:pos])
    return out


def _cut_head(data: bytes, compaction: bytes | None = None) -> tuple[bytes, bytes, bytes, bool]:
    """A delta head's deterministic encoding cut where the records the rule rebuilds go
    in: its fields before system_sections (1-5), between the prompt and the messages
    (8-9) and after the tools (12 on), and whether it carried any of the rebuilt fields
    (6, 7, 10, 11; left out). Only the fields before 12 are walked: the rest (the budget,
    the notes, a compaction prompt, which grow with the session) is one slice, as every
    field number below 12 is known and a deterministic encoding writes known fields in
    number order (unknown ones, of a newer daemon, after them). With `compaction` (the
    base's compaction record, which the delta keeps) the walk goes on to field 19 and
    puts it in there (DeltaMismatch when the head has a compaction of its own)."""
    front = middle = back = b""
    extra = False
    stop = 12 if compaction is None else _COMPACTION
    pos, end = 0, len(data)
    while pos < end:
        field_start = pos
        key, pos = _read_varint(data, pos)
        number = key >> 3
        if number >= stop:
            if compaction is None:
                return front, middle, data[field_start:], extra
            if number == _COMPACTION:
                raise DeltaMismatch("the delta keeps the base's compaction and has its own")
            return front, middle, back + compaction + data[field_start:], extra
        pos = _skip(data, pos, key & 7)
        if number < _SECTIONS:
            front += data[field_start:pos]
        elif _PROMPT < number < _MESSAGES:
            middle += data[field_start:pos]
        elif number > _TOOLS:
            back += data[field_start:pos]
        else:
            extra = True
    return front, middle, back + (compaction or b""), extra


def _compaction_span(back: bytes) -> tuple[int, int]:
    """Where the compaction request's record (field 19) is in a view's fields from 12 on
    (`back`, as _cut_head cuts it), (n, n) when it has none. Fields 12-18 are short and
    walked; the request is skipped by its length, and nothing after it is read."""
    pos, end = 0, len(back)
    while pos < end:
        start = pos
        key, pos = _read_varint(back, pos)
        if key >> 3 >= _COMPACTION:
            if key >> 3 > _COMPACTION:
                return start, start
            return start, _skip(back, pos, key & 7)
        pos = _skip(back, pos, key & 7)
    return end, end


# c_0 of the chained digest: the chain value of no messages.
_CHAIN_START = bytes(32)


def _chain(start: bytes, messages: Iterable[bytes | memoryview]) -> tuple[bytes, ...]:
    """The chain values after `start` for messages given as their encodings (the
    ViewMessage alone, no key or length)."""
    sha = hashlib.sha256
    out = []
    for encoded in messages:
        start = sha(start + sha(encoded).digest()).digest()
        out.append(start)
    return tuple(out)


def _value(record: bytes) -> memoryview:
    """A record's value: what follows its key and its length (two varints; a key is one
    byte up to field 15, two from 16 on: the compaction request's is field 19)."""
    _, pos = _read_varint(record, _read_varint(record, 0)[1])
    return memoryview(record)[pos:]


# Fields of CompiledView a delta's head carries: all but the ones rebuilt from the base
# (names ClearField accepts; its stub types them as literals).
_HEAD_FIELDS: tuple[Any, ...] = tuple(
    f.name
    for f in view_pb2.CompiledView.DESCRIPTOR.fields
    if f.number not in (_SECTIONS, _PROMPT, _MESSAGES, _TOOLS)
)


@dataclass(frozen=True, slots=True)
class HeldView:
    """A view the client applied completely: `view` as handed out, and what the next
    delta is rebuilt from. `chain` (c_1..c_n) and `own` (a copy of `view` that is never
    handed out) when held for the chained digest, else `messages`, the records."""

    view: view_pb2.CompiledView
    sections: tuple[bytes, ...]
    messages: tuple[bytes, ...] | None
    tools: tuple[bytes, ...]
    chain: tuple[bytes, ...] | None = None
    # `own` in a one-slot list: the next view takes it over (changing it in place), after
    # which this HeldView cannot be applied again.
    own: list[view_pb2.CompiledView] = field(default_factory=list)
    # A copy of `own` made by `prepare` while the next step is on its way: the next view
    # handed out is that copy changed in place as `own` is, instead of a copy made after
    # the answer came (the one part of applying a delta that follows the whole view).
    spare: list[view_pb2.CompiledView] = field(default_factory=list)
    # The system_prompt record (b"": no prompt) when the view's prompt is its sections'
    # texts joined, else None. A delta that keeps every section where it was (most steps)
    # then rebuilds this same prompt: neither joined, encoded nor set again.
    joined: bytes | None = None
    # The record of the view's compaction request when a delta kept it from its base (else
    # None): over budget every step of a turn keeps the same one, as long as a window of
    # history, and it is encoded once for the turn, not at every step.
    compaction: bytes | None = None
    # With the compaction apart (DELTA_DIGEST_MESSAGE_CHAIN_COMPACTION_APART): Q of the
    # digest, the sha256 of `compaction`'s encoding once hashed (None: not yet).
    apart: bool = False
    compaction_sha256: bytes | None = None

    @classmethod
    def of(
        cls, view: view_pb2.CompiledView, chained: bool = False, *, apart: bool = False
    ) -> HeldView:
        """`view` held for deltas with the whole view's digest, or with `chained` (and
        `apart`: the compaction request hashed apart)."""
        fields = _split(view.SerializeToString(deterministic=True))
        records = tuple(fields.get(_MESSAGES, ()))
        sections, tools = tuple(fields.get(_SECTIONS, ())), tuple(fields.get(_TOOLS, ()))
        prompt = view.system_prompt
        is_joined = prompt == "\n\n".join(s.text for s in view.system_sections)
        joined = b"".join(fields.get(_PROMPT, ())) if is_joined else None
        if not chained:
            return cls(view, sections, records, tools, joined=joined)
        own = view_pb2.CompiledView()
        own.CopyFrom(view)
        chain = _chain(_CHAIN_START, map(_value, records))
        return cls(view, sections, None, tools, chain, [own], joined=joined, apart=apart)

    def prepare(self) -> None:
        """Copies the internal view for the next one handed out, ahead of the delta (a
        client calls it while it waits for the daemon's answer)."""
        if self.own and not self.spare:
            spare = view_pb2.CompiledView()
            spare.CopyFrom(self.own[0])
            self.spare.append(spare)

    def apply(self, delta: cpb.ViewDelta) -> HeldView:
        """The view `delta` describes against this one, as the proto's ViewDelta comment
        says to rebuild it; DeltaMismatch when it cannot be rebuilt or its digest differs."""
        if delta.base_compile_id != self.view.compile_id:
            raise DeltaMismatch(f"the delta is against {delta.base_compile_id!r}")
        if delta.chain_sha256:
            return self._apply_chained(delta)
        return self._apply_whole(delta)

    def _head(self, delta: cpb.ViewDelta) -> tuple[bytes, bytes, bytes, bool, bytes | None]:
        """_cut_head of the delta's head with the base's compaction record when it keeps
        it, and that record."""
        kept = None
        if delta.compaction_kept:
            kept = self.compaction
            if kept is None:
                base = self.own[0] if self.own else self.view
                if not base.HasField("compaction"):
                    raise DeltaMismatch("the delta keeps a compaction the base lacks")
                kept = _record(_COMPACTION, base.compaction.SerializeToString(deterministic=True))
        head = delta.head.SerializeToString(deterministic=True)
        return *_cut_head(head, kept), kept

    def _slots(
        self, delta: cpb.ViewDelta, base_sections: Callable[[int], view_pb2.SystemSection]
    ) -> tuple[tuple[bytes, ...], list[view_pb2.SystemSection] | None, bytes]:
        """The new view's section records, its sections (None: the base's, and its prompt
        the base's, when every slot keeps the base's section at its place and the base's
        prompt is them joined) and its system_prompt record."""
        slots = delta.sections
        if (
            self.joined is not None
            and len(slots) == len(self.sections)
            and all(
                s.base_index == i and s.WhichOneof("slot") == "base_index"
                for i, s in enumerate(slots)
            )
        ):
            return self.sections, None, self.joined
        records, sections = [], []
        for slot in slots:
            if slot.WhichOneof("slot") == "section":
                records.append(
                    _record(_SECTIONS, slot.section.SerializeToString(deterministic=True))
                )
                sections.append(slot.section)
            elif slot.base_index < len(self.sections):
                records.append(self.sections[slot.base_index])
                sections.append(base_sections(slot.base_index))
            else:
                raise DeltaMismatch(f"no section {slot.base_index} in the base")
        prompt = "\n\n".join(s.text for s in sections).encode()
        return tuple(records), sections, _record(_PROMPT, prompt) if prompt else b""

    def _tools(self, delta: cpb.ViewDelta) -> tuple[bytes, ...]:
        if not delta.tools_changed:
            return self.tools
        return tuple(_record(_TOOLS, t.SerializeToString(deterministic=True)) for t in delta.tools)

    def _apply_chained(self, delta: cpb.ViewDelta) -> HeldView:
        if not self.own or self.chain is None:
            raise DeltaMismatch("the base is held for the whole view's digest, or was used")
        own, kept = self.own[0], delta.kept_messages
        if kept > len(self.chain):
            raise DeltaMismatch("the delta keeps more messages than the base has")

        def copy(index: int) -> view_pb2.SystemSection:
            out = view_pb2.SystemSection()
            out.CopyFrom(own.system_sections[index])
            return out

        front, middle, back, extra, compaction = self._head(delta)
        sections, section_msgs, prompt = self._slots(delta, copy)
        tools = self._tools(delta)
        start = self.chain[kept - 1] if kept else _CHAIN_START
        chain = self.chain[:kept] + _chain(
            start, (m.SerializeToString(deterministic=True) for m in delta.appended_messages)
        )
        last = chain[-1] if chain else start
        if self.apart:
            at, end = _compaction_span(back)
            if compaction is None and end > at:  # the head's own: held for the next steps
                compaction = back[at:end]
            q = self._compaction_digest(compaction)
            rest = _sha256((front, *sections, prompt, middle, *tools, back[:at], back[end:]))
            digest = hashlib.sha256(rest.digest() + last + q)
        else:
            rest = _sha256((front, *sections, prompt, middle, *tools, back))
            digest = hashlib.sha256(rest.digest() + last)
        if digest.hexdigest() != delta.chain_sha256:
            raise DeltaMismatch(f"view {delta.head.compile_id} does not match its digest")
        # Checked: the internal copy becomes the new view, changed in place (only what is
        # new is copied into it), and the caller gets a copy of that: the spare copy of
        # the base changed the same way when `prepare` made one, else a copy made now.
        self.own.clear()
        new_head = _head_only(delta.head) if extra else delta.head
        _change(own, delta, new_head, section_msgs, prompt)
        if self.spare:
            view = self.spare.pop()
            _change(view, delta, new_head, section_msgs, prompt)
        else:
            view = view_pb2.CompiledView()
            view.CopyFrom(own)
        return HeldView(
            view,
            sections,
            None,
            tools,
            chain,
            [own],
            joined=prompt,
            compaction=compaction,
            apart=self.apart,
            compaction_sha256=q if self.apart and compaction is not None else None,
        )

    def _compaction_digest(self, record: bytes | None) -> bytes:
        """Q of the digest with the compaction apart for the compaction `record` (None:
        the view has none): hashed once per request, not at every step that keeps it."""
        if record is None:
            return bytes(32)
        if record is self.compaction and self.compaction_sha256 is not None:
            return self.compaction_sha256
        return hashlib.sha256(_value(record)).digest()

    def _apply_whole(self, delta: cpb.ViewDelta) -> HeldView:
        records = self.messages
        if records is None:  # held for the chained digest; a daemon without it answered
            if not self.own:
                raise DeltaMismatch("the base was used")
            serialized = self.own[0].SerializeToString(deterministic=True)
            records = tuple(_split(serialized).get(_MESSAGES, ()))
        if delta.kept_messages > len(records):
            raise DeltaMismatch("the delta keeps more messages than the base has")
        front, middle, back, _, compaction = self._head(delta)
        sections, _, prompt = self._slots(delta, lambda i: self.view.system_sections[i])
        messages = records[: delta.kept_messages] + tuple(
            _record(_MESSAGES, m.SerializeToString(deterministic=True))
            for m in delta.appended_messages
        )
        tools = self._tools(delta)
        data = b"".join((front, *sections, prompt, middle, *messages, *tools, back))
        if hashlib.sha256(data).hexdigest() != delta.view_sha256:
            raise DeltaMismatch(f"view {delta.head.compile_id} does not match its digest")
        view = view_pb2.CompiledView.FromString(data)
        return HeldView(view, sections, messages, tools, joined=prompt, compaction=compaction)


def _sha256(pieces: Iterable[bytes]) -> hashlib._Hash:
    """The sha256 of the pieces' concatenation, without making it."""
    h = hashlib.sha256()
    for piece in pieces:
        h.update(piece)
    return h


def _change(
    view: view_pb2.CompiledView,
    delta: cpb.ViewDelta,
    head: Any,
    sections: list[view_pb2.SystemSection] | None,
    prompt: bytes,
) -> None:
    """Turns a copy of a delta's base into the view the delta describes, in place: only
    what is new is copied into it (`sections` None: the base's sections and prompt stay;
    `prompt` is the new prompt's record)."""
    for name in _HEAD_FIELDS:
        if name != "compaction" or not delta.compaction_kept:
            view.ClearField(name)
    view.MergeFrom(head)
    del view.messages[delta.kept_messages :]
    view.messages.extend(delta.appended_messages)
    if sections is not None:
        del view.system_sections[:]
        view.system_sections.extend(sections)
        view.system_prompt = "\n\n".join(s.text for s in sections)
    if delta.tools_changed:
        del view.tools[:]
        view.tools.extend(delta.tools)


def _head_only(head: view_pb2.CompiledView) -> Any:
    """`head` without the fields the rule rebuilds from the base (a head leaves them
    empty; one that does not would add its own to the view it is merged into)."""
    out = view_pb2.CompiledView()
    out.CopyFrom(head)
    for name in ("system_sections", "system_prompt", "messages", "tools"):
        out.ClearField(name)
    return out
