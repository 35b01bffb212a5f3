"""Checks on identifiers and sizes that hold for every entry point (API, CLI, replay)."""

from __future__ import annotations

import re

from server.domain.errors import invalid

_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")


def check_id(field: str, value: str, *, required: bool = True) -> str:
    if not value and not required:
        return value
    if not _ID.fullmatch(value):
        raise invalid(field, f"{field} must be 1-128 characters of [A-Za-z0-9._-]")
    return value
