"""How many tools a provider takes in one request, and which direct tools a view over
that cap offers through `tool_search` instead (R-TOOL-1, R-TOOL-2).

Limits, only where the provider states one (a protocol not listed has none):
- OpenAI, Chat Completions and Responses: 128. The API refuses more with "Invalid
  'tools': array too long. Expected an array with maximum length 128, but got an array
  with length 150 instead." (code `array_above_max_length`; quoted in GitHub issues such
  as zed-industries/zed#32946, musistudio/claude-code-router#686 (gpt-5-mini),
  julep-ai/julep#330); the API reference's `tools`: "A max of 128 functions are
  supported."
- Gemini generateContent: 512 function declarations. `Tool.function_declarations` in the
  google-genai SDK (3.6.1, shared by the Gemini API and Vertex AI) and the Vertex AI API
  reference: "Maximum 512 function declarations can be provided."; the Gemini API
  refuses more with "tools[0].function_declarations: [FIELD_INVALID] At most 512
  function declarations can be specified." (google-gemini/gemini-cli#19083, #25440).
  Vertex's function-calling guide still says 128 (it said 64 before): older than the
  API reference, not enforced here.
- Anthropic Messages: no count limit is stated (only the 32 MB request size), so none.

OpenAI also refuses a function description over 1,024 characters: "Invalid
'tools[13].function.description': string too long. Expected a string with maximum length
1024, but got a string with length 1103 instead." (code `string_above_max_length`; quoted
in getsentry/sentry-mcp#106 (gpt-4o), OpenHands/OpenHands#4838 (its 4,394-character
browser tool), FoundationAgents/OpenManus#993, dnakov/anon-kode#45 (o1, o3-mini, Azure)).
Real agents send longer ones (Claude Code's shell tool, ~9,000), so a view for an
`openai*` route cuts such a description to fit, marked as cut, with a note; the registry
keeps it whole and every other route gets it whole (Anthropic and Gemini state no limit).

The protocol is the route's (`Route.protocol`, e.g. "openai-chat", "openai-responses",
"gemini"): it names where the request goes, so the view is shaped for it whatever
formats a compile also renders.

A view over the cap keeps the first `cap - RESERVE` direct tools (name order) always,
the PREFIX; the direct tools after it are the overflow candidates, searchable by
`tool_search` as deferred tools are. The set searched depends on the registry and the
route only, so the SearchTools RPC and the compile's replay of a `tool_search` call in
the log find the same tools. Slots go to the built-ins, the prefix, then activated
tools, then as many more direct tools (name order) as fit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from server.domain.tools import ToolSpec, ToolVisibility

# The version of tool capping (and of tool_search's words) a compile applies, recorded
# in its basis: a rebuild of a recorded compile caps and searches as that compile did
# (exact time travel; compiles recorded before the version was kept are version 0,
# which caps nothing).
# 1: the count cap; 2: also OpenAI's description cap; 3: also tool_search matches words
# of any script, CJK text by character pairs (tool_search.py; before, ASCII words only);
# 4: also a word and its plural form are one word in a search, and a camel-case name's
# parts are words of it (tool_search._singular, tool_search.name_words).
TOOL_CAPPING = 4

# Slots a capped view holds back from the always-offered prefix: the three built-ins
# and room for the tools a turn's searches activate (a search activates 5 by default).
BUILTIN_SLOTS = 3
ACTIVATION_SLOTS = 32
RESERVE = BUILTIN_SLOTS + ACTIVATION_SLOTS


def tool_cap(protocol: str) -> int | None:
    """The most tools a request of this wire protocol may carry; None: no stated limit."""
    p = protocol.strip().lower()
    if p.startswith("openai"):
        return 128
    if p.startswith("gemini"):
        return 512
    return None


# OpenAI's longest function description, and what ends one cut to fit it.
DESCRIPTION_CAP = 1_024
CUT_MARK = " [description cut to the provider's 1,024-character limit]"


def description_cap(protocol: str) -> int | None:
    """The longest tool description a request of this protocol may carry; None: any."""
    return DESCRIPTION_CAP if protocol.strip().lower().startswith("openai") else None


def _utf16_units(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def fitted(spec: ToolSpec, cap: int | None) -> ToolSpec:
    """`spec` with its description cut to `cap` characters (counted as UTF-16 code units,
    which are never fewer than code points: it fits however the provider counts), ending
    with CUT_MARK; unchanged when it fits. The cut is at the last line break, else the last
    space, in the final quarter of the room, so that a word or line is not split."""
    text = spec.description
    n = len(text)
    # A code point is at most two UTF-16 units: only a text over half the cap is encoded
    # (this runs for every tool at every compile).
    if cap is None or n <= cap // 2 or (n <= cap and _utf16_units(text) <= cap):
        return spec
    room = cap - len(CUT_MARK)
    head = text[:room]
    while _utf16_units(head) > room:  # astral characters count twice in UTF-16
        head = head[:-1]
    for sep in ("\n", " "):
        at = head.rfind(sep)
        if at >= room * 3 // 4:
            head = head[:at]
            break
    return replace(spec, description=head.rstrip() + CUT_MARK)


def capped_candidates(
    direct: Sequence[ToolSpec], cap: int | None
) -> tuple[tuple[ToolSpec, ...], tuple[ToolSpec, ...]]:
    """`direct` (sorted by name) split into the prefix every view offers and the overflow
    candidates a view over the cap may offer through tool_search."""
    if cap is None or len(direct) <= cap - RESERVE:
        return tuple(direct), ()
    keep = cap - RESERVE
    return tuple(direct[:keep]), tuple(direct[keep:])


def searchable_registry(registry: Sequence[ToolSpec], cap: int | None) -> tuple[ToolSpec, ...]:
    """The registry as tool_search sees it on a route with this cap: the overflow
    candidates count as deferred. The registry itself never changes."""
    direct = sorted(
        (s for s in registry if s.visibility == ToolVisibility.DIRECT), key=lambda s: s.name
    )
    return with_deferred(registry, capped_candidates(direct, cap)[1])


def with_deferred(registry: Sequence[ToolSpec], over: Sequence[ToolSpec]) -> tuple[ToolSpec, ...]:
    """`registry` with the overflow candidates `over` (capped_candidates) as deferred."""
    if not over:
        return tuple(registry)
    names = {s.name for s in over}
    return tuple(
        replace(s, visibility=ToolVisibility.DEFERRED) if s.name in names else s for s in registry
    )
