"""Definitions of the tools ctxcc itself adds to views. The agent executes them by
calling the matching RPC (SourceService.LoadRule, ToolService.SearchTools,
ToolService.ReadToolResult)."""

from __future__ import annotations

import json

from server.compiler.view import ToolSpec, ToolVisibility


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
