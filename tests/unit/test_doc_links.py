"""Every relative link in the READMEs and docs/ names a file that exists and, when it has
a fragment, a heading or `<a id>` that the target renders (GitHub's heading anchors):
text moved between files must not leave readers at a dead link."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted(
    [
        ROOT / "README.md",
        *ROOT.glob("docs/*.md"),
        *ROOT.glob("client/*/README.md"),
        *ROOT.glob("deploy/**/*.md"),
    ]
)
# [text](target) outside code spans; images too. Targets with a scheme are not ours.
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_CODE = re.compile(r"`[^`]*`")
_FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped (hyphens
    and underscores kept), spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text.replace("`", ""))
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = _FENCE.sub("", path.read_text())
    found: set[str] = set(re.findall(r'<a id="([^"]+)"', text))
    seen: dict[str, int] = {}
    for line in text.splitlines():
        m = re.match(r"#{1,6} (.+)", line)
        if m:
            slug = _slug(m.group(1))
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            found.add(slug if n == 0 else f"{slug}-{n}")
    return found


def links(path: Path) -> list[str]:
    text = _FENCE.sub("", path.read_text())
    return [t for line in text.splitlines() for t in _LINK.findall(_CODE.sub("", line))]


def test_slugs_follow_github() -> None:
    assert _slug("The event log and its guarantees") == "the-event-log-and-its-guarantees"
    assert _slug("`ctxcc replay`") == "ctxcc-replay"
    assert _slug("Security: threat model") == "security-threat-model"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc: Path) -> None:
    dead = []
    for target in links(doc):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):
            continue  # http:, https:, mailto:
        file_part, _, fragment = target.partition("#")
        dest = (doc.parent / file_part).resolve() if file_part else doc
        if not dest.is_relative_to(ROOT):
            continue  # ../shared/SPEC.md: beside the checkout, not in a clean clone
        missing = fragment and dest.suffix == ".md" and fragment not in anchors(dest)
        if not dest.exists() or missing:
            dead.append(target)
    assert not dead, f"{doc.relative_to(ROOT)}: dead links {dead}"
