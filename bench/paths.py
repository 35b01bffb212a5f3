"""Where the development traces are: `../shared/traces` beside the checkout (as CI lays it
out), or beside the repository this checkout was cloned from."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def dev_traces() -> Path:
    candidates = [ROOT.parent / "shared"]
    try:
        origin = subprocess.run(
            ["git", "remote", "get-url", "origin"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout
        if origin.strip() and Path(origin.strip()).is_dir():
            candidates.append(Path(origin.strip()).resolve().parent / "shared")
    except OSError:
        pass
    for shared in candidates:
        trace = shared / "traces" / "dev-requests.jsonl.xz"
        if trace.exists():
            return trace
    return candidates[0] / "traces" / "dev-requests.jsonl.xz"
