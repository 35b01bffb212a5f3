"""The last views sent on compile streams, kept as the parts of their encoding
(`ViewBytes`), for two uses:

- a ResumeRequest after a reconnect, or after a ViewDelta failed its digest check, gets the
  very view it names (same compile_id, so usage reports still match) when nothing was
  appended since;
- a StepRequest naming one of them in delta_base_compile_id (on the stream that sent it)
  can be answered with a ViewDelta against it.

Bounded by count and by bytes (each view counted at its whole encoded size, although
consecutive views of a session share most of their message records, so the memory
really held is usually far less), and to a session's last PER_SESSION views: a step names
the last view its stream applied, a resume the session's last, so older ones only took
the room of other sessions' bases (five agents stepping over ~1 MB views pushed each
other's bases out, and their steps got whole views). Kept in memory only: after a daemon
restart there are none, a resume compiles afresh and a delta base is unknown, as the
proto says."""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass

from server.transport.view_bytes import ViewBytes


@dataclass(frozen=True, slots=True)
class KeptView:
    session_id: str
    view: ViewBytes


# A session's views kept: as many as a stream names bases (compile_stream._DELTA_BASES).
PER_SESSION = 4


class RecentViews:
    def __init__(self, max_views: int = 256, max_bytes: int = 64 << 20) -> None:
        self._views: OrderedDict[str, KeptView] = OrderedDict()
        # Each session's kept compile ids, oldest first.
        self._by_session: dict[str, deque[str]] = {}
        self._max_views = max_views
        self._max_bytes = max_bytes
        self._bytes = 0

    def keep(self, session_id: str, view: ViewBytes) -> None:
        """Remembers a view that was just sent."""
        if view.size > self._max_bytes // 4:  # one huge view must not push out all the others
            return
        self._drop(view.compile_id)
        self._views[view.compile_id] = KeptView(session_id, view)
        self._bytes += view.size
        ids = self._by_session.setdefault(session_id, deque())
        ids.append(view.compile_id)
        while len(ids) > PER_SESSION:
            self._drop(ids[0])
        while len(self._views) > self._max_views or self._bytes > self._max_bytes:
            self._drop(next(iter(self._views)))

    def _drop(self, compile_id: str) -> None:
        kept = self._views.pop(compile_id, None)
        if kept is None:
            return
        self._bytes -= kept.view.size
        ids = self._by_session[kept.session_id]
        ids.remove(compile_id)
        if not ids:
            del self._by_session[kept.session_id]

    def get(self, compile_id: str) -> KeptView | None:
        kept = self._views.get(compile_id)
        if kept is not None:
            self._views.move_to_end(compile_id)
        return kept
