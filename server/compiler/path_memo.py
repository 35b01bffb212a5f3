"""Path scans remembered: `paths_in` (server/compiler/textscan.py) per text, and its
union over a growing list of texts (the messages of a turn), so that a compile scans
only the texts it has not seen.

A memo of a pure function: answers are the same with or without it, and it scans
nothing itself, so every scan of client text stays in textscan.py; kept apart from it
because remembering (locks, LRU order, keys that keep no text alive) is another concern
than scanning in linear time. The caps are textscan's, read when a union is made.

A compile that continues a memo passes the union its predecessor made (`PathUnion`,
carried in the projection memo): only the texts after it are looked at. Found by
hashing every text's key instead, a step in a turn of thousands of tool calls cost
O(turn) (~0.1 µs a text); the process-wide unions serve compiles without a memo.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from server.compiler import textscan
from server.compiler.textscan import FoundPaths
from server.compiler.work import Check, unchecked


class _Memo:
    """Paths of texts seen recently, keyed by (hash, length) so no text is kept alive.
    Event texts are immutable and reappear in every compile of their turn: a 1 MiB
    message is scanned once (about 0.1 s), then costs one string hash per compile.
    A memo of a pure function: answers are the same with or without it."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._lock = threading.Lock()
        self._items: OrderedDict[tuple[int, int], FoundPaths] = OrderedDict()

    def get(self, text: str) -> FoundPaths:
        if len(text) < 4_096:
            return textscan.paths_in(text)
        key = (hash(text), len(text))
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
                return hit
        found = textscan.paths_in(text)
        with self._lock:
            self._items[key] = found
            if len(self._items) > self._size:
                self._items.popitem(last=False)
        return found


_MEMO = _Memo(1_024)


@dataclass(frozen=True, slots=True)
class PathUnion:
    """The union over some leading texts of a list, with what identifies those texts
    (how many, and a hash of their (hash, length) keys, 0 when not made: no text is kept
    alive). `seen` is never changed once the union is made (a longer list copies it)."""

    count: int
    key: int
    caps: tuple[int, int]
    seen: dict[str, None]
    size: int
    capped: bool
    full: bool  # the caps were reached: later texts add nothing
    found: FoundPaths

    def covers(self, count: int) -> bool:
        """Whether this union can continue over a list of `count` texts that starts with
        the ones it was made of (under today's caps)."""
        return self.caps == _caps() and self.count <= count


@dataclass(frozen=True, slots=True)
class TurnPaths:
    """The path union of a compile's active texts, and which texts those were: the
    turn's start in the memo's events and the seq of the user message whose texts go
    before the turn's (-1: none), so the next compile knows when they start its own."""

    turn_start: int
    user_seq: int
    union: PathUnion


def _caps() -> tuple[int, int]:
    return (textscan.MAX_PATHS, textscan.MAX_PATH_BYTES)


def _extend(texts: Sequence[str], prior: PathUnion | None, key: int, check: Check) -> PathUnion:
    """The union over `texts`, continuing `prior` (the union of its first texts)."""
    if prior is not None and (prior.full or prior.count == len(texts)):
        if prior.count == len(texts) and prior.key == key:
            return prior
        return PathUnion(
            len(texts),
            key,
            prior.caps,
            prior.seen,
            prior.size,
            prior.capped,
            prior.full,
            prior.found,
        )
    if prior is not None:
        start, seen, size, capped = prior.count, dict(prior.seen), prior.size, prior.capped
    else:
        start, seen, size, capped = 0, {}, 0, False
    full = False
    grew = False
    for text in texts[start:]:
        check()
        found = _MEMO.get(text)
        capped = capped or found.capped
        for path in found.paths:
            if path in seen:
                continue
            size += len(path) + 1
            if len(seen) >= textscan.MAX_PATHS or size > textscan.MAX_PATH_BYTES:
                capped = full = True
                break
            seen[path] = None
            grew = True
        if full:
            break
    if prior is not None and not grew and capped == prior.capped:
        result = prior.found  # the same value: the prompt memo compares it by identity
    else:
        result = FoundPaths(tuple(seen), capped)
    return PathUnion(len(texts), key, _caps(), seen, size, capped, full, result)


class _Unions:
    """Unions of recent text lists by their first text. A turn grows at its end, so
    the next compile's list starts with the last one's: only the new texts are looked
    at. A memo of a pure function, like `_Memo`."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._lock = threading.Lock()
        self._items: OrderedDict[tuple[int, int], PathUnion] = OrderedDict()

    def get(self, texts: Sequence[str], check: Check) -> PathUnion:
        keys = tuple((hash(t), len(t)) for t in texts)
        if not keys:
            return _NONE
        key = hash(keys)
        with self._lock:
            known = self._items.get(keys[0])
        prior = None
        if known is not None and known.covers(len(keys)) and hash(keys[: known.count]) == known.key:
            prior = known
        union = _extend(texts, prior, key, check)
        with self._lock:
            self._items[keys[0]] = union
            self._items.move_to_end(keys[0])
            if len(self._items) > self._size:
                self._items.popitem(last=False)
        return union


_NONE = PathUnion(0, 0, (0, 0), {}, 0, False, False, FoundPaths(()))


_UNIONS = _Unions(256)


def paths_in_texts(texts: Sequence[str], check: Check = unchecked) -> FoundPaths:
    """`textscan.paths_in` over several texts (the messages of a turn), each scanned once and
    remembered; the union keeps first-appearance order and the same caps. `check` runs
    before each text not yet remembered (a compile's work budget, see work.py)."""
    return path_union(texts, None, check).found


def path_union(
    texts: Sequence[str], prior: PathUnion | None, check: Check = unchecked
) -> PathUnion:
    """The union over `texts` (see `paths_in_texts`). `prior`: the union a compile's memo
    made of the texts `texts` starts with (the caller knows they are those texts: its
    events are the memo's, and the turn the same); only the texts after them are looked
    at, and no process-wide union is touched."""
    if prior is not None and prior.covers(len(texts)):
        return _extend(texts, prior, 0, check)
    return _UNIONS.get(texts, check)
