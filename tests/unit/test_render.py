"""Provider bodies checked against each provider's documented request shape: required
fields, roles, tool formats, image parts, cache hints."""

from __future__ import annotations

import base64
import itertools
import json
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from server.compiler import render as render_mod
from server.compiler import render_common
from server.compiler.compile import CompileInputs, compile_view
from server.compiler.projection import ImagePolicy
from server.compiler.provider_rules import OPENER
from server.compiler.render import RENDERING, RenderFormat, render
from server.compiler.render_common import flat_schema, schema
from server.domain.model import (
    ArtifactRef,
    AssistantMessage,
    ContentPart,
    Event,
    ImportedMessage,
    Role,
    Route,
    Session,
    ToolCall,
    ToolResult,
    TurnStarted,
    UserMessage,
)
from server.domain.tools import ToolSpec
from tests.unit.test_system_prompt import WordCounter

PNG = ArtifactRef("a1", "image/png", 4, "f" * 64, 10, 10)
DATA = {"a1": b"\x89PNG"}
SCHEMA = '{"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}'


def view(
    *payloads: Any,
    existing: tuple[tuple[str, int], ...] = (("a1", 4),),
    tools: tuple[ToolSpec, ...] = (ToolSpec("read", "Read a file", SCHEMA),),
) -> Any:
    events = tuple(Event(i + 1, f"e{i + 1}", 0, p) for i, p in enumerate(payloads))
    inputs = CompileInputs(
        "s:1",
        Session("s", 0, 0),
        events,
        len(events),
        Route(model="m"),
        tools=tools,
        images=ImagePolicy(existing=existing),
    )
    return compile_view(inputs, WordCounter())


V = view(
    ImportedMessage("other", 3, Role.SYSTEM, (ContentPart(text="imported rule"),)),
    UserMessage((ContentPart(text="look at this"), ContentPart(attachment=PNG))),
    AssistantMessage(
        (ContentPart(text="reading"),),
        (ToolCall("c1", "read", '{"path": "a.py"}'), ToolCall("c2", "read", '{"path": "b.py"}')),
    ),
    ToolResult("c1", "read", text="print(1)"),
    ToolResult("c2", "read", text="oops", is_error=True),
    UserMessage((ContentPart(text="thanks"),)),
)


def body(fmt: RenderFormat, v: Any = V) -> dict[str, Any]:
    text = render(v, fmt, DATA)
    parsed: dict[str, Any] = json.loads(text)
    return parsed


def test_openai_chat_completions() -> None:
    b = body(RenderFormat.OPENAI_CHAT)
    assert b["model"] == "m" and b["max_completion_tokens"] > 0
    assert b["prompt_cache_key"] == "ctxcc-" + V.prefix_digest[:32]
    roles = [m["role"] for m in b["messages"]]
    assert roles == ["system", "system", "user", "assistant", "tool", "tool", "user"]
    assert b["messages"][0]["content"] == V.system_prompt
    image = b["messages"][2]["content"][1]
    assert image == {
        "type": "image_url",
        "image_url": {"url": "data:image/png;base64," + base64.b64encode(b"\x89PNG").decode()},
    }
    calls = b["messages"][3]["tool_calls"]
    assert [c["id"] for c in calls] == ["c1", "c2"]
    assert all(c["type"] == "function" and json.loads(c["function"]["arguments"]) for c in calls)
    assert [m["tool_call_id"] for m in b["messages"][4:6]] == ["c1", "c2"]
    tool = b["tools"][0]
    assert tool["type"] == "function" and tool["function"]["parameters"]["required"] == ["path"]


def test_openai_responses() -> None:
    b = body(RenderFormat.OPENAI_RESPONSES)
    assert b["instructions"] == V.system_prompt and b["max_output_tokens"] > 0
    kinds = [(i["type"], i.get("role")) for i in b["input"]]
    assert kinds == [
        ("message", "developer"),
        ("message", "user"),
        ("message", "assistant"),
        ("function_call", None),
        ("function_call", None),
        ("function_call_output", None),
        ("function_call_output", None),
        ("message", "user"),
    ]
    assert b["input"][1]["content"][1]["type"] == "input_image"
    assert b["input"][1]["content"][1]["image_url"].startswith("data:image/png;base64,")
    assert b["input"][3] == {
        "type": "function_call",
        "call_id": "c1",
        "name": "read",
        "arguments": '{"path": "a.py"}',
    }
    assert b["input"][5] == {"type": "function_call_output", "call_id": "c1", "output": "print(1)"}
    assert b["tools"][0]["type"] == "function" and b["tools"][0]["name"] == "read"


def test_anthropic_messages() -> None:
    b = body(RenderFormat.ANTHROPIC_MESSAGES)
    assert b["max_tokens"] > 0
    roles = [m["role"] for m in b["messages"]]
    assert roles[0] == "user" and all(a != c for a, c in itertools.pairwise(roles))
    stable, volatile = b["system"]
    assert stable["cache_control"] == {"type": "ephemeral"} and "cache_control" not in volatile
    assert volatile["text"].startswith("<environment>")
    assert b["tools"][-1]["cache_control"] == {"type": "ephemeral"}
    assert b["tools"][0]["input_schema"]["required"] == ["path"]
    first = b["messages"][0]["content"]
    assert first[0] == {"type": "text", "text": "imported rule"}
    assert first[2] == {
        "type": "image",
        "source": {
            "type": "base64",
            "media_type": "image/png",
            "data": base64.b64encode(b"\x89PNG").decode(),
        },
    }
    uses = [c for c in b["messages"][1]["content"] if c["type"] == "tool_use"]
    assert [(u["id"], u["input"]) for u in uses] == [
        ("c1", {"path": "a.py"}),
        ("c2", {"path": "b.py"}),
    ]
    results = b["messages"][2]["content"]
    assert [(r["type"], r["tool_use_id"], r["is_error"]) for r in results[:2]] == [
        ("tool_result", "c1", False),
        ("tool_result", "c2", True),
    ]
    assert results[2] == {"type": "text", "text": "thanks"}  # merged into the same user turn


def test_anthropic_first_turn_is_always_user() -> None:
    v = view(AssistantMessage((ContentPart(text="hello"),)), UserMessage((ContentPart(text="hi"),)))
    text = render(v, RenderFormat.ANTHROPIC_MESSAGES)
    assert json.loads(text)["messages"][0]["content"][0]["text"] == OPENER


def test_gemini_generate_content() -> None:
    b = body(RenderFormat.GEMINI)
    assert b["systemInstruction"]["parts"][0]["text"] == V.system_prompt
    assert b["generationConfig"]["maxOutputTokens"] > 0
    roles = [c["role"] for c in b["contents"]]
    assert roles == ["user", "model", "user"]
    assert b["contents"][0]["parts"][2] == {
        "inlineData": {"mimeType": "image/png", "data": base64.b64encode(b"\x89PNG").decode()}
    }
    calls = [p["functionCall"] for p in b["contents"][1]["parts"] if "functionCall" in p]
    # No ids: Vertex AI refuses them; responses follow their calls' order.
    assert calls == [
        {"name": "read", "args": {"path": "a.py"}},
        {"name": "read", "args": {"path": "b.py"}},
    ]
    responses = [
        p["functionResponse"] for p in b["contents"][2]["parts"] if "functionResponse" in p
    ]
    assert [set(r) for r in responses] == [{"name", "response"}] * 2
    assert [r["response"] for r in responses] == [{"output": "print(1)"}, {"error": "oops"}]
    assert b["tools"][0]["functionDeclarations"][0]["parametersJsonSchema"]["required"] == ["path"]


def test_bodies_are_deterministic_and_images_by_reference_are_explained() -> None:
    for fmt in RenderFormat:
        assert render(V, fmt, DATA) == render(V, fmt, DATA)
        text = render(replace(V), fmt, {})  # no bytes: the reference is stated, not dropped
        assert "sent by reference only" in text


def test_a_view_is_rendered_with_the_version_its_compile_records() -> None:
    """Exact time travel: a compile recorded at rendering version 0 is rebuilt with the
    bodies it was given (render0, frozen), also where version 1 sends other bytes (a call
    name no API takes, an empty tool result, an image type the provider refuses); a new
    compile renders at render.RENDERING, which its inputs carry to the view."""
    svg = ArtifactRef("a2", "image/svg+xml", 4, "e" * 64, 10, 10)
    v = view(
        UserMessage((ContentPart(text="see"), ContentPart(attachment=svg))),
        AssistantMessage((), (ToolCall("c1", "functions.Read", '{"path": "a.py"}'),)),
        ToolResult("c1", "functions.Read", text=""),
        existing=(("a2", 4),),
    )
    assert v.rendering == RENDERING == 16
    data = {**DATA, "a2": b"<svg/>"}
    now = json.loads(render(v, RenderFormat.ANTHROPIC_MESSAGES, data))
    then = json.loads(render(replace(v, rendering=0), RenderFormat.ANTHROPIC_MESSAGES, data))
    assert then != now
    call_then, call_now = then["messages"][1]["content"][0], now["messages"][1]["content"][0]
    assert (call_then["name"], call_now["name"]) == ("functions.Read", "functions_Read")
    result_then, result_now = then["messages"][2]["content"][0], now["messages"][2]["content"][0]
    assert result_then["content"] == "" and "content" not in result_now
    image_then, image_now = then["messages"][0]["content"][1], now["messages"][0]["content"][1]
    assert image_then["type"] == "image"
    assert image_now == {
        "type": "text",
        "text": "[image a2 (image/svg+xml) not sent: the provider takes no image/svg+xml]",
    }


def test_a_union_at_a_schemas_top_level_is_flattened_from_rendering_6() -> None:
    """flat_schema: the branches' properties side by side (the top level's own first), a
    property the branches type differently as an anyOf, required what the top level and
    allOf require and what every anyOf/oneOf branch does; enum and not dropped; unions
    below the top level kept. Compiles recorded before version 6 send the schema as is."""
    nested = {"anyOf": [{"type": "string"}, {"type": "null"}]}
    union = {
        "type": "object",
        "properties": {"path": nested},
        "required": ["path"],
        "oneOf": [
            {"properties": {"n": {"type": "integer"}, "x": {"type": "string"}}, "required": ["n"]},
            {"properties": {"n": {"type": "string"}}, "required": ["n", "y"]},
        ],
        "enum": [{"path": "a"}],
        "not": {"required": ["z"]},
    }
    assert flat_schema(union) == {
        "type": "object",
        "properties": {
            "path": nested,
            "n": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
            "x": {"type": "string"},
        },
        "required": ["path", "n"],
    }
    # A branch that is no object schema (a bare type) leaves nothing required of anyOf.
    loose = {"anyOf": [{"properties": {"a": {}}, "required": ["a"]}, True]}
    assert flat_schema(loose) == {"type": "object", "properties": {"a": {}}}
    text = json.dumps(union)
    assert schema(text, flat=True) == flat_schema(union)
    assert schema(text) == union  # as rendering 5 sent it
    tool = ToolSpec("edit", "Edit", text)
    now = view(UserMessage((ContentPart(text="go"),)), tools=(tool,))
    body = json.loads(render(now, RenderFormat.ANTHROPIC_MESSAGES, {}))
    assert body["tools"][0]["input_schema"] == flat_schema(union)
    then = json.loads(render(replace(now, rendering=5), RenderFormat.ANTHROPIC_MESSAGES, {}))
    assert then["tools"][0]["input_schema"] == union


def test_an_object_schema_without_properties_gets_them_in_openai_bodies_from_rendering_9() -> None:
    """OpenAI refuses parameters without `properties` ("object schema missing properties"):
    from rendering 9 its bodies add `"properties": {}`, which constrains nothing; other
    formats, and a compile recorded at 8, send the schema as registered."""
    bare = '{"type": "object", "additionalProperties": false}'
    now = view(UserMessage((ContentPart(text="go"),)), tools=(ToolSpec("whoami", "d", bare),))
    want = {"type": "object", "additionalProperties": False}
    for when, openai in ((now, {**want, "properties": {}}), (replace(now, rendering=8), want)):
        chat = json.loads(render(when, RenderFormat.OPENAI_CHAT, {}))
        responses = json.loads(render(when, RenderFormat.OPENAI_RESPONSES, {}))
        assert chat["tools"][0]["function"]["parameters"] == openai
        assert responses["tools"][0]["parameters"] == openai
        anthropic = json.loads(render(when, RenderFormat.ANTHROPIC_MESSAGES, {}))
        assert anthropic["tools"][0]["input_schema"] == want
        gemini = json.loads(render(when, RenderFormat.GEMINI, {}))
        assert gemini["tools"][0]["functionDeclarations"][0]["parametersJsonSchema"] == want
    assert schema("{}", properties=False) == {"type": "object", "properties": {}}
    null = '{"type": "object", "properties": null}'
    assert schema(null, properties=True) == {"type": "object", "properties": {}}
    assert schema(null) == {"type": "object", "properties": None}


def test_image_notes_name_their_messages_reason_from_rendering_10() -> None:
    """An image in an imported tool message is noted as a tool result's, and one Chat
    cannot carry in a system message as a system message's; rendering 9 noted them as an
    assistant turn's and as "sent by reference only"."""
    v = view(
        UserMessage((ContentPart(text="go"),)),
        ImportedMessage("o", 1, Role.SYSTEM, (ContentPart(text="s"), ContentPart(attachment=PNG))),
        ImportedMessage("o", 2, Role.TOOL, (ContentPart(text="t"), ContentPart(attachment=PNG))),
    )
    old = replace(v, rendering=9)
    for fmt in RenderFormat:
        assert "a tool result carries no images" in render(v, fmt, DATA), fmt
        assert "an assistant turn carries no images" in render(old, fmt, DATA), fmt
    assert "a system message carries no images" in render(v, RenderFormat.OPENAI_CHAT, DATA)
    assert "sent by reference only" in render(old, RenderFormat.OPENAI_CHAT, DATA)


def test_rendering_7_jpg_alias_long_responses_ids_failed_empty_results() -> None:
    """image/jpg (a misspelling clients send, which the daemon reads as a JPEG) goes to
    every provider as image/jpeg; a Responses call id over 64 characters is shortened the
    same in the call and its output (the API refuses longer); a failed call without
    output says it failed in OpenAI bodies, as in Anthropic's. Rendering 6 did none."""
    jpg = ArtifactRef("j1", "image/jpg", 4, "e" * 64, 16, 16)
    long_id = "mcp__jira__search_" + "x" * 70
    v = view(
        UserMessage((ContentPart(text="see"), ContentPart(attachment=jpg))),
        AssistantMessage((), (ToolCall(long_id, "read", "{}"), ToolCall("c2", "read", "{}"))),
        ToolResult(long_id, "read", text="ok"),
        ToolResult("c2", "read", text="", is_error=True),
        existing=(("j1", 4),),
    )
    data = {"j1": b"\xff\xd8\xff\xe0"}
    sent = base64.b64encode(data["j1"]).decode()
    for fmt in RenderFormat:
        text = render(v, fmt, data)
        assert sent in text and "image/jpeg" in text and "image/jpg" not in text, fmt
        assert "image/jpg" in render(replace(v, rendering=6), fmt, data), fmt
    responses = json.loads(render(v, RenderFormat.OPENAI_RESPONSES, data))["input"]
    ids = [i["call_id"] for i in responses if i["type"] == "function_call"]
    outputs = [i for i in responses if i["type"] == "function_call_output"]
    assert len(ids[0]) == 64 and ids[0].startswith(long_id[:51]) and ids[1] == "c2"
    assert [o["call_id"] for o in outputs] == ids
    assert [o["output"] for o in outputs] == ["ok", "(the tool failed with no output)"]
    chat = json.loads(render(v, RenderFormat.OPENAI_CHAT, data))["messages"]
    assert [m["content"] for m in chat if m["role"] == "tool"] == [
        "ok",
        "(the tool failed with no output)",
    ]
    then = json.loads(render(replace(v, rendering=6), RenderFormat.OPENAI_RESPONSES, data))
    old_ids = [i["call_id"] for i in then["input"] if i["type"] == "function_call"]
    assert old_ids[0] == long_id
    assert [i["output"] for i in then["input"] if i["type"] == "function_call_output"] == [
        "ok",
        "",
    ]


def test_flattening_reaches_nested_unions_and_references() -> None:
    """A branch that is itself a union (zod's nested unions, an allOf holding a oneOf),
    a chain of references and an OpenAPI component reference: every property reaches the
    flat schema, with what every branch requires."""
    nested = {
        "anyOf": [
            {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
            {
                "anyOf": [
                    {"properties": {"b": {"type": "integer"}}, "required": ["b", "k"]},
                    {"properties": {"c": {"type": "integer"}}, "required": ["c", "k"]},
                ]
            },
        ]
    }
    assert flat_schema(nested) == {
        "type": "object",
        "properties": {"a": {"type": "string"}, "b": {"type": "integer"}, "c": {"type": "integer"}},
    }
    base = {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}
    intersection = {
        "allOf": [
            {"$ref": "#/$defs/Base"},
            {"oneOf": [{"properties": {"x": {}}, "required": ["x"]}, {"properties": {"y": {}}}]},
        ],
        "$defs": {"Base": base},
    }
    flat = flat_schema(intersection)
    assert flat["properties"] == {"id": {"type": "string"}, "x": {}, "y": {}}
    assert flat["required"] == ["id"]
    chain = {
        "oneOf": [{"$ref": "#/$defs/A"}],
        "$defs": {"A": {"$ref": "#/$defs/B"}, "B": base, "Loop": {"$ref": "#/$defs/Loop"}},
    }
    assert flat_schema(chain)["properties"] == {"id": {"type": "string"}}
    assert flat_schema(chain)["required"] == ["id"]
    looping = {"oneOf": [{"$ref": "#/$defs/Loop"}], "$defs": {"Loop": {"$ref": "#/$defs/Loop"}}}
    assert flat_schema(looping)["properties"] == {}  # a cycle stops, adds nothing
    components = {
        "oneOf": [{"$ref": "#/components/schemas/Cat"}],
        "components": {"schemas": {"Cat": {"properties": {"m~/": {}}, "required": ["m~/"]}}},
    }
    assert flat_schema(components)["required"] == ["m~/"]
    escaped = {"oneOf": [{"$ref": "#/d/a~1b~0c"}], "d": {"a/b~c": base}}
    assert flat_schema(escaped)["required"] == ["id"]


def test_a_view_with_no_message_yet_is_sent_with_the_opener() -> None:
    """Compiled before the first user message, or with only turn markers logged: every
    body holds one user message, the opener, where Anthropic, Gemini and Responses
    refuse a request with none; rendering 10 sent the empty lists."""
    for v in (view(), view(TurnStarted("t"))):
        assert v.messages == ()
        bodies = {f: json.loads(render(v, f, {})) for f in RenderFormat}
        assert bodies[RenderFormat.OPENAI_CHAT]["messages"][1:] == [
            {"role": "user", "content": OPENER}
        ]
        assert bodies[RenderFormat.OPENAI_RESPONSES]["input"] == [
            {"type": "message", "role": "user", "content": OPENER}
        ]
        assert bodies[RenderFormat.ANTHROPIC_MESSAGES]["messages"] == [
            {"role": "user", "content": [{"type": "text", "text": OPENER}]}
        ]
        assert bodies[RenderFormat.GEMINI]["contents"] == [
            {"role": "user", "parts": [{"text": OPENER}]}
        ]
        then = {f: json.loads(render(replace(v, rendering=10), f, {})) for f in RenderFormat}
        assert len(then[RenderFormat.OPENAI_CHAT]["messages"]) == 1  # the system prompt
        assert then[RenderFormat.OPENAI_RESPONSES]["input"] == []
        assert then[RenderFormat.ANTHROPIC_MESSAGES]["messages"] == []
        assert then[RenderFormat.GEMINI]["contents"] == []


def test_an_imported_tool_message_gets_a_call_id_every_api_takes() -> None:
    """A tool message imported from another session carries no call id, nor does the
    stand-in call the view gives it: OpenAI bodies send both as `cx_` (Anthropic's
    encoding of the empty id), which Responses takes (it refuses an empty call_id);
    rendering 6 sent "" in both."""
    v = view(
        UserMessage((ContentPart(text="go on"),)),
        ImportedMessage("other", 3, Role.TOOL, (ContentPart(text="42 rows"),)),
    )
    responses = json.loads(render(v, RenderFormat.OPENAI_RESPONSES, {}))["input"]
    ids = [i["call_id"] for i in responses if "call_id" in i]
    assert ids == ["cx_", "cx_"]
    chat = json.loads(render(v, RenderFormat.OPENAI_CHAT, {}))["messages"]
    assert [c["id"] for m in chat for c in m.get("tool_calls", [])] == ["cx_"]
    assert [m["tool_call_id"] for m in chat if m["role"] == "tool"] == ["cx_"]
    anthropic = json.loads(render(v, RenderFormat.ANTHROPIC_MESSAGES, {}))["messages"]
    uses = [b["id"] for m in anthropic for b in m["content"] if b["type"] == "tool_use"]
    assert uses == ["cx_"]
    then = json.loads(render(replace(v, rendering=6), RenderFormat.OPENAI_RESPONSES, {}))
    assert [i["call_id"] for i in then["input"] if "call_id" in i] == ["", ""]


def test_a_branch_named_many_times_is_flattened_once_per_depth(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A union whose k branches all name one definition, itself such a union: flattened
    once per definition and depth, not k^depth times; the result the same either way."""
    resolved = [0]
    real = render_common._resolved

    def counted(root: Any, branch: object) -> object:
        resolved[0] += 1
        return real(root, branch)

    monkeypatch.setattr(render_common, "_resolved", counted)
    defs: dict[str, Any] = {
        f"d{i}": {"anyOf": [{"$ref": f"#/$defs/d{i + 1}"}] * 3} for i in range(1, 8)
    }
    defs["d8"] = {"type": "object", "properties": {"a": {}}, "required": ["a"]}
    bomb = {"anyOf": [{"$ref": "#/$defs/d1"}] * 3, "$defs": defs}
    assert flat_schema(bomb) == {
        "type": "object",
        "$defs": defs,
        "properties": {"a": {}},
        "required": ["a"],
    }
    # 3 branches at each of 8 depths (and the top's own properties), not 3^8.
    assert resolved[0] <= 3 * 8 + 9
    looping = {
        "anyOf": [{"$ref": "#/$defs/L"}] * 4,
        "$defs": {"L": {"anyOf": [{"$ref": "#/$defs/L"}] * 4}},
    }
    resolved[0] = 0
    assert flat_schema(looping)["properties"] == {}
    assert resolved[0] <= 4 * 9 + 9


_BODY_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=7)
        | st.dictionaries(st.text(max_size=3) | st.integers(), inner, max_size=4)
    ),
    max_leaves=40,
)


@given(_BODY_JSON)
@settings(max_examples=500)
def test_a_body_in_pieces_is_the_text_of_one_dumps(value: object) -> None:
    whole = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    piece = render_mod.DUMPS_PIECE
    render_mod.DUMPS_PIECE = 2  # pieces of arrays of any length
    try:
        assert render_mod.dumps_in_pieces(value) == whole
    finally:
        render_mod.DUMPS_PIECE = piece


def test_a_long_body_is_encoded_a_few_members_a_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """A body of 100,000 messages was one json.dumps call (holding the GIL ~150 ms a
    format); no call encodes more than DUMPS_PIECE of its members now."""
    dumps = render_mod._dumps
    widths: list[int] = []

    def counted(value: object) -> str:
        widths.append(len(value) if isinstance(value, list | dict) else 1)
        return dumps(value)

    monkeypatch.setattr(render_mod, "_dumps", counted)
    messages = [
        {"role": "user", "content": [{"type": "text", "text": f"m{i}"}]} for i in range(100_000)
    ]
    body = {"model": "m", "messages": messages, "tools": []}
    text = render_mod.dumps_in_pieces(body)
    assert text == json.dumps(body, ensure_ascii=False, separators=(",", ":"))
    assert max(widths) <= render_mod.DUMPS_PIECE


def test_a_merged_turn_is_encoded_a_few_blocks_a_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """Anthropic merges every tool result of a step into one user turn: one member of the
    body's messages, which was one json.dumps call however many blocks it held (256
    results of 1 MiB: ~2.7 s holding the GIL). Its blocks, and a result's own blocks,
    go DUMPS_PIECE a call now, in a body of the same text."""
    dumps = render_mod._dumps
    blocks_a_call: list[int] = []

    def counted(value: object) -> str:
        text = dumps(value)
        blocks_a_call.append(text.count('"type":"tool_') + text.count('"type":"text"'))
        return text

    monkeypatch.setattr(render_mod, "_dumps", counted)
    calls = tuple(ToolCall(f"c{i}", "read", '{"path": "a.py"}') for i in range(100))
    v = view(
        UserMessage((ContentPart(text="go"),)),
        AssistantMessage((), calls),
        *(ToolResult(f"c{i}", "read", text=f"r{i}") for i in range(100)),
    )
    body: Any = render_mod.render_body(v, RenderFormat.ANTHROPIC_MESSAGES, {})
    merged = [m for m in body["messages"] if len(m["content"]) >= 100]
    assert len(merged) == 2, [len(m["content"]) for m in body["messages"]]  # calls, results
    # A result holding many blocks of its own is split again.
    blocks = [{"type": "text", "text": f"b{i}"} for i in range(40)]
    merged[1]["content"][7]["content"] = blocks
    text = render_mod.dumps_in_pieces(body)
    assert text == json.dumps(body, ensure_ascii=False, separators=(",", ":"))
    assert max(blocks_a_call) <= render_mod.DUMPS_PIECE, max(blocks_a_call)


def test_a_top_level_reference_is_the_schema_it_names_from_rendering_12() -> None:
    defs = {"Node": {"type": "object", "properties": {"kids": {"$ref": "#/$defs/Node"}}}}
    top = {"$ref": "#/$defs/Node", "$defs": defs, "description": "a tree"}
    assert schema(json.dumps(top), top_ref=True) == {
        **defs["Node"],
        "$defs": defs,
        "description": "a tree",
    }
    # Through a chain of references; the top level's own keys win.
    chain = {"$ref": "#/a", "a": {"$ref": "#/b"}, "b": {"type": "object", "title": "B"}}
    assert schema(json.dumps({**chain, "title": "T"}), top_ref=True)["title"] == "T"
    assert schema(json.dumps(chain), top_ref=True)["title"] == "B"
    # What names nothing, no object, or only itself stays as registered (with its type).
    for kept in (
        {"$ref": "#/$defs/Missing", "$defs": {}},
        {"$ref": "https://example.com/schema.json"},
        {"$ref": "#/x", "x": ["not", "an", "object"]},
        {"$ref": "#/x", "x": {"$ref": "#/x"}},
    ):
        assert schema(json.dumps(kept), top_ref=True) == {"type": "object", **kept}
    v = view(
        UserMessage((ContentPart(text="go"),)),
        tools=(ToolSpec("walk", "Walks a tree", json.dumps(top)),),
    )
    now = json.loads(render(v, RenderFormat.OPENAI_CHAT, {}))["tools"]
    then = json.loads(render(replace(v, rendering=11), RenderFormat.OPENAI_CHAT, {}))["tools"]
    walk_now, walk_then = (
        next(t["function"]["parameters"] for t in tools if t["function"]["name"] == "walk")
        for tools in (now, then)
    )
    assert walk_now["properties"] == defs["Node"]["properties"] and "$ref" not in walk_now
    assert walk_then["properties"] == {} and walk_then["$ref"] == "#/$defs/Node"


def test_large_tools_are_encoded_a_few_megabytes_a_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """200 tools of 250 KB schemas (52 MB of JSON) were one json.dumps call under the
    256-member pieces, holding the GIL ~0.33 s a render format: no call encodes more
    than 16 of them now."""
    dumps = render_mod._dumps
    sizes: list[int] = []

    def measured(value: object) -> str:
        text = dumps(value)
        sizes.append(len(text))
        return text

    monkeypatch.setattr(render_mod, "_dumps", measured)
    word = "word " * 20
    tools = [
        {
            "type": "function",
            "function": {
                "name": f"t{i}",
                "parameters": {
                    "type": "object",
                    "properties": {f"p{i}_{j}": {"description": word} for j in range(1_900)},
                },
            },
        }
        for i in range(200)
    ]
    body = {"model": "m", "messages": [], "tools": tools}
    text = render_mod.dumps_in_pieces(body)
    assert text == json.dumps(body, ensure_ascii=False, separators=(",", ":"))
    assert len(text) > 40 << 20
    assert max(sizes) < 8 << 20


def test_a_top_level_reference_to_no_object_schema_is_kept_from_rendering_14() -> None:
    """A top-level `$ref` naming a string or an array schema (RegisterTools checks only a
    `type` written at the top level) was sent to OpenAI and Anthropic as that type, which
    both refuse for every request that offers the tool: from rendering 14 it is kept as
    registered with `"type": "object"`, and a definition typed `["object", "null"]` is
    sent as the object it describes."""
    to_string = {"$ref": "#/definitions/D", "definitions": {"D": {"type": "string"}}}
    to_array = {"$ref": "#/$defs/L", "$defs": {"L": {"$ref": "#/$defs/A"}, "A": {"type": "array"}}}
    for kept in (to_string, to_array):
        for flat in (True, False):
            sent = schema(json.dumps(kept), flat=flat, top_ref=True, ref_objects=True)
            assert sent == {"type": "object", **kept}
    nullable = {"type": ["object", "null"], "properties": {"a": {"type": "string"}}}
    top = {"$ref": "#/$defs/N", "$defs": {"N": nullable}}
    sent = schema(json.dumps(top), top_ref=True, ref_objects=True)
    assert sent == {**nullable, "type": "object", "$defs": top["$defs"]}
    v = view(
        UserMessage((ContentPart(text="go"),)),
        tools=(ToolSpec("say", "Says a word", json.dumps(to_string)),),
    )
    for fmt in (RenderFormat.OPENAI_CHAT, RenderFormat.OPENAI_RESPONSES):
        for rendering, kind in ((13, "string"), (14, "object")):
            tools = json.loads(render(replace(v, rendering=rendering), fmt, {}))["tools"]
            params = [t.get("function", t)["parameters"] for t in tools]
            assert [p["type"] for p in params] == [kind], (fmt, rendering)
    for rendering, kind in ((13, "string"), (14, "object")):
        body = json.loads(render(replace(v, rendering=rendering), RenderFormat.ANTHROPIC_MESSAGES))
        assert [t["input_schema"]["type"] for t in body["tools"]] == [kind], rendering
