"""The last views of open CompileStreams, bounded together (server/transport/stream_views.py):
past the budget the streams that stepped least recently let go of theirs, the one that
stepped last keeps its own whatever its size, and an ended stream stops counting."""

from __future__ import annotations

from dataclasses import dataclass, field

from server.transport.stream_views import StreamViews
from server.transport.view_bytes import LentRecords, ViewBytes


def _lent(size: int) -> LentRecords:
    parts = ViewBytes("c", "s", 1, b"", (), b"", b"", (), (), b"", True, size)
    return LentRecords(parts=parts)


@dataclass
class _Stream:
    last: LentRecords = field(default_factory=LentRecords)


def _stepped(views: StreamViews, stream: _Stream, size: int) -> None:
    stream.last = _lent(size)
    views.kept(stream)


def test_streams_stepped_least_recently_let_go_past_the_budget() -> None:
    views = StreamViews(100)
    a, b, c = _Stream(), _Stream(), _Stream()
    _stepped(views, a, 40)
    _stepped(views, b, 40)
    assert views.held == 80 and a.last.parts is not None
    _stepped(views, a, 40)  # a steps again: b is now the least recent
    _stepped(views, c, 40)
    assert b.last.parts is None, "the least recently stepped stream let go"
    assert a.last.parts is not None and c.last.parts is not None
    assert views.held == 80
    # A view over the whole budget is kept by the stream that sent it, alone.
    _stepped(views, b, 500)
    assert b.last.parts is not None and a.last.parts is None and c.last.parts is None
    assert views.held == 500


def test_a_stream_counts_its_last_view_once_and_not_after_it_ends() -> None:
    views = StreamViews(100)
    a, b = _Stream(), _Stream()
    for size in (30, 35, 38):  # each step replaces the stream's last view
        _stepped(views, a, size)
    assert views.held == 38
    _stepped(views, b, 60)
    assert views.held == 98 and a.last.parts is not None
    views.closed(a)
    assert views.held == 60
    _stepped(views, b, 90)  # a no longer counts: nothing to let go
    assert views.held == 90
    views.closed(a)  # twice: nothing more
    assert views.held == 90
