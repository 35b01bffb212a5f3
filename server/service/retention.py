"""Session retention: a sidecar's data directory otherwise keeps every session its agents
never deleted, until the disk fills. With a retention set, sessions that nothing was
appended to or compiled of for that long are deleted, as DeleteSession deletes them
(their watches end, their memos go), a page of the session list at a time so that a
sweep never holds a storage thread for long."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from server.service.ports import Clock, Telemetry
from server.service.sessions import SessionUseCases

log = logging.getLogger(__name__)

# Sessions examined per page: one storage-thread call reads this many session records.
PAGE = 256


@dataclass(frozen=True, slots=True)
class Swept:
    """One page of a sweep: sessions examined, deleted, and whether the pass is done
    (the next page starts from the first session again)."""

    examined: int
    deleted: int
    wrapped: bool


class RetentionSweep:
    def __init__(
        self,
        sessions: SessionUseCases,
        clock: Clock,
        retention_ns: int,
        telemetry: Telemetry,
        page: int = PAGE,
    ) -> None:
        if retention_ns <= 0 or page <= 0:
            raise ValueError("a retention sweep needs a retention and a page size")
        self._sessions = sessions
        self._clock = clock
        self._retention_ns = retention_ns
        self._telemetry = telemetry
        self._page = page
        self._after = ""

    async def sweep_page(self) -> Swept:
        """Examines the next page of sessions and deletes those idle past the retention."""
        cutoff = self._clock.now_ns() - self._retention_ns
        page, _ = await self._sessions.list_sessions(self._after, self._page, "")
        deleted = 0
        for session in page:
            # A first look at the record just read; the store looks again under the
            # session's lock, with its latest compile, before it deletes anything.
            if session.update_time_ns >= cutoff:
                continue
            result = await self._sessions.delete_idle(session.session_id, cutoff)
            if result is None:
                continue
            deleted += 1
            self._telemetry.session_expired()
            log.info(
                "session %s deleted: idle for over %.0f s (%d events, %d blobs)",
                session.session_id,
                self._retention_ns / 1e9,
                result.deleted_events,
                result.deleted_blobs,
            )
        wrapped = len(page) < self._page
        self._after = "" if wrapped else page[-1].session_id
        return Swept(len(page), deleted, wrapped)
