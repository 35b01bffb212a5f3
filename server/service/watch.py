"""Fan-out of session updates to watchers, on the event loop.

A watcher has a bounded queue. Publishing never waits: when a queue is full its
backlog is dropped and replaced by one Resync marker carrying the session head, so a
stalled watcher costs appends nothing and learns exactly where to re-read from. Until
the watcher reads that marker, later updates only move its head: one step per publish.
Order is never changed: items leave each queue in publish order.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Protocol

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


class HeldCounter(Protocol):
    """Bytes held against a limit (the transport's HeldBytes); a limit of 0: none."""

    @property
    def limit(self) -> int: ...

    @property
    def held(self) -> int: ...

    def add(self, size: int) -> None: ...


class _Uncounted:
    limit = 0
    held = 0

    def add(self, size: int) -> None:
        pass


# How long a watch's message may wait on gRPC (its client reads nothing; a page being
# read does not count) before the watch is ended, once other watches wait for room: a
# reader takes a 1 MiB message in milliseconds, even a slow link in a few seconds.
STALLED_S = 5.0


class WatchBytes:
    """The bytes every watch holds in flight, bounded together (--max-watch-bytes-in-memory):
    the backlog page it read and hands on, and the message gRPC is sending. A watcher
    that stops reading keeps both for as long as its call lives: gRPC's send waits for
    the client's flow-control window (180 such watchers of 1 MB events held ~1 GB).

    Past the limit a watch reads nothing more: its next page waits for room (live updates
    queue up meanwhile, as for any slow reader). A watch alone (nothing held) always reads
    a page of at least one event. While watches wait, those whose message gRPC has not
    taken for STALLED_S are ended (`Holding`'s `end`: QUOTA_EXCEEDED,
    quota=watch_bytes_in_memory, after what their client was already sent), so a client
    that stopped reading never holds up the others for long; its client, reading again,
    watches again after the last event it got. On the event loop."""

    def __init__(self, counter: HeldCounter | None = None, stalled_s: float = STALLED_S) -> None:
        self._counter: HeldCounter = counter if counter is not None else _Uncounted()
        self._stalled_s = stalled_s
        self._freed = asyncio.Event()
        self._holders: set[Holding] = set()
        self.waiting = 0
        self.ended = 0

    @property
    def held(self) -> int:
        return self._counter.held

    @property
    def limit(self) -> int:
        return self._counter.limit

    def holding(self, end: Callable[[], None]) -> Holding:
        """One watch's part; `end` ends its call (called once, if it stalls)."""
        holding = Holding(self, end)
        self._holders.add(holding)
        return holding

    def stalled_error(self) -> CtxccError:
        return CtxccError(
            Reason.QUOTA_EXCEEDED,
            f"this watch held bytes of the daemon's {self.limit} for watches in flight, its "
            f"client reading none of them for {self._stalled_s:g} s while other watches "
            "waited: watch again after the last event received",
            quota="watch_bytes_in_memory",
            limit=str(self.limit),
        )

    async def _reserve(self, holding: Holding, most: int, over: int) -> int:
        while True:
            limit, held = self._counter.limit, self._counter.held
            if not limit or held <= 0:
                room = most
                break
            if held + over < limit:
                room = min(most, limit - held - over)
                break
            wait = self._end_stalled(holding)
            freed = self._freed
            self.waiting += 1
            try:
                await asyncio.wait_for(freed.wait(), wait)
            except TimeoutError:
                pass
            finally:
                self.waiting -= 1
        holding.take(room + over)
        return room

    def _end_stalled(self, waiter: Holding) -> float:
        """Ends the watches stalled now; how long until the next could be."""
        now = time.monotonic()
        wait = self._stalled_s
        for h in list(self._holders):
            # Only a message gRPC has not taken waits on the client: a watch reading its
            # page (a storage pool busy with syncs can take seconds) is not stalled.
            if h is waiter or h.held <= 0 or not h.in_send:
                continue
            left = h.moved + self._stalled_s - now
            if left > 0:
                wait = min(wait, left)
                continue
            self._holders.discard(h)  # ended once; its bytes come back as its call unwinds
            self.ended += 1
            h.end()
        return max(wait, 0.01)

    def _add(self, size: int) -> None:
        self._counter.add(size)
        if size < 0 and self.waiting:
            # Every waiter looks again; those that find no room wait on the next one.
            self._freed.set()
            self._freed = asyncio.Event()

    def _closed(self, holding: Holding) -> None:
        self._holders.discard(holding)


class Holding:
    """What one watch holds of WatchBytes, and when gRPC last took any of it."""

    __slots__ = ("_aside", "_aside_most", "_of", "end", "held", "in_send", "moved")

    def __init__(self, of: WatchBytes, end: Callable[[], None]) -> None:
        self._of = of
        self.end = end
        self.held = 0
        self.moved = time.monotonic()
        # Messages handed to gRPC and not yet taken: the watch can stall only in a send.
        self.in_send = 0
        # Bytes held for the messages of the page being handed on (see `sending`).
        self._aside = self._aside_most = 0

    async def reserve(self, most: int, over: int = 0) -> int:
        """Up to `most` bytes for the watch's next page to read, once there is room for
        them and `over` more (what the page may come to past its room, and its messages
        in flight), waiting while the watches hold the limit. Both are taken: `read`
        says what the page holds of them."""
        return await self._of._reserve(self, most, over)

    def read(self, reserved: int, page_bytes: int, aside: int) -> int:
        """The page read with `reserved` bytes holds `page_bytes`, and sets `aside` for
        its messages: the rest goes back. What `handed_on` gives back."""
        keep = page_bytes + aside
        if keep > reserved:
            self.take(keep - reserved)
        elif keep < reserved:
            self.give(reserved - keep)
        self._aside = self._aside_most = aside
        return page_bytes

    def handed_on(self, page_bytes: int) -> None:
        """The page is handed on: its bytes and what was set aside go back."""
        self.give(page_bytes + self._aside)
        self._aside = self._aside_most = 0

    def sending(self, size: int) -> None:
        """A message of `size` bytes handed to gRPC: of what its page set aside first."""
        if not self.in_send:
            self.moved = time.monotonic()  # waits on the client from now (not the read)
        self.in_send += 1
        drawn = min(size, self._aside)
        self._aside -= drawn
        self.take(size - drawn)

    def sent(self, size: int) -> None:
        """gRPC took it: what it drew of its page's set-aside bytes is set aside again."""
        self.in_send -= 1
        back = min(size, self._aside_most - self._aside)
        self._aside += back
        self.give(size - back)

    def take(self, size: int) -> None:
        """Counted without waiting: bytes already made (a message handed to gRPC)."""
        if self.held <= 0:
            self.moved = time.monotonic()  # held since now
        self.held += size
        self._of._add(size)

    def give(self, size: int) -> None:
        """Given back: sent (gRPC took the message), or done with."""
        self.held -= size
        self.moved = time.monotonic()
        self._of._add(-size)

    def close(self) -> None:
        if self.held:
            self._of._add(-self.held)
            self.held = 0
        self._of._closed(self)


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
