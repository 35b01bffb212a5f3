"""A session's basis bytes apart from its stored bytes: the one-time move at open.

Daemons from d7961be counted the parts a compile stores for its basis in the session's
`stored_bytes`, the figure `--max-session-bytes` bounds for its events and artifacts: a
session whose rules were edited between steps filled its quota with bases and had its
appends refused. Now they count in `basis_bytes`, bounded by
`--max-session-basis-bytes`. A store opened the first time by such a daemon gets each
session's basis bytes recomputed from the parts it holds and taken out of its stored
bytes, in one batch with a marker in `meta`, so it is done once.

What a stored part is tells whether an earlier daemon counted it: text and sources parts
(`TextPart`, `SourcesPart`) were only ever written by daemons that counted them; tools
and settings parts (`ToolsPart`, `SettingsPart`) were counted unless a basis stored
before texts were parts of their own (`source_texts` 0, the daemons that counted
nothing) names them; a `SourceInputs` part was never counted. The basis records
(`CompileBasis`) were never counted and table chunks nearly never (a record's own table
writes them first), so neither counts in `basis_bytes` afterwards either.
"""

from __future__ import annotations

import dataclasses
import logging

import msgspec
from google.protobuf.message import DecodeError

from ctxcc.storage.v1 import records_pb2
from server.domain.model import Session
from storage.codec import CorruptRecordError, decode_value, encode_value
from storage.keys import LAST_COMPILE, PART, session_key
from storage.kv import KV, Batch

log = logging.getLogger("ctxcc.storage")

MARKER = b"basis_bytes_apart"
# Parts a session holds for its bases, counted in its basis bytes.
_HELD = frozenset({"TextPart", "SourcesPart", "ToolsPart", "SettingsPart", "SourceInputs"})
# Parts every daemon that wrote them counted in stored_bytes.
_COUNTED = frozenset({"TextPart", "SourcesPart"})
# Parts counted in stored_bytes unless a basis of a daemon that counted nothing names them.
_COUNTED_IF_NEW = frozenset({"ToolsPart", "SettingsPart"})


@dataclasses.dataclass(frozen=True, slots=True)
class Split:
    """Of a session's basis parts: the bytes they hold, and those of them an earlier
    daemon counted in its stored bytes."""

    held: int
    counted: int


def split_basis_bytes(kv: KV, session_id: str) -> Split:
    start, end = session_key(session_id, PART), session_key(session_id, LAST_COMPILE)
    sizes: dict[bytes, tuple[str, int]] = {}
    uncounted: set[bytes] = set()
    for key, raw in kv.scan("compiles", start, end):
        try:
            rec = records_pb2.Record.FromString(raw)
        except DecodeError:
            continue  # damaged: its bytes are not guessed at
        sizes[key[len(start) :]] = (rec.type, len(raw))
        if rec.type == "CompileBasis":
            try:
                body = msgspec.msgpack.decode(rec.body)
            except msgspec.DecodeError:
                continue
            if isinstance(body, dict) and not body.get("source_texts"):
                for name in (body.get("tools"), body.get("settings")):
                    if isinstance(name, str):
                        uncounted.add(name.encode())
    held = counted = 0
    for name, (kind, size) in sizes.items():
        if kind in _HELD:
            held += size
        if kind in _COUNTED or (kind in _COUNTED_IF_NEW and name not in uncounted):
            counted += size
    return Split(held, counted)


def move_basis_bytes(kv: KV) -> int:
    """Once per store: each session's basis bytes recomputed and taken out of its stored
    bytes (see the module's doc). Returns how many sessions changed."""
    if kv.get("meta", MARKER) is not None:
        return 0
    batch = Batch()
    changed = moved = 0
    for key, raw in kv.scan("sessions", b"", b"\xff"):
        try:
            session = decode_value(raw, Session)
        except CorruptRecordError:
            continue  # read as damaged wherever it is read, as before
        if session.basis_bytes:
            # Written by a daemon that counts bases apart (no earlier one had the field):
            # moved already, were the marker lost, not moved twice.
            continue
        split = split_basis_bytes(kv, session.session_id)
        stored = max(0, session.stored_bytes - split.counted)
        if split.held == session.basis_bytes and stored == session.stored_bytes:
            continue
        moved += session.stored_bytes - stored
        updated = dataclasses.replace(session, stored_bytes=stored, basis_bytes=split.held)
        batch.put("sessions", key, encode_value(updated))
        changed += 1
    batch.put("meta", MARKER, b"1")
    kv.write(batch)
    if changed:
        log.info(
            "basis bytes of %d sessions counted apart from their stored bytes "
            "(%d bytes moved out of stored_bytes)",
            changed,
            moved,
        )
    return changed
