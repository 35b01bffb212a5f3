"""Bytes held in memory by calls in progress, against a budget: an upload buffered until
its sha256 is checked, a download gRPC keeps until it is read, a large request while it is
decoded and worked on. Counted on the event loop (gRPC's aio server decodes requests
there), but under a lock all the same: a request's bytes may be given back by the
garbage collector, which runs in whatever thread allocates, and an update lost there
would move the budget for good."""

from __future__ import annotations

import threading

from server.domain.errors import CtxccError, Reason


class HeldBytes:
    """Bytes held by calls in progress of one kind: `what` names them in the refusal,
    `quota` in its ErrorInfo."""

    def __init__(self, limit: int, what: str = "uploads", quota: str = "upload") -> None:
        self.limit = limit
        self.held = 0
        self._what = what
        self._quota = f"{quota}_bytes_in_memory"
        self._lock = threading.Lock()

    def refusal(self, size: int) -> CtxccError | None:
        """Why `size` more bytes cannot be taken now, or None when they can. One call alone
        always passes: an artifact stored under a larger --max-artifact-bytes, or a request
        larger than the whole budget, is never helped by a retry."""
        if not self.held or self.held + size <= self.limit:
            return None
        return CtxccError(
            Reason.QUOTA_EXCEEDED,
            f"{self._what} in progress hold {self.held} bytes; {size} more would pass "
            f"the daemon's {self.limit}; retry later",
            quota=self._quota,
            limit=str(self.limit),
        )

    def take(self, size: int) -> None:
        err = self.refusal(size)
        if err is not None:
            raise err
        self.add(size)

    def give(self, size: int) -> None:
        self.add(-size)

    def add(self, size: int) -> None:
        with self._lock:
            self.held += size


class Charge:
    """Bytes taken from a HeldBytes for one request, given back once: when the call is
    done with the request, or when this is dropped (a call cancelled between its decoding
    and its handler never reaches the code that gives them back, and a budget that leaked
    them would refuse every large request after a while)."""

    __slots__ = ("_held", "_size")

    def __init__(self, held: HeldBytes, size: int) -> None:
        held.add(size)
        self._held, self._size = held, size

    def release(self) -> None:
        size, self._size = self._size, 0
        if size:
            self._held.give(size)

    def __del__(self) -> None:
        self.release()
