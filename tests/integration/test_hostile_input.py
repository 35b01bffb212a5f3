"""Hostile input found by probing a real daemon: each case once answered INTERNAL (or
worse) where the README promises a documented reason."""

from __future__ import annotations

import base64

import grpc
import pytest

from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_pb2
from ctxcc.v1 import session_service_pb2 as spb
from tests.conftest import Stubs
from tests.helpers import error_info, user


def _token(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode()


# A page token is base64 of JSON the client hands back; nothing stops a client from
# handing back JSON nested past Python's recursion limit.
HOSTILE_TOKENS = [
    _token(b"[" * 200_000),
    _token(b'{"l":' * 100_000),
    _token(b'{"l": 1, "q": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"),
]


async def test_deeply_nested_page_tokens_answer_invalid_page_token(api: Stubs) -> None:
    await api.sessions.CreateSession(
        spb.CreateSessionRequest(session=session_pb2.Session(session_id="pages"))
    )
    await api.sessions.AppendEvents(
        spb.AppendEventsRequest(session_id="pages", events=[user("a"), user("b")])
    )
    listings = [
        lambda t: api.sessions.ListEvents(
            spb.ListEventsRequest(session_id="pages", page_size=1, page_token=t)
        ),
        lambda t: api.sessions.ListSessions(spb.ListSessionsRequest(page_size=1, page_token=t)),
        lambda t: api.compiles.ListCheckpoints(
            cpb.ListCheckpointsRequest(session_id="pages", page_size=1, page_token=t)
        ),
    ]
    for listing in listings:
        for token in HOSTILE_TOKENS:
            with pytest.raises(grpc.aio.AioRpcError) as exc:
                await listing(token)
            assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT, exc.value.details()
            assert error_info(exc.value).reason == "INVALID_PAGE_TOKEN"
    # A real token still pages on.
    first = await api.sessions.ListEvents(spb.ListEventsRequest(session_id="pages", page_size=1))
    rest = await api.sessions.ListEvents(
        spb.ListEventsRequest(session_id="pages", page_size=1, page_token=first.next_page_token)
    )
    assert [e.seq for e in [*first.events, *rest.events]] == [1, 2]
