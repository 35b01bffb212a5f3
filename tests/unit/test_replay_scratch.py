"""Where `ctxcc replay` without --target keeps its own daemon's data."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from server import replay


def test_the_replays_daemon_works_in_the_temp_dir_unless_its_path_is_too_long(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It always used /tmp, which a read-only root filesystem may not have, whatever
    TMPDIR said; a temp dir whose path leaves no room for the daemon's socket name is
    passed over for /tmp."""
    short = short_tmp / "t"
    short.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(short))
    assert len(str(short)) <= replay.MAX_SCRATCH_BASE_CHARS
    assert replay.scratch_base() == str(short)
    deep = short_tmp / ("d" * replay.MAX_SCRATCH_BASE_CHARS)
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    assert replay.scratch_base() == "/tmp"
