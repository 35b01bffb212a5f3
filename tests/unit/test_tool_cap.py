"""A view never carries more tools than its route's provider takes (tool_cap.py): the
direct tools that do not fit are offered through tool_search, as deferred tools are,
found and activated from the next step; routes without a stated limit are unchanged,
and a compile recorded before the cap existed is rebuilt without it."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from server.compiler.budget import ModelLimits
from server.compiler.compile import CompileInputs, compile_incremental, compile_view, tool_tokens
from server.compiler.render import RenderFormat, render
from server.compiler.tool_cap import (
    ACTIVATION_SLOTS,
    CUT_MARK,
    DESCRIPTION_CAP,
    RESERVE,
    searchable_registry,
    tool_cap,
)
from server.compiler.tool_search import search_tools
from server.compiler.view import CompiledView, ToolOrigin
from server.domain.model import (
    AssistantMessage,
    ContentPart,
    Event,
    Route,
    Session,
    ToolCall,
    ToolResult,
    UserMessage,
)
from server.domain.tools import ToolSpec, ToolVisibility
from tests.conformance.sdk_types import errors_for
from tests.unit.test_system_prompt import WordCounter

SCHEMA = '{"type": "object", "properties": {"q": {"type": "string"}}}'
OPENAI = Route("c", "openai-chat", "api", "gpt-4o")
RESPONSES = Route("c", "openai-responses", "api", "gpt-4o")
ANTHROPIC = Route("c", "anthropic-messages", "api", "claude-sonnet-4")
GEMINI = Route("c", "gemini", "api", "gemini-2.5-pro")
FORMAT_KIND = {
    RenderFormat.OPENAI_CHAT: "openai_chat",
    RenderFormat.OPENAI_RESPONSES: "openai_responses",
    RenderFormat.ANTHROPIC_MESSAGES: "anthropic_messages",
    RenderFormat.GEMINI: "gemini",
}


def tools(n: int, prefix: str = "mcp_t") -> tuple[ToolSpec, ...]:
    return tuple(
        ToolSpec(f"{prefix}{i:03d}", f"Tool number {i} of server {prefix}", SCHEMA)
        for i in range(n)
    )


def user(text: str) -> UserMessage:
    return UserMessage((ContentPart(text=text),))


def inputs(route: Route, registry: tuple[ToolSpec, ...], *payloads: Any, **kw: Any) -> Any:
    events = tuple(Event(i + 1, f"e{i + 1}", 0, p) for i, p in enumerate(payloads or (user("hi"),)))
    kw.setdefault("limits", ModelLimits(context_window=1_000_000, max_output_tokens=8_000))
    return CompileInputs(
        "s:1", Session("s", 0, 0), events, len(events), route, tools=registry, **kw
    )


def view(route: Route, registry: tuple[ToolSpec, ...], *payloads: Any, **kw: Any) -> CompiledView:
    return compile_view(inputs(route, registry, *payloads, **kw), WordCounter())


def names(v: CompiledView) -> list[str]:
    return [t.spec.name for t in v.tools]


def test_limits() -> None:
    assert tool_cap("openai-chat") == tool_cap("openai-responses") == tool_cap("OpenAI") == 128
    assert tool_cap("gemini") == 512
    assert tool_cap("anthropic-messages") is None and tool_cap("") is None


def test_200_direct_tools_on_an_openai_route_give_bodies_the_sdk_takes() -> None:
    registry = tools(200)
    for route in (OPENAI, RESPONSES):
        v = view(route, registry)
        assert len(v.tools) == 128
        # As many direct tools as fit, in name order, then tool_search (the only built-in).
        assert names(v)[:127] == [s.name for s in registry[:127]]
        assert v.tools[-1].origin == ToolOrigin.BUILTIN_TOOL_SEARCH
        assert v.tools_deferred_by_cap == 73
        assert any("73 of the 200 direct tools" in n and "128" in n for n in v.notes), v.notes
        for fmt in (RenderFormat.OPENAI_CHAT, RenderFormat.OPENAI_RESPONSES):
            body = json.loads(render(v, fmt))
            assert len(body["tools"]) == 128
            assert errors_for(FORMAT_KIND[fmt], body) == []


def test_every_tool_left_out_is_found_by_tool_search_and_activated_next_step() -> None:
    registry = tools(200)
    first = view(OPENAI, registry)
    left_out = [s for s in registry if s.name not in names(first)]
    assert len(left_out) == 73
    searchable = searchable_registry(registry, 128)
    for s in left_out:  # each is what a search by its name finds first
        assert search_tools(searchable, s.name)[0].name == s.name
    target = left_out[-1].name
    call = ToolCall("c1", "tool_search", json.dumps({"query": target}))
    found = search_tools(searchable, target)
    after = view(
        OPENAI,
        registry,
        user("use the last tool"),
        AssistantMessage((), (call,)),
        ToolResult("c1", "tool_search", text=", ".join(s.name for s in found)),
    )
    by_name = {t.spec.name: t for t in after.tools}
    assert by_name[target].origin == ToolOrigin.ACTIVATED
    # Sent as registered (a direct tool), its definition the registry's own.
    assert by_name[target].spec == next(s for s in registry if s.name == target)
    assert len(after.tools) == 128 and "tool_search" in by_name
    # Activated over the SearchTools RPC instead (it records what the search found): the
    # same view.
    assert len(found) == 5
    rpc = view(OPENAI, registry, activated_tools=tuple(s.name for s in found))
    assert names(rpc) == names(after)
    # A direct tool the view carries anyway is not moved by an activation.
    assert names(view(OPENAI, registry, activated_tools=("mcp_t000",))) == names(first)


def test_a_registry_that_fits_is_unchanged_and_no_tool_search_is_added() -> None:
    registry = tools(128)
    for route in (OPENAI, ANTHROPIC, GEMINI):
        v = view(route, registry)
        assert names(v) == [s.name for s in registry] and not v.notes
        assert v.tools_deferred_by_cap == 0


def test_anthropic_and_gemini_routes_are_unchanged_under_their_limits() -> None:
    registry = (*tools(200), ToolSpec("grep_logs", "Search logs", SCHEMA, ToolVisibility.DEFERRED))
    for route in (ANTHROPIC, GEMINI, Route("c", "", "", "gpt-4o")):
        v = view(route, registry)
        old = view(route, registry, tool_capping=0)
        assert v == old
        assert len(v.tools) == 201 and v.tools_deferred_by_cap == 0
        assert not any("tool_search in this view" in n for n in v.notes)


def test_gemini_is_capped_at_512_function_declarations() -> None:
    registry = (*tools(512), ToolSpec("grep_logs", "Search logs", SCHEMA, ToolVisibility.DEFERRED))
    v = view(GEMINI, registry)
    assert len(v.tools) == 512 and v.tools_deferred_by_cap == 1
    body = json.loads(render(v, RenderFormat.GEMINI))
    assert len(body["tools"][0]["functionDeclarations"]) == 512
    assert errors_for("gemini", body) == []
    assert len(view(GEMINI, registry, tool_capping=0).tools) == 513


def test_a_compile_recorded_before_the_cap_is_rebuilt_without_it() -> None:
    """Exact time travel: tool_capping 0 (a basis stored before it was kept) compiles
    the tools as before, byte for byte, where the capped view differs."""
    registry = tools(200)
    old = view(OPENAI, registry, tool_capping=0)
    assert len(old.tools) == 200 and not old.notes
    assert names(old) == [s.name for s in registry]
    new = view(OPENAI, registry)
    assert render(old, RenderFormat.OPENAI_CHAT) != render(new, RenderFormat.OPENAI_CHAT)
    assert old == view(OPENAI, registry, tool_capping=0)


def test_activations_take_their_slots_before_the_direct_tools_after_the_prefix() -> None:
    registry = tools(200) + tuple(
        ToolSpec(f"zz_deferred{i:02d}", "A deferred tool", SCHEMA, ToolVisibility.DEFERRED)
        for i in range(ACTIVATION_SLOTS + 5)
    )
    activated = tuple(s.name for s in registry[200:])
    v = view(OPENAI, registry, activated_tools=activated)
    assert len(v.tools) == 128
    shown = names(v)
    prefix = 128 - RESERVE
    assert shown[:prefix] == [s.name for s in registry[:prefix]]  # always offered
    origins = [t.origin for t in v.tools]
    # The room after the prefix and tool_search goes to activations first: 128 - 1 - 93.
    assert origins.count(ToolOrigin.ACTIVATED) == 128 - 1 - prefix
    assert any("3 tools activated this turn are not offered" in n for n in v.notes), v.notes


def test_the_incremental_compile_gives_the_same_capped_view() -> None:
    registry = tools(200)
    call = ToolCall("c1", "tool_search", '{"query": "mcp_t150"}')
    payloads: list[Any] = [
        user("go"),
        AssistantMessage((), (call,)),
        ToolResult("c1", "tool_search", text="mcp_t150"),
        user("again"),
    ]
    memo = None
    for k in range(1, len(payloads) + 1):
        full = view(OPENAI, registry, *payloads[:k])
        step, memo, _ = compile_incremental(
            inputs(OPENAI, registry, *payloads[:k]), WordCounter(), memo
        )
        assert step == full
        assert len(step.tools) == 128
        # Activation lasts for the turn: from the result until the next user message.
        assert ("mcp_t150" in names(step)) == (k == 3), k
    assert replace(step, notes=()) != step  # the view says why tools are missing


def _utf16(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


# OpenHands' browser tool, 4,394 characters: OpenAI refused it (OpenHands#4838).
BROWSER = ToolSpec(
    "browser",
    "".join(
        f"Line {i}: interact with the page by element id, one action a call.\n" for i in range(70)
    )[:4_394],
    SCHEMA,
)


def test_an_openai_view_cuts_a_description_over_1024_characters_and_says_so() -> None:
    assert len(BROWSER.description) == 4_394
    registry = (BROWSER, ToolSpec("grep", "Search files.", SCHEMA))
    for route in (OPENAI, RESPONSES):
        v = view(route, registry)
        shown = {t.spec.name: t for t in v.tools}
        text = shown["browser"].spec.description
        assert len(text) <= DESCRIPTION_CAP and text.endswith(CUT_MARK)
        # Cut at a line's end, well into the room: the kept part is the registry's text.
        kept = text[: -len(CUT_MARK)]
        assert BROWSER.description.startswith(kept + "\n")
        assert len(kept) > DESCRIPTION_CAP * 3 // 4 - len(CUT_MARK)
        assert shown["grep"].spec.description == "Search files."
        # What the view counts is what is sent.
        counted = shown["browser"].tokens
        assert counted == tool_tokens(shown["browser"].spec, WordCounter())
        assert counted < tool_tokens(BROWSER, WordCounter())
        assert any("descriptions of 1 tools (browser)" in n and "1024" in n for n in v.notes)
        for fmt in (RenderFormat.OPENAI_CHAT, RenderFormat.OPENAI_RESPONSES):
            body = json.loads(render(v, fmt))
            sent = [t.get("function", t)["description"] for t in body["tools"]]
            assert max(len(d) for d in sent) <= DESCRIPTION_CAP
    # Anthropic and Gemini state no limit: the registry's text, no note.
    for route in (ANTHROPIC, GEMINI):
        v = view(route, registry)
        assert v.tools[0].spec == BROWSER and not v.notes


def test_a_description_cut_fits_in_utf16_code_units_too() -> None:
    """Astral characters are one code point and two UTF-16 units: a description of 700
    of them is under 1,024 code points and over 1,024 units, and is cut to fit both."""
    wide = ToolSpec("emoji", "\U0001f600" * 700, SCHEMA)
    text = view(OPENAI, (wide,)).tools[0].spec.description
    assert text.endswith(CUT_MARK) and _utf16(text) <= DESCRIPTION_CAP
    exact = ToolSpec("exact", "x" * DESCRIPTION_CAP, SCHEMA)
    assert view(OPENAI, (exact,)).tools[0].spec == exact  # fits: untouched
    over = ToolSpec("over", "x" * (DESCRIPTION_CAP + 1), SCHEMA)
    cut = view(OPENAI, (over,)).tools[0].spec.description
    assert len(cut) <= DESCRIPTION_CAP and cut.startswith("x" * 900)


def test_a_compile_recorded_before_the_description_cap_is_rebuilt_without_it() -> None:
    """tool_capping 1 (count cap only): the description as registered, as it was sent."""
    v = view(OPENAI, (BROWSER,), tool_capping=1)
    assert v.tools[0].spec == BROWSER and not v.notes
    assert view(OPENAI, (BROWSER,)).tools[0].spec != BROWSER


def test_a_compile_recorded_before_any_script_search_replays_ascii_words() -> None:
    """tool_search finds tools by words of any script from TOOL_CAPPING 3; a compile
    recorded before it is rebuilt with its searches replayed as they ran then (ASCII
    words only, under which a Chinese query found nothing)."""
    registry = (ToolSpec("translate", "翻译文本", SCHEMA, visibility=ToolVisibility.DEFERRED),)
    turn = (
        user("翻译这个"),
        AssistantMessage((), (ToolCall("c1", "tool_search", '{"query": "翻译"}'),)),
        ToolResult("c1", "tool_search", text="translate"),
    )
    assert names(view(ANTHROPIC, registry, *turn)) == ["translate", "tool_search"]
    assert names(view(ANTHROPIC, registry, *turn, tool_capping=2)) == ["tool_search"]


def test_a_compile_recorded_before_plural_forms_replays_words_as_written() -> None:
    """From TOOL_CAPPING 4 a word and its plural are one word in a search; a compile
    recorded before it is rebuilt with its searches replayed as they ran then (Gemini
    CLI's `replace`, for "surgical edits to existing files", was not found by "edit a
    file")."""
    registry = (
        ToolSpec(
            "replace",
            "Preferred for surgical edits to existing files.",
            SCHEMA,
            visibility=ToolVisibility.DEFERRED,
        ),
    )
    turn = (
        user("fix the typo"),
        AssistantMessage((), (ToolCall("c1", "tool_search", '{"query": "edit a file"}'),)),
        ToolResult("c1", "tool_search", text="replace"),
    )
    assert names(view(ANTHROPIC, registry, *turn)) == ["replace", "tool_search"]
    assert names(view(ANTHROPIC, registry, *turn, tool_capping=3)) == ["tool_search"]
