"""The disk reserve and the recognition of RocksDB's out-of-space errors (the full-disk
behaviour itself is proven on a real tmpfs in tests/e2e/test_disk_full.py)."""

from __future__ import annotations

import errno
from pathlib import Path

from storage.space import RESERVE_NAME, Reserve, is_no_space

# As rocksdict raises them (a plain Exception carrying RocksDB's status string).
ROCKS_WAL_FULL = (
    "IO error: No space left on device: While appending to file: /d/db/000004.log: "
    "No space left on device"
)
ROCKS_AFTER_FAILURE = "IO error: Writer has previous error.; IO error: Writer has previous error."


def test_rocksdb_out_of_space_errors_are_recognised() -> None:
    assert is_no_space(Exception(ROCKS_WAL_FULL))
    assert is_no_space(OSError(errno.ENOSPC, "No space left on device"))
    assert not is_no_space(Exception("IO error: Input/output error"))
    assert not is_no_space(Exception("Corruption: bad block"))
    # What close() says after a failed write is not itself a sign of a full disk.
    assert not is_no_space(Exception(ROCKS_AFTER_FAILURE))


def test_reserve_is_allocated_then_given_back_when_disabled_or_resized(tmp_path: Path) -> None:
    reserve = Reserve(tmp_path, 1 << 20)
    assert reserve.ready()
    held = tmp_path / RESERVE_NAME
    assert held.stat().st_size == 1 << 20
    assert held.stat().st_blocks * 512 >= 1 << 20  # allocated, not a sparse file
    assert oct(held.stat().st_mode & 0o777) == "0o600"

    Reserve(tmp_path, 1 << 20).release_if_short()  # plenty free: kept
    assert held.exists()
    Reserve(tmp_path, 2 << 20).release_if_short()  # another size: given back, then remade
    assert not held.exists()
    assert Reserve(tmp_path, 2 << 20).ready()
    assert held.stat().st_size == 2 << 20
    Reserve(tmp_path, 0).release_if_short()  # disabled
    assert not held.exists()
