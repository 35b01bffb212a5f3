"""Text hygiene for user-controllable content: control characters out, visible
truncation, fences that content cannot close."""

from __future__ import annotations

import re

# C0 and C1 controls and DEL, except tab and newline; carriage returns go too so
# CRLF files and LF files of the same content compare equal.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def sanitize(text: str) -> str:
    return _CONTROL.sub("", text)


def truncate(text: str, cap: int) -> tuple[str, bool]:
    """Cut to `cap` characters with a visible marker; never a silent cut."""
    if len(text) <= cap:
        return text, False
    marker = f"\n[... truncated by ctxcc: showing {cap} of {len(text)} characters]"
    return text[:cap] + marker, True


# Every tag ctxcc fences content with. Content may not open or close any of them, so
# it can neither leave its fence nor fake another section (R-SYS-10).
FENCE_TAGS = (
    "instructions",
    "file",
    "skills_catalog",
    "rules",
    "rule",
    "rule_index",
    "memory",
    "entry",
    "environment",
    "untrusted_page_content",
    "conversation_summary",
)
_FENCE = re.compile(r"<\s*(/?)\s*(" + "|".join(FENCE_TAGS) + r")\b", re.IGNORECASE)


def escape_fences(text: str) -> str:
    return _FENCE.sub(lambda m: f"<{m.group(1)}\\{m.group(2)}", text)


def attr(value: str) -> str:
    return (
        value.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;").replace(">", "&gt;")
    )
