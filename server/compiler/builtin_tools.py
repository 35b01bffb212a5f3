"""Definitions of the tools ctxcc itself adds to views. The agent executes them by
calling the matching RPC (SourceService.LoadRule, ToolService.SearchTools,
ToolService.ReadToolResult)."""

from __future__ import annotations

import json

from server.domain.tools import ToolSpec, ToolVisibility


def _schema(properties: dict[str, object], required: list[str]) -> str:
    return json.dumps(
        {"type": "object", "properties": properties, "required": required},
        sort_keys=True,
        separators=(",", ":"),
    )


LOAD_RULE = ToolSpec(
    name="load_rule",
    description="Load the full text of a rule listed in the rule index, by its name.",
    input_schema_json=_schema({"name": {"type": "string", "description": "rule name"}}, ["name"]),
    visibility=ToolVisibility.DIRECT,
)

TOOL_SEARCH = ToolSpec(
    name="tool_search",
    description=(
        "Search for more tools by what you need to do. Matching tools become callable "
        "from your next step until the user's next message."
    ),
    input_schema_json=_schema(
        {"query": {"type": "string", "description": "words describing the capability"}},
        ["query"],
    ),
)

READ_TOOL_RESULT = ToolSpec(
    name="history_read_tool_result",
    description=(
        "Read a stored tool result that the conversation shows only in part: by lines, by "
        "bytes, or by searching it (substring or regular expression)."
    ),
    input_schema_json=_schema(
        {
            "call_id": {"type": "string", "description": "the call whose result to read"},
            "offset": {"type": "integer", "description": "first line (or byte) to read"},
            "limit": {"type": "integer", "description": "lines (or bytes) to read"},
            "unit": {"type": "string", "enum": ["lines", "bytes"]},
            "pattern": {"type": "string", "description": "search instead of paging"},
            "regex": {"type": "boolean"},
            "context_lines": {"type": "integer"},
        },
        ["call_id"],
    ),
)
