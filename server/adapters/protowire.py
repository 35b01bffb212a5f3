"""Protocol buffers' wire format, the two pieces written by hand: a varint, and a
length-delimited field. Used where bytes already encoded are joined into a message
without decoding them (a view's records, a stored record's body made in pieces)."""

from __future__ import annotations

# The one-byte varints: a record's key and most lengths and counts of a step.
_ONE_BYTE = tuple(bytes((n,)) for n in range(0x80))


def varint(n: int) -> bytes:
    if 0 <= n < 0x80:
        return _ONE_BYTE[n]
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def tagged(field: int, data: bytes) -> bytes:
    """A length-delimited field: its key, its length, its bytes. A repeated message field
    on the wire is the concatenation of such records, one per element."""
    return varint((field << 3) | 2) + varint(len(data)) + data
