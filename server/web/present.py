"""Names, numbers and colours for the pages: enum values as the words the API uses."""

from __future__ import annotations

import enum
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from server.compiler.render import RenderFormat, surrogates_escaped
from server.compiler.view import VOLATILE_SECTIONS, Decision, FallbackReason, Layer, SectionKind
from server.domain.model import (
    AssistantMessage,
    Attachment,
    BrowserSelection,
    ContentPart,
    Event,
    ImportedMessage,
    ToolCall,
    ToolResult,
    TurnCancelled,
    UserMessage,
)

__all__ = ["FallbackReason"]

LAYER_ORDER: tuple[str, ...] = (
    "pinned",
    "history",
    "working_set",
    "tool_schema",
    "native_state",
    "provider_overhead",
)
FORMATS: dict[str, RenderFormat] = {f.name.lower(): f for f in RenderFormat}
# Rendered bodies larger than this are cut on the page (base64 images mostly).
MAX_BODY_CHARS = 400_000
# Longest string shown whole inside a rendered JSON body.
MAX_JSON_STRING = 4_000
# Longest text part (a message part, a system section, an event, a tool description or
# call) shown whole on a page: the rest is counted, not shown.
MAX_PART_CHARS = 20_000
# Characters of such text one page shows in all; past them parts are shown empty and
# lists (messages, events) stop. With the rendered body's own cut this bounds a page:
# a session of 1 MB messages must not become a page of hundreds of megabytes.
MAX_PAGE_CHARS = 600_000
# What each part or list item costs that budget besides its text (its markup), so a
# view of many small messages is bounded too.
ITEM_COST = 300
# Where the whole of what a page cuts stays readable.
FULL_TEXT = (
    "the API returns it whole (SessionService.ListEvents for events; "
    "CompileService.Compile with rebuild_compile_id, or as_of_seq and dry_run, for a view)"
)


@dataclass(frozen=True, slots=True)
class Cut:
    """A text as a page shows it: its start, and how many characters were left out."""

    text: str
    omitted: int = 0


class PageBudget:
    """The text one page may still show (MAX_PAGE_CHARS), handed out part by part."""

    def __init__(self, total: int = MAX_PAGE_CHARS, part: int = MAX_PART_CHARS) -> None:
        self.left = total
        self.part = part

    @property
    def spent(self) -> bool:
        return self.left <= 0

    def item(self) -> None:
        """Charge one list item's markup."""
        self.left -= ITEM_COST

    def cut(self, text: str) -> Cut:
        shown = max(0, min(len(text), self.part, self.left))
        self.left -= shown + ITEM_COST
        return Cut(text[:shown], len(text) - shown)


def name(value: enum.Enum | int | None, kind: type[enum.Enum] | None = None) -> str:
    if value is None:
        return "-"
    if kind is not None and not isinstance(value, enum.Enum):
        try:
            value = kind(value)
        except ValueError:
            return str(value)
    return value.name.lower() if isinstance(value, enum.Enum) else str(value)


# Written before a session id in the inspector's paths when the id alone would be a
# dot segment ("." and ".." are valid ids), which a browser resolves away (also as %2e):
# "~" is no id character, so "~." and "~.." name those sessions and nothing else.
ID_ESCAPE = "~"


def id_path(session_id: str) -> str:
    """A session id as a path segment of the inspector's links."""
    return ID_ESCAPE + session_id if session_id in (".", "..") else session_id


def path_id(segment: str) -> str:
    """The session id a path segment of the inspector names (the reverse of id_path)."""
    return segment[1:] if segment in (ID_ESCAPE + ".", ID_ESCAPE + "..") else segment


def num(value: int | float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,}" if isinstance(value, int) else f"{value:,.1f}"


# Control characters as their Unicode pictures (U+0000 as ␀, U+000D as ␍, U+007F as ␡),
# but for tab and line feed: a browser drops NUL from a page and reads CR (and CR LF) as a
# line feed, so a text part holding them showed other characters than the model got. One
# character for one: a cut's counts stay right.
_PICTURES = {c: 0x2400 + c for c in range(0x20) if c not in (0x09, 0x0A)} | {0x7F: 0x2421}


def shown(text: str) -> str:
    """A text as a <pre> shows it: control characters (but tab and line feed) made
    visible as their pictures (the template escapes the rest)."""
    return text.translate(_PICTURES)


def pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def signed_pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:+.2f}%"


def when(ns: int) -> str:
    if not ns:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ns / 1e9)) + "Z"


def busts(kinds: tuple[int, ...]) -> list[str]:
    """Recorded prefix changes (cache busts) by name. Compiles recorded by older daemons
    may list the volatile environment section, which busts no cache: left out."""
    return [name(k, SectionKind) for k in kinds if k not in VOLATILE_SECTIONS]


def decision_name(value: int) -> str:
    return name(value, Decision) if value else "not recorded"


def layer_tokens(pairs: tuple[tuple[int, int], ...], estimate: int) -> dict[str, int]:
    """Tokens per layer plus the provider overhead: the part of the estimate no local
    layer explains (estimate - sum of layers), so the stack adds up to the estimate."""
    out = {name(Layer(n)): t for n, t in pairs if n in Layer._value2member_map_}
    if "provider_overhead" not in out:
        out["provider_overhead"] = estimate - sum(out.values())
    return out


def _cut(value: object) -> object:
    if isinstance(value, str) and len(value) > MAX_JSON_STRING:
        return value[:MAX_JSON_STRING] + f"… [{len(value) - MAX_JSON_STRING:,} more characters]"
    if isinstance(value, list):
        return [_cut(v) for v in value]
    if isinstance(value, dict):
        return {k: _cut(v) for k, v in value.items()}
    return value


_SPACE = re.compile(r"[ \t\r\n]*")
_SCALAR = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?|true|false|null")
_CLOSING = {"{": "}", "[": "]"}


# json's own string scanner (C): one call over one string; typeshed does not declare it.
_SCAN: Callable[[str, int], tuple[str, int]] = vars(json.decoder)["scanstring"]


def _scanstring(body: str, start: int) -> tuple[str, int]:
    """The JSON string whose opening quote is at `start - 1`, decoded, and where it ends."""
    return _SCAN(body, start)


def pretty_body(body: str) -> str:
    """The rendered provider body, indented as `json.dumps(indent=2)` would, with very
    long strings (image data) cut, up to MAX_BODY_CHARS: read token by token from the
    compact body and stopped there. (Parsing and indenting a whole body of 100,000
    messages took seconds of CPU, the parse one call holding the GIL, for a page that
    shows its first 400,000 characters.)"""
    out: list[str] = []
    size = depth = 0
    n = len(body)
    pos = _skip_space(body, 0)
    try:
        while pos < n and size <= MAX_BODY_CHARS:
            c = body[pos]
            if c == '"':
                value, pos = _scanstring(body, pos + 1)
                piece = json.dumps(_cut(value), ensure_ascii=False)
            elif c in _CLOSING:
                after = _skip_space(body, pos + 1)
                if body[after : after + 1] == _CLOSING[c]:
                    piece, pos = c + _CLOSING[c], after + 1
                else:
                    depth += 1
                    piece, pos = c + "\n" + "  " * depth, pos + 1
            elif c in "}]":
                depth -= 1
                piece, pos = "\n" + "  " * depth + c, pos + 1
            elif c == ",":
                piece, pos = ",\n" + "  " * depth, pos + 1
            elif c == ":":
                piece, pos = ": ", pos + 1
            else:
                scalar = _SCALAR.match(body, pos)
                if scalar is None:
                    raise ValueError(f"unexpected {c!r} at {pos}")
                piece, pos = scalar.group(), scalar.end()
            out.append(piece)
            size += len(piece)
            pos = _skip_space(body, pos)
            if depth < 0:
                raise ValueError("unbalanced")
        if pos >= n and depth:
            raise ValueError("unclosed")
    except ValueError:  # not JSON: shown as it is
        out, pos = [body[: MAX_BODY_CHARS + 1]], n
    text = surrogates_escaped("".join(out))
    if pos < n:  # stopped: what is left is not indented, so not counted in characters
        return text[:MAX_BODY_CHARS] + f"\n… [cut here: the body is {n:,} characters of JSON]"
    if len(text) > MAX_BODY_CHARS:
        text = text[:MAX_BODY_CHARS] + f"\n… [{len(text) - MAX_BODY_CHARS:,} more characters]"
    return text


def _skip_space(body: str, pos: int) -> int:
    """Where the JSON whitespace at `pos` ends."""
    space = _SPACE.match(body, pos)
    return space.end() if space is not None else pos


def parts_text(parts: tuple[ContentPart, ...]) -> str:
    out = []
    for p in parts:
        if p.text is not None:
            out.append(p.text)
        elif p.attachment is not None:
            a = p.attachment
            out.append(f"[attachment {a.artifact_id} ({a.mime_type}, {a.size_bytes:,} bytes)]")
        elif p.browser_element is not None:
            e = p.browser_element
            out.append(f"[page element {e.tag} {e.selector} at {e.url}] {e.text}")
    return "\n".join(out)


def event_text(event: Event) -> str:
    """A canonical event as plain text (the template escapes it)."""
    p = event.payload
    if isinstance(p, UserMessage | ImportedMessage):
        return parts_text(p.parts)
    if isinstance(p, AssistantMessage):
        calls = "".join(f"\n→ {c.name}({c.arguments_json}) [{c.call_id}]" for c in p.tool_calls)
        return parts_text(p.parts) + calls
    if isinstance(p, ToolCall):
        return f"{p.name}({p.arguments_json}) [{p.call_id}]"
    if isinstance(p, ToolResult):
        head = f"[{p.call_id}{' error' if p.is_error else ''}] "
        if p.blob is not None:
            return head + f"({p.blob.size_bytes:,} bytes stored as a blob) " + p.blob.preview
        return head + (p.text or "")
    if isinstance(p, Attachment):
        return f"[attachment {p.ref.artifact_id} ({p.ref.mime_type}, {p.ref.size_bytes:,} bytes)]"
    if isinstance(p, BrowserSelection):
        e = p.element
        return f"[page element {e.tag} {e.selector} at {e.url}] {e.text}"
    if isinstance(p, TurnCancelled):
        return p.reason
    return ""
