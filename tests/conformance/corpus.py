"""A corpus of realistic sessions, built through a real daemon's gRPC API and compiled
with every provider format: what agents actually send, end to end."""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from ctxcc.v1 import artifact_service_pb2 as apb
from ctxcc.v1 import checkpoint_pb2, common_pb2, event_pb2, session_pb2, tool_pb2, view_pb2
from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_service_pb2 as spb
from ctxcc.v1 import tool_service_pb2 as tpb
from tests.conformance import agent_tools
from tests.conftest import Stubs
from tests.helpers import ROUTE, assistant, tool_result, user

FORMATS = {
    "openai_chat": view_pb2.RENDER_FORMAT_OPENAI_CHAT,
    "openai_responses": view_pb2.RENDER_FORMAT_OPENAI_RESPONSES,
    "anthropic_messages": view_pb2.RENDER_FORMAT_ANTHROPIC_MESSAGES,
    "gemini": view_pb2.RENDER_FORMAT_GEMINI,
}
# A 1x1 PNG.
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)
CJK = "これはテストです。中文说明 ✅ 🚀 👩‍💻 — naïve café"


@dataclass
class Case:
    name: str
    view: view_pb2.CompiledView
    bodies: dict[str, dict[str, Any]] = field(default_factory=dict)


def _ev(**payload: Any) -> event_pb2.Event:
    return event_pb2.Event(**payload)


def _tools(specs: list[dict[str, Any]], deferred: bool = False) -> list[tool_pb2.ToolDefinition]:
    vis = tool_pb2.TOOL_VISIBILITY_DEFERRED if deferred else tool_pb2.TOOL_VISIBILITY_DIRECT
    return [
        tool_pb2.ToolDefinition(
            name=t["name"],
            description=t["description"],
            input_schema_json=json.dumps(t["schema"]),
            visibility=vis,
        )
        for t in specs
    ]


def _not_json(name: str) -> object:
    raise AssertionError(f"a body holds {name}, which is not JSON")


class Builder:
    def __init__(self, api: Stubs) -> None:
        self.api = api
        self.cases: list[Case] = []

    async def session(self, sid: str, *events: event_pb2.Event) -> None:
        await self.api.sessions.CreateSession(
            spb.CreateSessionRequest(session=session_pb2.Session(session_id=sid))
        )
        await self.append(sid, *events)

    async def append(self, sid: str, *events: event_pb2.Event) -> None:
        if events:
            await self.api.sessions.AppendEvents(
                spb.AppendEventsRequest(session_id=sid, events=list(events))
            )

    async def compile(self, name: str, sid: str, **kw: Any) -> Case:
        req = cpb.CompileRequest(
            session_id=sid,
            route=kw.pop("route", ROUTE),
            render_formats=list(FORMATS.values()),
            **kw,
        )
        view = (await self.api.compiles.Compile(req)).view
        case = Case(name, view)
        for r in view.renderings:
            fmt = next(k for k, v in FORMATS.items() if v == r.format)
            # As a provider's parser reads it: no NaN or Infinity, which Python's json
            # reads and writes but JSON (RFC 8259) has not.
            case.bodies[fmt] = json.loads(r.body_json, parse_constant=_not_json)
        self.cases.append(case)
        return case

    async def upload_png(self, sid: str) -> common_pb2.ArtifactRef:
        header = apb.ArtifactHeader(
            session_id=sid,
            mime_type="image/png",
            size_bytes=len(PNG),
            sha256=hashlib.sha256(PNG).hexdigest(),
            width=1,
            height=1,
        )

        async def chunks() -> AsyncIterator[apb.UploadArtifactRequest]:
            yield apb.UploadArtifactRequest(header=header)
            yield apb.UploadArtifactRequest(data=PNG)

        return (await self.api.artifacts.UploadArtifact(chunks())).artifact


def _user_with(text: str, ref: common_pb2.ArtifactRef) -> event_pb2.Event:
    ev = user(text)
    ev.user_message.parts.add(attachment=ref)
    return ev


async def build(api: Stubs) -> list[Case]:
    b = Builder(api)
    await b.session(
        "text",
        user("Summarise the design in two lines. " + CJK),
        assistant("", reasoning="A step with nothing model-visible."),
        assistant("It is a sidecar that compiles context. " + CJK),
        user("And the storage?"),
    )
    await b.compile("text", "text")

    await b.session(
        "parallel",
        user("Read both files."),
        assistant(
            "Reading them in parallel.",
            ("call_a", "Read", '{"file_path": "/src/a.py"}'),
            ("call_b", "Read", '{"file_path": "/src/b.py"}'),
        ),
        tool_result("call_b", "print('b')", "Read"),  # answered out of order
        tool_result("call_a", "print('a')", "Read"),
        assistant("Both files print a letter."),
        user("Thanks."),
    )
    await b.compile("parallel calls answered out of order", "parallel")

    failed = tool_result("c1", "bash: pytest: command not found", "Bash")
    failed.tool_result.is_error = True
    await b.session(
        "sequence",
        user("Run the tests."),
        assistant("", ("c1", "Bash", '{"command": "pytest -q"}')),
        failed,
        assistant("", ("c2", "Bash", '{"command": "python -m pytest -q"}')),
        tool_result("c2", "3 passed", "Bash"),
        assistant("All 3 tests pass."),
    )
    await b.compile("sequential calls with a tool error", "sequence")

    await b.session("images")
    ref = await b.upload_png("images")
    await b.append(
        "images",
        _user_with("What is in this screenshot?", ref),
        assistant("A single pixel."),
        _ev(attachment=ref),
        user("And this one?"),
    )
    await b.compile("images inline", "images")
    await b.compile("images by reference", "images", image_mode=cpb.IMAGE_MODE_REFERENCE)
    blind = cpb.ModelLimits(accepts_images=False)
    await b.compile("images to a model without vision", "images", limits=blind)

    await b.session("deferred")
    grep = {
        "name": "grep_logs",
        "description": "Searches the service logs for a pattern.",
        "schema": {"type": "object", "properties": {"pattern": {"type": "string"}}},
    }
    await api.tools.RegisterTools(
        tpb.RegisterToolsRequest(session_id="deferred", tools=_tools([grep], deferred=True))
    )
    await b.append("deferred", user("Why did the job fail last night?"))
    await b.compile("deferred tool not yet active", "deferred")
    await b.append(
        "deferred",
        assistant("", ("s1", "tool_search", '{"query": "logs"}')),
        tool_result("s1", "grep_logs: Searches the service logs", "tool_search"),
    )
    await b.compile("deferred tool activated", "deferred")
    await b.append(
        "deferred",
        assistant("", ("g1", "grep_logs", '{"pattern": "ERROR"}')),
        tool_result("g1", "ERROR disk full", "grep_logs"),
    )
    await b.compile("activated tool called", "deferred")

    await b.session(
        "cancelled",
        user("Refactor the parser."),
        assistant("", ("p1", "Read", '{"file_path": "/src/parser.py"}'), reasoning="Start small."),
        _ev(turn_cancelled=event_pb2.TurnCancelled(reason="user", keep_reasoning=True)),
        user("Continue, but only the lexer."),
    )
    await b.compile("cancelled turn with kept reasoning", "cancelled")

    chat = []
    for i in range(6):
        chat += [user(f"question {i} " + "about the design " * 60), assistant(f"answer {i}")]
    await b.session("checkpoint", *chat, user("and finally?"))
    small = cpb.ModelLimits(context_window=2_500)
    c = (await b.compile("over budget, compaction asked", "checkpoint", limits=small)).view
    await api.compiles.CreateCheckpoint(
        cpb.CreateCheckpointRequest(
            checkpoint=checkpoint_pb2.Checkpoint(
                session_id="checkpoint",
                covers_through_seq=c.compaction.through_seq,
                summary="Six design questions, answered.",
                covered_digest=c.compaction.covered_digest,
                source_route=ROUTE,
            )
        )
    )
    await b.compile("after a checkpoint", "checkpoint", limits=small)

    imported = [
        _ev(
            imported_message=event_pb2.ImportedMessage(
                origin_session_id="text",
                origin_seq=seq,
                role=role,
                parts=[common_pb2.ContentPart(text=text)],
            )
        )
        for seq, role, text in (
            (1, event_pb2.MESSAGE_ROLE_USER, "What is ctxcc?"),
            (2, event_pb2.MESSAGE_ROLE_ASSISTANT, "A context compiler."),
        )
    ]
    await b.session("imported", *imported, user("Go on from there."))
    await b.compile("imported messages", "imported")

    await b.session("assistant-first", assistant("Welcome back. " + CJK), user("Hi."))
    await b.compile("log starting with an assistant message", "assistant-first")

    await b.session(
        "malformed",
        user("Edit it."),
        assistant(
            "",
            ("m1", "Edit", "{not json"),
            ("m2", "Edit", "[1, 2]"),
            ("m3", "Edit", '{"line": NaN, "to": 1e400}'),
            # Whitespace JSON has not (str.strip() takes it away, no JSON parser does).
            ("m4", "Edit", '{"line": 4}\x0c'),
            ("m5", "Edit", '\u3000{"line": 5}'),
        ),
        tool_result("m1", "error: bad arguments", "Edit"),
        tool_result("m2", "error: bad arguments", "Edit"),
        tool_result("m3", "error: bad arguments", "Edit"),
        tool_result("m4", "error: bad arguments", "Edit"),
        tool_result("m5", "error: bad arguments", "Edit"),
    )
    await b.compile("malformed arguments", "malformed")

    await b.session(
        "reused",
        user("List, twice."),
        assistant("", ("call_0", "Bash", '{"command": "ls"}')),
        tool_result("call_0", "a b", "Bash"),
        assistant("", ("call_0", "Bash", '{"command": "ls -a"}')),  # the same id again
        tool_result("call_0", ". .. a b", "Bash"),
        assistant("", ("call.1", "Bash", '{"command": "sleep 100"}')),
        user("Stop waiting."),  # interrupts: the call's pair is closed early
        tool_result("call.1", "interrupted", "Bash"),
    )
    await b.compile("reused and re-created call ids", "reused")

    # JSON may escape a lone surrogate, which has no UTF-8 form: a schema and a call's
    # arguments that do (rendering them failed INTERNAL).
    await b.session("surrogates")
    lone = '{"type": "object", "description": "\\ud800 half", "properties": {}}'
    await api.tools.RegisterTools(
        tpb.RegisterToolsRequest(
            session_id="surrogates",
            tools=[tool_pb2.ToolDefinition(name="Odd", description="d", input_schema_json=lone)],
        )
    )
    await b.append(
        "surrogates",
        user("Open it."),
        assistant("", ("s1", "Odd", '{"path": "\\udc00\\ud800.txt"}')),
        tool_result("s1", "ok", "Odd"),
    )
    await b.compile("lone surrogate escapes in a schema and in arguments", "surrogates")

    await b.session("agent")
    real = agent_tools.claude_code_shaped() + agent_tools.openhands()
    await api.tools.RegisterTools(tpb.RegisterToolsRequest(session_id="agent", tools=_tools(real)))
    await b.append(
        "agent",
        user("Fix the failing test in tests/test_api.py."),
        assistant("", ("toolu_01", "Bash", '{"command": "pytest -q tests/test_api.py"}')),
        tool_result("toolu_01", "1 failed", "Bash"),
    )
    first = (await b.compile("a real agent's tool set", "agent")).view
    await api.compiles.ReportUsage(
        cpb.ReportUsageRequest(
            compile_id=first.compile_id, input_tokens=40_000, output_tokens=40, route=ROUTE
        )
    )
    await b.append(
        "agent",
        assistant(
            "",
            (
                "toolu_02",
                "TodoWrite",
                '{"todos": [{"content": "fix", "status": "pending", "id": "1"}]}',
            ),
        ),
        tool_result("toolu_02", "ok", "TodoWrite"),
    )
    await b.compile("after a short reply was reported", "agent")
    await b.compile(
        "caller's own output cap", "agent", limits=cpb.ModelLimits(max_output_tokens=8_000)
    )
    await _thinking_loop(b)
    await _screenshot_before_its_result(b)
    # Compiled before the first user message (to see the system prompt's size): the
    # system prompt and tools alone, sent with the opener as the one user message.
    await b.session("fresh")
    await b.compile("a session with no message yet", "fresh")
    return b.cases


# Reasoning items as a Responses output returns them (what the clients' helpers log):
# the raw reasoning text and the status are not sent back.
REASONING = [
    {
        "type": "reasoning",
        "id": "rs_0c5e2d6f8a1b4c3d",
        "summary": [{"type": "summary_text", "text": "The lexer splits the last token."}],
        "content": [{"type": "reasoning_text", "text": "raw reasoning"}],
        "encrypted_content": "gAAAAABpZ2VuY3J5cHRlZA==",
        "status": "completed",
    }
]


async def _thinking_loop(b: Builder) -> None:
    """A tool loop whose assistant messages carry the thinking state their provider wants
    back (Claude's blocks on the first, Gemini's signature on the second, OpenAI's
    reasoning items on the third, all on the compile's route): each format's body with
    what its SDK types take, or nothing."""
    await b.session("thinking", user("fix the failing parser test"))
    route_id = (await b.compile("a tool loop before its thinking state", "thinking")).view.route_id
    blocks = [
        {"type": "thinking", "thinking": "The parser drops the last token.", "signature": "EqQB"},
        {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix"},
    ]
    first = assistant("Reading the parser.", ("t1", "Read", '{"file_path": "parser.py"}'))
    first.assistant_message.native_state.CopyFrom(
        common_pb2.ProviderNativeState(
            route_id=route_id, kind="anthropic.thinking", data=json.dumps(blocks).encode()
        )
    )
    second = assistant("", ("t2", "Bash", '{"command": "pytest -x"}'), ("t3", "Read", "{}"))
    second.assistant_message.native_state.CopyFrom(
        common_pb2.ProviderNativeState(
            route_id=route_id,
            kind="gemini.thought_signatures",
            data=json.dumps({"t2": "CiQBVKhc7s1gn0g="}).encode(),
        )
    )
    third = assistant("", ("t4", "Read", '{"file_path": "lexer.py"}'))
    third.assistant_message.native_state.CopyFrom(
        common_pb2.ProviderNativeState(
            route_id=route_id, kind="openai.reasoning", data=json.dumps(REASONING).encode()
        )
    )
    await b.append(
        "thinking",
        first,
        tool_result("t1", "def parse(): ..."),
        user("also check the tokenizer"),  # typed while the tool ran: the loop goes on
        second,
        tool_result("t2", "1 failed"),
        tool_result("t3", "def tokenize(): ..."),
        third,
        tool_result("t4", "def lex(): ..."),
    )
    await b.compile("a tool loop with its thinking state", "thinking")


async def _screenshot_before_its_result(b: Builder) -> None:
    """A browser agent's call whose screenshot it logs as an attachment before the
    call's result, on a Claude turn with thinking, then two results imported from a
    sub-agent's session (tool messages without call ids)."""
    await b.session("screenshot", user("what does the checkout page show?"))
    route_id = (await b.compile("a screenshot turn before its call", "screenshot")).view.route_id
    ref = await b.upload_png("screenshot")
    blocks = [{"type": "thinking", "thinking": "Look at the page.", "signature": "EqQC"}]
    call = assistant("", ("shot1", "Screenshot", '{"url": "https://shop.example/checkout"}'))
    call.assistant_message.native_state.CopyFrom(
        common_pb2.ProviderNativeState(
            route_id=route_id, kind="anthropic.thinking", data=json.dumps(blocks).encode()
        )
    )
    imported = [
        _ev(
            imported_message=event_pb2.ImportedMessage(
                origin_session_id="sub-agent",
                origin_seq=seq,
                role=event_pb2.MESSAGE_ROLE_TOOL,
                parts=[common_pb2.ContentPart(text=text)],
            )
        )
        for seq, text in ((4, "cart: 2 items"), (6, "total: 41.90 EUR"))
    ]
    await b.append(
        "screenshot", call, _ev(attachment=ref), tool_result("shot1", "saved", "Screenshot")
    )
    await b.compile("a screenshot logged before its call's result", "screenshot")
    await b.append("screenshot", *imported)
    await b.compile("two tool messages imported in a row", "screenshot")
