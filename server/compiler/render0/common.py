"""What every provider renderer shares: content helpers, the output cap, tool-call
arguments as an object, and the cache hints' inputs."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

from server.compiler.textscan import loads_strict, parse_json
from server.compiler.view import CompiledView, ViewMessage, ViewPart

JSON = dict[str, Any]


def args_object(arguments_json: str) -> JSON:
    """A call's arguments as the object providers expect. The projection has already
    made every call's arguments a JSON object (see projection.well_formed_calls)."""
    value = loads_strict(arguments_json or "{}")
    assert isinstance(value, dict)
    return value


def args_text(arguments_json: str) -> str:
    return arguments_json or "{}"


def schema(text: str) -> JSON:
    ok, value = parse_json(text or "{}")
    if ok and isinstance(value, dict) and value:
        return value
    return {"type": "object", "properties": {}}


def text_of(m: ViewMessage) -> str:
    return "\n".join(p.text for p in m.parts if p.text is not None)


def inline_image(part: ViewPart, data: Mapping[str, bytes]) -> tuple[str, str] | None:
    """(mime type, base64) of an image whose bytes were materialized, else None."""
    ref = part.attachment
    if ref is None or ref.artifact_id not in data:
        return None
    return ref.mime_type, base64.b64encode(data[ref.artifact_id]).decode()


def image_note(part: ViewPart) -> str:
    ref = part.attachment
    assert ref is not None
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
