"""The compile memos of recent sessions: a bounded LRU by bytes.

A memo is a frozen value (compiler/projection_memo.py), so a compile reads one without a
lock held and two compiles of one session at once simply race to store theirs: either
is valid for the next compile, which verifies it anyway. Keyed by (session, route):
an agent switching routes keeps both memos warm.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict

from server.compiler.projection_memo import ProjectionMemo
from server.domain.model import of_deleted
from server.service.ports import Telemetry

log = logging.getLogger("ctxcc.memos")

MemoKey = tuple[str, int, str]  # session id, session create time, route id
# Sessions (and routes) whose memo over the whole budget was logged, before the log
# stays quiet.
_WARNED = 256


class MemoCache:
    def __init__(self, max_bytes: int, telemetry: Telemetry) -> None:
        self._max = max_bytes
        self._telemetry = telemetry
        self._items: OrderedDict[MemoKey, ProjectionMemo] = OrderedDict()
        # (session id, route id) -> the key of its memo, for `warm` (no create time there).
        self._routes: dict[tuple[str, str], MemoKey] = {}
        self._bytes = 0
        self._lock = threading.Lock()
        self._warned: set[tuple[str, str]] = set()

    def warm(self, session_id: str, route_id: str) -> bool:
        """Whether a memo of the session on the route is kept (a hint: the compile still
        verifies it, and a session made again under the id has another create time)."""
        return (session_id, route_id) in self._routes

    def _dropped(self, key: MemoKey) -> None:
        """Under the lock: `key`'s memo left the cache."""
        route = (key[0], key[2])
        if self._routes.get(route) == key:
            del self._routes[route]

    def get(self, key: MemoKey) -> ProjectionMemo | None:
        with self._lock:
            memo = self._items.get(key)
            if memo is not None:
                self._items.move_to_end(key)
            return memo

    def put(self, key: MemoKey, memo: ProjectionMemo | None) -> None:
        evicted = 0
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= old.size_bytes
                self._dropped(key)
            if memo is None or not self._max:  # dropped; or memos are off
                return
            if memo.size_bytes > self._max:
                # One memo over the whole budget is not kept: each compile of the session
                # starts from scratch (seconds a step at 100,000 events), which the
                # operator must be able to see and undo. Counted as an eviction.
                self._too_large(key, memo.size_bytes)
                evicted = 1
            else:
                self._items[key] = memo
                self._routes[(key[0], key[2])] = key
                self._bytes += memo.size_bytes
                while self._bytes > self._max:
                    gone_key, gone = self._items.popitem(last=False)
                    self._bytes -= gone.size_bytes
                    self._dropped(gone_key)
                    evicted += 1
            size = self._bytes
        self._telemetry.memo_changed(evicted, size)

    def _too_large(self, key: MemoKey, size_bytes: int) -> None:
        """Under the lock: a memo over the whole budget, logged once per session and
        route."""
        route = (key[0], key[2])
        if route in self._warned or len(self._warned) >= _WARNED:
            return
        self._warned.add(route)
        log.warning(
            "the compile memo of session %s on route %s (~%.1f MiB) is larger than "
            "--compile-memo-bytes (%.1f MiB): it is not kept, and each compile of the "
            "session projects its whole history again; raise --compile-memo-bytes or "
            "compact the session (logged once per session and route)",
            key[0],
            key[2],
            size_bytes / (1 << 20),
            self._max / (1 << 20),
        )

    def forget(self, session_id: str, created: int = 0) -> None:
        """The session made at `created` was deleted: its memos (of every route; of every
        incarnation with 0) go now; those of a session made again under its id since stay.
        Their key's create time keeps them from ever matching again, so until the LRU
        reached them they only held budget that live sessions' memos were evicted for
        (a session deleted right after its last step left the newest entry). A scan:
        deletes are rare next to steps, and the cache holds a few thousand at most."""
        with self._lock:
            gone = [
                key for key in self._items if key[0] == session_id and of_deleted(key[1], created)
            ]
            for key in gone:
                self._bytes -= self._items.pop(key).size_bytes
                self._dropped(key)
            size = self._bytes
        if gone:
            self._telemetry.memo_changed(0, size)

    def __len__(self) -> int:
        """Memos kept (for tests: a deleted session's are not)."""
        return len(self._items)
