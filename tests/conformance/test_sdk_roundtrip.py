"""Rendered bodies sent through the providers' own SDK clients (see sdk_fuzz): a seeded
set of generated sessions, and each defect that set found, minimized, as a case of its
own."""

from __future__ import annotations

import copy
import json
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from pydantic import BaseModel, TypeAdapter

from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import event_pb2, session_pb2, tool_pb2
from ctxcc.v1 import session_service_pb2 as spb
from ctxcc.v1 import tool_service_pb2 as tpb
from server.app import Daemon
from tests.conformance import sdk_fuzz
from tests.conformance.corpus import FORMATS
from tests.conftest import Stubs, make_config, stubs_for
from tests.helpers import ROUTE, assistant, error_info, tool_result, user

# Generated sessions per run: each compiled in all four formats and sent through the
# four SDK calls (exploring found every defect below within the first 150 of seed 2).
GENERATED = 60


@pytest.fixture
async def api(short_tmp: Path) -> AsyncIterator[Stubs]:
    daemon = Daemon(make_config(short_tmp / "data"))
    await daemon.start()
    stubs = stubs_for(f"unix:{daemon.endpoints.unix}")
    try:
        yield stubs
    finally:
        await stubs.channel.close()
        await daemon.stop()


async def _bodies(
    api: Stubs, sid: str, *events: event_pb2.Event, **kw: Any
) -> dict[str, dict[str, Any]]:
    tools = kw.pop("tools", None)
    await api.sessions.CreateSession(
        spb.CreateSessionRequest(session=session_pb2.Session(session_id=sid))
    )
    if tools:
        await api.tools.RegisterTools(tpb.RegisterToolsRequest(session_id=sid, tools=tools))
    for ev in events:
        await api.sessions.AppendEvents(spb.AppendEventsRequest(session_id=sid, events=[ev]))
    return await _compile(api, sid, **kw)


async def _compile(api: Stubs, sid: str, **kw: Any) -> dict[str, dict[str, Any]]:
    req = cpb.CompileRequest(
        session_id=sid, route=ROUTE, render_formats=list(FORMATS.values()), **kw
    )
    view = (await api.compiles.Compile(req)).view
    out = {}
    for r in view.renderings:
        fmt = next(k for k, v in FORMATS.items() if v == r.format)
        out[fmt] = json.loads(r.body_json)
    return out


def _sent_clean(bodies: dict[str, dict[str, Any]]) -> None:
    """Each body goes through its SDK call unchanged and keeps the API's rules."""
    problems = sdk_fuzz.check(sdk_fuzz.Outcome("case", bodies, []))
    assert not problems, "\n".join(problems)


# What each body carries of logged thinking state (domain/thinking.py).
_STATE_MARKERS = {
    "anthropic_messages": '"signature":"EqQB"',
    "openai_responses": '"type":"reasoning"',
    "gemini": '"thoughtSignature"',
}


async def test_generated_sessions_pass_the_sdks_and_the_api_rules(api: Stubs) -> None:
    found: dict[str, list[str]] = {}
    kinds: set[str] = set()
    state_sent: set[str] = set()
    for i in range(GENERATED):
        p = sdk_fuzz.plan(random.Random(7_000 + i), f"g{i}")
        kinds |= {str(s.WhichOneof("payload")) for s in p.steps if isinstance(s, event_pb2.Event)}
        outcome = await sdk_fuzz.run(api, p)
        assert set(outcome.bodies) == set(FORMATS)
        for problem in sdk_fuzz.check(outcome):
            found.setdefault(problem, []).append(p.sid)
        for fmt, marker in _STATE_MARKERS.items():
            if marker in outcome.body_text[fmt]:
                state_sent.add(fmt)
    assert not found, json.dumps(found, indent=1, ensure_ascii=False)[:6000]
    # Logged thinking state went back in each body that carries it.
    assert state_sent == set(_STATE_MARKERS), state_sent
    # The seeds reach every kind of event the generator writes.
    assert kinds >= {
        "user_message",
        "assistant_message",
        "tool_result",
        "imported_message",
        "turn_started",
        "turn_cancelled",
        "tool_call",
        "browser_element",
    }, kinds


def test_the_rule_checks_refuse_what_the_apis_refuse() -> None:
    """Each rule check fails on a body breaking the rule it stands for."""
    call = {"id": "c" * 41, "type": "function", "function": {"name": "a.b", "arguments": "{}"}}
    chat = {
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c" * 41, "content": "x"},
            {"role": "assistant", "content": None},
        ],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
    }
    errors = " | ".join(sdk_fuzz.rule_errors("openai_chat", chat))
    for expected in (
        "over 40",
        "call name 'a.b'",
        "neither content",
        "not type object",
        "parameters without properties",
    ):
        assert expected in errors, (expected, errors)
    union = {"type": "object", "anyOf": [{"type": "object"}], "not": {}}
    chat["tools"] = [{"type": "function", "function": {"name": "f", "parameters": union}}]
    assert "with ['anyOf', 'not'] at the top level" in " ".join(
        sdk_fuzz.rule_errors("openai_chat", chat)
    )
    anthropic: dict[str, list[dict[str, Any]]] = {
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": " "}]},
            {"role": "assistant", "content": [{"type": "text", "text": "done \n"}]},
        ]
    }
    anthropic["tools"] = [{"name": "f", "input_schema": union}]
    errors = " | ".join(sdk_fuzz.rule_errors("anthropic_messages", anthropic))
    assert "whitespace only" in errors and "ends with whitespace" in errors, errors
    assert "input_schema with ['anyOf'] at the top level" in errors, errors
    del anthropic["tools"]
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/bmp", "data": ""}}
    anthropic["messages"][0]["content"].append(image)
    assert "image of type image/bmp" in " ".join(
        sdk_fuzz.rule_errors("anthropic_messages", anthropic)
    )
    image["source"] = {"type": "base64", "media_type": "image/png", "data": "/9j/4AAQ"}
    assert "an image/png image whose bytes are image/jpeg" in " ".join(
        sdk_fuzz.rule_errors("anthropic_messages", anthropic)
    )
    gemini = {
        "contents": [
            {"role": "user", "parts": [{"text": ""}]},
            {"role": "model", "parts": [{"functionCall": {"id": "1", "name": "9x", "args": {}}}]},
            {
                "role": "user",
                "parts": [{"functionResponse": {"id": "1", "name": "9x", "response": {}}}],
            },
        ],
        "tools": [{"functionDeclarations": [{"name": "-f"}]}],
    }
    errors = " | ".join(sdk_fuzz.rule_errors("gemini", gemini))
    for expected in ("empty text part", "functionCall name '9x'", "declaration name '-f'"):
        assert expected in errors, (expected, errors)
    empty = {"input": [], "instructions": "You are a coding agent."}
    assert sdk_fuzz.rule_errors("openai_responses", empty) == ["no input"]
    lone = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "e"}
    said = {"type": "message", "role": "user", "content": "hi"}
    assert sdk_fuzz.rule_errors("openai_responses", {"input": [said, lone]}) == [
        "input[1]: a reasoning item without its following item"
    ]
    use = {"type": "tool_use", "id": "t1", "name": "f", "input": {}}
    result = {"type": "tool_result", "tool_use_id": "t1", "content": "x"}
    twice: dict[str, Any] = {
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {"role": "assistant", "content": [use]},
            {"role": "user", "content": [result]},
            {"role": "assistant", "content": [use]},
            {"role": "user", "content": [result]},
        ]
    }
    twice_errors = sdk_fuzz.rule_errors("anthropic_messages", twice)
    assert twice_errors == ["tool_use ids are not unique"], twice_errors
    thought = {"type": "redacted_thinking", "data": "EmwK"}
    twice["messages"] = [*twice["messages"][:3], {"role": "assistant", "content": [thought]}]
    assert sdk_fuzz.rule_errors("anthropic_messages", twice) == [
        "the final assistant turn ends with a thinking block"
    ]
    no_turns: list[tuple[str, dict[str, Any]]] = [
        ("anthropic_messages", {"messages": []}),
        ("gemini", {"contents": []}),
    ]
    for fmt, body in no_turns:
        assert sdk_fuzz.rule_errors(fmt, body) == ["first turn is not the user's: []"], fmt


UNION_TOOLS: dict[str, Any] = {
    # google-calendar-mcp's update-event shape: one of two ids.
    "update_event": {
        "anyOf": [
            {
                "type": "object",
                "properties": {"event_id": {"type": "string"}, "start": {"type": "string"}},
                "required": ["event_id", "start"],
            },
            {
                "type": "object",
                "properties": {"ical_uid": {"type": "string"}, "start": {"type": "string"}},
                "required": ["ical_uid", "start"],
            },
        ]
    },
    # A pydantic discriminated union: branches by reference, a property typed two ways.
    "edit": {
        "oneOf": [{"$ref": "#/$defs/Insert"}, {"$ref": "#/$defs/Delete"}],
        "discriminator": {"propertyName": "op"},
        "$defs": {
            "Insert": {
                "type": "object",
                "properties": {"op": {"const": "insert"}, "text": {"type": "string"}},
                "required": ["op", "text"],
            },
            "Delete": {
                "type": "object",
                "properties": {"op": {"const": "delete"}, "count": {"type": "integer"}},
                "required": ["op", "count"],
            },
        },
    },
    # zod's .and(): an intersection.
    "notion_update": {
        "allOf": [
            {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]},
            {"type": "object", "properties": {"title": {"type": "string"}}},
        ],
        "not": {"required": ["archived"]},
    },
}


async def test_tools_with_unions_at_the_top_level_are_sent_flat(api: Stubs) -> None:
    """OpenAI refuses a function whose parameters have oneOf/anyOf/allOf/enum/not at the
    top level and Anthropic an input_schema with oneOf/anyOf/allOf there; MCP servers and
    zod or pydantic unions send such schemas. Their bodies carry the branches' properties
    side by side instead (a property typed two ways as an anyOf below the top), required
    what every branch requires; Gemini's full JSON Schema carries the union as written."""
    tools = [
        tool_pb2.ToolDefinition(name=n, description=n, input_schema_json=json.dumps(schema))
        for n, schema in UNION_TOOLS.items()
    ]
    view_bodies = await _bodies(api, "unions", user("move my 3pm meeting"), tools=tools)
    _sent_clean(view_bodies)
    chat = {
        t["function"]["name"]: t["function"]["parameters"]
        for t in view_bodies["openai_chat"]["tools"]
    }
    assert chat["update_event"] == {
        "type": "object",
        "properties": {
            "event_id": {"type": "string"},
            "start": {"type": "string"},
            "ical_uid": {"type": "string"},
        },
        "required": ["start"],
    }
    assert chat["edit"]["properties"] == {
        "op": {"anyOf": [{"const": "insert"}, {"const": "delete"}]},
        "text": {"type": "string"},
        "count": {"type": "integer"},
    }
    assert chat["edit"]["required"] == ["op"] and "$defs" in chat["edit"]
    assert chat["notion_update"] == {
        "type": "object",
        "properties": {"id": {"type": "string"}, "title": {"type": "string"}},
        "required": ["id"],
    }
    responses = {t["name"]: t["parameters"] for t in view_bodies["openai_responses"]["tools"]}
    anthropic = {t["name"]: t["input_schema"] for t in view_bodies["anthropic_messages"]["tools"]}
    for name in UNION_TOOLS:
        assert responses[name] == anthropic[name] == chat[name], name
    gemini = {
        d["name"]: d["parametersJsonSchema"]
        for t in view_bodies["gemini"]["tools"]
        for d in t["functionDeclarations"]
    }
    assert gemini["update_event"] == {"type": "object", **UNION_TOOLS["update_event"]}
    assert gemini["edit"]["oneOf"] == UNION_TOOLS["edit"]["oneOf"]


def _ref_bomb(k: int, levels: int = 8) -> dict[str, Any]:
    """A union of k `$ref`s to a definition that is itself such a union, `levels` deep:
    a few hundred bytes that name k^levels branches, each of the same object."""
    defs: dict[str, Any] = {
        f"d{i}": {"anyOf": [{"$ref": f"#/$defs/d{i + 1}"}] * k} for i in range(1, levels)
    }
    defs[f"d{levels}"] = {"type": "object", "properties": {"a": {"type": "string"}}}
    return {"anyOf": [{"$ref": "#/$defs/d1"}] * k, "$defs": defs}


async def test_a_schema_of_unions_of_references_is_flattened_once_per_branch(api: Stubs) -> None:
    """7^8 (5.8 million) branches named by 700 bytes of schema: the flat bodies list the
    one object's property, made once per definition and depth (it held a compute thread
    for minutes, and every compile of the session with it)."""
    bomb = _ref_bomb(7)
    tool = tool_pb2.ToolDefinition(name="bomb", description="d", input_schema_json=json.dumps(bomb))
    bodies = await _bodies(api, "bomb", user("hi"), tools=[tool])
    _sent_clean(bodies)
    chat = bodies["openai_chat"]["tools"][0]["function"]["parameters"]
    assert chat["properties"] == {"a": {"type": "string"}}
    assert chat["$defs"] == bomb["$defs"]
    assert bodies["anthropic_messages"]["tools"][0]["input_schema"] == chat


async def test_a_hallucinated_call_name_is_sent_as_a_name_every_api_takes(api: Stubs) -> None:
    """Models call tools that do not exist (`functions.Read`, `Read tool`); the log keeps
    what they said, and OpenAI refuses such a name in the history ('string does not
    match pattern ^[a-zA-Z0-9_-]+$'), as Gemini does one not starting with a letter."""
    bodies = await _bodies(
        api,
        "names",
        user("Open it."),
        assistant(
            "",
            ("c1", "functions.Read", '{"path": "a"}'),
            ("c2", "Read tool", "{}"),
            ("c3", "7zip", "{}"),
            ("c4", "読む", "{}"),
        ),
        tool_result("c1", "a", "functions.Read"),
        tool_result("c2", "b", "Read tool"),
        tool_result("c3", "c", "7zip"),
        tool_result("c4", "d", "読む"),
    )
    _sent_clean(bodies)
    names = ["functions_Read", "Read_tool", "_7zip", "__"]  # 読む: two characters
    chat = bodies["openai_chat"]["messages"][2]["tool_calls"]
    assert [c["function"]["name"] for c in chat] == names
    assert [i["name"] for i in bodies["openai_responses"]["input"][1:5]] == names
    uses = bodies["anthropic_messages"]["messages"][1]["content"]
    assert [b["name"] for b in uses] == names
    contents = bodies["gemini"]["contents"]
    assert [p["functionCall"]["name"] for p in contents[1]["parts"]] == names
    assert [p["functionResponse"]["name"] for p in contents[2]["parts"]] == names


async def test_tool_definitions_every_api_takes(api: Stubs) -> None:
    """Names must start with a letter or '_' for Gemini; a schema's type must be object
    (OpenAI: 'schema must be a JSON Schema of type: "object"'; Anthropic requires
    input_schema.type), and one that names no type is sent with it."""
    await api.sessions.CreateSession(
        spb.CreateSessionRequest(session=session_pb2.Session(session_id="defs"))
    )
    for name, schema in (("7zip", "{}"), ("-x", "{}"), ("ok", '{"type": "string"}')):
        tool = tool_pb2.ToolDefinition(name=name, description="d", input_schema_json=schema)
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await api.tools.RegisterTools(tpb.RegisterToolsRequest(session_id="defs", tools=[tool]))
        assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT, name
        assert error_info(exc.value).reason == "INVALID_FIELD", name
    untyped = {"properties": {"q": {"type": "string"}}, "required": ["q"]}
    tools = [
        tool_pb2.ToolDefinition(name="_q", description="d", input_schema_json=json.dumps(untyped)),
        tool_pb2.ToolDefinition(name="A" * 64, description="", input_schema_json="{}"),
    ]
    bodies = await _bodies(api, "defs2", user("go"), tools=tools)
    _sent_clean(bodies)
    want = {"type": "object", **untyped}

    def named(tools: list[dict[str, Any]]) -> dict[str, Any]:
        return next(t for t in tools if t.get("name", t.get("function", {}).get("name")) == "_q")

    assert named(bodies["openai_chat"]["tools"])["function"]["parameters"] == want
    assert named(bodies["openai_responses"]["tools"])["parameters"] == want
    assert named(bodies["anthropic_messages"]["tools"])["input_schema"] == want
    decls = bodies["gemini"]["tools"][0]["functionDeclarations"]
    assert named(decls)["parametersJsonSchema"] == want


async def test_a_tool_without_arguments_is_sent_with_properties_to_openai(api: Stubs) -> None:
    """MCP servers give a tool that takes no arguments `{"type": "object"}` (the
    specification recommends adding `"additionalProperties": false`), which OpenAI refuses
    in Chat and Responses ("Invalid schema for function 'list_regions': In context=(),
    object schema missing properties"): OpenAI bodies send it with `"properties": {}`,
    which constrains nothing; Anthropic and Gemini get the schema as registered."""
    schemas: dict[str, dict[str, Any]] = {
        "list_regions": {"type": "object"},
        "get_lists": {"type": "object", "additionalProperties": False},
        "whoami": {"additionalProperties": False},
    }
    tools = [
        tool_pb2.ToolDefinition(name=n, description="d", input_schema_json=json.dumps(s))
        for n, s in schemas.items()
    ]
    bodies = await _bodies(api, "no-args", user("Which regions are there?"), tools=tools)
    _sent_clean(bodies)
    chat = {
        t["function"]["name"]: t["function"]["parameters"] for t in bodies["openai_chat"]["tools"]
    }
    responses = {t["name"]: t["parameters"] for t in bodies["openai_responses"]["tools"]}
    anthropic = {t["name"]: t["input_schema"] for t in bodies["anthropic_messages"]["tools"]}
    decls = bodies["gemini"]["tools"][0]["functionDeclarations"]
    gemini = {d["name"]: d["parametersJsonSchema"] for d in decls}
    for name, registered in schemas.items():
        typed = {"type": "object", **registered}
        assert chat[name] == responses[name] == {**typed, "properties": {}}, name
        assert anthropic[name] == gemini[name] == typed, name


async def test_images_of_a_type_the_provider_refuses_are_notes(api: Stubs) -> None:
    """The upload takes any image/* type; each API takes only some (OpenAI and Anthropic
    PNG, JPEG, GIF, WebP; Gemini PNG, JPEG, WebP, HEIC, HEIF)."""
    await api.sessions.CreateSession(
        spb.CreateSessionRequest(session=session_pb2.Session(session_id="img"))
    )
    ev = user("What are these?")
    for i, mime in enumerate(["image/svg+xml", "image/gif", "image/heic"]):
        ev.user_message.parts.add(attachment=await sdk_fuzz._upload(api, "img", mime, i))
    await api.sessions.AppendEvents(spb.AppendEventsRequest(session_id="img", events=[ev]))
    bodies = await _compile(api, "img")
    _sent_clean(bodies)
    for fmt in ("openai_chat", "openai_responses"):
        text = json.dumps(bodies[fmt])
        assert "data:image/gif;base64" in text, fmt
        assert "data:image/svg+xml" not in text and "data:image/heic" not in text, fmt
    blocks = bodies["anthropic_messages"]["messages"][0]["content"]
    assert [b["source"]["media_type"] for b in blocks if b["type"] == "image"] == ["image/gif"]
    parts = bodies["gemini"]["contents"][0]["parts"]
    assert [p["inlineData"]["mimeType"] for p in parts if "inlineData" in p] == ["image/heic"]
    for fmt, b in bodies.items():
        note = "(image/svg+xml) not sent: the provider takes no image/svg+xml"
        assert note in json.dumps(b), fmt


async def test_an_image_the_assistant_drew_is_a_note_in_every_body(api: Stubs) -> None:
    """The view holds an assistant message's image (and counts it); every renderer sent
    only the message's text, so the image vanished from each body without a note."""
    await api.sessions.CreateSession(
        spb.CreateSessionRequest(session=session_pb2.Session(session_id="drew"))
    )
    ref = await sdk_fuzz._upload(api, "drew", "image/png", 1)
    drew = assistant("Here is the diagram:")
    drew.assistant_message.parts.add(attachment=ref)
    events = [user("Draw it."), drew, user("Thanks.")]
    await api.sessions.AppendEvents(spb.AppendEventsRequest(session_id="drew", events=events))
    bodies = await _compile(api, "drew")
    _sent_clean(bodies)
    note = f"[image {ref.artifact_id} (image/png) not sent: an assistant turn carries no images]"
    want = "Here is the diagram:\n" + note
    assert bodies["openai_chat"]["messages"][2] == {"role": "assistant", "content": want}
    assert bodies["openai_responses"]["input"][1]["content"] == want
    assert bodies["anthropic_messages"]["messages"][1]["content"] == [
        {"type": "text", "text": want}
    ]
    assert bodies["gemini"]["contents"][1]["parts"] == [{"text": want}]


async def test_an_image_a_format_cannot_carry_is_noted_with_its_messages_reason(
    api: Stubs,
) -> None:
    """An image among the parts of an imported tool message is sent by no format (each
    sends a result as text): its note said "an assistant turn carries no images". One in
    an imported system message is sent by Responses, Anthropic and Gemini, but Chat's
    system content is text only: its note said "sent by reference only", although the
    view sent it inline. Each now names its message's reason."""
    await api.sessions.CreateSession(
        spb.CreateSessionRequest(session=session_pb2.Session(session_id="notes"))
    )
    ref = await sdk_fuzz._upload(api, "notes", "image/png", 1)
    events = []
    for seq, role in enumerate((event_pb2.MESSAGE_ROLE_SYSTEM, event_pb2.MESSAGE_ROLE_TOOL), 1):
        ev = event_pb2.Event()
        ev.imported_message.origin_session_id = "elsewhere"
        ev.imported_message.origin_seq = seq
        ev.imported_message.role = role
        ev.imported_message.parts.add(text="with a diagram")
        ev.imported_message.parts.add(attachment=ref)
        events.append(ev)
    for ev in (user("Go on."), *events):
        await api.sessions.AppendEvents(spb.AppendEventsRequest(session_id="notes", events=[ev]))
    bodies = await _compile(api, "notes")
    _sent_clean(bodies)
    tool_note = f"[image {ref.artifact_id} (image/png) not sent: a tool result carries no images]"
    for fmt, body in bodies.items():
        text = json.dumps(body)
        assert tool_note in text and "an assistant turn carries no images" not in text, fmt
    chat = bodies["openai_chat"]["messages"]
    system = next(m for m in chat[1:] if m["role"] == "system")
    assert system["content"] == (
        f"with a diagram\n[image {ref.artifact_id} (image/png) not sent: a system message"
        " carries no images]"
    )
    assert "sent by reference only" not in json.dumps(bodies["openai_chat"])
    for fmt in ("openai_responses", "anthropic_messages", "gemini"):
        assert "system message carries no images" not in json.dumps(bodies[fmt]), fmt


async def test_gemini_gets_no_empty_text_part(api: Stubs) -> None:
    """'Unable to submit request because it has an empty text parameter': a user message
    may hold an empty text part beside another part."""
    ev = user("")
    ev.user_message.parts.add(text="look")
    bodies = await _bodies(api, "empty", ev)
    _sent_clean(bodies)
    assert bodies["gemini"]["contents"][0]["parts"] == [{"text": "look"}]


async def test_a_step_with_only_an_empty_text_leaves_no_chat_message(api: Stubs) -> None:
    """OpenAI Chat refuses an assistant message with neither content nor tool_calls."""
    step = assistant("", reasoning="thinking")
    step.assistant_message.parts.add(text="")
    bodies = await _bodies(api, "blank", user("hi"), step, user("again"))
    _sent_clean(bodies)
    assert [m["role"] for m in bodies["openai_chat"]["messages"]] == ["system", "user", "user"]


async def test_a_final_assistant_turn_ends_without_whitespace_for_anthropic(api: Stubs) -> None:
    """'final assistant content cannot end with trailing whitespace' (a view ending with
    the assistant is a prefill)."""
    bodies = await _bodies(api, "prefill", user("hi"), assistant("Done. \n"))
    _sent_clean(bodies)
    last = bodies["anthropic_messages"]["messages"][-1]
    assert last == {"role": "assistant", "content": [{"type": "text", "text": "Done."}]}
    # Other formats send the text as it is.
    assert bodies["openai_chat"]["messages"][-1]["content"] == "Done. \n"


async def test_chat_call_ids_fit_forty_characters(api: Stubs) -> None:
    """Chat refuses a tool_calls id over 40 characters ('string_above_max_length'); a
    Responses item id is 53. The call and its result keep the same shortened id."""
    long_id = "fc_" + "0123456789abcdef" * 3
    bodies = await _bodies(
        api, "ids", user("go"), assistant("", (long_id, "Read", "{}")), tool_result(long_id, "ok")
    )
    _sent_clean(bodies)
    msgs = bodies["openai_chat"]["messages"]
    sent_id = msgs[2]["tool_calls"][0]["id"]
    assert len(sent_id) == 40 and sent_id.startswith(long_id[:27])
    assert msgs[3]["tool_call_id"] == sent_id
    # Responses and Gemini take the id as it is.
    assert bodies["openai_responses"]["input"][1]["call_id"] == long_id


async def test_a_whitespace_only_first_message_leaves_the_user_first(api: Stubs) -> None:
    """Anthropic refuses whitespace-only text, so a first user message of only that is
    dropped; the body then opened with the assistant's turn (a restored call for an
    orphan result here), which the API refuses."""
    bodies = await _bodies(api, "ws", user(" \n"), tool_result("orphan", "late", "Read"))
    _sent_clean(bodies)
    first = bodies["anthropic_messages"]["messages"][0]
    assert first == {
        "role": "user",
        "content": [{"type": "text", "text": "(conversation continues)"}],
    }
    assert bodies["anthropic_messages"]["messages"][1]["role"] == "assistant"
    # A log whose only message is whitespace (an ideographic space here) left no message.
    bodies = await _bodies(api, "ws2", user("\u3000"))
    _sent_clean(bodies)
    assert bodies["anthropic_messages"]["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "(conversation continues)"}]}
    ]


async def test_an_empty_tool_result_is_one_anthropic_takes(api: Stubs) -> None:
    """Anthropic refuses an empty tool_result content ("content field is empty"), and an
    empty one on a failed call ("content cannot be empty if is_error is true")."""
    failed = tool_result("c2", " \n", "Bash")
    failed.tool_result.is_error = True
    bodies = await _bodies(
        api,
        "quiet",
        user("go"),
        assistant("", ("c1", "Bash", '{"command": "true"}'), ("c2", "Bash", "{}")),
        tool_result("c1", "", "Bash"),
        failed,
    )
    _sent_clean(bodies)
    results = bodies["anthropic_messages"]["messages"][2]["content"]
    assert results == [
        {"type": "tool_result", "tool_use_id": "c1", "is_error": False},
        {
            "type": "tool_result",
            "tool_use_id": "c2",
            "content": "(the tool failed with no output)",
            "is_error": True,
        },
    ]


async def test_lone_surrogate_escapes_reach_the_sdks_encodable(api: Stubs) -> None:
    """JSON may escape a lone surrogate; parsed, it is a character no UTF-8 holds, and
    the openai and anthropic clients raised UnicodeEncodeError sending the body. Parsed
    values carry U+FFFD for it (as counting does); arguments sent as text keep the text."""
    lone = '{"type": "object", "description": "\\ud800 half", "properties": {}}'
    tools = [tool_pb2.ToolDefinition(name="Odd", description="d", input_schema_json=lone)]
    args = '{"path": "\\udc00\\ud800.txt"}'
    bodies = await _bodies(
        api,
        "lone",
        user("Open it."),
        assistant("", ("s1", "Odd", args)),
        tool_result("s1", "ok", "Odd"),
        tools=tools,
    )
    _sent_clean(bodies)
    schema = bodies["anthropic_messages"]["tools"][0]["input_schema"]
    assert schema["description"] == "\ufffd half"
    assert bodies["openai_chat"]["tools"][0]["function"]["parameters"] == schema
    assert bodies["anthropic_messages"]["messages"][1]["content"][0]["input"] == {
        "path": "\ufffd\ufffd.txt"
    }
    assert bodies["gemini"]["contents"][1]["parts"][0]["functionCall"]["args"] == {
        "path": "\ufffd\ufffd.txt"
    }
    assert bodies["openai_chat"]["messages"][2]["tool_calls"][0]["function"]["arguments"] == args


async def test_an_imported_message_without_content_is_refused(api: Stubs) -> None:
    """A log of only an empty import compiled to bodies with no message at all, which
    every API refuses (Gemini: 'contents are required'; Anthropic needs a first user
    turn)."""
    await api.sessions.CreateSession(
        spb.CreateSessionRequest(session=session_pb2.Session(session_id="imp"))
    )
    ev = event_pb2.Event(
        imported_message=event_pb2.ImportedMessage(
            origin_session_id="other", origin_seq=1, role=event_pb2.MESSAGE_ROLE_USER
        )
    )
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await api.sessions.AppendEvents(spb.AppendEventsRequest(session_id="imp", events=[ev]))
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(exc.value).reason == "INVALID_FIELD"
    ev.imported_message.parts.add(text="hello")
    await api.sessions.AppendEvents(spb.AppendEventsRequest(session_id="imp", events=[ev]))


def test_the_sdk_call_sends_the_body_as_rendered() -> None:
    """The SDK round trip is real: the recorded request is what the SDK serialized, and a
    body the SDK cannot serialize fails."""
    body: dict[str, Any] = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 5,
    }
    assert sdk_fuzz.send("anthropic_messages", body) == body
    broken = copy.deepcopy(body)
    broken["messages"][0]["content"] = object()
    with pytest.raises(TypeError):
        sdk_fuzz.send("anthropic_messages", broken)


class _Filter(BaseModel):
    """A recursive argument (a filter of filters): pydantic's schema of it is a top-level
    `$ref` into `$defs`."""

    field: str
    equals: str | None = None
    any_of: list[_Filter] = []


async def test_a_schema_that_is_a_top_level_reference_is_sent_as_the_object_it_names(
    api: Stubs,
) -> None:
    """pydantic makes `{"$defs": {...}, "$ref": "#/$defs/_Filter"}` of a recursive model,
    zod-to-json-schema `{"$ref": "#/definitions/args", "definitions": {...}}` of a named
    one. OpenAI and Anthropic bodies send the object the reference names, the
    definitions kept for the references inside it; rendering 11 sent OpenAI
    `{"type": "object", "properties": {}, "$ref": ...}`: a tool whose arguments the model
    could not see. Gemini takes full JSON Schema and gets it as registered."""
    recursive = TypeAdapter(_Filter).json_schema()
    assert set(recursive) == {"$defs", "$ref"}  # what pydantic makes, read, not assumed
    named = {
        "$ref": "#/definitions/args",
        "definitions": {
            "args": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
                "additionalProperties": False,
            }
        },
        "$schema": "http://json-schema.org/draft-07/schema#",
    }
    schemas = {"search": recursive, "read_file": named}
    tools = [
        tool_pb2.ToolDefinition(name=n, description="d", input_schema_json=json.dumps(s))
        for n, s in schemas.items()
    ]
    bodies = await _bodies(api, "top-ref", user("Find the open ones."), tools=tools)
    _sent_clean(bodies)
    chat = {
        t["function"]["name"]: t["function"]["parameters"] for t in bodies["openai_chat"]["tools"]
    }
    responses = {t["name"]: t["parameters"] for t in bodies["openai_responses"]["tools"]}
    anthropic = {t["name"]: t["input_schema"] for t in bodies["anthropic_messages"]["tools"]}
    decls = bodies["gemini"]["tools"][0]["functionDeclarations"]
    gemini = {d["name"]: d["parametersJsonSchema"] for d in decls}
    filter_def = recursive["$defs"]["_Filter"]
    assert chat["search"] == responses["search"] == anthropic["search"]
    assert chat["search"]["properties"] == filter_def["properties"]
    assert chat["search"]["required"] == ["field"] and chat["search"]["type"] == "object"
    assert chat["search"]["$defs"] == recursive["$defs"]  # any_of's items still resolve
    assert "$ref" not in chat["search"]
    assert chat["read_file"] == responses["read_file"] == anthropic["read_file"]
    assert chat["read_file"]["properties"] == {"path": {"type": "string"}}
    assert chat["read_file"]["additionalProperties"] is False
    assert chat["read_file"]["$schema"] == named["$schema"]
    assert gemini["search"] == {"type": "object", **recursive}
    assert gemini["read_file"] == {"type": "object", **named}


async def test_a_top_level_reference_to_no_object_is_sent_as_an_object(api: Stubs) -> None:
    """RegisterTools refuses a top-level `type` other than "object", but reads no
    reference: `{"$ref": "#/definitions/word", "definitions": {"word": {"type":
    "string"}}}` registers, and rendering 13 sent OpenAI and Anthropic `"type":
    "string"` (the Anthropic SDK's type takes only "object"; both APIs refuse it), in
    every request that offered the tool. It is sent as registered, typed "object"; a
    definition typed `["object", "null"]` as the object it describes."""
    to_string = {"$ref": "#/definitions/word", "definitions": {"word": {"type": "string"}}}
    nullable = {
        "$ref": "#/$defs/Args",
        "$defs": {"Args": {"type": ["object", "null"], "properties": {"q": {"type": "string"}}}},
    }
    tools = [
        tool_pb2.ToolDefinition(name=n, description="d", input_schema_json=json.dumps(s))
        for n, s in (("say", to_string), ("find", nullable))
    ]
    bodies = await _bodies(api, "ref-kind", user("Say it."), tools=tools)
    _sent_clean(bodies)
    anthropic = {t["name"]: t["input_schema"] for t in bodies["anthropic_messages"]["tools"]}
    chat = {
        t["function"]["name"]: t["function"]["parameters"] for t in bodies["openai_chat"]["tools"]
    }
    responses = {t["name"]: t["parameters"] for t in bodies["openai_responses"]["tools"]}
    assert chat == responses
    assert anthropic["say"] == {"type": "object", **to_string}
    assert chat["say"] == {**anthropic["say"], "properties": {}}  # OpenAI's rule
    for sent in (chat["find"], anthropic["find"]):
        assert sent["type"] == "object" and sent["properties"] == {"q": {"type": "string"}}


async def test_a_final_reply_of_whitespace_and_thinking_leaves_no_thinking_turn(
    api: Stubs,
) -> None:
    """Claude's answer after a tool ran may be thinking and "\n\n" of text. Logged with its
    thinking blocks as the last event, the Anthropic body (which drops whitespace-only
    text) ended with an assistant turn of thinking alone, which the API refuses ("The
    final block in an assistant message cannot be `thinking`"), until rendering 15: that
    turn is left out, the tool's result ends the body. Its text still reaches the other
    formats."""

    def thinking(ev: event_pb2.Event, signature: str) -> event_pb2.Event:
        state = ev.assistant_message.native_state
        state.route_id, state.kind = sdk_fuzz.ROUTE_ID, "anthropic.thinking"
        blocks = [{"type": "thinking", "thinking": "Reading it.", "signature": signature}]
        state.data = json.dumps(blocks).encode()
        return ev

    bodies = await _bodies(
        api,
        "thinking-last",
        user("What does a.py print?"),
        thinking(assistant("", ("toolu_1", "Read", '{"path": "a.py"}')), "EqQB"),
        tool_result("toolu_1", "print(1)", "Read"),
        thinking(assistant("\n\n"), "EqQC"),
    )
    _sent_clean(bodies)
    turns = bodies["anthropic_messages"]["messages"]
    assert [t["role"] for t in turns] == ["user", "assistant", "user"]
    assert turns[1]["content"][0] == {
        "type": "thinking",
        "thinking": "Reading it.",
        "signature": "EqQB",
    }
    assert turns[2]["content"][0]["type"] == "tool_result"
    assert bodies["openai_responses"]["input"][-1] == {
        "type": "message",
        "role": "assistant",
        "content": "\n\n",
    }
