"""The chained digest of a ViewDelta (DELTA_DIGEST_MESSAGE_CHAIN in compile_service.proto):
sha256(R || c_n), R the sha256 of the view's encoding without its messages, c_i =
sha256(c_{i-1} || sha256(message i's encoding)), c_0 zero. A view's chain values are kept
per stream, so the digest of the next view continues from the base's value at the kept
count and hashes only the appended messages and the (small) rest of the view, where the
whole view's sha256 hashed every message at every step. With the compaction apart
(apart_digest_of), the compaction request is hashed on its own too."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

from server.domain.grown import Grown, grown

# c_0: the chain value of no messages.
CHAIN_START = bytes(32)


def record_value(record: bytes) -> memoryview:
    """A length-delimited record's value: what follows its key and its length (two
    varints; a key is one byte up to field 15, two from 16 on)."""
    pos = 0
    while record[pos] & 0x80:
        pos += 1
    pos += 1
    while record[pos] & 0x80:
        pos += 1
    return memoryview(record)[pos + 1 :]


def chain(start: bytes, records: Iterable[bytes]) -> tuple[bytes, ...]:
    """c_{k+1}.. for the message records after the one whose chain value is `start`."""
    sha = hashlib.sha256
    out = []
    last = start
    for record in records:
        last = sha(last + sha(record_value(record)).digest()).digest()
        out.append(last)
    return tuple(out)


def continued(base: Sequence[bytes], kept: int, records: Sequence[bytes]) -> Grown[bytes]:
    """The chain values (c_1..c_n) of a view whose first `kept` messages are the base's (its
    chain values `base`) and the rest `records[kept:]`: going on with the base's list
    (grown.py), so a step copies none of the values it keeps."""
    start = base[kept - 1] if kept else CHAIN_START
    return grown(base).prefix(kept).extended(chain(start, records[kept:]))


def chain_digest(rest: bytes, values: Sequence[bytes]) -> str:
    """The lower-case hex digest of a view whose encoding without messages is `rest` and
    whose messages' chain values are `values`."""
    return chain_digest_of(hashlib.sha256(rest).digest(), values)


def chain_digest_of(rest_sha256: bytes, values: Sequence[bytes]) -> str:
    """chain_digest from the sha256 of the encoding without messages (hashed in pieces)."""
    last = values[-1] if values else CHAIN_START
    return hashlib.sha256(rest_sha256 + last).hexdigest()


def apart_digest_of(rest_sha256: bytes, values: Sequence[bytes], compaction: bytes) -> str:
    """The digest with the compaction apart (DELTA_DIGEST_MESSAGE_CHAIN_COMPACTION_APART):
    sha256(R' || c_n || q), R' the sha256 of the encoding without messages and without
    the compaction request, q the sha256 of that request's encoding (32 zero bytes
    without one). Over budget every step of a turn carries the same request, as long as
    a window of history: q is hashed when it changes, not at every step."""
    last = values[-1] if values else CHAIN_START
    return hashlib.sha256(rest_sha256 + last + compaction).hexdigest()
