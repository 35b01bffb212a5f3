"""A small front-matter reader for SKILL.md and rule files: `---`, `key: value` lines,
`---`. Only flat string keys are read (quotes stripped, `[a, b]` lists split, a trailing
`# comment` dropped as YAML drops it); anything else is ignored rather than guessed at."""

from __future__ import annotations


def parse_front_matter(text: str) -> tuple[dict[str, str | tuple[str, ...]], str]:
    """Returns (fields, body). Without front matter: ({}, text)."""
    # A leading byte-order mark (editors on Windows save UTF-8 with one) is encoding
    # metadata: left in, the first line is not `---` and the front matter goes unseen.
    text = text.removeprefix("\ufeff")
    lines = text.splitlines()
    if not lines or lines[0].strip() != "---":
        return {}, text
    fields: dict[str, str | tuple[str, ...]] = {}
    for i, line in enumerate(lines[1:], start=1):
        if line.strip() == "---":
            return fields, "\n".join(lines[i + 1 :]).lstrip("\n")
        key, sep, value = line.partition(":")
        key = key.strip()
        if not sep or not key or key.startswith("#") or line[:1].isspace():
            continue
        value = _without_comment(value.strip())
        if value.startswith("[") and value.endswith("]"):
            items = (_unquote(v.strip()) for v in value[1:-1].split(","))
            fields[key] = tuple(v for v in items if v)
        else:
            fields[key] = _unquote(value)
    return {}, text  # no closing marker: not front matter


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def _without_comment(value: str) -> str:
    """`value` without a trailing comment: from a `#` at its start or after whitespace,
    outside a quoted scalar (one that starts with a quote, alone or as a list item). Kept
    in, `activation: matched  # always | on_demand | matched` (the README's own example)
    was no activation the reader knows, and the rule was skipped."""
    quote = ""
    start = True  # at the start of a scalar: a quote here opens a quoted one
    for i, ch in enumerate(value):
        if quote:
            if ch == quote:
                quote = ""
            continue
        if start and ch in "'\"":
            quote, start = ch, False
        elif ch == "#" and (i == 0 or value[i - 1] in " \t"):
            return value[:i].rstrip()
        elif ch in "[,":
            start = True
        elif not ch.isspace():
            start = False
    return value
