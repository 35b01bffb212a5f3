"""What every provider renderer shares: content helpers, the output cap, tool-call
arguments as an object, and the cache hints' inputs."""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Collection, Mapping
from typing import Any

from server.compiler import renderings
from server.compiler.textscan import LONE_SURROGATE, loads_strict, parse_json
from server.compiler.view import CompiledView, ViewMessage, ViewPart
from server.domain.model import Role

JSON = dict[str, Any]


def args_object(arguments_json: str) -> JSON:
    """A call's arguments as the object providers expect. The projection has already
    made every call's arguments a JSON object (see projection.well_formed_calls)."""
    value = loads_strict(arguments_json or "{}")
    assert isinstance(value, dict)
    return encodable(value) if _may_escape_surrogates(arguments_json) else value


def _may_escape_surrogates(text: str) -> bool:
    # Client text holds no surrogate itself (it came as UTF-8): only a \uD8xx-\uDFxx
    # escape can make one, so text without "\ud" needs no walk.
    return "\\ud" in text or "\\uD" in text


def encodable(value: Any) -> Any:
    """Parsed JSON with each lone surrogate (which JSON may escape, "\\ud800") as U+FFFD,
    as counting takes it: no UTF-8 text holds one, and the SDKs encode bodies as UTF-8
    (openai and anthropic raise UnicodeEncodeError on one)."""
    if isinstance(value, str):
        return LONE_SURROGATE.sub("\ufffd", value) if not value.isascii() else value
    if isinstance(value, dict):
        return {encodable(k): encodable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [encodable(v) for v in value]
    return value


def args_text(arguments_json: str) -> str:
    return arguments_json or "{}"


def schema(
    text: str,
    *,
    flat: bool = False,
    properties: bool = False,
    top_ref: bool = False,
    ref_objects: bool = False,
) -> JSON:
    """A tool's input schema as every API takes it: an object schema. RegisterTools
    refuses a top-level `type` other than "object"; one that names no type (`{"properties":
    ...}`, a bare `anyOf`) gets it, as OpenAI refuses parameters without `type: object`
    and Anthropic's `input_schema.type` is required. With `flat`, no combinator at the
    top level either (flat_schema). With `properties`, a schema without `properties`
    (or with a value that is no object, as `null` from a Go server's nil map) gets
    `"properties": {}` (which constrains nothing): OpenAI refuses parameters
    without them ("Invalid schema for function 'f': In context=(), object schema missing
    properties"), the form MCP servers give a tool that takes no arguments (`{"type":
    "object"}`, or with `"additionalProperties": false` as the MCP specification
    recommends). With `top_ref`, a top level that is a local `$ref` is the schema it
    names, beside the top level's other keys (its definitions, for the references
    below); with `ref_objects` too, only when what it names describes an object (its
    `type` "object", a list holding it, sent as "object", or none): a reference to a
    string schema was sent as `"type": "string"`, which OpenAI and Anthropic refuse."""
    ok, value = parse_json(text or "{}")
    if ok and isinstance(value, dict) and value:
        value = encodable(value) if _may_escape_surrogates(text) else value
        if top_ref and isinstance(value.get("$ref"), str):
            value = _top_ref_resolved(value, ref_objects)
        if flat and not _TOP_LEVEL.isdisjoint(value):
            value = flat_schema(value)
        if "type" not in value:
            value = {"type": "object", **value}
        if properties and not isinstance(value.get("properties"), dict):
            value = {**value, "properties": {}}
        return value
    return {"type": "object", "properties": {}}


def _top_ref_resolved(value: dict[str, object], objects_only: bool) -> dict[str, object]:
    """A schema `{"$ref": "#/$defs/Node", "$defs": {...}}` as the definition it names,
    the top level's own keys kept beside it (and winning: they sit next to the reference
    on purpose). A reference that names nothing, or no object, is left as it is; with
    `objects_only`, so is one naming a schema of another type (a string, an array), and
    a type list holding "object" (`["object", "null"]`) is "object": a tool's arguments
    are an object, and OpenAI and Anthropic refuse any other top-level type."""
    named = _resolved(value, {"$ref": value["$ref"]})
    if not isinstance(named, dict) or "$ref" in named:
        return value
    if objects_only and "type" in named:
        kind = named["type"]
        if kind != "object" and not (isinstance(kind, list) and "object" in kind):
            return value
        named = {**named, "type": "object"}
    return {**named, **{k: v for k, v in value.items() if k != "$ref"}}


# OpenAI refuses parameters with "'oneOf'/'anyOf'/'allOf'/'enum'/'not' at the top level"
# (invalid_function_parameters) and Anthropic an input_schema with "oneOf, allOf, or
# anyOf at the top level"; zod and pydantic unions, and many MCP servers, make them.
_TOP_LEVEL = frozenset({"anyOf", "oneOf", "allOf", "enum", "not"})


def flat_schema(value: Mapping[str, object]) -> dict[str, object]:
    """An object schema without top-level combinators, for OpenAI and Anthropic: the
    properties of every branch side by side (a branch that is itself a union flattened
    first; local `$ref`s resolved, through chains and any JSON pointer into the schema,
    `#/$defs/...`, `#/definitions/...`, `#/components/schemas/...`), a property the
    branches describe differently as the `anyOf` of its descriptions (allowed below the
    top level); required what `allOf` requires and what every `anyOf`/`oneOf` branch
    does; `enum` and `not` dropped. The model loses which combination is valid, the tool
    still validates its arguments, and the request is not refused."""
    return _flat(value, value, 0, {})


# Unions nested deeper than this (or $ref cycles through them) add nothing more.
_FLAT_DEPTH = 8

# A branch flattened at a depth, by the branch's identity in the schema: a union of k
# `$ref`s to one definition that is itself such a union, eight levels down, is a schema
# of a few hundred bytes that names k^8 branches; each (branch, depth) is flattened once.
_Flattened = dict[tuple[int, int], dict[str, object]]


def _flat(
    value: Mapping[str, object], root: Mapping[str, object], depth: int, done: _Flattened
) -> dict[str, object]:
    out = {k: v for k, v in value.items() if k not in _TOP_LEVEL}
    shapes: dict[str, list[object]] = {}
    # Each property's shapes by _equal_key: `shape not in shapes[name]` compared every
    # shape with all kept before it, quadratic in the branches (a 250 KB union of 7,000
    # one-property branches took ~0.5 s a tool, at every compile and render format).
    seen_keys: dict[str, set[object]] = {}
    required: list[str] = []

    def add(branch: object) -> list[str] | None:
        """Adds a branch's properties; its required names (None: not an object)."""
        branch = _resolved(root, branch)
        if isinstance(branch, dict) and depth < _FLAT_DEPTH and not _TOP_LEVEL.isdisjoint(branch):
            # Every branch lives in `root` while this runs, so its id names it.
            key = (id(branch), depth + 1)
            flattened = done.get(key)
            if flattened is None:
                flattened = done[key] = _flat(branch, root, depth + 1, done)
            branch = flattened
        if not isinstance(branch, dict) or not isinstance(branch.get("properties", {}), dict):
            return None
        for name, shape in dict(branch.get("properties") or {}).items():
            same = _equal_key(shape)
            seen = seen_keys.setdefault(str(name), set())
            if same not in seen:
                seen.add(same)
                shapes.setdefault(str(name), []).append(shape)
        names = branch.get("required")
        return [str(n) for n in names] if isinstance(names, list) else []

    required += add(out) or []
    all_of = value.get("allOf")
    for branch in all_of if isinstance(all_of, list) else ():
        required += add(branch) or []
    for key in ("anyOf", "oneOf"):
        branches = value.get(key)
        if isinstance(branches, list) and branches:
            each = [add(b) for b in branches]
            if all(r is not None for r in each):
                required += [n for n in each[0] or [] if all(n in (r or []) for r in each)]
    out["properties"] = {n: s[0] if len(s) == 1 else {"anyOf": s} for n, s in shapes.items()}
    kept = [n for n in dict.fromkeys(required) if n in shapes]
    if kept:
        out["required"] = kept
    else:
        out.pop("required", None)
    out["type"] = "object"
    return out


def _equal_key(value: object) -> object:
    """A hashable key of parsed JSON, equal for two values exactly when they are equal
    (`==`, as 1 == 1.0 == True: equal numbers hash alike), to find a repeat in one set
    lookup. The tags keep an object's key from equalling an array's."""
    if isinstance(value, dict):
        return ("object", frozenset((k, _equal_key(v)) for k, v in value.items()))
    if isinstance(value, list):
        return ("array", tuple(_equal_key(v) for v in value))
    return value


def _resolved(root: Mapping[str, object], branch: object) -> object:
    """`branch`, or what its local `$ref` (a JSON pointer into `root`) names, followed
    through chains of references (a cycle, or one that names nothing, stops there)."""
    for _ in range(_FLAT_DEPTH):
        if not isinstance(branch, dict) or not isinstance(ref := branch.get("$ref"), str):
            return branch
        if not ref.startswith("#/"):
            return branch
        target: object = root
        for escaped in ref[2:].split("/"):
            token = escaped.replace("~1", "/").replace("~0", "~")
            if not isinstance(target, dict) or token not in target:
                return branch
            target = target[token]
        branch = target
    return branch


# A function name every API takes: OpenAI's and Anthropic's ^[a-zA-Z0-9_-]{1,64}$, and
# Gemini's first character, a letter or an underscore. RegisterTools holds registered
# names to it; a call in the log may name anything (a model's hallucinated
# `functions.Read` or `Read tool`), which no API takes back in the history.
FUNCTION_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")
_NOT_NAME = re.compile(r"[^A-Za-z0-9_-]")


def call_name(name: str) -> str:
    """A call's name as a body sends it: unchanged when every API takes it, else each
    other character as `_`, a leading `_` where the first is not a letter, at most 64."""
    if FUNCTION_NAME.fullmatch(name):
        return name
    fixed = _NOT_NAME.sub("_", name)
    if not FUNCTION_NAME.match(fixed[:1]):
        fixed = "_" + fixed  # a digit or a dash first
    return fixed[:64]


def text_of(m: ViewMessage, rendering: int) -> str:
    """A message's text as one string, for the messages a format sends as text only (the
    assistant's, a tool result's). An image among the parts of an assistant message (a
    diagram the agent drew) is a note in its place (it was dropped without a word): Chat
    and Responses take text only in an assistant message, Anthropic refuses "'image'
    blocks are not permitted within assistant turns", and Gemini is sent the same. One
    among a tool result's parts (a tool message imported from another session) is noted
    as a tool result's from rendering 10 (as an assistant turn's before)."""
    return "\n".join(p.text if p.text is not None else _not_sent(p, m, rendering) for p in m.parts)


def _not_sent(part: ViewPart, m: ViewMessage, rendering: int) -> str:
    ref = part.attachment
    if ref is None:
        return ""
    tool = m.role is Role.TOOL and rendering >= renderings.IMAGE_NOTES
    where = "a tool result" if tool else "an assistant turn"
    return f"[image {ref.artifact_id} ({ref.mime_type}) not sent: {where} carries no images]"


def system_image_note(part: ViewPart) -> str:
    """The note for an image Chat cannot carry in a system message (its content is text
    only), which another format sends: from rendering 10 (noted as "sent by reference
    only" before, also when it was sent inline elsewhere)."""
    ref = part.attachment
    assert ref is not None
    return (
        f"[image {ref.artifact_id} ({ref.mime_type}) not sent: a system message carries no images]"
    )


# The image types each API takes (OpenAI's and Anthropic's vision guides, Gemini's
# image understanding guide); any other is sent as a note, as the API would refuse it.
OPENAI_IMAGES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
ANTHROPIC_IMAGES = OPENAI_IMAGES
GEMINI_IMAGES = frozenset({"image/png", "image/jpeg", "image/webp", "image/heic", "image/heif"})


# "image/jpg", a common misspelling the daemon reads as a JPEG (image_size.py), is sent as
# image/jpeg, which every provider takes (from renderings.PROVIDER_LIMITS; before, no
# provider was sent it).
_ALIASES = {"image/jpg": "image/jpeg"}


def accepted_images(view: CompiledView, accepted: frozenset[str]) -> frozenset[str]:
    """The image types a body of `view` sends of those the provider takes (`accepted`)."""
    if view.rendering < renderings.PROVIDER_LIMITS:
        return accepted
    return accepted | {alias for alias, mime in _ALIASES.items() if mime in accepted}


def inline_image(
    part: ViewPart, data: Mapping[str, bytes], accepted: Collection[str]
) -> tuple[str, str] | None:
    """(mime type, base64) of an image whose bytes were materialized and whose type the
    provider takes, else None; an alias is sent under the type it stands for."""
    ref = part.attachment
    if ref is None or ref.artifact_id not in data or ref.mime_type not in accepted:
        return None
    mime = _ALIASES.get(ref.mime_type, ref.mime_type)
    return mime, base64.b64encode(data[ref.artifact_id]).decode()


def short_call_id(call_id: str, most: int) -> str:
    """A call id within `most` characters, the same for the same id (its call and its
    result alike): unchanged when it fits, else its first characters, `_` and 12 hex
    digits of its sha256."""
    if len(call_id) <= most:
        return call_id
    return f"{call_id[: most - 13]}_{hashlib.sha256(call_id.encode()).hexdigest()[:12]}"


def image_note(part: ViewPart, accepted: Collection[str]) -> str:
    ref = part.attachment
    assert ref is not None
    if ref.mime_type not in accepted:
        kind = ref.mime_type
        return f"[image {ref.artifact_id} ({kind}) not sent: the provider takes no {kind}]"
    return f"[image {ref.artifact_id} ({ref.mime_type}) sent by reference only]"


def stable_and_volatile(view: CompiledView) -> tuple[str, str]:
    stable = "\n\n".join(s.text for s in view.system_sections if s.stable)
    volatile = "\n\n".join(s.text for s in view.system_sections if not s.stable)
    return stable, volatile


def cache_key(view: CompiledView) -> str:
    return f"ctxcc-{view.prefix_digest[:32]}"


def output_cap(view: CompiledView) -> int:
    """The body's output cap (see budget.output_cap), never the local output reserve."""
    return view.budget.output_cap or view.budget.output_reserve
