"""Canonical digests, page tokens and the watch hub's bounded queues."""

from __future__ import annotations

import pytest

from server.domain.canonical import canonical_bytes, events_digest
from server.domain.errors import CtxccError, Reason
from server.domain.model import ContentPart, Event, UserMessage
from server.service.watch import Resync, WatchHub
from server.transport.paging import decode_token, encode_token


def _ev(seq: int, text: str) -> Event:
    return Event(seq, f"e{seq}", 123, UserMessage((ContentPart(text=text),)))


def test_digest_depends_on_content_not_time() -> None:
    a = events_digest([_ev(1, "a"), _ev(2, "b")])
    assert a == events_digest([_ev(1, "a"), Event(2, "e2", 999, _ev(2, "b").payload)])
    assert a != events_digest([_ev(1, "a"), _ev(2, "c")])
    # Length prefixes keep ("ab","c") and ("a","bc") apart.
    assert canonical_bytes(("ab", "c")) != canonical_bytes(("a", "bc"))


def test_page_tokens_are_bound_to_their_query() -> None:
    token = encode_token(42, {"s": "x"})
    assert decode_token(token, {"s": "x"}) == 42
    assert decode_token("", {"s": "x"}) is None
    for bad, query in ((token, {"s": "y"}), ("!!!", {"s": "x"}), ("e30=", {"s": "x"})):
        with pytest.raises(CtxccError) as exc:
            decode_token(bad, query)
        assert exc.value.reason is Reason.INVALID_PAGE_TOKEN


async def test_a_full_watcher_gets_a_resync_instead_of_blocking() -> None:
    hub = WatchHub(queue_size=3)
    async with hub.subscribe("s") as w:
        hub.publish("s", [_ev(i, "x") for i in range(1, 6)], head_seq=5)
        items = [w.queue.get_nowait() for _ in range(w.queue.qsize())]
        # The backlog was replaced by one marker saying where to re-read from.
        assert items == [Resync(5)]
        hub.publish("s", [_ev(6, "y")], head_seq=6)
        assert w.queue.get_nowait() == _ev(6, "y")
    assert hub.count() == 0


async def test_a_watcher_behind_its_unread_marker_queues_nothing_more() -> None:
    """While the marker is unread, later updates only move its head: a stalled watcher
    costs each publish one step, not a refill of its queue to drop again."""
    hub = WatchHub(queue_size=3)
    async with hub.subscribe("s") as w:
        hub.publish("s", [_ev(i, "x") for i in range(1, 6)], head_seq=5)
        for seq in range(6, 12):
            hub.publish("s", [_ev(seq, "y")], head_seq=seq)
            assert w.queue.qsize() == 1
        hub.publish("s", [_ev(3, "late")], head_seq=3)  # an earlier append, published late
        assert w.queue.get_nowait() == Resync(11)
        hub.publish("s", [_ev(12, "z")], head_seq=12)
        assert w.queue.get_nowait() == _ev(12, "z")


async def test_watchers_are_capped_per_session_and_in_all() -> None:
    hub = WatchHub(queue_size=3, per_session=2, most=3)

    def refused(sid: str) -> str:
        with pytest.raises(CtxccError) as exc:
            hub._refuse_past_caps(sid)
        assert exc.value.reason is Reason.QUOTA_EXCEEDED
        return str(exc.value.metadata["quota"])

    async with hub.subscribe("a"), hub.subscribe("a"):
        assert refused("a") == "watchers_per_session"
        async with hub.subscribe("b"):
            assert hub.count() == 3
            assert refused("c") == "watchers"
            # A deleted session's watchers count until their streams end.
            hub.deleted("a")
            assert refused("c") == "watchers"
        async with hub.subscribe("c"):
            assert hub.count() == 3
    assert hub.count() == 0


async def test_the_inspectors_watchers_have_a_per_session_cap_of_their_own() -> None:
    """The inspector's live pages shared the API's per-session cap: open tabs made the
    agent's WatchSession RESOURCE_EXHAUSTED. Each pool is capped on its own; both count
    toward the daemon's cap in all, and every watcher of the session gets its updates."""
    from server.service.watch import API, INSPECTOR

    hub = WatchHub(queue_size=3, per_session=2, most=6, inspector_per_session=1)

    def refused(pool: str) -> str:
        with pytest.raises(CtxccError) as exc:
            hub._refuse_past_caps("a", pool)
        assert exc.value.metadata["limit"] == str(1 if pool == INSPECTOR else 2)
        return str(exc.value.metadata["quota"])

    async with hub.subscribe("a", pool=INSPECTOR) as page:
        assert refused(INSPECTOR) == "watchers_per_session"
        async with hub.subscribe("a") as one, hub.subscribe("a", pool=API) as two:
            assert refused(API) == "watchers_per_session"
            assert hub.count() == 3
            hub.publish("a", [_ev(1, "x")], 1)
            assert [w.queue.qsize() for w in (page, one, two)] == [1, 1, 1]
        async with hub.subscribe("a"):  # the API's places are free again
            assert refused(INSPECTOR) == "watchers_per_session"
    async with hub.subscribe("a", pool=INSPECTOR):  # and the inspector's
        assert hub.count() == 1
    assert hub.count() == 0


def test_error_details_quoting_client_input_are_cut_to_fit_trailers() -> None:
    from server.transport.errors import status_for

    err = CtxccError(Reason.SESSION_NOT_FOUND, "session " + "x" * 300_000, session_id="y" * 300_000)
    st = status_for(err)
    details = dict(st.trailing_metadata)["grpc-status-details-bin"]
    assert len(details) < 2_000 and len(st.details) <= 1_000


def test_a_store_failure_is_logged_with_its_detail_as_a_step_error_as_a_status(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The client sees "stored data is damaged"; RocksDB's words (which table file) only
    # ever reach the daemon's log, where an operator paged for them looks.
    from server.transport.compile_stream import step_error
    from server.transport.errors import status_for
    from storage.rocks import ReadFailedError

    err = ReadFailedError(Exception("Corruption: block checksum mismatch in 000012.sst"))
    with caplog.at_level("ERROR", logger="ctxcc.transport"):
        step_error(err)
        status_for(err)
    said = [r.getMessage() for r in caplog.records if r.name == "ctxcc.transport"]
    assert (
        said
        == ["RECORD_CORRUPT: RocksDB read: Corruption: block checksum mismatch in 000012.sst"] * 2
    )
