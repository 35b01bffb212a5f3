"""Element counts of repeated request fields, read from the wire before decoding.

Decoding a message of millions of tiny elements holds the GIL for seconds (2,000,000
one-character events: about 3 s), stalling every other RPC. Counting them first costs
at most `limit + 1` steps of a walk over the raw bytes, so an over-long list is
refused before the decoder ever sees it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from server.domain.errors import CtxccError, Reason, invalid


@dataclass(frozen=True, slots=True)
class RepeatedCap:
    field: int
    limit: int
    error: Callable[[int], CtxccError]
    # Packed scalars (enums): one length-delimited run holds many elements.
    packed: bool = False


def _varint(data: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        if i >= len(data) or shift > 63:
            raise ValueError("truncated varint")
        b = data[i]
        i += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, i
        shift += 7


def count_over(data: bytes, cap: RepeatedCap) -> int | None:
    """How many elements the capped field holds when that is over its limit, else
    None. Counting stops at `limit + 1`. Malformed bytes answer None: the real decoder
    reports them."""
    count, i = 0, 0
    try:
        while i < len(data):
            tag, i = _varint(data, i)
            number, wire = tag >> 3, tag & 7
            if wire == 0:
                _, i = _varint(data, i)
                count += number == cap.field
            elif wire == 1:
                i += 8
            elif wire == 5:
                i += 4
            elif wire == 2:
                size, i = _varint(data, i)
                if number == cap.field:
                    count += _packed_count(data, i, i + size, cap) if cap.packed else 1
                i += size
            else:
                return None
            if count > cap.limit:
                return count
    except ValueError:
        return None
    return None


def _packed_count(data: bytes, start: int, end: int, cap: RepeatedCap) -> int:
    """Varints in a packed run: each ends with a byte below 0x80. Stops past the limit."""
    n = 0
    for i in range(start, min(end, len(data))):
        n += data[i] < 0x80
        if n > cap.limit:
            break
    return n


def request_caps(max_events_per_append: int) -> dict[str, RepeatedCap]:
    def too_many(n: int) -> CtxccError:
        return CtxccError(
            Reason.TOO_MANY_EVENTS,
            f"over {max_events_per_append} events in one append",
            limit=str(max_events_per_append),
        )

    def kinds(n: int) -> CtxccError:
        return invalid("kinds", f"kinds lists at most {MAX_KINDS} event kinds")

    return {
        "/ctxcc.v1.SessionService/AppendEvents": RepeatedCap(2, max_events_per_append, too_many),
        "/ctxcc.v1.SessionService/ListEvents": RepeatedCap(5, MAX_KINDS, kinds, packed=True),
    }


# More than every event kind there is, with room for repeats.
MAX_KINDS = 64
