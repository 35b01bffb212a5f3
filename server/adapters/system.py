"""Clock and id sources: the only places the daemon reads time or randomness."""

from __future__ import annotations

import hashlib
import itertools
import secrets
import time


class SystemClock:
    def now_ns(self) -> int:
        return time.time_ns()


class RandomIds:
    """96-bit ids, hex: unique without coordination, unpredictable, safe in keys and URLs.

    Each id is a keyed BLAKE2b of a counter under a key read from the OS once: as
    unpredictable as 96 bits read from the OS for each id, without a getrandom(2) per id
    (a stream step makes three, and each call let go of the GIL, so the compiling thread
    then waited for it behind the event loop: ~25 µs of a step's wall time)."""

    def __init__(self) -> None:
        self._key = secrets.token_bytes(32)
        # next() on a count is atomic under the GIL: no two threads get the same number.
        self._count = itertools.count()

    def new_id(self, prefix: str) -> str:
        n = next(self._count).to_bytes(16, "big")
        return f"{prefix}{hashlib.blake2b(n, key=self._key, digest_size=12).hexdigest()}"
