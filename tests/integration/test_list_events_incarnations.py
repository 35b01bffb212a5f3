"""ListEvents and ListCheckpoints pages of a session deleted and made again under its id
between two pages: the next page's token is of the old session, and the new log's seqs
start over. The token held only a position (the last seq, an index), so the listing went
on with the new session's events or checkpoints after it, as if they followed the old
ones; it now ends SESSION_NOT_FOUND, as a watch of the old session does
(tests/integration/test_watch_incarnations.py)."""

from __future__ import annotations

import grpc
import pytest

from ctxcc.v1 import checkpoint_pb2, session_pb2
from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_service_pb2 as spb
from tests.conftest import Stubs
from tests.helpers import error_info, user


async def _made_with(api: Stubs, sid: str, texts: list[str]) -> None:
    create = spb.CreateSessionRequest(session=session_pb2.Session(session_id=sid))
    await api.sessions.CreateSession(create)
    events = [user(text) for text in texts]
    await api.sessions.AppendEvents(spb.AppendEventsRequest(session_id=sid, events=events))


async def test_a_listing_never_goes_on_into_a_session_made_again(unix_api: Stubs) -> None:
    api, sid = unix_api, "remade"
    await _made_with(api, sid, [f"old {i}" for i in range(1, 6)])
    first = await api.sessions.ListEvents(spb.ListEventsRequest(session_id=sid, page_size=2))
    assert [e.user_message.parts[0].text for e in first.events] == ["old 1", "old 2"]
    assert first.next_page_token

    await api.sessions.DeleteSession(spb.DeleteSessionRequest(session_id=sid))
    await _made_with(api, sid, [f"new {i}" for i in range(1, 6)])
    with pytest.raises(grpc.aio.AioRpcError) as gone:
        await api.sessions.ListEvents(
            spb.ListEventsRequest(session_id=sid, page_size=2, page_token=first.next_page_token)
        )
    assert gone.value.code() == grpc.StatusCode.NOT_FOUND
    assert error_info(gone.value).reason == "SESSION_NOT_FOUND"

    # The new log lists from its start, page after page.
    texts, token = [], ""
    while True:
        page = await api.sessions.ListEvents(
            spb.ListEventsRequest(session_id=sid, page_size=2, page_token=token)
        )
        texts += [e.user_message.parts[0].text for e in page.events]
        token = page.next_page_token
        if not token:
            break
    assert texts == [f"new {i}" for i in range(1, 6)]


async def _checkpoints(api: Stubs, sid: str, summaries: list[str]) -> None:
    for seq, summary in enumerate(summaries, start=1):
        checkpoint = checkpoint_pb2.Checkpoint(
            session_id=sid, covers_through_seq=seq, summary=summary
        )
        await api.compiles.CreateCheckpoint(cpb.CreateCheckpointRequest(checkpoint=checkpoint))


async def test_a_checkpoint_listing_never_goes_on_into_a_session_made_again(
    unix_api: Stubs,
) -> None:
    api, sid = unix_api, "remade"
    await _made_with(api, sid, [f"old {i}" for i in range(1, 6)])
    await _checkpoints(api, sid, [f"old summary {i}" for i in range(1, 5)])
    first = await api.compiles.ListCheckpoints(
        cpb.ListCheckpointsRequest(session_id=sid, page_size=2)
    )
    assert len(first.checkpoints) == 2 and first.next_page_token

    await api.sessions.DeleteSession(spb.DeleteSessionRequest(session_id=sid))
    await _made_with(api, sid, [f"new {i}" for i in range(1, 6)])
    await _checkpoints(api, sid, [f"new summary {i}" for i in range(1, 5)])
    with pytest.raises(grpc.aio.AioRpcError) as gone:
        await api.compiles.ListCheckpoints(
            cpb.ListCheckpointsRequest(
                session_id=sid, page_size=2, page_token=first.next_page_token
            )
        )
    assert gone.value.code() == grpc.StatusCode.NOT_FOUND
    assert error_info(gone.value).reason == "SESSION_NOT_FOUND"

    summaries, token = [], ""
    while True:
        page = await api.compiles.ListCheckpoints(
            cpb.ListCheckpointsRequest(session_id=sid, page_size=2, page_token=token)
        )
        summaries += [c.summary for c in page.checkpoints]
        token = page.next_page_token
        if not token:
            break
    assert sorted(summaries) == [f"new summary {i}" for i in range(1, 5)]
