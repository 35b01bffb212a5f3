"""Checks on identifiers and sizes that hold for every entry point (API, CLI, replay)."""

from __future__ import annotations

import posixpath
import re

from server.domain.errors import CtxccError, Reason, invalid

_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")


def check_id(field: str, value: str, *, required: bool = True) -> str:
    if not value and not required:
        return value
    if not _ID.fullmatch(value):
        raise invalid(field, f"{field} must be 1-128 characters of [A-Za-z0-9._-]")
    return value


def within(path: str, root: str) -> bool:
    """Whether normalized absolute `path` is `root` or below it."""
    root = root.rstrip("/") or "/"
    return path == root or path.startswith(root if root == "/" else root + "/")


# Linux's PATH_MAX: no longer path can be opened.
MAX_PATH_CHARS = 4_096


def check_path_form(field: str, raw: str) -> None:
    """A path the daemon may later open: no control characters (NUL cannot reach a
    system call at all), at most PATH_MAX long."""
    if len(raw) > MAX_PATH_CHARS:
        raise invalid(field, f"{field} is over {MAX_PATH_CHARS} characters")
    if any(c < " " or c == "\x7f" for c in raw):
        raise invalid(field, f"{field} holds a control character")


def check_session_paths(project_root: str, working_directory: str) -> None:
    """Session paths are absolute, free of '..', and the working directory lies under
    the project root. Whether the root is readable is the workspace adapter's call."""
    for field, raw in (("project_root", project_root), ("working_directory", working_directory)):
        check_path_form(field, raw)
        if raw and (".." in raw.split("/") or not raw.startswith("/")):
            raise CtxccError(
                Reason.PATH_OUTSIDE_ROOT,
                f"{field} must be an absolute path without '..'",
                field=field,
            )
    wd, root = posixpath.normpath(working_directory), posixpath.normpath(project_root)
    if working_directory and project_root and not within(wd, root):
        raise CtxccError(
            Reason.PATH_OUTSIDE_ROOT,
            "working_directory must lie under project_root",
            field="working_directory",
        )
