"""Delta views: a CompileStream step may be answered with a ViewDelta against the last
view this client applied; `HeldView.apply` rebuilds the whole view from it and checks the
digest the daemon sent.

A view is held as the records of its deterministic encoding (one per system section,
message and tool), so a step joins bytes instead of copying protobuf messages: the
kept messages are a slice of the base's records, only the appended ones are encoded,
and the joined bytes are both what the digest is checked on and what the view handed
out is decoded from."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from itertools import chain

from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import view_pb2

# CompiledView field numbers held as records; the others are the head's.
_SECTIONS, _PROMPT, _MESSAGES, _TOOLS = 6, 7, 10, 11


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


def _split(data: bytes) -> dict[int, list[bytes]]:
    """The top-level fields of an encoded message, each field number's records (key,
    length and value bytes as they stand) in order."""
    out: dict[int, list[bytes]] = {}
    pos, end = 0, len(data)
    while pos < end:
        start = pos
        key, pos = _read_varint(data, pos)
        wire = key & 7
        if wire == 0:
            _, pos = _read_varint(data, pos)
        elif wire == 1:
            pos += 8
        elif wire == 2:
            size, pos = _read_varint(data, pos)
            pos += size
        elif wire == 5:
            pos += 4
        else:
            raise DeltaMismatch(f"unexpected wire type {wire}")
        out.setdefault(key >> 3, []).append(data[start:pos])
    return out


@dataclass(frozen=True, slots=True)
class HeldView:
    """A view the client applied completely, with the records of its encoding."""

    view: view_pb2.CompiledView
    sections: tuple[bytes, ...]
    messages: tuple[bytes, ...]
    tools: tuple[bytes, ...]

    @classmethod
    def of(cls, view: view_pb2.CompiledView) -> HeldView:
        fields = _split(view.SerializeToString(deterministic=True))
        return cls(
            view,
            tuple(fields.get(_SECTIONS, ())),
            tuple(fields.get(_MESSAGES, ())),
            tuple(fields.get(_TOOLS, ())),
        )

    def apply(self, delta: cpb.ViewDelta) -> HeldView:
        """The view `delta` describes against this one, as the proto's ViewDelta comment
        says to rebuild it; DeltaMismatch when it cannot be rebuilt or its digest differs."""
        if delta.base_compile_id != self.view.compile_id:
            raise DeltaMismatch(f"the delta is against {delta.base_compile_id!r}")
        if delta.kept_messages > len(self.messages):
            raise DeltaMismatch("the delta keeps more messages than the base has")
        head = _split(delta.head.SerializeToString(deterministic=True))
        messages = self.messages[: delta.kept_messages] + tuple(
            _record(_MESSAGES, m.SerializeToString(deterministic=True))
            for m in delta.appended_messages
        )
        sections, texts = [], []
        for slot in delta.sections:
            if slot.WhichOneof("slot") == "section":
                sections.append(
                    _record(_SECTIONS, slot.section.SerializeToString(deterministic=True))
                )
                texts.append(slot.section.text)
            elif slot.base_index < len(self.sections):
                sections.append(self.sections[slot.base_index])
                texts.append(self.view.system_sections[slot.base_index].text)
            else:
                raise DeltaMismatch(f"no section {slot.base_index} in the base")
        prompt = "\n\n".join(texts)
        tools = (
            tuple(_record(_TOOLS, t.SerializeToString(deterministic=True)) for t in delta.tools)
            if delta.tools_changed
            else self.tools
        )
        # The head's fields around the records, in field number order.
        front = (r for n in sorted(head) if n < _SECTIONS for r in head[n])
        middle = (r for n in sorted(head) if _PROMPT < n < _MESSAGES for r in head[n])
        back = (r for n in sorted(head) if n > _TOOLS for r in head[n])
        data = b"".join(
            chain(
                front,
                sections,
                (_record(_PROMPT, prompt.encode()) if prompt else b"",),
                middle,
                messages,
                tools,
                back,
            )
        )
        if hashlib.sha256(data).hexdigest() != delta.view_sha256:
            raise DeltaMismatch(f"view {delta.head.compile_id} does not match its digest")
        return HeldView(view_pb2.CompiledView.FromString(data), tuple(sections), messages, tools)
