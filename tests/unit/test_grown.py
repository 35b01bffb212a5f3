"""Grown (server/domain/grown.py): a view of a shared list that only grows must read as
the tuple of its items whatever is appended after it, and share only when that is safe."""

from __future__ import annotations

import operator
import threading

from hypothesis import given
from hypothesis import strategies as st

from server.domain.grown import Grown, grown


def test_extending_the_longest_view_shares_and_older_views_do_not_change() -> None:
    a = Grown([1, 2])
    b = a.extended([3])
    c = b.extended([4, 5])
    assert (tuple(a), tuple(b), tuple(c)) == ((1, 2), (1, 2, 3), (1, 2, 3, 4, 5))
    assert c._items is a._items  # appended in place: nothing copied
    assert c.starts_with(a) and c.starts_with(b) and not a.starts_with(b)
    assert a[-1] == 2 and b[1:] == (2, 3) and list(reversed(b)) == [3, 2, 1]


def test_a_fork_copies_and_keeps_both_lines_apart() -> None:
    a = Grown([1, 2])
    b = a.extended([3])
    fork = a.extended([9])  # `a` is no longer the list's longest view
    assert tuple(fork) == (1, 2, 9) and tuple(b) == (1, 2, 3)
    assert fork._items is not b._items
    assert not b.starts_with(fork) and not fork.starts_with(b)
    assert fork.starts_with(a)  # equal items, another list: compared
    again = a.extended([3])  # what the list goes on with already: shared, not forked
    assert again._items is b._items and tuple(again) == (1, 2, 3) and b.starts_with(again)
    assert b.extended([4])._items is b._items  # `b` is still the shared list's tip
    # Going on past the list's end with equal items first (the last messages projected
    # again): shared, the rest appended.
    c = Grown([1]).extended([2, 3])
    d = c.prefix(2).extended([3, 4, 5])
    assert d._items is c._items and tuple(d) == (1, 2, 3, 4, 5) and tuple(c) == (1, 2, 3)
    assert c.prefix(1).extended([7])._items is not c._items  # other items: a fork


def test_reads_stop_at_the_views_length() -> None:
    a = Grown("xy")
    a.extended("z")
    assert list(a) == ["x", "y"] and len(a) == 2 and a[:] == ("x", "y")
    for bad in (2, -3):
        try:
            a[bad]
        except IndexError:
            continue
        raise AssertionError(f"index {bad} past the view was read")


def test_equality_and_hash_are_the_tuples() -> None:
    a = Grown([1, 2]).extended([3])
    assert a == (1, 2, 3) and operator.eq((1, 2, 3), a) and a == Grown([1, 2, 3])
    assert a != (1, 2) and Grown([1, 2]) != a
    assert hash(a) == hash((1, 2, 3))
    assert grown(a) is a and grown((1,)) == (1,)


def test_concurrent_extensions_of_one_view_each_get_their_own_items() -> None:
    base = Grown(range(100))
    out: list[Grown[int]] = []
    lock = threading.Lock()

    def extend(k: int) -> None:
        g = base.extended(range(1000 * k, 1000 * k + 50))
        with lock:
            out.append(g)

    threads = [threading.Thread(target=extend, args=(k,)) for k in range(1, 9)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(tuple(g)[100] for g in out) == [1000 * k for k in range(1, 9)]
    for g in out:
        k = g[100] // 1000
        assert tuple(g) == (*range(100), *range(1000 * k, 1000 * k + 50))
    assert sum(g._items is base._items for g in out) == 1  # one took the tip, the rest forked


@given(st.lists(st.tuples(st.integers(0, 5), st.lists(st.integers(), max_size=4)), max_size=30))
def test_any_history_of_extensions_reads_as_tuples(ops: list[tuple[int, list[int]]]) -> None:
    views: list[tuple[Grown[int], tuple[int, ...]]] = [(Grown(()), ())]
    for pick, more in ops:
        g, t = views[pick % len(views)]
        views.append((g.extended(more), t + tuple(more)))
        views.append((g.prefix(pick), t[:pick]))
    for g, t in views:
        assert tuple(g) == t and g == t and len(g) == len(t)
        assert g[1:3] == t[1:3] and g[::-1] == t[::-1]
    for g, t in views:
        for h, u in views:
            assert g.starts_with(h) == (u == t[: len(u)])
