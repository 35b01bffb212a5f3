"""A view's per-message table (8 digest bytes and a token count a message, see
`CompileRecord.message_digests`) as stored: in chunks of `CHUNK` messages named by their
content, plus the messages after the last full chunk inline.

A compile record, the session's copy of its latest one, the route state a usage report
writes and a compile's basis each hold the table of a view. A step appends a couple of
messages to a view of thousands, so the chunks of the step before are the chunks of this
one: a record names them and carries only its tail, and a step writes what it added, not
the whole table four times over. Records written before chunks existed carry the whole
table inline (no chunk names) and read as they are.

In memory a record always holds its whole table and no chunk names: the store splits a
record when it writes it and joins it when it reads it (`stored`, `whole`)."""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from itertools import chain
from typing import TypeVar

from server.domain.records import MESSAGE_DIGEST_BYTES, CompileRecord, RouteState

# The records that hold a view's per-message table.
Tabled = TypeVar("Tabled", CompileRecord, RouteState)

# Messages per stored chunk: a step's writes carry at most this many entries inline.
CHUNK = 256
# Bytes of digest per message in a table.
_WIDTH = MESSAGE_DIGEST_BYTES
# Tables split, remembered (most recent last).
_SPLITS = 16


@dataclass(frozen=True, slots=True)
class TableChunk:
    """CHUNK consecutive entries of a table."""

    digests: bytes
    tokens: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Split:
    """A table as stored: the names of the chunks it starts with, then the rest inline
    (`digests`, `tokens`). `whole_*` is the table itself, which `chunk` cuts."""

    names: tuple[str, ...]
    digests: bytes
    tokens: tuple[int, ...]
    whole_digests: bytes
    whole_tokens: tuple[int, ...]

    def chunk(self, i: int) -> TableChunk:
        """The chunk `names[i]` names (for a writer that has not stored it yet)."""
        return TableChunk(
            self.whole_digests[i * CHUNK * _WIDTH : (i + 1) * CHUNK * _WIDTH],
            self.whole_tokens[i * CHUNK : (i + 1) * CHUNK],
        )


@dataclass(frozen=True, slots=True)
class PendingChunk:
    """A chunk of a split table, cut from it only when a writer finds it not stored yet
    (a step's chunks are nearly all stored already)."""

    split: Split
    index: int

    def cut(self) -> TableChunk:
        return self.split.chunk(self.index)


def pending(split: Split) -> tuple[tuple[str, PendingChunk], ...]:
    """A split's chunks as (name, chunk) parts to store."""
    return tuple((name, PendingChunk(split, i)) for i, name in enumerate(split.names))


def chunk_name(chunk: TableChunk) -> str:
    """Content digest of a chunk (the tokens written out: no width to outgrow)."""
    h = hashlib.sha256(b"table-chunk\x00")
    h.update(chunk.digests)
    h.update(",".join(map(str, chunk.tokens)).encode())
    return h.hexdigest()[:32]


class Splitter:
    """`split` with what it computed remembered: a step's table is an earlier table with a
    few entries added, so the names of the chunks they share are taken from that table's
    split (a comparison of their prefixes in C), and only a chunk filled since is hashed;
    a table written several times (a record, its latest copy, the report's record and
    route state, the next compile's basis) is split once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._splits: OrderedDict[tuple[int, int], Split] = OrderedDict()

    def split(self, digests: bytes, tokens: tuple[int, ...]) -> Split:
        """The stored form of a table whose entries agree (one digest per token count);
        a table that does not is kept whole inline, as records always were."""
        full = len(tokens) // CHUNK
        if not full or len(digests) != len(tokens) * _WIDTH:
            return Split((), digests, tokens, digests, tokens)
        # By identity of the table's two values (the split holds them: the ids stay theirs).
        key = (id(digests), id(tokens))
        with self._lock:
            kept = self._splits.get(key)
            earlier = list(reversed(self._splits.values()))
        if kept is not None and kept.whole_digests is digests and kept.whole_tokens is tokens:
            return kept
        names: tuple[str, ...] = ()
        for old in earlier:  # the most recent first
            shared = min(len(old.names), full)
            if shared > len(names) and _same_start(old, digests, tokens, shared):
                names = old.names[:shared]
        done = Split((), digests, tokens, digests, tokens)
        names += tuple(chunk_name(done.chunk(i)) for i in range(len(names), full))
        done = Split(
            names, digests[full * CHUNK * _WIDTH :], tokens[full * CHUNK :], digests, tokens
        )
        with self._lock:
            self._splits[key] = done
            while len(self._splits) > _SPLITS:
                self._splits.popitem(last=False)
        return done


def _same_start(old: Split, digests: bytes, tokens: tuple[int, ...], chunks: int) -> bool:
    """Whether a table starts with the first `chunks` chunks of `old`'s."""
    rows = len(old.whole_tokens)
    # Usually the table is `old`'s with rows added: compared with the whole of `old`'s,
    # one slice of it is made instead of two (a step's table holds thousands of rows).
    if (
        rows <= len(tokens)
        and old.whole_digests == digests[: rows * _WIDTH]
        and old.whole_tokens == tokens[:rows]
    ):
        return True
    n = chunks * CHUNK
    return (
        old.whole_digests[: n * _WIDTH] == digests[: n * _WIDTH]
        and old.whole_tokens[:n] == tokens[:n]
    )


def whole(
    value: Tabled, chunk: Callable[[str], TableChunk | None], damaged: Callable[[], Exception]
) -> Tabled:
    """A record as read, with its whole table: its named chunks in order (`chunk` finds
    one by name; a missing or malformed one raises `damaged()`), then its inline rest.
    Records written before chunks existed hold the table inline and are returned as is."""
    if not value.table_chunks:
        return value
    found: list[TableChunk] = []
    for name in value.table_chunks:
        part = chunk(name)
        if part is None or not well_formed(part):
            raise damaged()
        found.append(part)
    digests = b"".join([*(p.digests for p in found), value.message_digests])
    tokens = tuple(chain.from_iterable(p.tokens for p in found)) + value.message_tokens
    return replace(value, message_digests=digests, message_tokens=tokens, table_chunks=())


def stored(value: Tabled, splitter: Splitter) -> tuple[Tabled, tuple[tuple[str, object], ...]]:
    """The form of a record that is written: its table's chunks named, with the chunks as
    parts to store (those not stored yet), and only the rest of its table inline."""
    written, split = stored_form(value, splitter)
    return written, pending(split) if split is not None else ()


def stored_form(value: Tabled, splitter: Splitter) -> tuple[Tabled, Split | None]:
    """`stored` without the chunks made into parts (a long table names dozens, nearly
    always all stored already): the split, None when the table is inline whole."""
    split = splitter.split(value.message_digests, value.message_tokens)
    if not split.names:
        return value, None
    written = replace(
        value, message_digests=split.digests, message_tokens=split.tokens, table_chunks=split.names
    )
    return written, split


def well_formed(part: TableChunk) -> bool:
    """Whether a chunk read back has the shape every written chunk has."""
    return len(part.tokens) == CHUNK and len(part.digests) == CHUNK * _WIDTH
