"""Generated sessions sent through the providers' own SDK clients.

A seeded generator writes event logs of the shapes real agents produce (edge-case texts,
parallel and orphan calls, tool errors, images of every kind the upload takes, deferred
tools, cancelled turns, checkpoints, imported messages, browser elements, thinking state
of each kind the daemon reads, awkward schemas and names at the edge of the naming
rules), appends them to a real daemon, compiles every render format,
and hands each body to the SDK's own request call (`OpenAI().chat.completions.create`,
`.responses.create`, `Anthropic().messages.create`, google-genai's
`models.generate_content`) over an in-memory transport that records what the SDK sent.
Then each sent body is checked against the provider rules the SDK types do not enforce
but the APIs do (each rule's source is named where it is checked).

Run directly to explore many seeds: `python -m tests.conformance.sdk_fuzz COUNT [SEED]`.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import random
import re
import sys
import tempfile
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import grpc
import httpx2

from ctxcc.v1 import artifact_service_pb2 as apb
from ctxcc.v1 import checkpoint_pb2, common_pb2, event_pb2, session_pb2, tool_pb2
from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_service_pb2 as spb
from ctxcc.v1 import tool_service_pb2 as tpb
from server.compiler.provider_rules import OPENER
from server.domain.model import Route
from tests.conformance.corpus import FORMATS, PNG
from tests.conformance.sdk_types import errors_for
from tests.conftest import Stubs
from tests.helpers import ROUTE, gif_bytes, jpeg_bytes, webp_bytes

# -- pools of awkward values --------------------------------------------------------------

TEXTS = [
    "ok",
    "",
    " ",
    "\n\t  \n",
    "trailing space ",
    "trailing newline\n",
    "\u3000",  # an ideographic space: whitespace to str.strip()
    "\u200b",  # a zero-width space: not whitespace, invisible
    # Astral: mathematical letters, emoji with a joiner, a hieroglyph.
    "\U0001d573\U0001d58a\U0001d591 \U0001f9ea \U00013000 \U0001f469\u200d\U0001f4bb",
    "مرحبا \u202eevil\u202c שלום",  # RTL and a bidi override
    "a\x00b NUL",
    "\x01\x07\x1b[31mred\x1b[0m",
    "line\u2028sep\u2029para",
    "\ufeffBOM first",
    "e\u0301\u0301\u0301 combining",
    '{"json": "looking"}',
    "</tool_result></function_results>",
    "x" * 70_000,
    ("word " * 5_000) + " ",
]
CALL_IDS = [
    "call_{n}",
    "toolu_01{n}ABCDEFGHIJKLMNOPQRSTU",
    "fc_{n}" + "0123456789abcdef" * 3,  # a Responses item id: 53 characters
    "call.{n}",
    "tool:use/{n}",
    "呼び出し{n}",
    "{n}",
    "cx_{n}",
    "call {n}",
    "x" * 70 + "{n}",
]
TOOL_NAMES = [
    "Read",
    "a",
    "A" * 64,
    "x-y_z",
    "mcp__server__do_thing",
    "0starts_with_digit",
    "-dash-first",
    "_underscore",
    "B" * 63,
]
HALLUCINATED = ["functions.Read", "Read tool", "", "repo_browser.open_file", "読む", "a" * 80]
SCHEMAS: list[Any] = [
    {},
    {"type": "object"},
    {"type": "object", "properties": {}},
    {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "properties": {"node": {"$ref": "#/$defs/node"}},
        "$defs": {
            "node": {
                "type": "object",
                "properties": {"child": {"$ref": "#/$defs/node"}, "v": {"type": "integer"}},
            }
        },
    },
    {
        "type": "object",
        "properties": {
            "mode": {"type": "string", "enum": ["a", "b", "c"]},
            "n": {"type": ["integer", "null"]},
            "u": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            "c": {"const": 3},
            "f": {"type": "string", "format": "date-time"},
        },
        "additionalProperties": False,
    },
    {"properties": {"q": {"type": "string"}}},  # no top-level type
    {"anyOf": [{"type": "object"}, {"type": "null"}]},
    # Unions at the top level, as zod, pydantic and MCP servers write them (OpenAI and
    # Anthropic refuse them there).
    {
        "anyOf": [
            {
                "type": "object",
                "properties": {"event_id": {"type": "string"}},
                "required": ["event_id"],
            },
            {
                "type": "object",
                "properties": {"ical_uid": {"type": "string"}},
                "required": ["ical_uid"],
            },
        ]
    },
    {
        "type": "object",
        "properties": {"path": {"type": "string"}},
        "required": ["path"],
        "oneOf": [
            {"properties": {"insert": {"type": "string"}}, "required": ["insert"]},
            {"properties": {"delete": {"type": "integer"}}, "required": ["delete"]},
        ],
    },
    {
        "allOf": [{"$ref": "#/$defs/Page"}, {"properties": {"title": {"type": "string"}}}],
        "$defs": {
            "Page": {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}
        },
    },
    {"type": "object", "properties": {"a": {"type": "string"}}, "not": {"required": ["b"]}},
    {"type": "object", "properties": {"k": {"type": "string", "description": "\u202e rtl"}}},
]


def _deep(depth: int) -> dict[str, Any]:
    s: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        s = {"type": "object", "properties": {"n": s}}
    return s


SCHEMAS.append(_deep(31))  # 63 levels: just inside --max-tool-schema-depth (64)
# The route the sessions compile for: thinking state logged on it goes back in the
# bodies (domain/thinking.py), state of another route does not.
ROUTE_ID = Route(ROUTE.connection, ROUTE.protocol, ROUTE.endpoint, ROUTE.model).route_id


def _native_state(rng: random.Random, msg: Any) -> None:
    """Thinking state of one of the kinds the daemon reads, as the APIs return it: Claude's
    thinking blocks, Gemini's thought signatures of the message's calls, a Responses
    output's reasoning items (each with its id: the SDKs' request types require one)."""
    state = msg.native_state
    state.route_id = ROUTE_ID if rng.random() < 0.85 else "another-route"
    state.kind = rng.choice(["anthropic.thinking", "gemini.thought_signatures", "openai.reasoning"])
    blocks: Any
    if state.kind == "anthropic.thinking":
        thought = rng.choice(["", "hmm", "t" * 500])
        blocks = [
            {"type": "thinking", "thinking": thought, "signature": "EqQB"}
            if rng.random() < 0.7
            else {"type": "redacted_thinking", "data": "EmwK"}
            for _ in range(rng.randint(1, 3))
        ]
    elif state.kind == "gemini.thought_signatures":
        ids = [c.call_id for c in msg.tool_calls] or ["no_call"]
        blocks = {cid: base64.b64encode(f"sig {cid}".encode()).decode() for cid in ids}
    else:
        blocks = [
            {
                "type": "reasoning",
                "id": f"rs_{i}" + "x" * rng.choice([0, 80]),
                "summary": rng.choice([[], [{"type": "summary_text", "text": _text(rng)}]]),
                "encrypted_content": "gAAAA",
            }
            for i in range(rng.randint(1, 2))
        ]
    state.data = json.dumps(blocks).encode()


IMAGE_TYPES = [
    "image/png",
    "image/jpeg",
    "image/gif",
    "image/webp",
    "image/svg+xml",
    "image/bmp",
    "image/heic",
    "image/tiff",
    "application/pdf",
    "text/plain",
]


# -- the generator ----------------------------------------------------------------------


@dataclass
class Plan:
    sid: str
    tools: list[tool_pb2.ToolDefinition] = field(default_factory=list)
    steps: list[Any] = field(default_factory=list)  # events, ("image", mime), ("checkpoint",)
    image_mode: int = cpb.IMAGE_MODE_INLINE
    accepts_images: bool = True


def _text(rng: random.Random) -> str:
    return rng.choice(TEXTS) if rng.random() < 0.6 else rng.choice(TEXTS[:17])


def _args(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.7:
        return json.dumps({"path": _text(rng)[:200], "n": rng.randint(-3, 3)})
    if r < 0.8:
        return "{}"
    if r < 0.85:
        return ""
    return rng.choice(
        [
            "{not json",
            "[1]",
            '{"a": NaN}',
            "null",
            '{"deep": ' * 30 + "1" + "}" * 30,
            '{"p": "\\ud800 lone"}',  # a lone surrogate, escaped as JSON allows
        ]
    )


def plan(rng: random.Random, sid: str) -> Plan:
    p = Plan(sid)
    names = rng.sample(TOOL_NAMES, rng.randint(0, 5))
    for name in names:
        vis = rng.choice(
            [tool_pb2.TOOL_VISIBILITY_DIRECT] * 3
            + [tool_pb2.TOOL_VISIBILITY_DEFERRED, tool_pb2.TOOL_VISIBILITY_HIDDEN]
        )
        p.tools.append(
            tool_pb2.ToolDefinition(
                name=name,
                description=rng.choice(["", "Does a thing.", "\u202e", "d" * 2000]),
                input_schema_json=json.dumps(rng.choice(SCHEMAS)),
                visibility=vis,
            )
        )
    callable_names = names + HALLUCINATED[:4] + ["tool_search"]
    p.image_mode = rng.choice([cpb.IMAGE_MODE_INLINE, cpb.IMAGE_MODE_REFERENCE])
    p.accepts_images = rng.random() < 0.85
    open_calls: list[tuple[str, str]] = []
    for n in range(1, rng.randint(1, 14) + 1):
        kind = rng.choices(
            [
                "user",
                "assistant",
                "results",
                "orphan",
                "attach",
                "import",
                "turn",
                "call",
                "browser",
                "checkpoint",
            ],
            [5, 6, 5, 1, 1, 1, 1, 1, 1, 1],
        )[0]
        if kind == "user":
            ev = event_pb2.Event()
            for _ in range(rng.randint(1, 3)):
                if rng.random() < 0.2:
                    p.steps.append(("image", rng.choice(IMAGE_TYPES)))
                    ev.user_message.parts.add(text="\x00IMAGE")  # replaced by the ref
                elif rng.random() < 0.1:
                    b = ev.user_message.parts.add().browser_element
                    b.url, b.selector, b.tag, b.text = "https://example.com/", "#a", "a", _text(rng)
                else:
                    ev.user_message.parts.add(text=_text(rng))
            p.steps.append(ev)
        elif kind == "assistant":
            ev = event_pb2.Event()
            if rng.random() < 0.6:
                ev.assistant_message.parts.add(text=_text(rng))
            if rng.random() < 0.1:  # a diagram the agent drew
                p.steps.append(("image", rng.choice(IMAGE_TYPES)))
                ev.assistant_message.parts.add(text="\x00IMAGE")
            for _ in range(rng.choice([0, 0, 1, 1, 2, 4])):
                cid = rng.choice(CALL_IDS).format(n=rng.randint(0, 3))
                name = rng.choice(callable_names) or "x"
                args = _args(rng)
                if name == "tool_search":
                    args = json.dumps({"query": rng.choice([*names, "thing", ""])})
                ev.assistant_message.tool_calls.add(call_id=cid, name=name, arguments_json=args)
                open_calls.append((cid, name))
            if rng.random() < 0.3:
                ev.assistant_message.reasoning = _text(rng) or "thinking"
            if not ev.assistant_message.parts and not ev.assistant_message.tool_calls:
                ev.assistant_message.reasoning = ev.assistant_message.reasoning or "thinking"
            if rng.random() < 0.4:
                _native_state(rng, ev.assistant_message)
            p.steps.append(ev)
        elif kind == "results" and open_calls:
            rng.shuffle(open_calls)
            k = rng.randint(1, len(open_calls))
            for cid, name in open_calls[:k]:
                ev = event_pb2.Event()
                ev.tool_result.call_id = cid
                ev.tool_result.tool_name = name
                ev.tool_result.text = _text(rng)
                ev.tool_result.is_error = rng.random() < 0.3
                p.steps.append(ev)
            open_calls = open_calls[k:]
        elif kind == "orphan":
            ev = event_pb2.Event()
            ev.tool_result.call_id = f"orphan_{n}"
            ev.tool_result.tool_name = rng.choice(["", "Read", "gone.tool"])
            ev.tool_result.text = _text(rng)
            ev.tool_result.is_error = rng.random() < 0.5
            p.steps.append(ev)
        elif kind == "attach":
            p.steps.append(("image", rng.choice(IMAGE_TYPES)))
            p.steps.append(("attach",))
        elif kind == "import":
            ev = event_pb2.Event()
            m = ev.imported_message
            m.origin_session_id = "elsewhere"
            m.origin_seq = n
            m.role = rng.choice(
                [
                    event_pb2.MESSAGE_ROLE_USER,
                    event_pb2.MESSAGE_ROLE_ASSISTANT,
                    event_pb2.MESSAGE_ROLE_TOOL,
                    event_pb2.MESSAGE_ROLE_SYSTEM,
                ]
            )
            for _ in range(rng.randint(0, 2)):
                m.parts.add(text=_text(rng))
            p.steps.append(ev)
        elif kind == "turn":
            ev = event_pb2.Event()
            r = rng.random()
            if r < 0.33:
                ev.turn_started.turn_id = f"t{n}"
            elif r < 0.66:
                ev.turn_cancelled.reason = "user"
                ev.turn_cancelled.keep_reasoning = rng.random() < 0.5
            else:
                ev.turn_completed.SetInParent()
            p.steps.append(ev)
        elif kind == "call":
            ev = event_pb2.Event()
            cid = f"solo_{n}"
            ev.tool_call.call_id = cid
            ev.tool_call.name = rng.choice(callable_names) or "x"
            ev.tool_call.arguments_json = _args(rng)
            open_calls.append((cid, ev.tool_call.name))
            p.steps.append(ev)
        elif kind == "browser":
            ev = event_pb2.Event()
            b = ev.browser_element
            b.url = "https://example.com/"
            b.selector = "#x"
            b.tag = "button"
            b.text = _text(rng)
            p.steps.append(ev)
        elif kind == "checkpoint":
            p.steps.append(("checkpoint", _text(rng)))
    if not any(isinstance(s, event_pb2.Event) for s in p.steps):
        # A log with no message at all gives a body with none, which no API takes and no
        # renderer can fill: not a case to send.
        ev = event_pb2.Event()
        ev.user_message.parts.add(text="ok")
        p.steps.append(ev)
    return p


# -- running a plan on a daemon -----------------------------------------------------------


# Bytes of each image type the daemon reads, as agents upload them (an upload declared
# as one of these types whose bytes are another is stored as what its bytes are); the
# other types get a PNG's bytes, which are sent as declared (as no provider takes them).
_IMAGE_BYTES = {
    "image/jpeg": jpeg_bytes(1, 1),
    "image/gif": gif_bytes(1, 1),
    "image/webp": webp_bytes(1, 1),
    "image/heic": b"\x00\x00\x00\x18ftypheic\x00\x00\x00\x00mif1heic",  # an HEIF box
}


async def _upload(api: Stubs, sid: str, mime: str, salt: int) -> common_pb2.ArtifactRef:
    # Distinct bytes, distinct artifacts.
    data = _IMAGE_BYTES.get(mime, PNG) + salt.to_bytes(4, "big")
    header = apb.ArtifactHeader(
        session_id=sid,
        mime_type=mime,
        size_bytes=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        width=1,
        height=1,
    )

    async def chunks() -> AsyncIterator[apb.UploadArtifactRequest]:
        yield apb.UploadArtifactRequest(header=header)
        yield apb.UploadArtifactRequest(data=data)

    return (await api.artifacts.UploadArtifact(chunks())).artifact


@dataclass
class Outcome:
    sid: str
    bodies: dict[str, dict[str, Any]]
    refused: list[str]  # appends the daemon refused (fine: that is its own rule)
    body_text: dict[str, str] = field(default_factory=dict)
    # A log with nothing model-visible (only reasoning, turn markers, refused appends)
    # gives bodies with no message, which no API takes and no renderer can fill.
    empty: bool = False


async def run(api: Stubs, p: Plan) -> Outcome:
    await api.sessions.CreateSession(
        spb.CreateSessionRequest(session=session_pb2.Session(session_id=p.sid))
    )
    refused: list[str] = []
    for tool in p.tools:  # one by one: a name the daemon refuses costs only its tool
        try:
            await api.tools.RegisterTools(tpb.RegisterToolsRequest(session_id=p.sid, tools=[tool]))
        except grpc.aio.AioRpcError as exc:
            refused.append(f"RegisterTools: {exc.details()}")
    pending: list[common_pb2.ArtifactRef] = []
    salt = 0
    for step in p.steps:
        if isinstance(step, tuple):
            if step[0] == "image":
                salt += 1
                pending.append(await _upload(api, p.sid, step[1], salt))
            elif step[0] == "attach":
                await _append(api, p.sid, event_pb2.Event(attachment=pending.pop()), refused)
            elif step[0] == "checkpoint":
                await _checkpoint(api, p.sid, step[1], refused)
            continue
        kind = step.WhichOneof("payload")
        if kind in ("user_message", "assistant_message"):
            for part in getattr(step, kind).parts:
                if part.text == "\x00IMAGE":
                    part.attachment.CopyFrom(pending.pop(0))
        await _append(api, p.sid, step, refused)
    req = cpb.CompileRequest(
        session_id=p.sid,
        route=ROUTE,
        render_formats=list(FORMATS.values()),
        image_mode=p.image_mode,  # type: ignore[arg-type]
        limits=cpb.ModelLimits(accepts_images=p.accepts_images),
    )
    view = (await api.compiles.Compile(req)).view
    out = Outcome(p.sid, {}, refused, empty=not view.messages)
    for r in view.renderings:
        fmt = next(k for k, v in FORMATS.items() if v == r.format)
        out.body_text[fmt] = r.body_json
        out.bodies[fmt] = json.loads(r.body_json)
    return out


async def _append(api: Stubs, sid: str, ev: event_pb2.Event, refused: list[str]) -> None:
    try:
        await api.sessions.AppendEvents(spb.AppendEventsRequest(session_id=sid, events=[ev]))
    except grpc.aio.AioRpcError as exc:
        refused.append(f"AppendEvents {ev.WhichOneof('payload')}: {exc.details()}")


async def _checkpoint(api: Stubs, sid: str, summary: str, refused: list[str]) -> None:
    events = await api.sessions.ListEvents(spb.ListEventsRequest(session_id=sid))
    seqs = [e.seq for e in events.events]
    if not seqs:
        return
    try:
        await api.compiles.CreateCheckpoint(
            cpb.CreateCheckpointRequest(
                checkpoint=checkpoint_pb2.Checkpoint(
                    session_id=sid,
                    covers_through_seq=seqs[-1],
                    summary=summary,
                    source_route=ROUTE,
                ),
                covered_digest_mode=cpb.COVERED_DIGEST_MODE_COMPUTE,
            )
        )
    except grpc.aio.AioRpcError as exc:
        refused.append(f"CreateCheckpoint: {exc.details()}")


# -- the SDKs' own request calls ------------------------------------------------------------

_CHAT_REPLY = {
    "id": "c",
    "object": "chat.completion",
    "created": 0,
    "model": "m",
    "choices": [
        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "ok"}}
    ],
}
_RESPONSES_REPLY = {
    "id": "r",
    "object": "response",
    "created_at": 0,
    "model": "m",
    "output": [],
    "status": "completed",
    "parallel_tool_calls": True,
    "tool_choice": "auto",
    "tools": [],
}
_ANTHROPIC_REPLY = {
    "id": "m",
    "type": "message",
    "role": "assistant",
    "model": "m",
    "content": [{"type": "text", "text": "ok"}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {"input_tokens": 1, "output_tokens": 1},
}
_GEMINI_REPLY = {"candidates": [{"content": {"role": "model", "parts": [{"text": "ok"}]}}]}


def _recorder(reply: dict[str, Any], sent: list[dict[str, Any]]) -> httpx2.Client:
    def handler(request: httpx2.Request) -> httpx2.Response:
        sent.append(json.loads(request.content))
        return httpx2.Response(200, json=reply)

    return httpx2.Client(transport=httpx2.MockTransport(handler))


def send(fmt: str, body: dict[str, Any]) -> dict[str, Any]:
    """The body as the SDK's own request call sent it (raises what the SDK raises)."""
    sent: list[dict[str, Any]] = []
    if fmt == "openai_chat":
        import openai

        client = openai.OpenAI(
            api_key="k",
            base_url="http://sdk.test/v1",
            max_retries=0,
            http_client=_recorder(_CHAT_REPLY, sent),
        )
        client.chat.completions.create(**body)
    elif fmt == "openai_responses":
        import openai

        client = openai.OpenAI(
            api_key="k",
            base_url="http://sdk.test/v1",
            max_retries=0,
            http_client=_recorder(_RESPONSES_REPLY, sent),
        )
        client.responses.create(**body)
    elif fmt == "anthropic_messages":
        import anthropic

        aclient = anthropic.Anthropic(
            api_key="k",
            base_url="http://sdk.test",
            max_retries=0,
            http_client=_recorder(_ANTHROPIC_REPLY, sent),
        )
        # An explicit timeout: without one the SDK refuses a non-streaming call whose
        # max_tokens could take over 10 minutes (agents stream those; the body is the same).
        aclient.messages.create(**body, timeout=600)
    else:
        from google import genai
        from google.genai import types

        gclient = genai.Client(
            api_key="k",
            http_options=types.HttpOptions(
                base_url="http://sdk.test/", httpx_client=_recorder(_GEMINI_REPLY, sent)
            ),
        )
        config = types.GenerateContentConfig(
            system_instruction=body.get("systemInstruction"),
            tools=body.get("tools"),
            max_output_tokens=body["generationConfig"]["maxOutputTokens"],
        )
        gclient.models.generate_content(
            model="gemini-2.5-pro", contents=body["contents"], config=config
        )
    assert len(sent) == 1, f"{fmt}: the SDK sent {len(sent)} requests"
    return sent[0]


# -- rules the APIs enforce and the SDK types do not ---------------------------------------

# OpenAI function names (Chat `tools[].function.name`, Responses `tools[].name`), and
# Anthropic's custom tool names: 1-64 of [a-zA-Z0-9_-].
FUNCTION_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
# Gemini function declarations: start with a letter or underscore; letters, digits,
# underscores, dots, colons and dashes; at most 64 (ai.google.dev FunctionDeclaration).
GEMINI_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_.:-]{0,63}$")
ANTHROPIC_ID = re.compile(r"^[a-zA-Z0-9_-]+$")
ANTHROPIC_IMAGE = {"image/jpeg", "image/png", "image/gif", "image/webp"}
OPENAI_IMAGE = {"image/jpeg", "image/png", "image/gif", "image/webp"}
GEMINI_IMAGE = {"image/png", "image/jpeg", "image/webp", "image/heic", "image/heif"}


def _data_url_mime(url: str) -> str:
    return url[5 : url.index(";")] if url.startswith("data:") else ""


# The first bytes of each image type the providers take and the daemon reads.
_MAGIC = {
    b"\x89PNG": "image/png",
    b"\xff\xd8\xff": "image/jpeg",
    b"GIF8": "image/gif",
    b"RIFF": "image/webp",
}


def _mislabelled(mime: str, data: str) -> str | None:
    """What an image's bytes are when they are not its declared type (None when they
    are, or are none of the four): Anthropic refuses such an image ("Image does not match
    the provided media type image/png"). `data` is base64, standard or URL-safe (which
    google-genai re-encodes it as)."""
    head = base64.urlsafe_b64decode(data[:16].replace("+", "-").replace("/", "_"))
    actual = next((t for magic, t in _MAGIC.items() if head.startswith(magic)), None)
    return actual if actual is not None and actual != mime else None


# OpenAI: "schema must have type 'object' and not have 'oneOf'/'anyOf'/'allOf'/'enum'/'not'
# at the top level" (invalid_function_parameters); Anthropic: "input_schema does not support
# oneOf, allOf, or anyOf at the top level".
_OPENAI_TOP = frozenset({"oneOf", "anyOf", "allOf", "enum", "not"})
_ANTHROPIC_TOP = frozenset({"oneOf", "anyOf", "allOf"})


def rule_errors(fmt: str, body: dict[str, Any]) -> list[str]:
    check: Callable[[dict[str, Any]], list[str]] = {
        "openai_chat": _chat,
        "openai_responses": _responses,
        "anthropic_messages": _anthropic,
        "gemini": _gemini,
    }[fmt]
    return check(body)


def _chat(body: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for t in body.get("tools", []):
        fn = t["function"]
        if not FUNCTION_NAME.match(fn["name"]):
            out.append(f"tool name {fn['name']!r} breaks ^[a-zA-Z0-9_-]{{1,64}}$")
        if fn["parameters"].get("type") != "object":
            out.append(f"tool {fn['name']}: parameters are not type object")
        if banned := _OPENAI_TOP & set(fn["parameters"]):
            out.append(f"tool {fn['name']}: parameters with {sorted(banned)} at the top level")
        if "properties" not in fn["parameters"]:
            # "Invalid schema for function 'f': In context=(), object schema missing
            # properties" (invalid_function_parameters).
            out.append(f"tool {fn['name']}: parameters without properties")
    open_ids: list[str] = []
    for i, m in enumerate(body["messages"]):
        if m["role"] == "tool":
            if m["tool_call_id"] not in open_ids:
                out.append(f"messages[{i}]: tool result without its call {m['tool_call_id']!r}")
            else:
                open_ids.remove(m["tool_call_id"])
            continue
        if open_ids:
            out.append(f"messages[{i}]: calls left unanswered {open_ids}")
            open_ids = []
        for c in m.get("tool_calls") or []:
            if len(c["id"]) > 40:
                out.append(f"messages[{i}]: tool_calls id over 40 characters ({len(c['id'])})")
            if not FUNCTION_NAME.match(c["function"]["name"]):
                out.append(f"messages[{i}]: call name {c['function']['name']!r}")
            open_ids.append(c["id"])
        if m["role"] == "assistant" and not m.get("content") and not m.get("tool_calls"):
            out.append(f"messages[{i}]: assistant message with neither content nor tool_calls")
        if isinstance(m.get("content"), list):
            for p in m["content"]:
                if p["type"] == "image_url":
                    mime = _data_url_mime(p["image_url"]["url"])
                    if mime not in OPENAI_IMAGE:
                        out.append(f"messages[{i}]: image of type {mime}")
                    if bytes_are := _mislabelled(mime, p["image_url"]["url"].split(",")[1]):
                        out.append(f"messages[{i}]: an {mime} image whose bytes are {bytes_are}")
    if open_ids:
        out.append(f"calls left unanswered at the end {open_ids}")
    return out


def _responses(body: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for t in body.get("tools", []):
        if not FUNCTION_NAME.match(t["name"]):
            out.append(f"tool name {t['name']!r} breaks ^[a-zA-Z0-9_-]{{1,64}}$")
        if t["parameters"].get("type") != "object":
            out.append(f"tool {t['name']}: parameters are not type object")
        if banned := _OPENAI_TOP & set(t["parameters"]):
            out.append(f"tool {t['name']}: parameters with {sorted(banned)} at the top level")
        if "properties" not in t["parameters"]:
            # "Invalid schema for function 'f': In context=(), object schema missing
            # properties" (invalid_function_parameters).
            out.append(f"tool {t['name']}: parameters without properties")
    if not body["input"]:
        # Refused even with instructions: a request needs input (pydantic/pydantic-ai#3470).
        out.append("no input")
    calls = [i["call_id"] for i in body["input"] if i.get("type") == "function_call"]
    outputs = [i["call_id"] for i in body["input"] if i.get("type") == "function_call_output"]
    if sorted(calls) != sorted(outputs) or len(set(calls)) != len(calls):
        out.append(f"calls and outputs do not pair: {calls} / {outputs}")
    for i, (item, nxt) in enumerate(pairwise([*body["input"], {}])):
        # "Item 'rs_...' of type 'reasoning' was provided without its required following
        # item": a reasoning item goes right before the call or message it led to.
        ahead = nxt.get("type") == "function_call" or nxt.get("role") == "assistant"
        if item.get("type") == "reasoning" and not ahead:
            out.append(f"input[{i}]: a reasoning item without its following item")
        if item.get("type") == "function_call" and not FUNCTION_NAME.match(item["name"]):
            out.append(f"input[{i}]: call name {item['name']!r}")
        if item.get("type") == "message" and isinstance(item["content"], list):
            for p in item["content"]:
                if p["type"] == "input_image":
                    mime = _data_url_mime(p["image_url"])
                    if mime not in OPENAI_IMAGE:
                        out.append(f"input[{i}]: image of type {mime}")
                    if bytes_are := _mislabelled(mime, p["image_url"].split(",")[1]):
                        out.append(f"input[{i}]: an {mime} image whose bytes are {bytes_are}")
    return out


def _anthropic(body: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for t in body.get("tools", []):
        if not FUNCTION_NAME.match(t["name"]):
            out.append(f"tool name {t['name']!r} breaks ^[a-zA-Z0-9_-]{{1,64}}$")
        if t["input_schema"].get("type") != "object":
            out.append(f"tool {t['name']}: input_schema is not type object")
        if banned := _ANTHROPIC_TOP & set(t["input_schema"]):
            out.append(f"tool {t['name']}: input_schema with {sorted(banned)} at the top level")
    msgs = body["messages"]
    roles = [m["role"] for m in msgs]
    if not roles or roles[0] != "user":
        out.append(f"first turn is not the user's: {roles[:2]}")
    if any(a == b for a, b in pairwise(roles)):
        out.append(f"roles do not alternate: {roles}")
    for i, m in enumerate(msgs):
        blocks = m["content"]
        if not blocks:
            out.append(f"messages[{i}]: empty content")
        for b in blocks:
            if b["type"] == "text" and not b["text"].strip():
                out.append(f"messages[{i}]: text block empty or whitespace only")
            # "content cannot be empty if is_error is true", and "the content field ...
            # is empty" for an empty string.
            empty = b["type"] == "tool_result" and not _result_text(b).strip()
            if empty and (b.get("is_error") or "content" in b):
                out.append(f"messages[{i}]: tool_result content empty or whitespace only")
            if b["type"] == "image" and b["source"].get("media_type") not in ANTHROPIC_IMAGE:
                out.append(f"messages[{i}]: image of type {b['source'].get('media_type')}")
            if b["type"] == "image" and b["source"].get("type") == "base64":
                mime = b["source"]["media_type"]
                if bytes_are := _mislabelled(mime, b["source"]["data"]):
                    out.append(f"messages[{i}]: an {mime} image whose bytes are {bytes_are}")
            if b["type"] == "tool_use":
                if not ANTHROPIC_ID.match(b["id"]):
                    out.append(f"messages[{i}]: tool_use id {b['id']!r}")
                if not FUNCTION_NAME.match(b["name"]):
                    out.append(f"messages[{i}]: tool_use name {b['name']!r}")
        uses = [b["id"] for b in blocks if b["type"] == "tool_use"]
        results = [b["tool_use_id"] for b in blocks if b["type"] == "tool_result"]
        before = [b["id"] for b in msgs[i - 1]["content"] if b["type"] == "tool_use"] if i else []
        if sorted(results) != sorted(before) and m["role"] == "user":
            out.append(f"messages[{i}]: results {results} do not answer the calls {before}")
        kinds = [b["type"] == "tool_result" for b in blocks]
        if kinds != sorted(kinds, reverse=True):
            out.append(f"messages[{i}]: tool results do not lead the turn")
        if uses and i + 1 == len(msgs):
            out.append("the last turn holds unanswered tool_use blocks")
    # "messages.1.content.1: `tool_use` ids must be unique" (over the whole request).
    ids = [b["id"] for m in msgs for b in m["content"] if b["type"] == "tool_use"]
    if len(set(ids)) != len(ids):
        out.append("tool_use ids are not unique")
    if msgs and msgs[-1]["role"] == "assistant":
        last = msgs[-1]["content"][-1]
        if last["type"] == "text" and last["text"] != last["text"].rstrip():
            out.append("final assistant content ends with whitespace")
        if last["type"] in ("thinking", "redacted_thinking"):
            # "The final block in an assistant message cannot be `thinking`".
            out.append("the final assistant turn ends with a thinking block")
    return out


def _result_text(block: dict[str, Any]) -> str:
    content = block.get("content", "")
    if isinstance(content, str):
        return content
    return "".join(c.get("text", "x") for c in content)


def _gemini(body: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for t in body.get("tools", []):
        for d in t.get("functionDeclarations", []):
            if not GEMINI_NAME.match(d["name"]):
                out.append(f"function declaration name {d['name']!r}")
    contents = body["contents"]
    roles = [c["role"] for c in contents]
    if not roles or roles[0] != "user":
        out.append(f"first turn is not the user's: {roles[:2]}")
    for i, c in enumerate(contents):
        if not c["parts"]:
            out.append(f"contents[{i}]: parts must not be empty")
        for p in c["parts"]:
            if "text" in p and p["text"] == "":
                out.append(f"contents[{i}]: an empty text part")
            if "inlineData" in p and p["inlineData"]["mimeType"] not in GEMINI_IMAGE:
                out.append(f"contents[{i}]: image of type {p['inlineData']['mimeType']}")
            if "inlineData" in p:
                mime = p["inlineData"]["mimeType"]
                if bytes_are := _mislabelled(mime, p["inlineData"]["data"]):
                    out.append(f"contents[{i}]: an {mime} image whose bytes are {bytes_are}")
            if "functionCall" in p and not GEMINI_NAME.match(p["functionCall"]["name"]):
                out.append(f"contents[{i}]: functionCall name {p['functionCall']['name']!r}")
            if "functionResponse" in p and not GEMINI_NAME.match(p["functionResponse"]["name"]):
                out.append(
                    f"contents[{i}]: functionResponse name {p['functionResponse']['name']!r}"
                )
        calls = [p["functionCall"] for p in c["parts"] if "functionCall" in p]
        if calls:
            nxt = contents[i + 1]["parts"] if i + 1 < len(contents) else []
            resp = [p["functionResponse"] for p in nxt if "functionResponse" in p]
            # Matched by order and name: Vertex AI refuses an id on either ('Unknown
            # name "id" at contents[1].parts[0].function_call').
            if [r["name"] for r in resp] != [x["name"] for x in calls]:
                out.append(f"contents[{i}]: calls not answered in order in the next turn")
            if any("id" in x for x in (*calls, *resp)):
                out.append(f"contents[{i}]: a functionCall or functionResponse with an id")
    return out


# Values that are the caller's data, not the API's field names.
_OPAQUE = {"args", "response", "parametersJsonSchema"}


def camel(value: Any) -> Any:
    """google-genai writes some REST fields in snake_case (`mime_type`), which the API
    reads as their camelCase names, and inline bytes as URL-safe base64: compare in
    camelCase, inline data in standard base64 and signatures in URL-safe base64 (apply it
    to both sides)."""
    if isinstance(value, list):
        return [camel(v) for v in value]
    if not isinstance(value, dict):
        return value
    out = {}
    for k, v in value.items():
        key = re.sub(r"_([a-z])", lambda m: m.group(1).upper(), k)
        out[key] = v if key in _OPAQUE else camel(v)
    if isinstance(out.get("inlineData"), dict) and isinstance(out["inlineData"].get("data"), str):
        # google-genai re-encodes inline bytes as URL-safe base64: the same bytes.
        data = out["inlineData"]["data"].replace("-", "+").replace("_", "/")
        out["inlineData"] = {**out["inlineData"], "data": data}
    if isinstance(out.get("thoughtSignature"), str):
        # A signature is bytes too, which google-genai sends as URL-safe base64 (the
        # stand-in `skip_thought_signature_validator` is that already): compared so.
        out["thoughtSignature"] = out["thoughtSignature"].replace("+", "-").replace("/", "_")
    return out


def check(out: Outcome) -> list[str]:
    """Every failure of one outcome: what the SDK refused, what it changed, what breaks a
    documented rule."""
    problems: list[str] = []
    if out.empty:
        # No API takes a request without a message: from rendering 11 each body sends the
        # opener as its one user message (it then goes through every check below).
        for fmt, body in out.bodies.items():
            said = [m for m in body.get("messages", []) if m["role"] != "system"]
            said += body.get("input", []) + body.get("contents", [])
            if len(said) != 1 or OPENER not in json.dumps(said[0]):
                problems.append(f"{fmt}: a view with no message rendered {said[:2]}")
    for fmt, body in out.bodies.items():
        try:
            sent = send(fmt, body)
        except Exception as exc:
            problems.append(f"{fmt}: the SDK refused: {type(exc).__name__}: {str(exc)[:300]}")
            continue
        if fmt == "gemini":
            sent = camel(sent)
            for key in ("contents", "systemInstruction", "tools"):
                if key in body and sent.get(key) != camel(body[key]):
                    problems.append(f"gemini: the SDK sent {key} other than the body")
        elif sent != body:
            problems.append(f"{fmt}: the SDK sent other than the body")
        problems += [f"{fmt}: {e}" for e in rule_errors(fmt, sent)]
        # And the SDKs' own request types, unknown keys forbidden (sdk_types).
        problems += [f"{fmt}: SDK type: {e}" for e in errors_for(fmt, body)]
    return problems


# -- exploring ----------------------------------------------------------------------------


async def explore(count: int, seed: int) -> dict[str, list[str]]:
    from server.app import Daemon
    from tests.conftest import make_config, stubs_for

    found: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory(prefix="ctxcc-fuzz-", dir="/tmp") as d:
        daemon = Daemon(make_config(Path(d)))
        await daemon.start()
        api = stubs_for(f"unix:{daemon.endpoints.unix}")
        try:
            for i in range(count):
                rng = random.Random(seed * 100_003 + i)
                p = plan(rng, f"s{i}")
                try:
                    outcome = await run(api, p)
                except grpc.aio.AioRpcError as exc:
                    found.setdefault(f"compile failed: {exc.code()} {exc.details()}", []).append(
                        p.sid
                    )
                    continue
                for problem in check(outcome):
                    key = re.sub(r"\d+", "N", problem)[:200]
                    found.setdefault(key, []).append(p.sid)
        finally:
            await api.channel.close()
            await daemon.stop()
    return found


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    s = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    result = asyncio.run(explore(n, s))
    for k, v in sorted(result.items(), key=lambda kv: -len(kv[1])):
        print(f"{len(v):4d}  {k}   e.g. {v[:3]}")
