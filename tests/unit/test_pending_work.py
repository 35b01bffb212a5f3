"""What each session's next compile has not seen (server/service/lanes.py PendingWork):
the count that sends a compile to the light lane or the compute pool."""

from __future__ import annotations

from server.service.lanes import PendingWork


def test_compiles_at_once_see_what_landed_before_them_once() -> None:
    """Two streams and a unary Compile of one session at once, a unary append landing
    while they run: the append stays unseen (taking what each saw off the count lost it,
    all three having seen the same 200 KB)."""
    pending = PendingWork()
    pending.landed("s", 200_000)
    running = [pending.start("s") for _ in range(3)]
    assert [r.unseen for r in running] == [200_000] * 3
    pending.landed("s", 500_000)
    for r in running:
        pending.finish(r, compiled=True)
    assert pending.unseen("s") == 500_000
    pending.finish(pending.start("s"), compiled=True)
    assert pending.unseen("s") == 0 and pending.kept() == 0


def test_a_failed_compile_sees_nothing_and_a_steps_own_append_counts_next() -> None:
    pending = PendingWork()
    pending.landed("s", 1_000)
    pending.finish(pending.start("s"), compiled=False)
    assert pending.unseen("s") == 1_000
    step = pending.start("s")
    pending.landed("s", 300)  # the step's own append lands while its compile runs
    pending.finish(step, compiled=True)
    assert pending.unseen("s") == 300


def test_a_session_deleted_while_its_compile_runs_keeps_no_count() -> None:
    """The compile of a deleted session ends on a count no longer kept: a session made
    again under the id meanwhile keeps its own, and nothing outlives both."""
    pending = PendingWork()
    pending.landed("s", 1_000)
    old = pending.start("s")
    pending.forget("s")
    pending.landed("s", 50)  # made again, appended to
    again = pending.start("s")
    pending.finish(old, compiled=True)
    assert pending.unseen("s") == 50
    pending.finish(again, compiled=True)
    assert pending.kept() == 0


def test_a_session_made_here_is_whole_until_a_compile_sees_it() -> None:
    """Until its first compile, what landed in a session this daemon made is its whole
    log (so that compile may be light work); a session it did not make, one whose
    compile saw it, or one with a checkpoint made is not."""
    pending = PendingWork()
    pending.made("new")
    pending.landed("new", 5_000)
    pending.landed("old", 5_000)  # made before a restart: its log is more than this
    assert pending.whole("new") and not pending.whole("old")
    assert pending.unseen("new") == 5_000
    pending.finish(pending.start("new"), compiled=False)  # a failed compile saw nothing
    assert pending.whole("new")
    step = pending.start("new")
    pending.landed("new", 100)
    pending.finish(step, compiled=True)
    assert not pending.whole("new") and pending.unseen("new") == 100
    pending.made("summed")
    pending.reprojected("summed")
    assert not pending.whole("summed")
    pending.made("gone")
    pending.forget("gone")
    assert not pending.whole("gone")


def test_an_append_landing_before_the_session_is_known_made_stays_counted() -> None:
    """CreateSession notes the session as made once its write returns to the event loop;
    another client's append to it may land first. Its bytes stay unseen (forgetting
    them sent a compile of a log of megabytes to the light lane, which loaded all of it
    before finding it heavy)."""
    pending = PendingWork()
    pending.landed("s", 3_000_000)
    pending.made("s")
    assert pending.whole("s") and pending.unseen("s") == 3_000_000
