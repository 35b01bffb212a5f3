"""The message records of the last view a unary Compile sent, per session, lent to the
next one: a session's consecutive views share the message objects its compile memo
carries over, so their records are found by identity (compared in C) instead of one
cache lookup per message (see `view_bytes.LentRecords`; streams keep theirs per stream).

Bounded by sessions and by the bytes of the views (counted whole, although they share
records with the memos and the kept stream views); in memory only."""

from __future__ import annotations

import threading
from collections import OrderedDict

from server.service.compile_types import CompileResult
from server.transport.view_bytes import LentRecords, ViewBytes


class LentBySession:
    def __init__(self, max_sessions: int = 64, max_bytes: int = 64 << 20) -> None:
        self._lent: OrderedDict[str, tuple[LentRecords, int]] = OrderedDict()
        self._max_sessions = max_sessions
        self._max_bytes = max_bytes
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, session_id: str) -> LentRecords:
        with self._lock:
            found = self._lent.get(session_id)
        return found[0] if found is not None else LentRecords()

    def keep(self, result: CompileResult, view: ViewBytes) -> None:
        """Lends the records of a view just sent; one with inline image bytes lends none
        (those records are this compile's only)."""
        if result.attachments or view.size > self._max_bytes // 4:
            return
        lent = LentRecords(result.view.messages, view.messages, result.view, view)
        with self._lock:
            old = self._lent.pop(view.session_id, None)
            if old is not None:
                self._bytes -= old[1]
            self._lent[view.session_id] = (lent, view.size)
            self._bytes += view.size
            while len(self._lent) > self._max_sessions or self._bytes > self._max_bytes:
                _, (_, size) = self._lent.popitem(last=False)
                self._bytes -= size
