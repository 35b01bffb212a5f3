"""Confined reads on real directories: links inside the root work, anything leading out
is refused, non-regular files are refused without blocking, and swapping a directory
for a symlink while reading never yields a byte from outside."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from server.adapters.confined import Refused, read_confined
from server.adapters.workspace import WorkspaceConfig, WorkspaceReader


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "root"
    (r / "a" / "b").mkdir(parents=True)
    (r / "AGENTS.md").write_text("inside")
    (r / "a" / "b" / "deep.md").write_text("deep")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "AGENTS.md").write_text("OUTSIDE")
    return r


def _read(root: Path, rel: str) -> bytes | Refused:
    return read_confined(str(root), rel.split("/"), 1 << 20)


def test_links_inside_the_root_are_followed(root: Path) -> None:
    (root / "CLAUDE.md").symlink_to("AGENTS.md")
    (root / "abs.md").symlink_to(root / "a" / "b" / "deep.md")
    (root / "a" / "up.md").symlink_to("../AGENTS.md")
    (root / "dirlink").symlink_to("a/b")
    assert _read(root, "CLAUDE.md") == b"inside"
    assert _read(root, "abs.md") == b"deep"
    assert _read(root, "a/up.md") == b"inside"
    assert _read(root, "dirlink/deep.md") == b"deep"


@pytest.mark.parametrize(
    ("name", "target"),
    [
        ("file.md", "../out/AGENTS.md"),
        ("dir", "../out"),
        ("absdir", "{out}"),
        ("absfile.md", "{out}/AGENTS.md"),
        ("a/escape", "../../out"),
    ],
)
def test_links_leading_out_are_refused(root: Path, name: str, target: str) -> None:
    out = root.parent / "out"
    (root / name).symlink_to(target.format(out=out))
    rel = name if name.endswith(".md") else f"{name}/AGENTS.md"
    got = _read(root, rel)
    assert isinstance(got, Refused) and got.outside, got


def test_loops_fifos_and_directories_are_refused(root: Path) -> None:
    (root / "loop").symlink_to("loop")
    os.mkfifo(root / "fifo.md")
    for rel in ("loop", "fifo.md", "a", "AGENTS.md/x", "missing.md"):
        got = _read(root, rel)
        assert isinstance(got, Refused) and not got.outside, (rel, got)
    missing = _read(root, "missing.md")
    assert isinstance(missing, Refused) and missing.missing


def _swapper(sub: Path, outside: Path, stop: threading.Event) -> None:
    """Swaps `sub` between a real directory and a symlink to `outside`, endlessly."""
    real = sub.with_name("sub.real")
    link = sub.with_name("sub.link")
    link.symlink_to(outside)
    while not stop.is_set():
        os.rename(real, sub)  # sub is the real directory
        os.rename(sub, real)
        os.rename(link, sub)  # sub is the symlink
        os.rename(sub, link)


def test_swapping_a_directory_for_a_symlink_never_leaks(root: Path) -> None:
    sub = root / "sub"
    real = root / "sub.real"
    real.mkdir()
    (real / "AGENTS.md").write_text("inside sub")
    outside = root.parent / "out"
    reader = WorkspaceReader(WorkspaceConfig(roots=(root.parent,)))
    stop = threading.Event()
    swap = threading.Thread(target=_swapper, args=(sub, outside, stop))
    swap.start()
    seen: dict[str, int] = {}
    try:
        for _ in range(3_000):
            got = read_confined(str(root), ["sub", "AGENTS.md"], 1 << 20)
            key = got.decode() if isinstance(got, bytes) else got.why
            seen[key] = seen.get(key, 0) + 1
            files = reader.read(str(root), str(sub)).instruction_files
            assert all("OUTSIDE" not in f.text for f in files)
    finally:
        stop.set()
        swap.join()
    assert "OUTSIDE" not in seen, seen
    assert seen.get("inside sub", 0) > 0, seen  # the race was really run


def test_a_root_that_is_a_symlink_is_refused(root: Path) -> None:
    """Callers pass a root they resolved and checked; if that path has since become a
    symlink (the project directory swapped after the check), nothing under it is read."""
    out = root.parent / "out"
    swapped = root.parent / "swapped"
    swapped.symlink_to(out)
    got = read_confined(str(swapped), ["AGENTS.md"], 1 << 20)
    assert isinstance(got, Refused) and got.outside, got
    (root / "a" / "link").symlink_to(out)  # a link on the way to the root, too
    got = read_confined(str(root / "a" / "link"), ["AGENTS.md"], 1 << 20)
    assert isinstance(got, Refused) and got.outside, got
    assert _read(root, "a/b/deep.md") == b"deep"  # a real root is still read


def test_swapping_the_project_root_for_a_symlink_never_leaks(tmp_path: Path) -> None:
    """The reader resolves and checks the project root, then reads under it: a swap of
    the project directory itself in between must not lead the reads outside."""
    ws = tmp_path / "ws"
    real = ws / "sub.real"  # the names _swapper swaps
    (real / ".ctxcc").mkdir(parents=True)
    (real / "AGENTS.md").write_text("inside proj")
    outside = tmp_path / "out"
    (outside / ".ctxcc").mkdir(parents=True)
    (outside / "AGENTS.md").write_text("OUTSIDE")
    (outside / ".ctxcc" / "MEMORY.md").write_text("OUTSIDE memory")
    proj = ws / "sub"
    reader = WorkspaceReader(WorkspaceConfig(roots=(ws,)))
    stop = threading.Event()
    swap = threading.Thread(target=_swapper, args=(proj, outside, stop))
    swap.start()
    inside = 0
    try:
        for _ in range(3_000):
            got = reader.read(str(proj), str(proj))
            texts = [f.text for f in got.instruction_files] + [m.text for m in got.memory]
            assert all("OUTSIDE" not in t for t in texts), texts
            inside += any("inside proj" in t for t in texts)
    finally:
        stop.set()
        swap.join()
    assert inside > 0  # the race was really run
