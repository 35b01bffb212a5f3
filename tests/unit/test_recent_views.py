"""The views kept for delta bases and resumes (server/transport/recent_views.py): bounded
by bytes and count, and to each session's last few, so that one session stepping over
large views never pushes another session's base out while its own old views stay."""

from __future__ import annotations

from server.transport.recent_views import PER_SESSION, RecentViews
from server.transport.view_bytes import ViewBytes


def _view(compile_id: str, session_id: str, size: int) -> ViewBytes:
    return ViewBytes(
        compile_id=compile_id,
        session_id=session_id,
        event_boundary=1,
        front=b"",
        sections=(),
        prompt=b"",
        middle=b"",
        messages=(),
        tools=(),
        back=b"",
        prompt_is_joined=True,
        size=size,
    )


def test_a_session_keeps_its_last_views_only_and_others_keep_their_bases() -> None:
    recent = RecentViews(max_views=256, max_bytes=10 * 1000)
    recent.keep("quiet", _view("q1", "quiet", 1000))
    for i in range(50):  # a busy session steps over views a tenth of the budget each
        recent.keep("busy", _view(f"b{i}", "busy", 1000))
    kept = [f"b{i}" for i in range(50) if recent.get(f"b{i}") is not None]
    assert kept == [f"b{i}" for i in range(50 - PER_SESSION, 50)]
    found = recent.get("q1")
    assert found is not None and found.session_id == "quiet"


def test_bytes_and_count_still_bound_many_sessions() -> None:
    recent = RecentViews(max_views=6, max_bytes=5000)
    for i in range(10):
        recent.keep(f"s{i}", _view(f"c{i}", f"s{i}", 1000))
    # By bytes: five views of 1,000 bytes; the oldest went first.
    assert [i for i in range(10) if recent.get(f"c{i}") is not None] == [5, 6, 7, 8, 9]
    small = RecentViews(max_views=3, max_bytes=1 << 20)
    for i in range(5):
        small.keep(f"s{i}", _view(f"c{i}", f"s{i}", 10))
    assert [i for i in range(5) if small.get(f"c{i}") is not None] == [2, 3, 4]


def test_a_view_kept_again_under_its_id_counts_once() -> None:
    recent = RecentViews(max_views=256, max_bytes=4000)
    for _ in range(10):  # a resend of one view: one place, one size
        recent.keep("s", _view("c", "s", 1000))
    for cid, sid in (("d", "s"), ("e", "t"), ("f", "t")):
        recent.keep(sid, _view(cid, sid, 1000))
    assert all(recent.get(c) is not None for c in ("c", "d", "e", "f"))
    recent.keep("t", _view("g", "t", 1000))  # over 4,000 bytes: the oldest, c, goes
    assert recent.get("c") is None and recent.get("g") is not None
