"""Free space on the data directory's filesystem, and the reserve kept there.

RocksDB needs room to recover: at open it replays the write-ahead log into a table
file, and after a write fails for lack of space its log writer stays broken until the
database is reopened. A full disk must therefore never leave the daemon without the
room to do that. The reserve is a preallocated file (`RESERVE.ctxcc`) of
`reserve_bytes` beside the database: it is given up at open when space is short, so
RocksDB can always replay its log, and recreated once space is back. Writes are
accepted again only when, with the reserve in place, at least `reserve_bytes` more are
free, so a disk that is nearly full does not flap between full and writable.
"""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path

RESERVE_NAME = "RESERVE.ctxcc"


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def is_no_space(exc: BaseException) -> bool:
    """RocksDB reports ENOSPC as an `IO error: No space left on device: …` status;
    a writer that already failed answers `Writer has previous error` until reopened."""
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return True
    text = str(exc)
    return "No space left on device" in text or "NoSpace" in text


class Reserve:
    def __init__(self, directory: Path, reserve_bytes: int) -> None:
        self._path = directory / RESERVE_NAME
        self.size = reserve_bytes

    def _held(self) -> bool:
        """The reserve file is there at its configured size."""
        try:
            return self._path.stat().st_size == self.size
        except FileNotFoundError:
            return False

    def release(self) -> None:
        """Give the reserved space back to the filesystem (before RocksDB opens)."""
        with contextlib.suppress(FileNotFoundError):
            self._path.unlink()

    def release_if_short(self) -> None:
        """At open: give the reserve back when RocksDB may need it to replay its log, or
        when it is disabled or no longer its configured size (it is recreated later)."""
        if not self._held() or free_bytes(self._path.parent) < self.size:
            self.release()

    def ready(self) -> bool:
        """True when writes may be accepted: the reserve is in place (recreated if
        there is room for it and for as much again) and `size` bytes are free."""
        directory = self._path.parent
        if self.size == 0:
            return free_bytes(directory) > 0
        if not self._held():
            if free_bytes(directory) < 2 * self.size:
                return False
            self._create()
        return free_bytes(directory) >= self.size

    def _create(self) -> None:
        tmp = self._path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
        try:
            # Allocated blocks, not a sparse file: the space is really held back.
            os.posix_fallocate(fd, 0, self.size)
        except OSError:
            os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            return
        os.close(fd)
        os.replace(tmp, self._path)
