"""Where the development traces are: `../shared/traces` beside the checkout (as CI lays it
out), beside the main checkout of a `git worktree`, or beside the repository this checkout
was cloned from."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _git(*args: str) -> str:
    try:
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10, check=False
        ).stdout.strip()
    except OSError:
        return ""


def dev_traces() -> Path:
    candidates = [ROOT.parent / "shared"]
    common = _git("rev-parse", "--path-format=absolute", "--git-common-dir")
    if common.endswith("/.git"):  # a worktree: the main checkout holds the .git directory
        candidates.append(Path(common).parent.parent / "shared")
    origin = _git("remote", "get-url", "origin")
    if origin and Path(origin).is_dir():
        candidates.append(Path(origin).resolve().parent / "shared")
    for shared in candidates:
        trace = shared / "traces" / "dev-requests.jsonl.xz"
        if trace.exists():
            return trace
    return candidates[0] / "traces" / "dev-requests.jsonl.xz"
