"""A step in a turn that called tool_search, against the same step in a turn that did
not: every compile of the turn runs the turn's searches again over the deferred tools
(R-TOOL-2: the activation is derived from the log), so a registry of many deferred
tools made each such search a cost of every step.

The two sessions hold the same 200 deferred tools (~2.5 KB descriptions, as an MCP
server's) and the same history; one's current turn has 3 answered tool_search calls.
Both then step alike (a tool call and its result appended, compile over CompileStream
with the usage report, as the clients step); the figure is the daemon's CPU per step of
the searched turn over the other's (`step_after_3_searches_vs_none_cpu`), no target.

    python -m bench.searched
"""

from __future__ import annotations

import json
import random
import tempfile
from pathlib import Path
from typing import Any

from bench.daemon import BenchDaemon
from bench.isolation import daemon_cpu_s
from bench.rpc import Api, StreamAgent, conversation, tool_step
from ctxcc.v1 import event_pb2, tool_pb2, tool_service_pb2_grpc
from ctxcc.v1 import session_service_pb2 as spb
from ctxcc.v1 import tool_service_pb2 as tpb

TOOLS = 200
SEARCHES = 3
_WORDS = (
    "read",
    "write",
    "file",
    "search",
    "grep",
    "list",
    "directory",
    "create",
    "update",
    "delete",
    "issue",
    "pull",
    "request",
    "branch",
    "commit",
    "repository",
    "user",
    "team",
    "project",
    "label",
    "comment",
    "review",
    "merge",
)


def _registry() -> list[Any]:
    rnd = random.Random(7)
    return [
        tool_pb2.ToolDefinition(
            name=f"mcp_tool_{i}",
            description=" ".join(f"{rnd.choice(_WORDS)}{rnd.randint(0, 500)}" for _ in range(300)),
            input_schema_json='{"type": "object"}',
            visibility=tool_pb2.TOOL_VISIBILITY_DEFERRED,
        )
        for i in range(TOOLS)
    ]


def _search_call(call: str, query: str) -> list[event_pb2.Event]:
    asked = event_pb2.Event()
    asked.assistant_message.tool_calls.add(
        call_id=call, name="tool_search", arguments_json=json.dumps({"query": query})
    )
    answered = event_pb2.Event()
    answered.tool_result.call_id = call
    answered.tool_result.text = "found tools"
    return [asked, answered]


def run(data_dir: Path, scale: float = 1.0) -> dict[str, float]:
    n = max(20, int(200 * scale))
    d = BenchDaemon(data_dir)
    d.start_timed()
    try:
        api = Api(d.target)
        tools: Any = tool_service_pb2_grpc.ToolServiceStub(api.channel)
        turn = conversation(1, "q")[:1]  # the current turn's user message
        cpu: dict[str, float] = {}
        for sid, searches in (("plain", 0), ("searched", SEARCHES)):
            api.session(sid, conversation(60, sid[0]))
            tools.RegisterTools(tpb.RegisterToolsRequest(session_id=sid, tools=_registry()))
            events = list(turn)
            for k in range(searches):
                events += _search_call(f"{sid}s{k}", f"create pull request {k}")
            api.sessions.AppendEvents(spb.AppendEventsRequest(session_id=sid, events=events))
            agent = StreamAgent(api, sid)
            for i in range(5):  # the stream's first view and warm memos
                agent.step(tool_step(f"{sid}w{i}"))
            assert d.proc is not None
            started = daemon_cpu_s(d.proc.pid)
            for i in range(n):
                agent.step(tool_step(f"{sid}{i}"))
            cpu[sid] = (daemon_cpu_s(d.proc.pid) - started) / n * 1000
            agent.close()
    finally:
        d.stop()
    return {
        "step_no_search_daemon_cpu_ms": cpu["plain"],
        "step_after_3_searches_daemon_cpu_ms": cpu["searched"],
        "step_after_3_searches_vs_none_cpu": cpu["searched"] / cpu["plain"],
    }


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        out = run(Path(tmp) / "data")
    for key, value in out.items():
        print(f"{key:40} {value:.3f}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
