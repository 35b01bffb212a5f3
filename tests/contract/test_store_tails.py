"""The events an append wrote, kept by the store for the reads that follow (tails.py):
every read it answers equals the same read from RocksDB, on real RocksDB."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from server.domain.model import AppendBatch, ContentPart, Event, NewEvent, Session, UserMessage
from storage import KVEventStore, open_rocks
from storage.tails import Tails


@pytest.fixture
def store(tmp_path: Path) -> Iterator[KVEventStore]:
    s = KVEventStore(open_rocks(tmp_path / "db"))
    yield s
    s.close()


def _append(store: KVEventStore, sid: str, *texts: str) -> None:
    events = tuple(NewEvent(f"{sid}-{t}", UserMessage((ContentPart(text=t),))) for t in texts)
    store.append(AppendBatch(sid, events, now_ns=7))


def _stored(store: KVEventStore, sid: str, after: int, through: int) -> list[Event]:
    """The same read from RocksDB, the tails passed by."""
    tails, store._tails = store._tails, Tails()
    try:
        return store.read_events(sid, after, None, frozenset(), through)
    finally:
        store._tails = tails


def _texts(events: list[Event]) -> list[str]:
    return [p.text or "" for e in events for p in getattr(e.payload, "parts", ())]


def test_reads_of_the_latest_appends_equal_the_stored_events(store: KVEventStore) -> None:
    store.create_session(Session("s", 1, 1))
    _append(store, "s", "a", "b")
    _append(store, "s", "c")
    _append(store, "s", "d", "e")
    for after in range(6):
        for through in range(after, 6):
            kept = store._tails.read("s", after, through)
            assert kept is not None, (after, through)
            assert kept == _stored(store, "s", after, through)
            assert store.read_events("s", after, None, frozenset(), through) == kept


def test_a_range_reaching_before_the_tail_is_read_from_the_store(store: KVEventStore) -> None:
    store.create_session(Session("s", 1, 1))
    for i in range(40):  # more than a tail keeps
        _append(store, "s", f"m{i}")
    assert store._tails.read("s", 0, 40) is None
    got = store.read_events("s", 0, None, frozenset(), 40)
    assert _texts(got) == [f"m{i}" for i in range(40)]
    assert [e.seq for e in store.read_events("s", 30, None, frozenset(), 40)] == list(range(31, 41))


def test_a_gap_in_what_was_kept_is_never_bridged() -> None:
    """An append that does not continue the tail starts a new one: seqs it never saw
    (written by a store that forgot, or another life of the session) are not made up."""

    def ev(seq: int) -> Event:
        return Event(seq, f"e{seq}", 1, UserMessage((ContentPart(text=str(seq)),)))

    tails = Tails()
    tails.wrote("s", [ev(1), ev(2)], [10, 10])
    tails.wrote("s", [ev(5)], [10])
    assert tails.read("s", 1, 5) is None
    assert tails.read("s", 4, 5) == [ev(5)]
    tails.wrote("s", [ev(6), ev(7)], [10, 10])
    assert tails.read("s", 4, 7) == [ev(5), ev(6), ev(7)]
    assert tails.read("s", 4, 8) is None  # not written yet


def test_a_deleted_and_recreated_session_never_reads_its_old_events(
    store: KVEventStore,
) -> None:
    """A range of the old life (as a checkpoint's origin digest asks for) must come from
    the store, which no longer holds it."""
    store.create_session(Session("s", 1, 1))
    _append(store, "s", "old1", "old2", "old3")
    store.delete_session("s")
    store.create_session(Session("s", 2, 2))
    assert store.read_events("s", 0, None, frozenset(), 3) == []
    _append(store, "s", "new1")
    assert _texts(store.read_events("s", 0, None, frozenset(), 3)) == ["new1"]


def test_concurrent_appends_by_several_writers_read_back_whole(store: KVEventStore) -> None:
    """Appends of one session from several threads (one stream's step, another's, a
    unary append): any range a reader asks for up to the head is every event in it."""
    store.create_session(Session("s", 1, 1))
    failures: list[str] = []

    def writer(k: int) -> None:
        for i in range(30):
            _append(store, "s", f"w{k}-{i}")

    def reader() -> None:
        seen = 0
        while seen < 90:
            head = store.get_session("s").head_seq
            got = store.read_events("s", seen, None, frozenset(), head)
            if [e.seq for e in got] != list(range(seen + 1, head + 1)):
                failures.append(f"read ({seen}, {head}]: {[e.seq for e in got]}")
                return
            seen = head

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(3)]
    threads.append(threading.Thread(target=reader))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures
    whole = store.read_events("s", 0, None, frozenset(), 90)
    assert whole == _stored(store, "s", 0, 90)
    assert sorted(_texts(whole)) == sorted(f"w{k}-{i}" for k in range(3) for i in range(30))


def test_tails_stay_within_their_counts_and_bytes() -> None:
    def ev(seq: int) -> Event:
        return Event(seq, f"e{seq}", 1, UserMessage((ContentPart(text=str(seq)),)))

    tails = Tails(events=3, budget=100)
    tails.wrote("a", [ev(1), ev(2)], [20, 20])
    tails.wrote("a", [ev(3), ev(4)], [20, 20])  # four events: the first is dropped
    assert tails.read("a", 0, 4) is None
    assert tails.read("a", 1, 4) == [ev(2), ev(3), ev(4)]
    tails.wrote("b", [ev(1)], [50])  # 110 bytes in all: the older session goes
    assert tails.read("a", 3, 4) is None
    assert tails.read("b", 0, 1) == [ev(1)]
    tails.wrote("b", [ev(2)], [60])  # one tail over the budget is not kept
    assert tails.read("b", 0, 1) is None
    tails.wrote("c", [ev(1)], [100])
    assert tails.read("c", 0, 1) == [ev(1)]
    tails.forget("c")
    assert tails.read("c", 0, 1) is None
