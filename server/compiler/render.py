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
    GIL ~150 ms (and every render format another). A member that holds an array longer
    than that is encoded apart, its arrays in pieces too: a merged turn (Anthropic's
    user turn of every tool result of a step, Gemini's parts) is one member of the
    body's messages, and one of 256 blocks of 1 MiB was one call of ~2.7 s."""
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        return _dumps(value)
    return _object(value)


def _object(value: dict[str, object]) -> str:
    """The text of an object whose keys are strings, each array in pieces."""
    members = (
        f"{_dumps(k)}:{_array(v) if isinstance(v, list) else _dumps(v)}" for k, v in value.items()
    )
    return "{" + ",".join(members) + "}"


def _array(items: list[object]) -> str:
    """The text of an array, DUMPS_PIECE members a call; those holding a long array apart."""
    if len(items) <= DUMPS_PIECE and not _holds_long(items):
        return _dumps(items)
    pieces = []
    for i in range(0, len(items), DUMPS_PIECE):
        piece = items[i : i + DUMPS_PIECE]
        if _holds_long(piece):
            pieces.append(",".join(_member(m) for m in piece))
        else:
            pieces.append(_dumps(piece)[1:-1])
    return "[" + ",".join(pieces) + "]"


def _member(value: object) -> str:
    if isinstance(value, list):
        return _array(value)
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return _object(value)
    return _dumps(value)


def _holds_long(items: list[object]) -> bool:
    """Whether a member of `items` is, or has as a value, an array over DUMPS_PIECE long.
    Plain loops: ~10 ms over 100,000 messages (a generator per member took ~30)."""
    for m in items:
        if type(m) is dict:
            for v in m.values():
                if type(v) is list and len(v) > DUMPS_PIECE:
                    return True
        elif type(m) is list and len(m) > DUMPS_PIECE:
            return True
    return False


def surrogates_escaped(text: str) -> str:
    """JSON text written with non-ASCII kept, with each lone surrogate as its escape.

    A client's JSON may escape a lone surrogate ("\\ud800" in a tool schema or a call's
    arguments, which the renderers parse): valid JSON, but no character UTF-8 can carry.
    Written back as the escape it came as (inside a string, where json.dumps put it), the
    text is still valid JSON of the same value, and encodable."""
    if text.isascii() or not LONE_SURROGATE.search(text):
        return text
    return LONE_SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
