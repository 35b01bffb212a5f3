"""The last view each open CompileStream keeps (`StreamState.last`: its records, lent to
the next view's encoding, and the view itself, its next step's delta base when the
recent views do not hold it), bounded together: each stream kept its own whatever the
others held, so 20 streams of ~27 MB views held ~1.3 GB between their steps. Past the
budget the streams that stepped least recently let go of theirs; the stream that stepped
last always keeps its own (a view larger than the whole budget is still its next step's
delta base). A stream that let go answers its next step whole (or as a delta against a
recent view), encoding every record again: bytes and CPU once, never a wrong view.
On the event loop, as the steps' answers are."""

from __future__ import annotations

from collections import OrderedDict
from typing import Protocol

from server.transport.view_bytes import LentRecords

# Bytes of the views all streams keep together, each counted at its whole encoded size
# (consecutive views of a session share most records, so far less is really held).
STREAM_VIEWS_BYTES = 128 << 20


class Keeping(Protocol):
    last: LentRecords


class StreamViews:
    def __init__(self, max_bytes: int | None = None) -> None:
        self._max_bytes = STREAM_VIEWS_BYTES if max_bytes is None else max_bytes
        # By the stream's identity, least recently stepped first: (stream, bytes counted).
        self._kept: OrderedDict[int, tuple[Keeping, int]] = OrderedDict()
        self._bytes = 0

    @property
    def held(self) -> int:
        return self._bytes

    def kept(self, stream: Keeping) -> None:
        """`stream` has just set its `last`: counted, and older streams' let go past the
        budget."""
        self.closed(stream)
        parts = stream.last.parts
        size = parts.size if parts is not None else 0
        if not size:
            return
        self._kept[id(stream)] = (stream, size)
        self._bytes += size
        while self._bytes > self._max_bytes and len(self._kept) > 1:
            _, (oldest, counted) = self._kept.popitem(last=False)
            self._bytes -= counted
            oldest.last = LentRecords()

    def closed(self, stream: Keeping) -> None:
        """`stream` ended (or is counted again): its view no longer counts."""
        found = self._kept.pop(id(stream), None)
        if found is not None:
            self._bytes -= found[1]
