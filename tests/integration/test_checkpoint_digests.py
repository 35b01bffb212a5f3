"""A compile verifies each checkpoint it considers against the log: the digest of the
events it covers, from the first. Digests are kept once made, but after a restart the
first compile on a route other than the checkpoints' passed over each of them, reading
and hashing the log from its start once a checkpoint (50 checkpoints over 10,000 events:
4.5 s, against 0.15 s on their route). One pass over the newest range now makes the
digests of the older checkpoints' ranges too (the hash of 1..n is the hash of 1..m
carried on), and those digests must be the ones the checkpoints were made with."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ctxcc.v1 import checkpoint_pb2, common_pb2, session_pb2, view_pb2
from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_service_pb2 as spb
from server.app import Daemon
from server.domain.canonical import events_digest, events_digests
from server.domain.model import ContentPart, Event, UserMessage
from storage.store import KVEventStore
from tests.conftest import make_config, stubs_for
from tests.helpers import ROUTE, assistant, user

OTHER = common_pb2.Route(connection="o", protocol="openai-chat", endpoint="x", model="gpt-4o")


async def test_checkpoints_passed_over_after_a_restart_are_verified_in_one_pass(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Ten checkpoints made on ROUTE, then ten on OTHER, 20 events apart.
    d = Daemon(make_config(short_tmp, ui_listen="none"))
    await d.start()
    api = stubs_for(f"unix:{d.endpoints.unix}")
    made = []
    try:
        session = session_pb2.Session(session_id="k")
        await api.sessions.CreateSession(spb.CreateSessionRequest(session=session))
        for j in range(20):
            events = [e for i in range(10) for e in (user(f"q{j}.{i}"), assistant(f"a{j}.{i}"))]
            appended = await api.sessions.AppendEvents(
                spb.AppendEventsRequest(session_id="k", events=events)
            )
            ck = await api.compiles.CreateCheckpoint(
                cpb.CreateCheckpointRequest(
                    checkpoint=checkpoint_pb2.Checkpoint(
                        session_id="k",
                        covers_through_seq=appended.last_seq,
                        summary=f"summary {j}",
                        source_route=ROUTE if j < 10 else OTHER,
                    ),
                    covered_digest_mode=cpb.COVERED_DIGEST_MODE_COMPUTE,
                )
            )
            made.append(ck.checkpoint.checkpoint_id)
        await api.sessions.AppendEvents(
            spb.AppendEventsRequest(session_id="k", events=[user("now")])
        )
    finally:
        await api.channel.close()
        await d.stop()

    from_start: list[int | None] = []
    read = KVEventStore.read_events

    def noted(store: KVEventStore, sid: str, after: int = 0, *args: Any, **kwargs: Any) -> Any:
        if after == 0:
            from_start.append(kwargs.get("through_seq", args[2] if len(args) > 2 else None))
        return read(store, sid, after, *args, **kwargs)

    monkeypatch.setattr(KVEventStore, "read_events", noted)
    d = Daemon(make_config(short_tmp, ui_listen="none"))  # nothing of the digests kept
    await d.start()
    api = stubs_for(f"unix:{d.endpoints.unix}")
    try:
        req = cpb.CompileRequest(session_id="k", route=ROUTE, dry_run=True)
        view = (await api.compiles.Compile(req)).view
        # The ten of OTHER passed over, the newest of ROUTE's taken: its digest, made in
        # the pass over the newest range, is the one it was made with.
        assert view.checkpoint_id == made[9]
        assert list(view.fallback_reasons) == [view_pb2.FALLBACK_REASON_ROUTE_MISMATCH]
        assert from_start == [400], from_start
        # Every digest is kept: on another route, all twenty are passed over unread.
        other = (
            await api.compiles.Compile(
                cpb.CompileRequest(session_id="k", route=OTHER, dry_run=True)
            )
        ).view
        assert other.checkpoint_id == made[19] and from_start == [400]
    finally:
        await api.channel.close()
        await d.stop()


@given(
    texts=st.lists(st.text(max_size=8), max_size=12),
    ends=st.lists(st.integers(0, 12), max_size=5),
)
def test_digests_made_in_one_pass_are_each_ranges_own(texts: list[str], ends: list[int]) -> None:
    events = [
        Event(i + 1, f"e{i + 1}", 0, UserMessage((ContentPart(text=t),)))
        for i, t in enumerate(texts)
    ]
    marks = sorted({min(e, len(events)) for e in ends})
    assert events_digests(events, marks) == [events_digest(events[:m]) for m in marks]
