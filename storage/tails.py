"""The latest events of each session, kept as the values its appends wrote.

A stream step appends an event or two and then compiles, and the compile reads the log
after what its memo saw: exactly the events that step's append just wrote. Reading them
back is a RocksDB iterator and a decode per event (a good part of what a step's load
costs), for values the append held a moment before. So an append, once written and
still under its session's lock, keeps its events here; `read_events` answers from here
when the range it is asked for lies wholly in the session's tail, and reads the store
otherwise (a range reaching back further, a tail that is gone or not there yet).

Rules this module keeps:
- a tail holds consecutive seqs only, each event as written (the log is append-only, so
  a kept event never goes stale); an append that does not continue the tail starts a
  new one, so a gap is never filled by a guess;
- the events are added only after the write has landed (never a value that is not
  stored), and a session's tail is dropped before any write that deletes from the log
  (a session deleted, maybe made again under its id);
- bounded: a few dozen events a session, a budget of bytes (as encoded) over all.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

from server.domain.model import Event

# Events kept per session: a step's compile asks for the one or two its append wrote,
# a compile after a few appends without one for a few more.
TAIL_EVENTS = 32
# Bytes (as encoded) kept over all sessions, and sessions kept.
TAIL_BYTES = 8 << 20
_SESSIONS = 4096


class _Tail:
    """One session's kept events (consecutive seqs) and their encoded sizes: changed and
    read only under the Tails' lock."""

    __slots__ = ("events", "size", "sizes")

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.sizes: list[int] = []
        self.size = 0


class Tails:
    def __init__(self, events: int = TAIL_EVENTS, budget: int = TAIL_BYTES) -> None:
        self._events = events
        self._budget = budget
        self._lock = threading.Lock()
        self._tails: OrderedDict[str, _Tail] = OrderedDict()
        self._bytes = 0

    def wrote(self, session_id: str, events: Sequence[Event], sizes: Sequence[int]) -> None:
        """After the write of `events` (consecutive seqs, `sizes` bytes each as encoded),
        made holding the session's lock."""
        if not events:
            return
        with self._lock:
            tail = self._tails.get(session_id)
            if tail is None:
                tail = self._tails[session_id] = _Tail()
            else:
                self._tails.move_to_end(session_id)
                if tail.events[-1].seq + 1 != events[0].seq:
                    self._bytes -= tail.size  # not a continuation: a new tail
                    tail.events, tail.sizes, tail.size = [], [], 0
            tail.events += events
            tail.sizes += sizes
            added = sum(sizes)
            tail.size += added
            self._bytes += added
            over = len(tail.events) - self._events
            if over > 0:
                dropped = sum(tail.sizes[:over])
                del tail.events[:over], tail.sizes[:over]
                tail.size -= dropped
                self._bytes -= dropped
            if tail.size > self._budget:  # one tail over the whole budget is not kept
                self._bytes -= self._tails.pop(session_id).size
            while len(self._tails) > _SESSIONS or self._bytes > self._budget:
                self._bytes -= self._tails.popitem(last=False)[1].size

    def read(self, session_id: str, after_seq: int, through_seq: int) -> list[Event] | None:
        """The events after `after_seq` through `through_seq` when the tail holds every one
        of them, else None (read the store)."""
        with self._lock:
            tail = self._tails.get(session_id)
            if tail is None:
                return None
            first, last = tail.events[0].seq, tail.events[-1].seq
            if after_seq + 1 < first or through_seq > last:
                return None
            start = after_seq + 1 - first
            return tail.events[start : start + max(0, through_seq - after_seq)]

    def forget(self, session_id: str | None = None) -> None:
        """Before a write that deletes from a log: that session's tail (None: all) goes."""
        with self._lock:
            if session_id is None:
                self._tails.clear()
                self._bytes = 0
                return
            old = self._tails.pop(session_id, None)
            if old is not None:
                self._bytes -= old.size
