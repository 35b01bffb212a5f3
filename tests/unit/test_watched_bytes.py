"""The encoded watch responses kept for all of a session's watchers."""

from __future__ import annotations

from ctxcc.v1 import session_service_pb2 as pb
from server.domain.model import ContentPart, Event, UserMessage
from server.transport.session_servicer import WatchedBytes


def _event(seq: int, text: str) -> Event:
    return Event(seq, f"e{seq}", 1, UserMessage((ContentPart(text=text),)))


def test_an_event_is_encoded_once_and_the_kept_bytes_stay_bounded() -> None:
    kept = WatchedBytes(most_bytes=5_000)
    first = _event(1, "a" * 1_000)
    once = kept.of(first)
    assert kept.of(first) is once  # the same object: its bytes again
    assert pb.WatchSessionResponse.FromString(once.data).event.seq == 1
    equal = _event(1, "a" * 1_000)
    assert kept.of(equal) is not once  # another event (another log's, say): encoded anew
    assert kept.of(equal).data == once.data
    later = [_event(n, "b" * 1_000) for n in range(2, 12)]
    for e in later:
        kept.of(e)
    assert kept._bytes <= 5_000 and len(kept._kept) <= 5
    assert kept.of(later[-1]) is kept.of(later[-1])
    # One event larger than the bound is still kept alone (its watchers read it next).
    big = _event(99, "c" * 20_000)
    assert kept.of(big) is kept.of(big) and len(kept._kept) == 1
