"""Real agents' tool sets, as fixtures: OpenHands' four tools verbatim (from its public
logs, MIT, see fixtures/LICENSE.openhands), the GitHub MCP server's, the reference MCP
servers', Gemini CLI's and SWE-agent's (below, each with its license beside it) and a
set of the size and shape of Claude
Code's (a shell tool with a ~9,600-character description, file tools, a todo list of
objects, a sub-agent launcher), plus a tool whose schema nests deep, as MCP servers
and OpenAPI-derived tools send. The Claude Code-shaped texts are written here, not
copied; only their sizes and structure follow the real tool set.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).parent / "fixtures"

# Guidance paragraphs of the kind a coding agent gives its shell tool.
_SHELL_GUIDANCE = (
    "Runs a command in a persistent shell session, with an optional timeout, and returns "
    "its standard output and standard error.",
    "Before creating files or directories, check with `ls` that the parent directory "
    "exists and is the one you mean; quote every path that contains spaces.",
    "Commands time out after two minutes unless a timeout of up to ten minutes is given; "
    "long builds and test runs should be started with a generous timeout.",
    "Output longer than 30000 characters is cut; prefer commands that print only what "
    "you need, such as `grep -n`, `head` and `tail`, over dumping whole files.",
    "Do not use `find`, `grep`, `cat`, `head`, `tail` or `ls` to read or search files "
    "when the dedicated search and read tools can do it: they are faster and their "
    "output is structured.",
    "Keep the working directory stable across commands by using absolute paths rather "
    "than `cd`; chain dependent commands with `&&` and independent ones with `;`.",
    "Never run interactive commands (editors, pagers, `git rebase -i`, prompts asking "
    "for input): they block until the timeout and their output is lost.",
    "When asked to commit: run `git status`, `git diff` and `git log` in parallel first, "
    "draft a message that says why the change was made, stage only the relevant files, "
    "and never skip hooks, amend published commits or force-push unless explicitly asked.",
    "When asked to open a pull request: check the branch's upstream, summarise every "
    "commit that will be included (not only the latest), and return the request's URL.",
    "Never update the git config, never push to a remote unless the user asks, and never "
    "commit secrets such as `.env` files or credentials; warn when asked to do so.",
    "Sandboxed commands cannot reach the network or write outside the workspace; when a "
    "command fails for that reason, say so and ask before retrying without the sandbox.",
    "Prefer the project's own scripts (Makefile targets, package.json scripts) to ad-hoc "
    "invocations, so that flags and environment match what continuous integration runs.",
)


def _shell_description() -> str:
    parts = []
    for i in range(5):
        parts += [f"{i + 1}.{j + 1} {text}" for j, text in enumerate(_SHELL_GUIDANCE)]
    examples = "\n".join(
        f"<example>\nuser: run the tests of package {n}\nassistant: make test PKG={n}\n</example>"
        for n in ("api", "store", "web", "cli")
    )
    return "\n\n".join(parts) + "\n\nExamples:\n" + examples


def _schema(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
        "$schema": "http://json-schema.org/draft-07/schema#",
    }


def _deep(levels: int) -> dict[str, Any]:
    """A filter language: groups of conditions nested `levels` deep, as OpenAPI-derived
    tools send them."""
    node: dict[str, Any] = {
        "type": "object",
        "properties": {"field": {"type": "string"}, "equals": {"type": "string"}},
        "required": ["field"],
    }
    for depth in range(levels):
        node = {
            "type": "object",
            "description": f"condition group at depth {levels - depth}",
            "properties": {
                "op": {"type": "string", "enum": ["and", "or", "not"]},
                "conditions": {"type": "array", "items": node},
            },
            "required": ["op", "conditions"],
        }
    return node


def claude_code_shaped() -> list[dict[str, Any]]:
    """(name, description, schema) dicts, Claude Code-sized."""
    text = {"type": "string"}
    return [
        {
            "name": "Bash",
            "description": _shell_description(),
            "schema": _schema(
                {
                    "command": {"type": "string", "description": "The command to run"},
                    "timeout": {"type": "number", "description": "Milliseconds, up to 600000"},
                    "description": {"type": "string", "description": "What it does, 5-10 words"},
                    "run_in_background": {"type": "boolean"},
                },
                ["command"],
            ),
        },
        {
            "name": "Task",
            "description": "Launches a sub-agent for a multi-step task. " * 60,
            "schema": _schema(
                {"description": text, "prompt": text, "subagent_type": text},
                ["description", "prompt", "subagent_type"],
            ),
        },
        {
            "name": "Read",
            "description": "Reads a file from the local filesystem by absolute path. " * 30,
            "schema": _schema(
                {"file_path": text, "offset": {"type": "number"}, "limit": {"type": "number"}},
                ["file_path"],
            ),
        },
        {
            "name": "MultiEdit",
            "description": "Makes several exact string replacements in one file. " * 40,
            "schema": _schema(
                {
                    "file_path": text,
                    "edits": {
                        "type": "array",
                        "minItems": 1,
                        "items": {
                            "type": "object",
                            "properties": {
                                "old_string": text,
                                "new_string": text,
                                "replace_all": {"type": "boolean", "default": False},
                            },
                            "required": ["old_string", "new_string"],
                            "additionalProperties": False,
                        },
                    },
                },
                ["file_path", "edits"],
            ),
        },
        {
            "name": "TodoWrite",
            "description": "Creates and updates the structured task list of the session. " * 80,
            "schema": _schema(
                {
                    "todos": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {
                                "content": {"type": "string", "minLength": 1},
                                "status": {
                                    "type": "string",
                                    "enum": ["pending", "in_progress", "completed"],
                                },
                                "id": text,
                            },
                            "required": ["content", "status", "id"],
                            "additionalProperties": False,
                        },
                    }
                },
                ["todos"],
            ),
        },
        {
            "name": "search_records",
            "description": "Searches records with a nested filter expression.",
            "schema": _schema({"filter": _deep(14), "limit": {"type": "integer"}}, ["filter"]),
        },
    ]


def openhands() -> list[dict[str, Any]]:
    data = json.loads((FIXTURES / "openhands_tools.json").read_text(encoding="utf-8"))
    return [
        {
            "name": t["function"]["name"],
            "description": t["function"]["description"],
            "schema": t["function"]["parameters"],
        }
        for t in data["tools"]
    ]


def github_mcp() -> list[dict[str, Any]]:
    """The GitHub MCP server's 117 tools (github/github-mcp-server at 64a49f34, MIT, see
    fixtures/LICENSE.github-mcp-server), verbatim: each is one of the server's own
    snapshots of a tool as its `tools/list` returns it (pkg/github/__toolsnaps__/*.snap,
    which its tests compare the Go definitions against), so no schema here was written or
    derived by hand. Descriptions reach 1,115 characters (over OpenAI's 1,024); schemas
    hold `oneOf` and `anyOf` below the top level, `enum`, `default` and
    `minimum`/`maximum`."""
    data = json.loads((FIXTURES / "github_mcp_tools.json").read_text(encoding="utf-8"))
    return [
        {"name": t["name"], "description": t["description"], "schema": t["inputSchema"]}
        for t in data["tools"]
    ]


def mcp_reference_servers() -> list[dict[str, Any]]:
    """The reference MCP servers' 51 tools (modelcontextprotocol/servers at 76d64c82, MIT
    and Apache-2.0, see fixtures/LICENSE.mcp-servers), each server built from that
    commit with the versions its lock file pins and run over stdio, `tools/list` as it
    answered: the TypeScript servers filesystem (14), memory (9) and everything (13),
    zod-made schemas with `$schema`, `default`, `enum`, `minItems`, `minimum`/`maximum`;
    the Python servers git (12), fetch (1) and time (2), the first two's pydantic-made
    with `title`s, `format: uri`, `exclusiveMinimum`/`exclusiveMaximum` and optional
    arguments as `anyOf` with `null`. Named as Claude Code names MCP tools,
    `mcp__<server>__<tool>`, so the servers share one registry."""
    data = json.loads((FIXTURES / "mcp_reference_servers_tools.json").read_text(encoding="utf-8"))
    return [
        {
            "name": f"mcp__{server}__{t['name']}",
            "description": t["description"],
            "schema": t["inputSchema"],
        }
        for server, tools in data["servers"].items()
        for t in tools
    ]


def gemini_cli() -> list[dict[str, Any]]:
    """Gemini CLI's 16 core tools (google-gemini/gemini-cli at 5411f113, Apache-2.0, see
    fixtures/LICENSE.gemini-cli), verbatim: its function declarations for
    gemini-3-pro-preview as its own snapshot test records them
    (packages/core/src/tools/definitions/__snapshots__/coreToolsModelSnapshots.test.ts.snap;
    the default variant of each tool). The snapshot is vitest's print of each
    declaration, keys sorted; read back as JSON, each printed again the vitest way gives
    the snapshot's text exactly. Most schemas are written by hand in its source; the
    skill tool's comes from zod (`$schema` draft-07, `additionalProperties: false`), and
    the todo tool's descriptions run to ~4,900 characters."""
    data = json.loads((FIXTURES / "gemini_cli_tools.json").read_text(encoding="utf-8"))
    return [
        {"name": t["name"], "description": t["description"], "schema": t["parametersJsonSchema"]}
        for t in data["functionDeclarations"]
    ]


def swe_agent() -> list[dict[str, Any]]:
    """SWE-agent's 31 tools (SWE-agent/SWE-agent at 3ea751c0, MIT, see
    fixtures/LICENSE.swe-agent): its built-in `bash` and every uniquely named tool of its
    bundles' tools/*/config.yaml, each as SWE-agent itself sends it to a model
    (sweagent/tools/commands.py `Command.get_function_calling_tool`: a tool without
    arguments is `{"type": "object"}`, with no `properties`). Derived by running that
    rule over the YAML; fixtures/swe_agent_tools.json names each tool's file."""
    data = json.loads((FIXTURES / "swe_agent_tools.json").read_text(encoding="utf-8"))
    return [
        {
            "name": t["function"]["name"],
            "description": t["function"]["description"],
            "schema": t["function"]["parameters"],
        }
        for t in data["tools"]
    ]


def schema_depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((schema_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((schema_depth(v) for v in value), default=0)
    return 0
