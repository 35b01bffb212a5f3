"""Repeated compiles that depend on what another session holds: an imported portable
checkpoint is verified against the events of the session it was made in (its origin),
so writes to the origin can change the importing session's view although nothing of
the importing session was written. Through a real daemon, as in
test_repeat_compiles.py: each next view must be what a compile that repeats nothing
makes (a dry run), and the checkpoint must be used once its origin verifies. Views
that passed over such a checkpoint are not repeated (the session's write generation
does not count the origin's writes)."""

from __future__ import annotations

from ctxcc.v1 import checkpoint_pb2, session_pb2, view_pb2
from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_service_pb2 as spb
from tests.integration import test_repeat_compiles as repeats
from tests.integration.test_repeat_compiles import SID, Session, _without_id

ORIGIN = "origin"
# The same session and daemon as test_repeat_compiles.py's cases.
session = repeats.session


async def _import_checkpoint(s: Session) -> None:
    """A portable checkpoint over the session's three events, made in ORIGIN (as a
    session forked from ORIGIN carries the summary written there)."""
    await s.api.compiles.CreateCheckpoint(
        cpb.CreateCheckpointRequest(
            checkpoint=checkpoint_pb2.Checkpoint(
                session_id=SID,
                covers_through_seq=3,
                summary="Fixed it.",
                portable=True,
                origin_session_id=ORIGIN,
            ),
            covered_digest_mode=cpb.COVERED_DIGEST_MODE_COMPUTE,
        )
    )


async def _copy_events(s: Session, first: int, last: int) -> None:
    """Events first..last of the session appended to ORIGIN as they are (same ids and
    payloads: the covered digest is over both)."""
    listed = await s.api.sessions.ListEvents(spb.ListEventsRequest(session_id=SID))
    events = [e for e in listed.events if first <= e.seq <= last]
    for e in events:
        e.ClearField("seq")
        e.ClearField("create_time")
    await s.api.sessions.AppendEvents(spb.AppendEventsRequest(session_id=ORIGIN, events=events))


async def _create_origin(s: Session) -> None:
    await s.api.sessions.CreateSession(
        spb.CreateSessionRequest(session=session_pb2.Session(session_id=ORIGIN))
    )


def _uses_checkpoint(view: view_pb2.CompiledView) -> bool:
    return bool(view.checkpoint_id)


async def test_an_origin_created_later_ends_the_repeat(session: Session) -> None:
    """The checkpoint's origin does not exist yet: the view falls back to the history
    and would be repeated. Creating the origin with the covered events (writes of another
    session only) makes the checkpoint usable: the next view must use it."""
    await _import_checkpoint(session)
    await session.compile()
    before = await session.compile()  # its previous sections are its own: repeatable
    assert not _uses_checkpoint(before), "the origin is not there to verify it"
    await _create_origin(session)
    await _copy_events(session, 1, 3)
    after = await session.compile()  # equal to a dry run made just before it
    assert _uses_checkpoint(after)
    assert _without_id(after) != _without_id(before)


async def test_an_origin_that_grows_to_the_covered_events_ends_the_repeat(
    session: Session,
) -> None:
    """The origin holds only two of the three covered events: the checkpoint cannot be
    verified yet. Once the origin's log reaches the covered range, it can: the next
    view uses it (a range shorter than asked for is not final, the log grows)."""
    await _import_checkpoint(session)
    await _create_origin(session)
    await _copy_events(session, 1, 2)
    await session.compile()
    before = await session.compile()
    assert not _uses_checkpoint(before), "the origin is short of the covered range"
    await _copy_events(session, 3, 3)
    after = await session.compile()
    assert _uses_checkpoint(after)
