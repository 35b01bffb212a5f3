"""Write generations: counters that every write of the store bumps once it has landed.

The daemon is the only writer of its data directory, so "nothing was written since" is
known in memory: a reader that took a generation before reading and finds it unchanged
later knows that what it read still holds. Three kinds, so that one session's writes do
not invalidate what another read: per session (its events, tools, activations,
artifacts, checkpoints, compile records, route states), per route (the route's learned
model, read by every session on that route), and daemon-wide (sources of any scope and
session deletions, which other sessions' compiles can read: global and project
entries, a deleted origin of a checkpoint). In memory only: a restart starts from
nothing remembered, so no generation of a previous process is ever compared.

Per session and table (column family) too: a session's counter moves at every step (its
append, its compile record, its usage report), while what a step reads of its
checkpoints or tools changes only when those are written; a reader of one table compares
that table's count (with the daemon-wide one, which a session's deletion bumps).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from server.domain.generation import Generation


class Generations:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._everything = 0
        self._sessions: dict[str, int] = {}
        self._routes: dict[str, int] = {}
        self._tables: dict[str, dict[str, int]] = {}

    def of(self, session_id: str, route_id: str) -> Generation:
        with self._lock:
            return Generation(
                self._everything,
                self._sessions.get(session_id, 0),
                self._routes.get(route_id, 0),
            )

    def of_table(self, session_id: str, table: str) -> tuple[int, int]:
        """The daemon-wide count and that of the writes to this session's `table`."""
        with self._lock:
            return self._everything, self._tables.get(session_id, {}).get(table, 0)

    def wrote(
        self,
        session_id: str = "",
        route_id: str = "",
        everything: bool = False,
        tables: Iterable[str] = (),
    ) -> None:
        """A write landed: bumps what it may have changed (`tables`: the column families
        it wrote to, of the session's records)."""
        with self._lock:
            if session_id:
                self._sessions[session_id] = self._sessions.get(session_id, 0) + 1
                mine = self._tables.setdefault(session_id, {})
                for table in tables:
                    mine[table] = mine.get(table, 0) + 1
            if route_id:
                self._routes[route_id] = self._routes.get(route_id, 0) + 1
            if everything:
                self._everything += 1

    def forget(self, session_id: str) -> None:
        """A deleted session's counter goes (its deletion bumps `everything`, so no
        generation taken before it can match one taken after)."""
        with self._lock:
            self._everything += 1
            self._sessions.pop(session_id, None)
            self._tables.pop(session_id, None)
