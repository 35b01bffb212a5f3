"""A canonical byte encoding of domain values, for digests that must not change with
the storage format or the Python version: tagged, length-prefixed, field-ordered."""

from __future__ import annotations

import dataclasses
import enum
import hashlib
from collections.abc import Iterable, Sequence

from server.domain.model import Event


def _encode(value: object, out: list[bytes]) -> None:
    if value is None:
        out.append(b"N")
    elif isinstance(value, bool):
        out.append(b"T" if value else b"F")
    elif isinstance(value, enum.Enum):
        _encode(value.value, out)
    elif isinstance(value, int):
        out.append(b"I%d;" % value)
    elif isinstance(value, str):
        data = value.encode()
        out.append(b"S%d:" % len(data) + data)
    elif isinstance(value, bytes):
        out.append(b"B%d:" % len(value) + value)
    elif isinstance(value, tuple):
        out.append(b"L%d:" % len(value))
        for item in value:
            _encode(item, out)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        name = type(value).__name__.encode()
        fields = dataclasses.fields(value)
        out.append(b"D%d:" % len(name) + name + b"%d:" % len(fields))
        for f in fields:
            _encode(getattr(value, f.name), out)
    else:
        raise TypeError(f"no canonical encoding for {type(value).__name__}")


def canonical_bytes(value: object) -> bytes:
    out: list[bytes] = []
    _encode(value, out)
    return b"".join(out)


def events_digest(events: Iterable[Event]) -> str:
    """Digest of a run of events (seq, id and payload; not the acceptance time)."""
    h = hashlib.sha256()
    for e in events:
        h.update(canonical_bytes((e.seq, e.event_id, e.payload)))
    return h.hexdigest()


def events_digests(events: Sequence[Event], ends: Sequence[int]) -> list[str]:
    """events_digest of `events[:end]` for each of `ends` (ascending), in one pass."""
    h = hashlib.sha256()
    out: list[str] = []
    done = 0
    for end in ends:
        for e in events[done:end]:
            h.update(canonical_bytes((e.seq, e.event_id, e.payload)))
        done = end
        out.append(h.copy().hexdigest())
    return out
