"""Provider request bodies from a compiled view: OpenAI Chat Completions, OpenAI
Responses, Anthropic Messages and Gemini generateContent.

Rules the renderers keep (each format's module says what is particular to it):
- the body carries exactly the view: same system text, messages, tools and images;
  a renderer adds no content of its own, so the view's estimate covers the body;
- every body is valid for its provider's official SDK request type (checked in the
  conformance suite) and for the API's semantic rules (pairing, order, roles);
- the output cap is the view's `budget.output_cap` (the caller's value, else the
  model's maximum, lowered only to fit the window), never the local output reserve;
- provider cache hints sit at the end of the stable prefix, which `prefix_digest`
  covers: Anthropic `cache_control`, OpenAI `prompt_cache_key`.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Mapping

from server.compiler import renderings
from server.compiler.render0 import anthropic as anthropic0
from server.compiler.render0 import gemini as gemini0
from server.compiler.render0 import openai as openai0
from server.compiler.render_anthropic import anthropic_messages
from server.compiler.render_common import JSON
from server.compiler.render_gemini import gemini
from server.compiler.render_openai import openai_chat, openai_responses
from server.compiler.textscan import LONE_SURROGATE
from server.compiler.view import CompiledView


class RenderFormat(enum.IntEnum):
    OPENAI_CHAT = 1
    OPENAI_RESPONSES = 2
    ANTHROPIC_MESSAGES = 3
    GEMINI = 4


Renderer = Callable[[CompiledView, Mapping[str, bytes]], JSON]

# The version of the bodies a compile renders, recorded in its basis (renderings.py says
# what each brought).
RENDERING = renderings.LATEST

RENDERERS: dict[RenderFormat, Renderer] = {
    RenderFormat.OPENAI_CHAT: openai_chat,
    RenderFormat.OPENAI_RESPONSES: openai_responses,
    RenderFormat.ANTHROPIC_MESSAGES: anthropic_messages,
    RenderFormat.GEMINI: gemini,
}
RENDERERS_0: dict[RenderFormat, Renderer] = {
    RenderFormat.OPENAI_CHAT: openai0.openai_chat,
    RenderFormat.OPENAI_RESPONSES: openai0.openai_responses,
    RenderFormat.ANTHROPIC_MESSAGES: anthropic0.anthropic_messages,
    RenderFormat.GEMINI: gemini0.gemini,
}


def render_body(
    view: CompiledView, fmt: RenderFormat, data: Mapping[str, bytes] | None = None
) -> JSON:
    """The body as the view's rendering version makes it."""
    return (RENDERERS if view.rendering >= 1 else RENDERERS_0)[fmt](view, data or {})


def render(view: CompiledView, fmt: RenderFormat, data: Mapping[str, bytes] | None = None) -> str:
    """The body as compact JSON text."""
    body = render_body(view, fmt, data)
    return surrogates_escaped(dumps_in_pieces(body))


# Members of a body's array encoded by one json.dumps call at most. Members can be
# large (a tool of a 256 KiB schema, a message of a 1 MiB event): at 256 a call, one
# call encoded the 200 tools of 250 KiB schemas of a body, 52 MB, holding the GIL
# ~0.33 s a format; 16 bounds a call to ~5 MB of such tools (~30 ms), for ~20% more
# encoding time for 100,000 small messages than 256 (0.099 s a format, was 0.081).
DUMPS_PIECE = 16


def _dumps(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def dumps_in_pieces(value: object) -> str:
    """`json.dumps(value, ensure_ascii=False, separators=(",", ":"))`, the same text, with
    the arrays of the body's top level (its messages, contents, tools) encoded
    DUMPS_PIECE members a call: one call over a whole body of 100,000 messages held the
    GIL ~150 ms (and every render format another)."""
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        return _dumps(value)
    members = []
    for key, member in value.items():
        if isinstance(member, list) and len(member) > DUMPS_PIECE:
            pieces = (
                _dumps(member[i : i + DUMPS_PIECE])[1:-1]
                for i in range(0, len(member), DUMPS_PIECE)
            )
            members.append(f"{_dumps(key)}:[{','.join(pieces)}]")
        else:
            members.append(f"{_dumps(key)}:{_dumps(member)}")
    return "{" + ",".join(members) + "}"


def surrogates_escaped(text: str) -> str:
    """JSON text written with non-ASCII kept, with each lone surrogate as its escape.

    A client's JSON may escape a lone surrogate ("\\ud800" in a tool schema or a call's
    arguments, which the renderers parse): valid JSON, but no character UTF-8 can carry.
    Written back as the escape it came as (inside a string, where json.dumps put it), the
    text is still valid JSON of the same value, and encodable."""
    if text.isascii() or not LONE_SURROGATE.search(text):
        return text
    return LONE_SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
