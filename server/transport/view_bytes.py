"""A compiled view as the parts of its deterministic encoding (ViewDeltas between two of
them: view_delta.py).

A CompileStream step answers with a ViewDelta against a view the client already holds
when that is smaller than the whole view. Both views are kept as these parts (the
encoded head fields, one record per section, message and tool) so that the delta is
found by comparing bytes: the messages two consecutive views share are neither decoded
nor re-encoded, and the records themselves are the cached encodings of
`message_record`, shared with the compile memo."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, fields, replace
from itertools import chain, compress, count
from operator import attrgetter, is_, is_not

from ctxcc.v1 import view_pb2
from server.adapters.protowire import tagged, varint
from server.compiler.view import CompiledView, ViewMessage
from server.domain.grown import Grown, grown
from server.service.compile_types import CompileResult
from server.transport.convert_view import (
    back_fields_bytes,
    compaction_out,
    front_bytes,
    head_front,
    head_middle,
    message_record,
    message_record_inline,
    renderings_bytes,
    section_record,
    tool_record,
)
from server.transport.view_digest import record_value


@dataclass(frozen=True, slots=True)
class ViewBytes:
    """The deterministic encoding of a CompiledView cut at its repeated fields: `front`
    (fields 1-5), the records of system_sections (6), of system_prompt (7, empty when
    the prompt is), `middle` (8-9), the records of messages (10) and tools (11), and
    `back` (12-21). Their concatenation, in this order, is the whole view."""

    compile_id: str
    session_id: str
    event_boundary: int
    front: bytes
    sections: tuple[bytes, ...]
    prompt: bytes
    middle: bytes
    # Grown (server/domain/grown.py): a step's records share the list of the last view's.
    messages: Sequence[bytes]
    tools: tuple[bytes, ...]
    back: bytes
    # A ViewDelta's reader rebuilds system_prompt as the sections' texts joined by two
    # newlines; a view whose prompt is anything else is only ever sent whole.
    prompt_is_joined: bool
    size: int
    # The record of the compaction request (field 19) within `back`, lent to the next
    # view of the stream when its request is the same, and where in `back` it starts.
    compaction: bytes = b""
    compaction_at: int = 0
    # q of the digest with the compaction apart (view_digest.py): the sha256 of that
    # request's encoding, made once when a step first needs it and lent with the record
    # (a one-slot cell, empty until then).
    compaction_sha256: list[bytes] = field(default_factory=list)
    # The records of the notes (field 21, the end of `back`), lent to the next view of the
    # stream when its notes start with these.
    notes: bytes = b""
    # CompileResult.created_ns: the session life the view is of (not part of the view).
    created_ns: int = 0

    def whole(self, field: int = 0) -> bytes:
        """The view's encoding; with `field`, as that length-delimited field of another
        message (a CompileResponse's view), joined in one copy."""
        key = varint((field << 3) | 2) + varint(self.size) if field else b""
        return b"".join(chain((key,), self.parts()))

    def parts(self) -> Iterator[bytes]:
        """The pieces whose concatenation is `whole()`, to hash or join without a copy."""
        return chain(
            (self.front,),
            self.sections,
            (self.prompt, self.middle),
            self.messages,
            self.tools,
            (self.back,),
        )

    def parts_without_messages(self) -> Iterator[bytes]:
        """The pieces of the view's encoding with its messages left out (R of the chained
        digest)."""
        return chain(
            (self.front,), self.sections, (self.prompt, self.middle), self.tools, (self.back,)
        )

    def parts_without_messages_or_compaction(self) -> Iterator[bytes]:
        """parts_without_messages with the compaction request left out too (R of the
        digest with the compaction apart)."""
        at, end = self.compaction_at, self.compaction_at + len(self.compaction)
        back = (self.back[:at], self.back[end:]) if self.compaction else (self.back,)
        return chain((self.front,), self.sections, (self.prompt, self.middle), self.tools, back)

    def compaction_digest(self) -> bytes:
        """q of the digest with the compaction apart: the sha256 of the compaction
        request's encoding, 32 zero bytes without one."""
        if not self.compaction:
            return bytes(32)
        cell = self.compaction_sha256
        if not cell:
            cell.append(hashlib.sha256(record_value(self.compaction)).digest())
        return cell[0]

    def size_without_messages(self) -> int:
        return (
            len(self.front)
            + sum(map(len, self.sections))
            + len(self.prompt)
            + len(self.middle)
            + sum(map(len, self.tools))
            + len(self.back)
        )

    def head(self) -> bytes:
        """The view without messages, sections, system prompt and tools: ViewDelta.head."""
        return self.front + self.middle + self.back

    def head_record(self, field: int, without_compaction: bool = False) -> tuple[bytes, ...]:
        """head() as a length-delimited field of another message, in pieces (a head can
        hold a compaction prompt as long as the history: not copied to be framed); with
        `without_compaction`, with its compaction request left out."""
        back: tuple[bytes, ...] = (self.back,)
        if without_compaction and self.compaction:
            at, end = self.compaction_at, self.compaction_at + len(self.compaction)
            back = (self.back[:at], self.back[end:])
        size = len(self.front) + len(self.middle) + sum(map(len, back))
        return varint((field << 3) | 2) + varint(size), self.front, self.middle, *back


@dataclass(frozen=True, slots=True)
class LentRecords:
    """The messages of a stream's last view with their records: the memo hands the next
    compile the same message objects for the history it carries over, so their records
    are found by identity, compared in C, instead of one cache lookup per message."""

    messages: Sequence[ViewMessage] = ()
    records: Sequence[bytes] = ()
    # The last view itself and its parts: a repeat of it (the same view under a new
    # compile id, see service/repeats.py) re-encodes only the head field that holds the id.
    view: CompiledView | None = None
    parts: ViewBytes | None = None


# Every field of a view but its compile id: a view whose fields are all these same
# objects (frozen values) is a repeat of the other.
_fields_but_id = attrgetter(*(f.name for f in fields(CompiledView) if f.name != "compile_id"))


def same_but_id(new: CompiledView, old: CompiledView) -> bool:
    """Whether `new` is `old` under another compile id (a repeat, service/repeats.py)."""
    return all(map(is_, _fields_but_id(new), _fields_but_id(old)))


def _repeat_of(new: CompiledView, last: LentRecords, created_ns: int) -> ViewBytes | None:
    """`last`'s parts for `new` when `new` is `last`'s view under another compile id (of
    the session life `created_ns`: the same fields may be another life's)."""
    old, parts = last.view, last.parts
    # A step with new events has another boundary: no field walk needed to tell.
    if old is None or parts is None or old.event_boundary != new.event_boundary:
        return None
    if not same_but_id(new, old):
        return None
    # The compile id is field 1, first in the deterministic encoding of the head's front.
    old_id = tagged(1, old.compile_id.encode())
    if parts.front.startswith(old_id):
        front = tagged(1, new.compile_id.encode()) + parts.front[len(old_id) :]
    else:
        front = head_front(new).SerializeToString(deterministic=True)
    size = parts.size - len(parts.front) + len(front)
    return replace(parts, compile_id=new.compile_id, front=front, size=size, created_ns=created_ns)


def _records(messages: Sequence[ViewMessage], last: LentRecords) -> tuple[Grown[bytes], int]:
    """The messages' records and their total size. Both follow only the messages that are
    not `last`'s (the lent view's size is known, the records it lends are not summed)."""
    parts = last.parts
    old, lent_records = last.messages, last.records
    same = _kept(old, messages)
    # The memo projects the last few messages again at every step, as other objects: the
    # ones equal to the last view's at their place take its records. Compared only near
    # the first one not kept: a history that moved (a checkpoint) is not compared through.
    near = min(len(old), len(lent_records), same + TAIL)
    new = [
        lent_records[i] if i < near and old[i] == m else message_record(m)
        for i, m in enumerate(messages[same:], same)
    ]
    # The lent records' list goes on with these (grown.py): nothing copied.
    records = grown(lent_records).prefix(same).extended(new)
    if parts is not None and parts.messages is last.records:
        lent = parts.size - parts.size_without_messages() - sum(map(len, last.records[same:]))
        return records, lent + sum(map(len, new))
    return records, sum(map(len, records))


# How far from the end of the lent messages (or a delta base's records, view_delta.py)
# the first one a step kept is looked for.
TAIL = 16


def _kept(old: Sequence[ViewMessage], new: Sequence[ViewMessage]) -> int:
    """How many messages at the start of `new` have `old`'s records. A step usually keeps
    all of the last view's message objects but the last few (projected again after the
    memo's cut): when both share the memo's list (grown.py) the shorter is the other's
    start; otherwise the last one kept is looked for from the end, and the ones before
    it compared in one tuple comparison in C (equal values that are other objects have
    the same records too)."""
    n = min(len(old), len(new))
    if isinstance(new, Grown) and new.shares(old):
        return n
    k = n
    while k > n - TAIL and k > 0 and old[k - 1] is not new[k - 1]:
        k -= 1
    if old[:k] == new[:k]:
        return k
    return next(compress(count(), map(is_not, old, new)), n)


def _compaction_record(v: CompiledView, last: LentRecords) -> tuple[bytes, list[bytes]]:
    """The view's compaction request (field 19) with its digest's cell, or the last
    view's when it is the same request: over budget, it holds a prompt as long as the
    history, rebuilt as an equal value at every step."""
    c = v.compaction
    if c is None:
        return b"", []
    old = last.view.compaction if last.view is not None else None
    if last.parts is not None and last.parts.compaction and (old is c or old == c):
        return last.parts.compaction, last.parts.compaction_sha256
    return tagged(19, compaction_out(c).SerializeToString(deterministic=True)), []


def _notes_record(v: CompiledView, last: LentRecords) -> bytes:
    """The records of the view's notes (field 21): the last view's and those of the notes
    after them when the view's notes start with the last view's (a session whose steps
    each add a note has as many notes as steps, all sent in every head)."""
    notes, old, parts = v.notes, last.view, last.parts
    if old is not None and parts is not None and parts.notes and old.notes:
        k = len(old.notes)
        if notes[:k] == old.notes:
            return parts.notes + _notes_only(notes[k:])
    return _notes_only(notes)


def _notes_only(notes: tuple[str, ...]) -> bytes:
    if not notes:
        return b""
    return view_pb2.CompiledView(notes=notes).SerializeToString(deterministic=True)


def _sections_of(v: CompiledView, last: LentRecords) -> tuple[tuple[bytes, ...], bytes, bool]:
    """The records of the view's sections and of its system prompt, and whether the prompt
    is the sections joined: the last view's when its sections and prompt are equal values
    (they are compiled again at every step; with long instruction files, hashing them for
    the records' cache, encoding and joining the prompt again cost as much as the rest)."""
    old, parts = last.view, last.parts
    if (
        old is not None
        and parts is not None
        and old.system_prompt == v.system_prompt
        and old.system_sections == v.system_sections
    ):
        return parts.sections, parts.prompt, parts.prompt_is_joined
    sections = tuple(map(section_record, v.system_sections))
    prompt = tagged(7, v.system_prompt.encode()) if v.system_prompt else b""
    joined = v.system_prompt == "\n\n".join(s.text for s in v.system_sections)
    return sections, prompt, joined


def view_bytes(result: CompileResult, last: LentRecords = LentRecords()) -> ViewBytes:
    """The view's parts; `last` (a stream's previous view without inline attachments)
    lends the records of the messages both share."""
    v = result.view
    if not result.attachments and not result.renderings:
        repeated = _repeat_of(v, last, result.created_ns)
        if repeated is not None:
            return repeated
    front = front_bytes(v)
    middle = head_middle(v).SerializeToString(deterministic=True)
    compaction, compaction_sha256 = _compaction_record(v, last)
    # Fields 12-18, the compaction request (19), then renderings (20) and notes (21): the
    # deterministic encoding writes fields in number order, so the four concatenate.
    rendered = renderings_bytes(result.renderings)
    notes = _notes_record(v, last)
    back_fields = back_fields_bytes(v)
    back = b"".join((back_fields, compaction, rendered, notes))
    sections, prompt, joined = _sections_of(v, last)
    if result.attachments:
        data = dict(result.attachments)
        messages: Sequence[bytes] = tuple(message_record_inline(m, data) for m in v.messages)
        messages_size = sum(map(len, messages))
    else:
        messages, messages_size = _records(v.messages, last)
    tools = tuple(map(tool_record, v.tools))
    size = (
        len(front)
        + sum(map(len, sections))
        + len(prompt)
        + len(middle)
        + messages_size
        + sum(map(len, tools))
        + len(back)
    )
    return ViewBytes(
        compile_id=v.compile_id,
        session_id=v.session_id,
        event_boundary=v.event_boundary,
        front=front,
        sections=sections,
        prompt=prompt,
        middle=middle,
        messages=messages,
        tools=tools,
        back=back,
        prompt_is_joined=joined,
        size=size,
        compaction=compaction,
        compaction_at=len(back_fields),
        compaction_sha256=compaction_sha256,
        notes=notes,
        created_ns=result.created_ns,
    )
