"""Element counts of repeated request fields, read from the wire before decoding.

Decoding a message of millions of tiny elements holds the GIL for seconds (2,000,000
one-character events: about 3 s; a rule with 200,000 globs: 100-200 ms), stalling every
other RPC. Counting them first costs at most `limit + 1` steps of a walk over the raw
bytes, so an over-long list is refused before the decoder ever sees it. A capped field
may sit inside nested messages (a rule's globs, a session's labels, a stream step's
events): the walk descends through the fields of `path` without decoding them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from server.compiler.textscan import MAX_GLOBS
from server.domain.errors import CtxccError, Reason, invalid
from server.domain.validation import MAX_LABELS


@dataclass(frozen=True, slots=True)
class RepeatedCap:
    field: int
    limit: int
    error: Callable[[int], CtxccError]
    # Packed scalars (enums): one length-delimited run holds many elements.
    packed: bool = False
    # Message fields leading to the capped one, outermost first. Occurrences of a
    # singular message field merge when decoded, so their counts add up.
    path: tuple[int, ...] = ()
    # On a stream whose failures are answered in-band: the path of the string that
    # names the refused message (a step's step_id), so the stream stays open.
    id_path: tuple[int, ...] = ()
    # More fields (full paths, leaf last) whose elements count toward the same limit.
    also: tuple[tuple[int, ...], ...] = ()

    def trie(self) -> _Node:
        """The fields to descend into, from the root; a field whose node holds COUNTED is
        counted (and still descended into when its node holds more)."""
        root: _Node = {}
        for full in ((*self.path, self.field), *self.also):
            node = root
            for number in full:
                node = node.setdefault(number, {})
            node[COUNTED] = {}
        return root


_Node = dict[int, "_Node"]
# No protobuf field has number 0: the key marks a counted field in the trie.
COUNTED = 0


@dataclass(frozen=True, slots=True)
class RefusedMessage:
    """A stream message refused from its raw bytes, to be answered in-band under `ident`
    (the servicer sees this in place of the decoded message)."""

    ident: str
    error: CtxccError


@dataclass(frozen=True, slots=True)
class Encoded:
    """A response its handler has already serialized (see `passing`)."""

    data: bytes


def passing(serialize: Callable[[Any], bytes] | None) -> Callable[[Any], bytes] | None:
    """A method's response serializer that lets `Encoded` responses through as they are."""
    if serialize is None:
        return None

    def encode(message: Any) -> bytes:
        return message.data if type(message) is Encoded else serialize(message)

    return encode


def _varint(data: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        if i >= len(data) or shift > 63:
            raise ValueError("truncated varint")
        b = data[i]
        i += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, i
        shift += 7


def count_over(data: bytes, cap: RepeatedCap, trie: _Node | None = None) -> int | None:
    """How many elements the capped fields hold when that is over the limit, else None.
    Counting stops at `limit + 1`. Malformed bytes answer None: the real decoder
    reports them. `trie`: `cap.trie()`, when the caller keeps it."""
    if len(data) <= cap.limit:
        return None  # every element takes at least one byte
    try:
        count = _count(data, 0, len(data), trie or cap.trie(), cap, 0)
    except ValueError:
        return None
    return count if count > cap.limit else None


def _count(data: bytes, i: int, end: int, node: _Node, cap: RepeatedCap, count: int) -> int:
    """`count` plus the capped elements in data[i:end], a message at `node` of the trie;
    one pass, however many fields are capped together."""
    while i < end:
        # Tags and most lengths are one byte: read inline, the loop for longer ones.
        tag = data[i]
        if tag < 0x80:
            i += 1
        else:
            tag, i = _varint(data, i)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            _, i = _varint(data, i)
            count += number in node and COUNTED in node[number]
        elif wire == 2:
            if i < end and data[i] < 0x80:
                size = data[i]
                i += 1
            else:
                size, i = _varint(data, i)
            if i + size > end:
                raise ValueError("length past the end")
            child = node.get(number)
            if child is not None:
                if COUNTED in child:
                    if cap.packed:
                        count += _packed_count(data, i, i + size, cap.limit - count)
                    else:
                        count += 1
                if len(child) > (COUNTED in child):
                    count = _count(data, i, i + size, child, cap, count)
            i += size
        else:
            # Fixed-size scalars, and groups: no field of ours is a group, but the decoder
            # keeps an unknown one as unknown fields: two bytes of it in front of a flood
            # must not end the walk (then the decoder, not this count, saw the millions
            # of elements).
            i = _past(data, i, end, tag)
        if count > cap.limit:
            return count
    if i > end:
        raise ValueError("field past the end")
    return count


# Groups nested deeper than this are refused by the decoder (upb's default depth limit).
_GROUP_DEPTH = 100


def _past(data: bytes, i: int, end: int, tag: int, depth: int = 0) -> int:
    """Where the value of the field `tag` that starts at `i` ends: a group's, past its
    matching end tag (nested groups included; nothing inside is counted, it is never
    decoded into fields). The one walker over field values, so that what `_count` and
    `string_at` step over cannot differ."""
    wire = tag & 7
    if wire == 0:
        return _varint(data, i)[1]
    if wire == 1:
        return i + 8
    if wire == 5:
        return i + 4
    if wire == 2:
        size, i = _varint(data, i)
        return i + size
    if wire != 3:
        raise ValueError("unknown wire type")  # 4 (an end without its start), 6, 7
    if depth >= _GROUP_DEPTH:
        raise ValueError("groups nested too deep")
    while i < end:
        inner, i = _varint(data, i)
        if inner & 7 == 4:
            if inner >> 3 != tag >> 3:
                raise ValueError("malformed group")
            return i
        i = _past(data, i, end, inner, depth + 1)
    raise ValueError("group past the end")


def string_at(data: bytes, path: tuple[int, ...]) -> str:
    """The first string at `path` (message fields, then the string's field), "" if none
    or malformed; reads only the bytes on the way."""
    i, end = 0, len(data)
    try:
        for depth, number in enumerate(path):
            while i < end:
                tag, i = _varint(data, i)
                if tag & 7 != 2:
                    i = _past(data, i, end, tag)
                    continue
                size, i = _varint(data, i)
                if tag >> 3 == number and i + size <= end:
                    if depth == len(path) - 1:
                        return data[i : i + size].decode("utf-8", "replace")
                    end = i + size
                    break
                i += size
            else:
                return ""
    except ValueError:
        return ""
    return ""


def _packed_count(data: bytes, start: int, end: int, room: int) -> int:
    """Varints in a packed run: each ends with a byte below 0x80. Stops past `room`."""
    n = 0
    for i in range(start, end):
        n += data[i] < 0x80
        if n > room:
            break
    return n


STREAM_STEP = 1  # CompileStreamRequest.step
STREAM_RESUME = 2  # CompileStreamRequest.resume
RESUME_COMPILE, RESUME_STEP_ID = 2, 3  # ResumeRequest.compile, .step_id


# Repeated elements inside an Event: user_message (10) and assistant_message (11) parts
# (1), assistant tool_calls (2), imported_message (14) parts (4), the attributes (5) of a
# browser element (16), alone or in a part (3).
_PARTS = ((10, 1), (11, 1), (14, 4))
_EVENT_ELEMENTS = (
    *_PARTS,
    (11, 2),
    (16, 5),
    *((*part, 3, 5) for part in _PARTS),
)
# CompileRequest's packed enums: exclude_sections (7), render_formats (9).
_COMPILE_ENUMS = ((7,), (9,))
STEP_COMPILE = 5  # StepRequest.compile


def _elements_of_events(events: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    return tuple((*events, *inner) for inner in _EVENT_ELEMENTS)


def request_caps(max_events_per_append: int, max_tools: int) -> dict[str, tuple[RepeatedCap, ...]]:
    def too_many(n: int) -> CtxccError:
        return CtxccError(
            Reason.TOO_MANY_EVENTS,
            f"over {max_events_per_append} events in one append",
            limit=str(max_events_per_append),
        )

    def kinds(n: int) -> CtxccError:
        return invalid("kinds", f"kinds lists at most {MAX_KINDS} event kinds")

    def globs(n: int) -> CtxccError:
        return invalid("rule.path_globs", f"at most {MAX_GLOBS} globs per rule")

    def labels(n: int) -> CtxccError:
        return invalid("session.labels", f"at most {MAX_LABELS} labels")

    def tools(n: int) -> CtxccError:
        return invalid("tools", f"at most {max_tools} tools per session (max_tools)")

    def parts(n: int) -> CtxccError:
        return invalid(
            "events",
            f"at most {MAX_EVENT_ELEMENTS} content parts, tool calls and element attributes "
            "in one append",
        )

    def keywords(n: int) -> CtxccError:
        return invalid("tools", f"at most {MAX_KEYWORDS} search keywords in one request")

    def enums(n: int) -> CtxccError:
        return invalid(
            "compile", f"at most {MAX_KINDS} exclude_sections and render_formats in a compile"
        )

    first = _elements_of_events((2,))
    in_step = _elements_of_events((STREAM_STEP, 2))

    return {
        "/ctxcc.v1.SessionService/AppendEvents": (
            RepeatedCap(2, max_events_per_append, too_many),
            RepeatedCap(
                first[0][-1], MAX_EVENT_ELEMENTS, parts, path=first[0][:-1], also=first[1:]
            ),
        ),
        "/ctxcc.v1.SessionService/ListEvents": (RepeatedCap(5, MAX_KINDS, kinds, packed=True),),
        # CreateSessionRequest.session -> Session.labels (map entries)
        "/ctxcc.v1.SessionService/CreateSession": (RepeatedCap(6, MAX_LABELS, labels, path=(1,)),),
        # PutRuleRequest.rule -> Rule.path_globs
        "/ctxcc.v1.SourceService/PutRule": (RepeatedCap(8, MAX_GLOBS, globs, path=(1,)),),
        # CompileStreamRequest.step -> StepRequest.events, checked per stream message and
        # answered in-band under the step's step_id, as the servicer's own check did
        "/ctxcc.v1.CompileService/CompileStream": (
            RepeatedCap(
                2, max_events_per_append, too_many, path=(STREAM_STEP,), id_path=(STREAM_STEP, 1)
            ),
            RepeatedCap(
                in_step[0][-1],
                MAX_EVENT_ELEMENTS,
                parts,
                path=in_step[0][:-1],
                also=in_step[1:],
                id_path=(STREAM_STEP, 1),
            ),
            RepeatedCap(
                7,
                MAX_KINDS,
                enums,
                packed=True,
                path=(STREAM_STEP, STEP_COMPILE),
                also=((STREAM_STEP, STEP_COMPILE, 9),),
                id_path=(STREAM_STEP, 1),
            ),
            # A resume compiles too: the same enums, answered under the resume's step_id.
            RepeatedCap(
                7,
                MAX_KINDS,
                enums,
                packed=True,
                path=(STREAM_RESUME, RESUME_COMPILE),
                also=((STREAM_RESUME, RESUME_COMPILE, 9),),
                id_path=(STREAM_RESUME, RESUME_STEP_ID),
            ),
        ),
        "/ctxcc.v1.ToolService/RegisterTools": (
            RepeatedCap(2, max_tools, tools),
            # RegisterToolsRequest.tools -> ToolDefinition.search_keywords
            RepeatedCap(5, MAX_KEYWORDS, keywords, path=(2,)),
        ),
        "/ctxcc.v1.CompileService/Compile": (
            RepeatedCap(7, MAX_KINDS, enums, packed=True, also=_COMPILE_ENUMS[1:]),
        ),
    }


# Content parts and tool calls of all events of one append (or step), together: far
# more than agents send (a message has a few parts), far fewer than the millions of
# empty parts whose decoding held the GIL for seconds (10,000,000 in 20 MB: 1.8 s).
MAX_EVENT_ELEMENTS = 16_384
# Search keywords of all tools of one RegisterTools (at most --max-tools tools).
MAX_KEYWORDS = 16_384
# More than every event kind there is, with room for repeats.
MAX_KINDS = 64
