"""Reads files under a root without ever leaving it, whatever changes on disk meanwhile.

Resolving a path and then opening it by name races with anyone who can swap a
directory for a symlink in between. Here every step opens one name relative to the
directory descriptor already held, with O_NOFOLLOW: a symlink is never followed by
the kernel. Symlinks met on the way are read (readlinkat) and resolved by this module
against the root, so links inside the tree keep working (CLAUDE.md -> AGENTS.md) and
any link or swap that points outside ends the walk. Only regular files are read.
"""

from __future__ import annotations

import errno
import heapq
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import PurePosixPath

# Symlinks followed in one walk, as the kernel's own limit (40) but tighter.
MAX_LINKS = 16
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


@dataclass(frozen=True, slots=True)
class Refused:
    """Why a file was not read; shown in the view's notes, never raised."""

    why: str
    # Nothing there: the common case for optional files, not worth a note.
    missing: bool = False
    # It leads outside the root.
    outside: bool = False


class _Outside(Exception):
    pass


class Opens:
    """How many more names the walks of one workspace read may open. A walk opens one
    name per component and goes back to the root for each absolute link and each `..`,
    so a chain of 15 links, each `d/` 800 times then `../` 800 times, cost ~5M opens and
    5.8 s for one file, a rules directory of such files hours of a compute thread. The
    walks of one read share one, and each refuses to open more once it is spent."""

    __slots__ = ("left",)

    def __init__(self, left: int) -> None:
        self.left = left

    def take(self) -> None:
        if self.left <= 0:
            raise OSError(errno.ELOOP, "past the directories one workspace read may open")
        self.left -= 1


def _take(opens: Opens | None) -> None:
    if opens is not None:
        opens.take()


def _relative(root: str, target: str) -> list[str]:
    """An absolute link target as components under `root`, or _Outside."""
    norm = os.path.normpath(target)
    if norm != root and not norm.startswith(root.rstrip("/") + "/"):
        raise _Outside
    return [p for p in PurePosixPath(norm).relative_to(root).parts if p != "/"]


def _root_fd(root: str, opens: Opens | None = None) -> int:
    """A descriptor of the directory `root`, opened one component at a time from `/`
    without following a symlink. Callers pass a root they resolved and checked: a
    component that is a symlink now was swapped in since (a project directory replaced
    by a link to elsewhere), and following it would read outside, so it is _Outside."""
    _take(opens)
    fd = os.open("/", _DIR)
    try:
        for name in PurePosixPath(os.path.abspath(root)).parts[1:]:
            _take(opens)
            try:
                nfd = os.open(name, _DIR, dir_fd=fd)
            except OSError as exc:
                _link_target(fd, name, exc)  # re-raises unless `name` is a symlink
                raise _Outside from None
            os.close(fd)
            fd = nfd
        return fd
    except BaseException:
        os.close(fd)
        raise


def _walk(root: str, parts: list[str], directory: bool = False, opens: Opens | None = None) -> int:
    """A descriptor of the regular file (or with `directory`, the directory) at
    root/parts, resolved inside root only. Raises _Outside, or OSError for anything
    missing, looping or not a file (a directory)."""
    links = 0
    todo = list(parts)
    done: list[str] = []  # real directories under root, opened one by one
    fd = _root_fd(root, opens)
    try:
        while todo:
            name = todo.pop(0)
            if name in ("", "."):
                continue
            if name == "..":
                if not done:
                    raise _Outside
                done.pop()
                os.close(fd)
                # Closed: should the reopen fail, the handler below must not close the
                # number again (another thread may have been given it meanwhile).
                fd = -1
                fd = _reopen(root, done, opens)
                continue
            last = not todo
            _take(opens)
            try:
                nfd = os.open(name, _FILE if last and not directory else _DIR, dir_fd=fd)
            except OSError as exc:
                target = _link_target(fd, name, exc)
                links += 1
                if links > MAX_LINKS:
                    raise OSError(errno.ELOOP, "too many levels of symbolic links") from None
                if os.path.isabs(target):
                    done = []
                    os.close(fd)
                    fd = -1  # as for `..` above
                    fd = _root_fd(root, opens)
                    todo = _relative(root, target) + todo
                else:
                    todo = [p for p in target.split("/") if p] + todo
                continue
            os.close(fd)
            fd = nfd
            if last:
                break
            done.append(name)
        else:
            if not directory:
                raise OSError(errno.EISDIR, "is a directory")
        if not directory and not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        return fd
    except BaseException:
        if fd >= 0:
            os.close(fd)
        raise


def _link_target(fd: int, name: str, exc: OSError) -> str:
    """The target of the symlink `name` that refused to open, else re-raise."""
    if exc.errno not in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
        raise exc
    try:
        return os.readlink(name, dir_fd=fd)
    except OSError:
        raise exc from None


def _reopen(root: str, parts: list[str], opens: Opens | None) -> int:
    fd = _root_fd(root, opens)
    for name in parts:
        try:
            _take(opens)
            nfd = os.open(name, _DIR, dir_fd=fd)
        finally:
            os.close(fd)
        fd = nfd
    return fd


def read_confined(
    root: str, parts: list[str], limit: int, opens: Opens | None = None
) -> bytes | Refused:
    """Up to `limit` bytes of the regular file root/parts, never from outside root."""
    try:
        fd = _walk(root, parts, opens=opens)
    except _Outside:
        return Refused("it resolves outside its root", outside=True)
    except OSError as exc:
        # strerror only: str(exc) would carry the absolute file name.
        return Refused(exc.strerror or type(exc).__name__, exc.errno == errno.ENOENT)
    try:
        with os.fdopen(fd, "rb") as f:
            return f.read(limit)
    except OSError as exc:
        return Refused(exc.strerror or type(exc).__name__)


def open_root(root: str, opens: Opens | None = None) -> int | None:
    """A descriptor of the directory `root` (as `read_confined` opens it: no component a
    link), or None. The caller closes it."""
    try:
        return _root_fd(root, opens)
    except (_Outside, OSError):
        return None


def open_subdir(fd: int, name: str, opens: Opens | None = None) -> int | None:
    """A descriptor of the real directory `name` in the directory `fd`, or None for
    anything else (missing, a link, a file). A real directory of a confined directory is
    confined: nothing was followed. The caller closes it."""
    if name in ("", ".", "..") or "/" in name:
        return None
    try:
        _take(opens)
        return os.open(name, _DIR, dir_fd=fd)
    except OSError:
        return None


def read_at(fd: int, name: str, limit: int, opens: Opens | None = None) -> bytes | Refused | None:
    """Up to `limit` bytes of the regular file `name` in the confined directory `fd`;
    Refused (missing) when there is no such name; None when it is anything else (a
    link, a FIFO, a device...), for the caller to read it with `read_confined`, which
    resolves links inside the root and says why it refuses. Reading a chain of nested
    directories this way opens each once, where `read_confined` walks from the root for
    every file (quadratic in the depth: seconds for a 2,000-deep working directory)."""
    if name in ("", ".", "..") or "/" in name:
        return None
    try:
        _take(opens)
        nfd = os.open(name, _FILE, dir_fd=fd)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return Refused(exc.strerror or "missing", missing=True)
        return None
    try:
        with os.fdopen(nfd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return None
            return f.read(limit)
    except OSError:
        return None


def list_confined(
    root: str,
    parts: list[str],
    wanted: Callable[[str, bool], bool],
    most: int,
    opens: Opens | None = None,
) -> tuple[list[str], int] | Refused:
    """The first `most` names, by name, of the entries of the directory root/parts that
    `wanted` takes (given the name and whether it is a directory or a link: what may hold
    a skill), and how many it takes in all; never listing a directory outside root: a
    rules or skills directory that is a link to elsewhere would name files outside the
    root. Only those `most` are kept while the directory is read: listing all of a
    directory of 1,000,000 entries (anyone who writes the workspace can make one) raised
    the daemon's peak by ~380 MB at every compile."""
    try:
        fd = _walk(root, parts, directory=True, opens=opens)
    except _Outside:
        return Refused("it resolves outside its root", outside=True)
    except OSError as exc:
        return Refused(exc.strerror or type(exc).__name__, exc.errno == errno.ENOENT)
    taken = 0

    def taking(entries: Iterator[os.DirEntry[str]]) -> Iterator[str]:
        nonlocal taken
        for e in entries:
            if wanted(e.name, e.is_dir(follow_symlinks=False) or e.is_symlink()):
                taken += 1
                yield e.name

    try:
        with os.scandir(fd) as entries:
            return heapq.nsmallest(most, taking(entries)), taken
    except OSError as exc:
        return Refused(exc.strerror or type(exc).__name__)
    finally:
        os.close(fd)
