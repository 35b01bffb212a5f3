"""The last views sent on compile streams, so that a ResumeRequest after a reconnect gets the
very view it names (same compile_id, so usage reports still match) when nothing was
appended since. Bounded by count and bytes; kept in memory only: after a daemon restart
there are none and a resume compiles afresh, as the proto says."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from ctxcc.v1 import view_pb2


@dataclass(frozen=True, slots=True)
class KeptView:
    session_id: str
    view: view_pb2.CompiledView
    size: int


class RecentViews:
    def __init__(self, max_views: int = 256, max_bytes: int = 64 << 20) -> None:
        self._views: OrderedDict[str, KeptView] = OrderedDict()
        self._max_views = max_views
        self._max_bytes = max_bytes
        self._bytes = 0

    def keep(self, session_id: str, view: view_pb2.CompiledView) -> None:
        """Remembers a view that was just sent; the message must not change afterwards."""
        size = view.ByteSize()
        if size > self._max_bytes // 4:  # one huge view must not push out all the others
            return
        old = self._views.pop(view.compile_id, None)
        if old is not None:
            self._bytes -= old.size
        self._views[view.compile_id] = KeptView(session_id, view, size)
        self._bytes += size
        while len(self._views) > self._max_views or self._bytes > self._max_bytes:
            _, dropped = self._views.popitem(last=False)
            self._bytes -= dropped.size

    def get(self, compile_id: str) -> KeptView | None:
        kept = self._views.get(compile_id)
        if kept is not None:
            self._views.move_to_end(compile_id)
        return kept
