"""ViewDeltas between two views held as the parts of their encoding (view_bytes.ViewBytes):
found by comparing the parts' bytes, with the whole view's sha256 (view_sha256) or the
chained digest (chain_sha256, view_digest.py)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from itertools import compress, count
from operator import ne

from server.adapters.protowire import tagged, varint
from server.domain.grown import Grown
from server.transport import view_digest
from server.transport.view_bytes import TAIL, ViewBytes

# Keys of the length-delimited CompiledView fields held as records (all one byte).
_SECTIONS_KEY, _MESSAGES_KEY, _TOOLS_KEY = 0x32, 0x52, 0x5A


def common_prefix(a: Sequence[bytes], b: Sequence[bytes]) -> int:
    """How many records at the start of `a` and `b` are equal. A step keeps all of its
    base's records or all but the last few (a new turn re-layers the old working set):
    when both share one list (grown.py) the shorter is the other's start; otherwise the
    first unequal one is looked for from the end, and the records before it compared in
    one tuple comparison in C (the kept ones are the base's own objects), so a long view
    is never walked in Python."""
    n = min(len(a), len(b))
    if isinstance(a, Grown) and a.shares(b):
        return n
    if a[:n] == b[:n]:  # the usual step: the base's messages all kept (compared in C)
        return n
    k = n
    while k > n - TAIL and k > 0 and a[k - 1] != b[k - 1]:
        k -= 1
    # Every record from k to the tail differs: the prefix is k if all before k are equal.
    if a[:k] == b[:k]:
        return k
    return next(compress(count(), map(ne, a, b)), n)


def _retag(record: bytes, old_key: int, field: int) -> bytes:
    """A record of one length-delimited field as a record of another field number."""
    assert record[0] == old_key, "records carry their one-byte key"
    return varint((field << 3) | 2) + record[1:]


def delta_record(base: ViewBytes, new: ViewBytes, keep_compaction: bool = False) -> bytes | None:
    """The encoded ViewDelta that turns `base` into `new` with the whole view's sha256
    (view_sha256), or None when `new` must go whole (its system prompt is not the joined
    sections). Its size is not judged here. `keep_compaction`: the client applies
    compaction_kept."""
    found = _delta_parts(base, new, keep_compaction)
    if found is None:
        return None
    parts, _ = found
    parts.append(tagged(8, _sha256(new.parts()).hexdigest().encode()))
    return b"".join(parts)


def _sha256(pieces: Iterable[bytes]) -> hashlib._Hash:
    """The sha256 of the pieces' concatenation, without making it."""
    h = hashlib.sha256()
    for piece in pieces:
        h.update(piece)
    return h


def chained_delta_record(
    base: ViewBytes,
    new: ViewBytes,
    base_chain: Sequence[bytes] | None,
    keep_compaction: bool = False,
    compaction_apart: bool = False,
) -> tuple[bytes, Sequence[bytes]] | None:
    """delta_record with the chained digest (chain_sha256) instead of view_sha256, and the
    new view's chain values. `base_chain` (None: not kept) are the base's; without them
    the base's kept messages are hashed once here. `compaction_apart`: the digest with
    the compaction request hashed apart (view_digest.apart_digest_of)."""
    found = _delta_parts(base, new, keep_compaction)
    if found is None:
        return None
    parts, kept = found
    if base_chain is None:
        base_chain = view_digest.chain(view_digest.CHAIN_START, base.messages[:kept])
    values = view_digest.continued(base_chain, kept, new.messages)
    if compaction_apart:
        rest = _sha256(new.parts_without_messages_or_compaction()).digest()
        digest = view_digest.apart_digest_of(rest, values, new.compaction_digest())
    else:
        rest = _sha256(new.parts_without_messages()).digest()
        digest = view_digest.chain_digest_of(rest, values)
    parts.append(tagged(9, digest.encode()))
    return b"".join(parts), values


def _delta_parts(
    base: ViewBytes, new: ViewBytes, keep_compaction: bool
) -> tuple[list[bytes], int] | None:
    """The ViewDelta's fields but its digest, and the kept message count."""
    if not new.prompt_is_joined:
        return None
    kept = common_prefix(base.messages, new.messages)
    # Over budget, each step of a turn recommends the same compaction (lent by the stream's
    # last view, so usually the same object): its prompt is sent once, not at every step.
    compaction_kept = (
        keep_compaction
        and bool(new.compaction)
        and (new.compaction is base.compaction or new.compaction == base.compaction)
    )
    parts = [tagged(1, base.compile_id.encode()), *new.head_record(2, compaction_kept)]
    if kept:
        parts.append(varint(3 << 3) + varint(kept))
    parts.extend(_retag(r, _MESSAGES_KEY, 4) for r in new.messages[kept:])
    in_base = {record: i for i, record in enumerate(base.sections)}
    for record in new.sections:
        index = in_base.get(record)
        # SectionSlot: base_index (field 1, sent even when 0: it is in a oneof) or the
        # section itself (field 2).
        slot = (
            varint(1 << 3) + varint(index)
            if index is not None
            else _retag(record, _SECTIONS_KEY, 2)
        )
        parts.append(tagged(5, slot))
    if new.tools != base.tools:
        parts.append(varint(6 << 3) + varint(1))
        parts.extend(_retag(r, _TOOLS_KEY, 7) for r in new.tools)
    if compaction_kept:
        parts.append(varint(10 << 3) + varint(1))
    return parts, kept
