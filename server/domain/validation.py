"""Checks on identifiers and sizes that hold for every entry point (API, CLI, replay)."""

from __future__ import annotations

import posixpath
import re

from server.domain.errors import CtxccError, Reason, invalid

_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")


def is_id(value: str) -> bool:
    """Whether `value` is a well-formed id (session, event, request...)."""
    return _ID.fullmatch(value) is not None


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


# Route fields name a connection, protocol, endpoint and model: short strings. Bounded,
# so no compile record or baseline key grows with what a client sends.
MAX_ROUTE_FIELD_CHARS = 256
# The platform and shell a compile names are rendered into its view's environment section.
MAX_ENVIRONMENT_FIELD_CHARS = 256
# A session's workspace id rides in the session record, rewritten by every append.
MAX_WORKSPACE_ID_CHARS = 1_024
MAX_LABELS = 64
MAX_LABEL_KEY_CHARS = 128
MAX_LABEL_VALUE_CHARS = 1_024


# Control characters in a route field: a route's id joins its fields with one (\x1f), so
# ("a\x1fb", "c") and ("a", "b\x1fc") would be one route, sharing baselines and state.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def check_route_fields(fields: dict[str, str], prefix: str = "route") -> None:
    for name, value in fields.items():
        if len(value) > MAX_ROUTE_FIELD_CHARS:
            raise invalid(
                f"{prefix}.{name}", f"{prefix}.{name} is over {MAX_ROUTE_FIELD_CHARS} characters"
            )
        if _CONTROL.search(value):
            raise invalid(f"{prefix}.{name}", f"{prefix}.{name} holds a control character")


def check_environment_fields(fields: dict[str, str]) -> None:
    for name, value in fields.items():
        if len(value) > MAX_ENVIRONMENT_FIELD_CHARS:
            raise invalid(
                f"environment.{name}",
                f"environment.{name} is over {MAX_ENVIRONMENT_FIELD_CHARS} characters",
            )


def check_workspace_id(workspace_id: str) -> None:
    if len(workspace_id) > MAX_WORKSPACE_ID_CHARS:
        raise invalid(
            "session.workspace_id",
            f"session.workspace_id is over {MAX_WORKSPACE_ID_CHARS} characters",
        )


def check_labels(labels: dict[str, str]) -> None:
    """Labels ride in the session record, rewritten by every append: kept small."""
    if len(labels) > MAX_LABELS:
        raise invalid("session.labels", f"at most {MAX_LABELS} labels")
    for key, value in labels.items():
        if not key or len(key) > MAX_LABEL_KEY_CHARS:
            raise invalid("session.labels", f"label keys are 1-{MAX_LABEL_KEY_CHARS} characters")
        if len(value) > MAX_LABEL_VALUE_CHARS:
            raise invalid(
                "session.labels", f"label values are at most {MAX_LABEL_VALUE_CHARS} characters"
            )
