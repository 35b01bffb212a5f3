# mypy: disable-error-code="list-item"
# (raw enum numbers on purpose: the wire count does not care what they mean)
"""Element counts of capped repeated fields, read from the raw request bytes."""

from __future__ import annotations

from ctxcc.v1 import event_pb2
from ctxcc.v1 import session_service_pb2 as spb
from server.domain.errors import CtxccError, Reason
from server.transport.wire import RepeatedCap, count_over, request_caps

CAPS = request_caps(1_000)
APPEND = CAPS["/ctxcc.v1.SessionService/AppendEvents"]
LIST = CAPS["/ctxcc.v1.SessionService/ListEvents"]


def _append(n: int) -> bytes:
    ev = event_pb2.Event()
    ev.user_message.parts.add(text="x" * 200)  # multi-byte lengths inside each element
    return spb.AppendEventsRequest(
        session_id="s", events=[ev] * n, request_id="r", expected_last_seq=7
    ).SerializeToString()


def test_events_are_counted_on_the_wire() -> None:
    assert count_over(_append(1_000), APPEND) is None
    assert count_over(_append(1_001), APPEND) == 1_001
    err = APPEND.error(1_001)
    assert isinstance(err, CtxccError) and err.reason is Reason.TOO_MANY_EVENTS


def test_packed_kinds_are_counted_element_by_element() -> None:
    ok = spb.ListEventsRequest(session_id="s", kinds=[1, 2, 3] * 21, after_seq=300)
    assert count_over(ok.SerializeToString(), LIST) is None
    many = spb.ListEventsRequest(session_id="s", kinds=[1] * 65)
    assert count_over(many.SerializeToString(), LIST) == 65
    big = spb.ListEventsRequest(session_id="s", kinds=[300] * 65)  # two-byte varints
    assert count_over(big.SerializeToString(), LIST) == 65


def test_malformed_bytes_are_left_to_the_decoder() -> None:
    cap = RepeatedCap(2, 1, APPEND.error)
    assert count_over(b"\x12\xff", cap) is None  # truncated length
    assert count_over(b"\x0f", cap) is None  # wire type 7
