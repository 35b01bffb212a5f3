"""The README's error table is the one users branch on: every `ErrorReason` the wire can
carry is in it, with the gRPC code the transport's error table maps it to."""

from __future__ import annotations

import re
from pathlib import Path

from ctxcc.v1 import error_pb2
from server.domain.errors import Reason
from server.transport.errors import CODES

README = Path(__file__).resolve().parents[2] / "README.md"
PREFIX = "ERROR_REASON_"


def _documented() -> dict[str, set[str]]:
    """reason -> the codes the README's "Errors" table gives it."""
    text = README.read_text()
    section = text[text.index("### Errors") :]
    section = section[: section.index("\n#", 1)]
    rows: dict[str, set[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[1].startswith("`"):
            continue
        code = cells[1].strip("`")
        # Only the reasons themselves, not what their metadata is called.
        names = re.findall(r"`([A-Z_]+)`", re.sub(r"\(metadata[^)]*\)", "", cells[2]))
        for name in names:
            rows.setdefault(name, set()).add(code)
    return rows


def test_every_error_reason_is_in_the_readme_with_its_grpc_code() -> None:
    documented = _documented()
    reasons = [
        name.removeprefix(PREFIX)
        for name in (v.name for v in error_pb2.DESCRIPTOR.enum_types_by_name["ErrorReason"].values)
        if name != f"{PREFIX}UNSPECIFIED"
    ]
    assert len(reasons) >= 29
    missing = [r for r in reasons if r not in documented]
    assert not missing, f"reasons absent from the README's error table: {missing}"
    wrong = {
        r: (documented[r], CODES[Reason(r)].name)
        for r in reasons
        if documented[r] != {CODES[Reason(r)].name}
    }
    assert not wrong, f"README code differs from server/transport/errors.py: {wrong}"
    unknown = set(documented) - set(reasons)
    assert not unknown, f"the README names reasons the enum lacks: {unknown}"
