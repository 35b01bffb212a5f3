"""Text hygiene for user-controllable content: control characters out, invisible format
characters made visible, visible truncation, fences that content cannot close."""

from __future__ import annotations

import re

# C0 and C1 controls and DEL, except tab and newline; carriage returns go too so
# CRLF files and LF files of the same content compare equal.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


# Unicode format characters (category Cf, Unicode 14): bidi embeddings, overrides and
# isolates, zero-width spaces and joiners, invisible operators, tag characters. They
# render as nothing or reorder what is shown, so text can read one way to a reviewer and
# another to the model (the "Trojan Source" class). They are shown as [U+XXXX].
_INVISIBLE = re.compile(
    "[\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f"
    "\u202a-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\U000110bd\U000110cd"
    "\U00013430-\U00013438\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001"
    "\U000e0020-\U000e007f]"
)


def count_invisible(text: str) -> int:
    """Format characters sanitize() makes visible (a leading byte-order mark excepted)."""
    return len(_INVISIBLE.findall(text.removeprefix("\ufeff")))


def sanitize(text: str) -> str:
    # A leading byte-order mark is encoding metadata, not content: it just goes.
    text = _CONTROL.sub("", text.removeprefix("\ufeff"))
    return _INVISIBLE.sub(lambda m: f"[U+{ord(m.group()):04X}]", text)


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
# Possessive: with two plain `\s*` around an absent `/`, every way of splitting a run of
# whitespace after `<` was tried before failing, quadratic in the run (8,000 spaces after
# one `<` in a compile held the GIL ~11 s). The first run can only end at a
# non-space, so nothing that could match is given up.
_FENCE = re.compile(r"<\s*+(/?)\s*+(" + "|".join(FENCE_TAGS) + r")\b", re.IGNORECASE)


def escape_fences(text: str) -> str:
    return _FENCE.sub(lambda m: f"<{m.group(1)}\\{m.group(2)}", text)


def attr(value: str) -> str:
    return (
        value.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;").replace(">", "&gt;")
    )
