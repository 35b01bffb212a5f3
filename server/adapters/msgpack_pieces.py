"""MessagePack of a stored value in pieces, the same bytes as one `encode` call.

A compile's tools part holds the session's whole registry: 200 tools of 250 KB schemas
are ~50 MB of MessagePack, and one `msgspec` call that encodes them holds the GIL
~50-90 ms, stalling every other session's thread and the event loop. Each time the part
was hashed (its digest names it, at every compile) and stored, one such call ran. Here a
dataclass whose last field is a long tuple has that tuple's members encoded one call
each (a member is at most one tool: ~0.3 ms), and the pieces are hashed one at a time
(hashlib lets the GIL go for each) or joined (bytes.join lets it go for a large copy).
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

import msgspec

_encoder = msgspec.msgpack.Encoder()

# Members of a value's last tuple field above which it is encoded a member a call.
PIECES_FROM = 16


def msgpack_pieces(value: object) -> list[bytes]:
    """Pieces whose concatenation is `msgspec.msgpack.encode(value)`: a dataclass that
    opts in (a class attribute `ENCODED_IN_PIECES = True`: values whose members can be
    large; a value of many small members encodes faster in one call) and whose last
    field is a tuple of over PIECES_FROM members is its head (the fields before, the
    tuple's length) and then each member's encoding; anything else is one piece.

    msgspec writes a dataclass's fields in declaration order, so the last field's array
    ends the encoding, and `msgspec.Raw(b"")` members write nothing: the head is the
    value encoded with its members replaced by those."""
    if (
        getattr(type(value), "ENCODED_IN_PIECES", False)
        and dataclasses.is_dataclass(value)
        and not isinstance(value, type)
    ):
        fields = dataclasses.fields(value)
        if fields:
            last = getattr(value, fields[-1].name)
            if isinstance(last, tuple) and len(last) > PIECES_FROM:
                blanks: Any = (msgspec.Raw(b""),) * len(last)
                head = _encoder.encode(dataclasses.replace(value, **{fields[-1].name: blanks}))
                return [head, *map(_encoder.encode, last)]
    return [_encoder.encode(value)]


def sha256_of_pieces(pieces: list[bytes]) -> hashlib._Hash:
    """The sha256 of the pieces' concatenation, without making it."""
    h = hashlib.sha256()
    for piece in pieces:
        h.update(piece)
    return h
