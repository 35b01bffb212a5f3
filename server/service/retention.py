"""Session retention: a sidecar's data directory otherwise keeps every session its agents
never deleted, until the disk fills. With a retention set, sessions that nothing was
appended to or compiled of for that long are deleted, as DeleteSession deletes them
(their watches end, their memos go), a page of the session list at a time so that a
sweep never holds a storage thread for long."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from server.domain.errors import CtxccError
from server.domain.model import DeleteResult
from server.service.ports import Clock, Telemetry
from server.service.sessions import SessionUseCases

log = logging.getLogger(__name__)

# Sessions examined per page: one storage-thread call reads this many session records.
PAGE = 256
# Idleness is measured on the wall clock (the times stored with the sessions), which can
# step: between two pages, a wall clock that moved this much more, or less, than the
# monotonic clock stepped, and the step is not counted as time the sessions were idle.
# A forward step (an NTP correction after booting with a wrong clock, say) otherwise
# made every session look idle at once and the sweep deleted them all.
CLOCK_STEP_NS = 5_000_000_000


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
        monotonic_ns: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        if retention_ns <= 0 or page <= 0:
            raise ValueError("a retention sweep needs a retention and a page size")
        self._sessions = sessions
        self._clock = clock
        self._retention_ns = retention_ns
        self._telemetry = telemetry
        self._page = page
        self._monotonic_ns = monotonic_ns
        # The wall and monotonic clocks at the last page, and how far the wall clock
        # stepped forward since the sweep began (never below 0: a step back only makes
        # sessions look younger than they are, which keeps them longer).
        self._last: tuple[int, int] | None = None
        self._stepped_ns = 0
        self._after = ""

    async def sweep_page(self) -> Swept:
        """Examines the next page of sessions and deletes those idle past the retention."""
        cutoff = self._now_ns() - self._retention_ns - self._stepped_ns
        page, _ = await self._sessions.list_sessions(self._after, self._page, "")
        deleted = 0
        for session in page:
            # A first look at the record just read; the store looks again under the
            # session's lock, with its latest compile, before it deletes anything.
            if session.update_time_ns >= cutoff:
                continue
            deleting = asyncio.ensure_future(self._sessions.delete_idle(session.session_id, cutoff))
            try:
                result = await asyncio.shield(deleting)
            except asyncio.CancelledError:
                # The daemon stops: the delete's storage thread finishes it whatever
                # happens, so it is logged and counted all the same before the sweep ends.
                with contextlib.suppress(CtxccError):  # failed: nothing was deleted
                    self._expired(session.session_id, await deleting)
                raise
            if self._expired(session.session_id, result):
                deleted += 1
        wrapped = len(page) < self._page
        self._after = "" if wrapped else page[-1].session_id
        return Swept(len(page), deleted, wrapped)

    def _now_ns(self) -> int:
        """The wall clock, with a step since the last page noticed and logged."""
        now, mono = self._clock.now_ns(), self._monotonic_ns()
        if self._last is not None:
            step = (now - self._last[0]) - (mono - self._last[1])
            if abs(step) > CLOCK_STEP_NS:
                self._stepped_ns = max(0, self._stepped_ns + step)
                log.warning(
                    "the wall clock stepped %+.0f s: session retention does not count the "
                    "step as idle time (sessions are deleted %.0f s later than the wall "
                    "clock says until the daemon restarts)",
                    step / 1e9,
                    self._stepped_ns / 1e9,
                )
        self._last = (now, mono)
        return now

    def _expired(self, session_id: str, result: DeleteResult | None) -> bool:
        """Logs and counts a session the sweep deleted (None: it was kept)."""
        if result is None:
            return False
        self._telemetry.session_expired()
        log.info(
            "session %s deleted: idle for over %.0f s (%d events, %d blobs)",
            session_id,
            self._retention_ns / 1e9,
            result.deleted_events,
            result.deleted_blobs,
        )
        return True
