"""Tool registry, tool_search activations and reads of stored tool results (R-TOOL)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from server.compiler.builtin_tools import LOAD_RULE, READ_TOOL_RESULT, TOOL_SEARCH
from server.compiler.render_common import FUNCTION_NAME
from server.compiler.textscan import (
    MAX_PATTERN_CHARS,
    LineSearch,
    PatternError,
    compile_search,
    line_slice,
    loads_strict,
)
from server.compiler.tool_cap import searchable_registry, tool_cap
from server.compiler.tool_search import search_tools
from server.domain.errors import CtxccError, Reason, invalid
from server.domain.model import ToolResult
from server.domain.tools import ToolSpec
from server.domain.validation import check_id
from server.service.blocking import Blocking
from server.service.lanes import PendingWork
from server.service.ports import EventStore

# Names every provider accepts for functions: OpenAI's and Anthropic's characters and
# length, and Gemini's first character (a letter or an underscore).
_NAME = FUNCTION_NAME
# Search keywords are words: each short, and a tool's together no longer than a
# description may be. The registry is read by every compile and kept outside the
# session's byte quota, so nothing in a definition may grow without a bound.
MAX_KEYWORD_CHARS = 128
RESERVED = {LOAD_RULE.name, READ_TOOL_RESULT.name, TOOL_SEARCH.name}
# CPU seconds one search may spend over the whole result (not per line): RE2 scans
# tens of MB a second, so only a pathological pattern on a huge result reaches it.
SEARCH_BUDGET_S = 2.0


@dataclass(frozen=True, slots=True)
class ToolLimits:
    """Abuse guards, configurable; defaults fit real agents' tool sets with room to spare
    (Claude Code's shell tool alone has a ~9,000-character description)."""

    max_tools: int = 512
    max_description_chars: int = 65_536
    max_schema_bytes: int = 256 << 10
    max_schema_depth: int = 64


@dataclass(frozen=True, slots=True)
class Slice:
    text: str
    offset: int
    total: int
    has_more: bool


@dataclass(frozen=True, slots=True)
class Match:
    line: int
    text: str


def _depth(value: object, limit: int) -> int:
    """Nesting depth of parsed JSON, stopping early past `limit`."""
    stack = [(value, 1)]
    deepest = 0
    while stack:
        item, d = stack.pop()
        deepest = max(deepest, d)
        if deepest > limit:
            return deepest
        if isinstance(item, dict):
            stack.extend((v, d + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, d + 1) for v in item)
    return deepest


def check_tool(i: int, spec: ToolSpec, limits: ToolLimits = ToolLimits()) -> None:
    field = f"tools[{i}]"
    if not _NAME.fullmatch(spec.name):
        raise invalid(
            f"{field}.name",
            "tool names are 1-64 characters of [A-Za-z0-9_-], the first a letter or '_'",
        )
    if spec.name in RESERVED:
        raise invalid(f"{field}.name", f"{spec.name} is a built-in tool of ctxcc")
    if len(spec.description) > limits.max_description_chars:
        raise invalid(
            f"{field}.description",
            f"description is over {limits.max_description_chars} characters "
            "(max_tool_description_chars)",
        )
    for keyword in spec.search_keywords:
        if len(keyword) > MAX_KEYWORD_CHARS:
            raise invalid(
                f"{field}.search_keywords",
                f"a search keyword is over {MAX_KEYWORD_CHARS} characters",
            )
    if sum(len(k) for k in spec.search_keywords) > limits.max_description_chars:
        raise invalid(
            f"{field}.search_keywords",
            f"search keywords are over {limits.max_description_chars} characters together "
            "(max_tool_description_chars)",
        )
    if len(spec.input_schema_json.encode()) > limits.max_schema_bytes:
        raise invalid(
            f"{field}.input_schema_json",
            f"schema is over {limits.max_schema_bytes} bytes (max_tool_schema_bytes)",
        )
    try:
        schema = loads_strict(spec.input_schema_json or "{}")
    except (ValueError, RecursionError):
        raise invalid(f"{field}.input_schema_json", "input_schema_json is not valid JSON") from None
    if not isinstance(schema, dict):
        raise invalid(f"{field}.input_schema_json", "input_schema_json must be a JSON object")
    if schema.get("type", "object") != "object":
        # A tool's input is an object for every provider (OpenAI refuses other
        # parameters, Anthropic's input_schema.type is "object").
        raise invalid(f"{field}.input_schema_json", 'the schema\'s type must be "object"')
    if _depth(schema, limits.max_schema_depth) > limits.max_schema_depth:
        raise invalid(
            f"{field}.input_schema_json",
            f"input_schema_json nests deeper than {limits.max_schema_depth} "
            "(max_tool_schema_depth)",
        )


def _spec_bytes(spec: ToolSpec) -> int:
    """What a compile counts of a definition (its name, description and schema), and
    the keywords a search reads."""
    texts = (spec.name, spec.description, spec.input_schema_json, *spec.search_keywords)
    return sum(len(t.encode()) for t in texts)


class ToolUseCases:
    def __init__(
        self,
        store: EventStore,
        blocking: Blocking,
        limits: ToolLimits = ToolLimits(),
        pending: PendingWork | None = None,
    ) -> None:
        self._store = store
        self._blocking = blocking
        self._limits = limits
        # Shared with the compiles: definitions registered are text the next compile
        # counts, as appended events are (lanes.py).
        self._pending = pending or PendingWork()

    async def register(
        self, session_id: str, specs: tuple[ToolSpec, ...], replace_all: bool
    ) -> int:
        check_id("session_id", session_id)
        most = self._limits.max_tools
        if len(specs) > most:
            raise invalid("tools", f"at most {most} tools per session (max_tools)")
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise invalid("tools", "tool names repeat in one request")
        # Each schema is parsed and walked: up to 64 MiB of definitions in one request
        # (a 240 KB schema ~50 ms of CPU, so seconds for hundreds), not on the event loop.
        await self._blocking.compute(self._check_tools, specs)
        count, changed = await self._blocking.run(
            self._store.put_tools, session_id, specs, replace_all, most
        )
        # Megabytes of new definitions are counted by the next compile however little its
        # log holds (a 2 MB set ~0.75 s on a Claude route): not the light lane's work.
        # Those registered again as they were are not (an agent that registers its tool
        # set before every step): their counts are the counter's cached ones.
        self._pending.landed(session_id, sum(_spec_bytes(s) for s in changed))
        return count

    def _check_tools(self, specs: tuple[ToolSpec, ...]) -> None:
        """Blocking (CPU): every definition's checks, schemas parsed one at a time."""
        for i, spec in enumerate(specs):
            check_tool(i, spec, self._limits)

    async def list_tools(self, session_id: str) -> list[ToolSpec]:
        check_id("session_id", session_id)
        await self._blocking.run(self._store.get_session, session_id)
        return await self._blocking.run(self._store.list_tools, session_id)

    async def search(self, session_id: str, query: str, max_results: int) -> list[ToolSpec]:
        """Matches are activated for the current turn only; the registry never changes."""
        check_id("session_id", session_id)
        if len(query) > 1_000:
            raise invalid("query", "query is over 1000 characters")
        most = min(max_results, 50)
        # Words are read from every deferred definition (512 of 64 KB descriptions: ~8 s
        # of CPU): compute work, which must not take the storage threads other sessions'
        # appends need.
        found = await self._blocking.compute(self._search_tools, session_id, query, most)
        if found:
            # Deferred definitions are counted only once activated: by the next compile.
            self._pending.landed(session_id, sum(_spec_bytes(s) for s in found))
        return found

    def _search_tools(self, session_id: str, query: str, most: int) -> list[ToolSpec]:
        """Blocking (CPU), one hop: the search and, when it found tools, their activation."""
        session = self._store.get_session(session_id)
        # On a route with a tool cap, direct tools a view may not carry are searched as
        # deferred ones (tool_cap.py): the route is the one the session last compiled for,
        # whose view offered the tool_search being answered.
        last = self._store.get_last_compile(session_id)
        cap = tool_cap(last.route.protocol) if last is not None else None
        registry = searchable_registry(self._store.list_tools(session_id), cap)
        found = search_tools(registry, query, most)
        if found:
            turn = self._store.last_turn_start(session_id, session.head_seq)
            names = tuple(s.name for s in found)
            self._store.add_activations(
                session_id, turn.seq if turn else 0, names, session.create_time_ns
            )
        return found

    def _result_data(self, session_id: str, call_id: str) -> bytes:
        """Blocking: the whole stored result's bytes (up to the 32 MiB result limit)."""
        self._store.get_session(session_id)
        event = self._store.find_tool_result(session_id, call_id)
        if event is None or not isinstance(event.payload, ToolResult):
            raise CtxccError(
                Reason.TOOL_RESULT_NOT_FOUND, f"no result for call {call_id!r} in this session"
            )
        result = event.payload
        if result.blob is None:
            return (result.text or "").encode()
        data = self._store.get_blob(result.blob.sha256)
        if data is None:
            raise CtxccError(Reason.TOOL_RESULT_NOT_FOUND, "the stored result is gone")
        return data

    def _result_text(self, session_id: str, call_id: str) -> str:
        return self._result_data(session_id, call_id).decode("utf-8", errors="replace")

    def _lines(self, session_id: str, call_id: str, offset: int, limit: int) -> Slice:
        limit = min(limit or 200, 2_000)
        # Decoded and split in pieces, keeping only the lines asked for (line_slice).
        text, total = line_slice(self._result_data(session_id, call_id), offset, limit)
        return Slice(text, offset, total, offset + limit < total)

    def _bytes(self, session_id: str, call_id: str, offset: int, limit: int) -> Slice:
        data = self._result_text(session_id, call_id).encode()
        limit = min(limit or 16_384, 1 << 20)
        chunk = data[offset : offset + limit]
        return Slice(
            chunk.decode("utf-8", errors="replace"), offset, len(data), offset + limit < len(data)
        )

    def _search(
        self, session_id: str, call_id: str, pattern: str, is_regex: bool, context: int, most: int
    ) -> list[Match]:
        """Blocking: the session and result are checked before the pattern is compiled,
        and the scan stops when the request's CPU budget is spent."""
        data = self._result_data(session_id, call_id)
        try:
            program: Any = compile_search(pattern, is_regex)
        except PatternError as exc:
            raise CtxccError(Reason.INVALID_PATTERN, str(exc)) from None
        scan = LineSearch(data, program, min(context, 20), min(most or 20, 200))
        spent = time.thread_time() + SEARCH_BUDGET_S
        while not scan.done:
            scan.step()
            if time.thread_time() > spent:
                raise CtxccError(
                    Reason.INVALID_PATTERN,
                    f"the search used its {SEARCH_BUDGET_S:g} s budget before the end of the "
                    "result; simplify the pattern or page through the result",
                )
        return [Match(m.line, m.text) for m in scan.found]

    @staticmethod
    def _check_call(session_id: str, call_id: str) -> None:
        check_id("session_id", session_id)
        if not call_id:
            raise invalid("call_id", "call_id is required")

    # Results can be tens of MiB: reading, decoding and slicing them happen on the I/O
    # pool, never on the event loop.
    async def read_lines(self, session_id: str, call_id: str, offset: int, limit: int) -> Slice:
        self._check_call(session_id, call_id)
        return await self._blocking.run(self._lines, session_id, call_id, offset, limit)

    async def read_bytes(self, session_id: str, call_id: str, offset: int, limit: int) -> Slice:
        self._check_call(session_id, call_id)
        return await self._blocking.run(self._bytes, session_id, call_id, offset, limit)

    async def search_result(
        self, session_id: str, call_id: str, pattern: str, is_regex: bool, context: int, most: int
    ) -> list[Match]:
        if not pattern:
            raise invalid("search.pattern", "pattern is required")
        if len(pattern) > MAX_PATTERN_CHARS:
            raise invalid("search.pattern", f"pattern is over {MAX_PATTERN_CHARS} characters")
        self._check_call(session_id, call_id)
        return await self._blocking.compute(
            self._search, session_id, call_id, pattern, is_regex, context, most
        )
