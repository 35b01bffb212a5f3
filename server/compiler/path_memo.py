"""Path scans remembered: `paths_in` (server/compiler/textscan.py) per text, and its
union over a growing list of texts (the messages of a turn), so that a compile scans
only the texts it has not seen.

A memo of a pure function: answers are the same with or without it, and it scans
nothing itself, so every scan of client text stays in textscan.py; kept apart from it
because remembering (locks, LRU order, keys that keep no text alive) is another concern
than scanning in linear time. The caps are textscan's, read when a union is made.
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
class _Union:
    """The union over some leading texts of a list, with what identifies those texts
    (how many, and a hash of their (hash, length) keys: no text is kept alive)."""

    count: int
    key: int
    caps: tuple[int, int]
    seen: dict[str, None]
    size: int
    capped: bool
    full: bool  # the caps were reached: later texts add nothing


class _Unions:
    """Unions of recent text lists by their first text. A turn grows at its end, so
    the next compile's list starts with the last one's: only the new texts are looked
    at. A memo of a pure function, like `_Memo`."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._lock = threading.Lock()
        self._items: OrderedDict[tuple[int, int], _Union] = OrderedDict()

    def get(self, texts: Sequence[str], check: Check) -> FoundPaths:
        keys = tuple((hash(t), len(t)) for t in texts)
        if not keys:
            return FoundPaths(())
        with self._lock:
            known = self._items.get(keys[0])
        if (
            known is not None
            and known.caps == (textscan.MAX_PATHS, textscan.MAX_PATH_BYTES)
            and known.count <= len(keys)
            and hash(keys[: known.count]) == known.key
        ):
            if known.full or known.count == len(keys):
                return FoundPaths(tuple(known.seen), known.capped)
            start, seen, size, capped = known.count, dict(known.seen), known.size, known.capped
        else:
            start, seen, size, capped = 0, {}, 0, False
        full = False
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
            if full:
                break
        union = _Union(
            len(keys),
            hash(keys),
            (textscan.MAX_PATHS, textscan.MAX_PATH_BYTES),
            seen,
            size,
            capped,
            full,
        )
        with self._lock:
            self._items[keys[0]] = union
            self._items.move_to_end(keys[0])
            if len(self._items) > self._size:
                self._items.popitem(last=False)
        return FoundPaths(tuple(seen), capped)


_UNIONS = _Unions(256)


def paths_in_texts(texts: Sequence[str], check: Check = unchecked) -> FoundPaths:
    """`textscan.paths_in` over several texts (the messages of a turn), each scanned once and
    remembered; the union keeps first-appearance order and the same caps. `check` runs
    before each text not yet remembered (a compile's work budget, see work.py)."""
    return _UNIONS.get(texts, check)
