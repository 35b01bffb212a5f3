"""A sequence that only grows, shared between the values made from it.

A session's log is append-only, and so is much of what a compile derives from it (the
events it read, the current turn's texts). Carried from step to step as tuples, each of
those is copied and compared whole at every step: ~20-70 µs at 10,000 items, paid a few
times per step, so a step's cost grew with its history. A `Grown` is the first `n`
items of a list that is never changed below its end: extending the longest `Grown` of
a list appends to that list in place and returns a longer view of it, so the two share
their items, and "does this start with that" is one identity and one length check
instead of a copy and a compare. Extending a shorter one with the items the list goes
on with shares too (equal items: a compile projects its last few messages again at
every step); with others (a fork) copies its items into a list of its own first.

A `Grown` is immutable as seen from outside: its length and items never change.
Extending takes a lock, since compiles of one session may run on several threads.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sequence
from itertools import islice
from typing import TypeVar, overload

T = TypeVar("T")


class Grown(Sequence[T]):
    """The first `len(self)` items of a shared list that only grows (see the module)."""

    __slots__ = ("_items", "_lock", "_n")

    _items: list[T]
    _lock: threading.Lock
    _n: int

    def __init__(self, items: Iterable[T] = ()) -> None:
        self._items = list(items)
        self._lock = threading.Lock()
        self._n = len(self._items)

    @classmethod
    def _sharing(cls, items: list[T], lock: threading.Lock, n: int) -> Grown[T]:
        out: Grown[T] = cls.__new__(cls)
        out._items, out._lock, out._n = items, lock, n
        return out

    def extended(self, more: Iterable[T]) -> Grown[T]:
        """These items, then `more`: shared with the list when it goes on with `more`
        (or with a first part of it, up to its end), else a list of their own."""
        added = list(more)
        if not added:
            return self
        n, end = self._n, self._n + len(added)
        with self._lock:
            items = self._items
            after = items[n:end]
            # Extended with (some of) these very items before: a turn derived twice, a
            # step that projects its last messages again as equal values.
            if after == added[: len(after)]:  # shorter only where the list ends
                items.extend(added[len(after) :])
                return self._sharing(items, self._lock, end)
        # A fork: the shared list went on past this view with other items.
        return Grown(items[:n] + added)

    def prefix(self, n: int) -> Grown[T]:
        """The first `n` items (all of them when `n` is larger), sharing the list."""
        return self if n >= self._n else self._sharing(self._items, self._lock, max(n, 0))

    def shares(self, other: Sequence[T]) -> bool:
        """Whether `other` is a view of the same list: then the shorter of the two is the
        first items of the longer."""
        return isinstance(other, Grown) and other._items is self._items

    def starts_with(self, prefix: Sequence[T]) -> bool:
        """Whether `prefix`'s items are the first of these: at once when `prefix` shares
        this list (its items are this list's first ones), else compared in C."""
        n = len(prefix)
        if n > self._n:
            return False
        if isinstance(prefix, Grown) and prefix._items is self._items:
            return True
        return tuple(self._items[:n]) == tuple(prefix)

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, i: int) -> T: ...

    @overload
    def __getitem__(self, i: slice) -> tuple[T, ...]: ...

    def __getitem__(self, i: int | slice) -> T | tuple[T, ...]:
        if isinstance(i, slice):
            if i.step is None or i.step == 1:
                start, stop, _ = i.indices(self._n)
                return tuple(self._items[start:stop])
            # Other steps: indices() gives a stop of -1 going backwards, which a list
            # slice would read as its last item.
            return tuple(self._items[: self._n][i])
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError("Grown index out of range")
        return self._items[i]

    def __iter__(self) -> Iterator[T]:
        # Items appended past this view by a longer one are never reached.
        return islice(self._items, self._n)

    def __reversed__(self) -> Iterator[T]:
        items = self._items
        return (items[i] for i in range(self._n - 1, -1, -1))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Grown):
            if other._items is self._items:
                return other._n == self._n
            return other._n == self._n and self._items[: self._n] == other._items[: other._n]
        if isinstance(other, tuple):
            return len(other) == self._n and tuple(self._items[: self._n]) == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self._items[: self._n]))

    def __repr__(self) -> str:
        return f"Grown({self._items[: self._n]!r})"


def grown(items: Sequence[T]) -> Grown[T]:
    """`items` as a `Grown` (itself when it is one already)."""
    return items if isinstance(items, Grown) else Grown(items)
