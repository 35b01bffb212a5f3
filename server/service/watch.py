"""Fan-out of session updates to watchers, on the event loop.

A watcher has a bounded queue. Publishing never waits: when a queue is full its
backlog is dropped and replaced by one Resync marker carrying the session head, so a
stalled watcher costs appends nothing and learns exactly where to re-read from. Until
the watcher reads that marker, later updates only move its head: one step per publish.
Order is never changed: items leave each queue in publish order.
"""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from server.domain.errors import CtxccError, Reason
from server.domain.model import Event, of_deleted
from server.domain.records import Checkpoint


@dataclass(frozen=True, slots=True)
class CompileNotice:
    compile_id: str
    event_boundary: int
    estimated_input_tokens: int


@dataclass(frozen=True, slots=True)
class Resync:
    head_seq: int


Update = Event | Checkpoint | CompileNotice | Resync


class Closed:
    """Sentinel: the daemon is shutting down; the watch ends with SHUTTING_DOWN."""


class Deleted:
    """Sentinel: the watched session was deleted; the watch ends with SESSION_NOT_FOUND
    (a session made again with the same id is another log, whose seqs start over)."""


class Watcher:
    def __init__(self, size: int, incarnation: int = 0) -> None:
        # The create time of the session watched: a session deleted and made again under
        # its id is another log, whose updates this watcher must never get.
        self.incarnation = incarnation
        self.queue: asyncio.Queue[Update | Closed | Deleted] = asyncio.Queue(maxsize=size)
        # The Resync that replaced an overflowed backlog; behind while it is unread.
        self._marker: Resync | None = None
        self._ended = False

    def close(self, why: Closed | Deleted | None = None) -> None:
        self._ended = True
        while self.queue.full():
            self.queue.get_nowait()
        self.queue.put_nowait(why or Closed())

    def offer(self, update: Update, head_seq: int) -> bool:
        """Queue an update; on overflow replace the backlog by Resync(head_seq), return False."""
        if self._ended:
            return False
        if self._marker is not None:
            if not self.queue.empty():
                # Still behind: the queue holds only the unread marker, whose head moves
                # on. Filling the queue again only to drop it at the next overflow cost
                # every append a few hundred steps per stalled watcher, on the event loop
                # that serves every session.
                head = max(self._marker.head_seq, head_seq)
                self.queue.get_nowait()
                self._marker = Resync(head)
                self.queue.put_nowait(self._marker)
                return False
            self._marker = None  # read: what follows queues again
        try:
            self.queue.put_nowait(update)
            return True
        except asyncio.QueueFull:
            while not self.queue.empty():
                self.queue.get_nowait()
            self._marker = Resync(head_seq)
            self.queue.put_nowait(self._marker)
            return False


# The inspector's live pages watch in a pool of their own: sharing the API's per-session
# cap, 64 open tabs made the agent's own WatchSession RESOURCE_EXHAUSTED.
API, INSPECTOR = "api", "inspector"
INSPECTOR_PER_SESSION = 16


class WatchHub:
    def __init__(
        self,
        queue_size: int,
        per_session: int = 64,
        most: int = 4_096,
        inspector_per_session: int = INSPECTOR_PER_SESSION,
    ) -> None:
        self._size = queue_size
        self._caps = {API: per_session, INSPECTOR: inspector_per_session}
        self._most = most
        self._watchers: dict[str, set[Watcher]] = defaultdict(set)
        # Watchers per (pool, session): each pool has its own per-session cap.
        self._pooled: Counter[tuple[str, str]] = Counter()
        self._count = 0
        self._closed = False

    def _refuse_past_caps(self, session_id: str, pool: str = API) -> None:
        """Each watcher costs every append of its session a queue offer on the event loop
        (and memory for its queue): bounded per session (in its pool) and in all."""
        cap = self._caps[pool]
        if self._pooled[(pool, session_id)] >= cap:
            whose = "" if pool == API else f" {pool}"
            raise CtxccError(
                Reason.QUOTA_EXCEEDED,
                f"session {session_id} already has {cap}{whose} watchers",
                quota="watchers_per_session",
                limit=str(cap),
            )
        if self._count >= self._most:
            raise CtxccError(
                Reason.QUOTA_EXCEEDED,
                f"the daemon already serves {self._most} watchers",
                quota="watchers",
                limit=str(self._most),
            )

    @asynccontextmanager
    async def subscribe(
        self, session_id: str, incarnation: int = 0, pool: str = API
    ) -> AsyncIterator[Watcher]:
        self._refuse_past_caps(session_id, pool)
        watcher = Watcher(self._size, incarnation)
        if self._closed:
            # Subscribed while the daemon shuts down: end at once rather than wait for
            # updates that will never come (and hold up the shutdown).
            watcher.close()
        self._watchers[session_id].add(watcher)
        self._pooled[(pool, session_id)] += 1
        self._count += 1
        try:
            yield watcher
        finally:
            self._count -= 1
            self._pooled[(pool, session_id)] -= 1
            if not self._pooled[(pool, session_id)]:
                del self._pooled[(pool, session_id)]
            watchers = self._watchers.get(session_id)
            if watchers is not None:
                watchers.discard(watcher)
                if not watchers:
                    del self._watchers[session_id]

    def watched(self, session_id: str) -> bool:
        """Whether anyone watches the session: its updates need not be made otherwise."""
        return session_id in self._watchers

    def publish(
        self, session_id: str, updates: list[Update], head_seq: int, incarnation: int = 0
    ) -> None:
        """To the watchers of the session made at `incarnation` (its create time; 0: any).
        An append to a session that was then deleted and made again under its id can be
        handed back to the loop after a watcher of the new one subscribed: its events are
        the old log's, at seqs the new one will reuse."""
        for watcher in self._watchers.get(session_id, ()):
            if incarnation and watcher.incarnation and watcher.incarnation != incarnation:
                continue
            for update in updates:
                if not watcher.offer(update, head_seq):
                    break  # the Resync marker's head already covers the rest of the batch

    def deleted(self, session_id: str, incarnation: int = 0) -> None:
        """Ends the watches of the deleted session made at `incarnation` (its create
        time; 0: every watch of the id). They leave the hub at once: a session made again
        under the id publishes nothing to them (its updates could push the marker out of
        a full queue). The watches of a session made again under the id before this runs
        (the delete's result reached the event loop late) go on: theirs is another log."""
        watchers = self._watchers.get(session_id)
        if watchers is None:
            return
        gone = [w for w in watchers if of_deleted(w.incarnation, incarnation)]
        for watcher in gone:
            watchers.discard(watcher)
            watcher.close(Deleted())
        if not watchers:
            del self._watchers[session_id]

    def close_all(self) -> None:
        self._closed = True
        for watchers in self._watchers.values():
            for watcher in watchers:
                watcher.close()

    def count(self) -> int:
        return self._count
