"""The encoded watch responses kept for all of a session's watchers."""

from __future__ import annotations

import tracemalloc

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


def test_the_memory_kept_stays_near_the_bound_for_small_events() -> None:
    """Small events hold far more as Python objects than their encodings: counted by the
    encodings alone, the 16 MiB bound kept ~310,000 one-word messages (~200 MB). Each
    entry now counts what it holds, so 40,000 such events keep less than the bound."""
    kept = WatchedBytes()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for seq in range(1, 40_001):
            kept.of(_event(seq, "x"))  # held by the cache alone once encoded
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held < 16 << 20, f"{held / 2**20:.0f} MiB kept for a 16 MiB bound"
    assert len(kept._kept) <= 16_384
