"""The message records of the last view a unary Compile sent, per session, lent to the
next one: a session's consecutive views share the message objects its compile memo
carries over, so their records are found by identity (compared in C) instead of one
cache lookup per message (see `view_bytes.LentRecords`; streams keep theirs per stream).

The answer itself is kept too: a repeat of the view (the same view under a new compile
id, service/repeats.py) is that answer with the compile id's bytes replaced, one copy of
the rest, instead of the view's parts joined again.

Bounded by sessions and by the bytes of the views and answers (counted whole, although
the views share records with the memos and the kept stream views); in memory only."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from server.adapters.protowire import tagged, varint
from server.compiler.view import CompiledView
from server.service.compile_types import CompileResult
from server.transport.view_bytes import LentRecords, ViewBytes, same_but_id

# CompileResponse.view (field 1, length-delimited): the key an answer starts with.
_VIEW_KEY = varint((1 << 3) | 2)


@dataclass(frozen=True, slots=True)
class _Kept:
    lent: LentRecords
    # The answer sent (CompileResponse's bytes: the view as field 1, whose own first field
    # is its compile id), and where the view's fields after that id start in it.
    answer: bytes
    rest: int
    size: int


class LentBySession:
    def __init__(self, max_sessions: int = 64, max_bytes: int = 64 << 20) -> None:
        self._lent: OrderedDict[str, _Kept] = OrderedDict()
        self._max_sessions = max_sessions
        self._max_bytes = max_bytes
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, session_id: str) -> LentRecords:
        with self._lock:
            found = self._lent.get(session_id)
        return found.lent if found is not None else LentRecords()

    def repeated(self, view: CompiledView) -> bytes | None:
        """The answer for `view` when it repeats the session's last view sent: that
        answer under `view`'s compile id."""
        with self._lock:
            kept = self._lent.get(view.session_id)
        if kept is None or not kept.answer or kept.lent.view is None:
            return None
        if not same_but_id(view, kept.lent.view):
            return None
        new_id = tagged(1, view.compile_id.encode())
        body = len(kept.answer) - kept.rest + len(new_id)
        return b"".join((_VIEW_KEY, varint(body), new_id, memoryview(kept.answer)[kept.rest :]))

    def keep(self, result: CompileResult, view: ViewBytes, answer: bytes = b"") -> None:
        """Lends the records of a view just sent (with `answer`, the CompileResponse it
        went as, kept for repeats); one with inline image bytes lends none (those records
        are this compile's only)."""
        if result.attachments or view.size > self._max_bytes // 4:
            return
        lent = LentRecords(result.view.messages, view.messages, result.view, view)
        rest = len(_VIEW_KEY) + len(varint(view.size))
        first = tagged(1, view.compile_id.encode())
        if not answer.startswith(first, rest) or len(answer) != rest + view.size:
            answer = b""  # not an answer of this view: nothing to splice into
        size = view.size + len(answer)
        kept = _Kept(lent, answer, rest + len(first), size)
        with self._lock:
            old = self._lent.pop(view.session_id, None)
            if old is not None:
                self._bytes -= old.size
            self._lent[view.session_id] = kept
            self._bytes += size
            while len(self._lent) > self._max_sessions or self._bytes > self._max_bytes:
                _, dropped = self._lent.popitem(last=False)
                self._bytes -= dropped.size
