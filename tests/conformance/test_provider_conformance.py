"""Every body ctxcc renders for a corpus of realistic sessions is a request the provider
accepts: validated against the official SDKs' request types (Python: pydantic over
`openai`, `anthropic` and `google-genai` types with unknown keys forbidden; TypeScript:
`tsc --strict` over `openai` and `@anthropic-ai/sdk` types), and checked for the rules
the types cannot express (call/result pairing and order, role alternation, cache
breakpoints, system placement, output caps)."""

from __future__ import annotations

import asyncio
import copy
import json
import re
import subprocess
import tempfile
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import grpc
import pytest

from ctxcc.v1 import tool_pb2, view_pb2
from ctxcc.v1 import tool_service_pb2 as tpb
from server.app import Daemon
from tests.conformance import agent_tools, ts_bodies
from tests.conformance.corpus import CJK, REASONING, Case, build
from tests.conformance.sdk_types import errors_for
from tests.conftest import make_config, stubs_for
from tests.helpers import error_info

REPO = Path(__file__).resolve().parents[2]
TS_DIR = REPO / "client" / "typescript"
ANTHROPIC_ID = re.compile(r"^[a-zA-Z0-9_-]+$")
# A system prompt of the size real agents send (tens of KB), as the kernel prefix.
KERNEL = "You are a coding agent working in a user's repository.\n" + "\n".join(
    f"{i}. Follow the project's conventions; explain risky steps before taking them."
    for i in range(600)
)
MODEL_MAX_OUTPUT = 64_000  # claude-sonnet-4 in the shipped model catalog


async def _corpus(tmp: Path) -> list[Case]:
    kernel = tmp / "kernel.md"
    kernel.write_text(KERNEL, encoding="utf-8")
    daemon = Daemon(make_config(tmp / "data", kernel_file=str(kernel)))
    await daemon.start()
    api = stubs_for(f"unix:{daemon.endpoints.unix}")
    try:
        return await build(api)
    finally:
        await api.channel.close()
        await daemon.stop()


@pytest.fixture(scope="module")
def corpus() -> Iterator[list[Case]]:
    with tempfile.TemporaryDirectory(prefix="ctxcc-conf-", dir="/tmp") as d:
        yield asyncio.run(_corpus(Path(d)))


def _all(corpus: list[Case]) -> Iterator[tuple[Case, str, dict[str, Any]]]:
    for case in corpus:
        assert len(case.bodies) == 4, case.name
        for fmt, body in case.bodies.items():
            yield case, fmt, body


def test_every_body_validates_against_the_python_sdk_types(corpus: list[Case]) -> None:
    failures = {
        f"{case.name} / {fmt}": errs
        for case, fmt, body in _all(corpus)
        if (errs := errors_for(fmt, body))
    }
    assert not failures, json.dumps(failures, indent=1)


def test_the_python_validators_catch_what_the_apis_refuse(corpus: list[Case]) -> None:
    """The checker itself must fail on bodies the APIs refuse: an unknown key deep in a
    content block, a missing required field, an input image without `detail`."""
    case = next(c for c in corpus if c.name == "images inline")
    for fmt, body in case.bodies.items():
        assert errors_for(fmt, body) == []
        broken = copy.deepcopy(body)
        messages: list[dict[str, Any]] = (
            broken.get("messages") or broken.get("input") or broken["contents"]
        )
        last = messages[-1]
        parts = last.get("content") or last.get("parts")
        if isinstance(parts, list):
            parts[0]["unknown_key"] = 1
        else:
            last["unknown_key"] = 1
        assert errors_for(fmt, broken), f"{fmt}: an unknown key passed"
    responses = copy.deepcopy(case.bodies["openai_responses"])
    image = next(p for p in responses["input"][0]["content"] if p["type"] == "input_image")
    del image["detail"]
    assert errors_for("openai_responses", responses)
    anthropic = copy.deepcopy(case.bodies["anthropic_messages"])
    del anthropic["max_tokens"]
    assert errors_for("anthropic_messages", anthropic)


def test_every_body_type_checks_with_the_typescript_sdks(corpus: list[Case]) -> None:
    tsc = TS_DIR / "node_modules" / ".bin" / "tsc"
    sdk = TS_DIR / "node_modules" / "@anthropic-ai" / "sdk"
    assert tsc.exists() and sdk.exists(), (
        "client/typescript dev dependencies missing: run `make clients`"
    )
    lines = ts_bodies.imports()
    n = 0
    for case, fmt, body in _all(corpus):
        if fmt in ts_bodies.TYPES or fmt == "gemini":
            lines.append(f"// {case.name}")
            lines += ts_bodies.declarations(n, fmt, body)
            n += 1
    # The checker must refuse what the API refuses: each of these has to be an error.
    sample = next(c for c in corpus if c.name == "images inline").bodies
    responses = copy.deepcopy(sample["openai_responses"])
    responses["tools"] = [{"type": "function", "name": "f", "parameters": {}}]  # no strict
    anthropic = copy.deepcopy(sample["anthropic_messages"])
    anthropic["messages"][0]["content"][0]["unknown_key"] = 1
    for fmt, body in (("openai_responses", responses), ("anthropic_messages", anthropic)):
        lines.append("// @ts-expect-error a body the API refuses")
        lines.append(f"export const bad_{fmt}: {ts_bodies.TYPES[fmt]} = {json.dumps(body)};")
    gemini = copy.deepcopy(sample["gemini"]["contents"])
    gemini[0]["parts"][0]["thought_signature"] = "CiQB"  # snake case: not the REST field
    lines.append("// @ts-expect-error a body the API refuses")
    lines.append(f"export const bad_gemini: Content[] = {json.dumps(gemini)};")
    out = TS_DIR / "conformance" / "bodies.generated.ts"
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    done = subprocess.run(
        [str(tsc), "--noEmit", "--strict", "-p", str(TS_DIR / "conformance" / "tsconfig.json")],
        cwd=TS_DIR,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[:6000]
    assert n == 4 * len(corpus)


# -- semantic rules the types cannot express -------------------------------------------


def _chat(body: dict[str, Any]) -> None:
    msgs = body["messages"]
    assert msgs[0]["role"] == "system"
    assert msgs[1]["role"] == "user", "the conversation opens with the user"
    seen: set[str] = set()
    open_ids: list[str] = []
    for m in msgs[1:]:
        if m["role"] == "tool":
            assert m["tool_call_id"] in open_ids, f"result without its call: {m['tool_call_id']}"
            open_ids.remove(m["tool_call_id"])
            continue
        assert not open_ids, f"calls left unanswered: {open_ids}"
        assert m.get("content") or m.get("tool_calls"), "an empty message"
        for c in m.get("tool_calls", []):
            assert c["id"] not in seen, f"call id repeats: {c['id']}"
            seen.add(c["id"])
            assert isinstance(json.loads(c["function"]["arguments"]), dict)
            open_ids.append(c["id"])
    assert not open_ids


def _responses(body: dict[str, Any]) -> None:
    items = body["input"]
    assert items[0]["type"] == "message" and items[0]["role"] in ("user", "developer")
    calls = [i["call_id"] for i in items if i["type"] == "function_call"]
    outputs = [i["call_id"] for i in items if i["type"] == "function_call_output"]
    assert len(set(calls)) == len(calls) and sorted(calls) == sorted(outputs)
    for i, item in enumerate(items):
        if item["type"] == "function_call_output":
            before = [x["call_id"] for x in items[:i] if x["type"] == "function_call"]
            assert item["call_id"] in before
    assert all(t.get("strict") is False for t in body.get("tools", []))


def _anthropic(body: dict[str, Any], view: view_pb2.CompiledView) -> None:
    msgs = body["messages"]
    roles = [m["role"] for m in msgs]
    assert roles[0] == "user" and all(a != b for a, b in pairwise(roles)), roles
    ids: list[str] = []
    for i, m in enumerate(msgs):
        blocks = m["content"]
        assert all(b.get("text", "x").strip() for b in blocks), "empty text block"
        uses = [b["id"] for b in blocks if b["type"] == "tool_use"]
        ids += uses
        if uses:
            nxt = msgs[i + 1]["content"]
            results = [b["tool_use_id"] for b in nxt if b["type"] == "tool_result"]
            assert sorted(results) == sorted(uses), "every tool_use answered in the next turn"
            kinds = [b["type"] == "tool_result" for b in nxt]
            assert kinds == sorted(kinds, reverse=True), "tool results lead their turn"
    assert all(ANTHROPIC_ID.match(i) for i in ids) and len(set(ids)) == len(ids), ids
    # Cache breakpoints: at most four, on the last tool and the stable system block,
    # which ends where the volatile environment begins: the end of the stable prefix.
    marks = [b for b in body.get("tools", []) if "cache_control" in b]
    marks += [b for b in body.get("system", []) if "cache_control" in b]
    marks += [b for m in msgs for b in m["content"] if "cache_control" in b]
    assert 1 <= len(marks) <= 4
    if body.get("tools"):
        assert "cache_control" in body["tools"][-1]
    system = body["system"]
    stable = "\n\n".join(s.text for s in view.system_sections if s.stable)
    assert system[0]["text"] == stable and "cache_control" in system[0]
    assert all("cache_control" not in s for s in system[1:])
    assert system[-1]["text"].startswith("<environment>")


def _gemini(body: dict[str, Any]) -> None:
    contents = body["contents"]
    roles = [c["role"] for c in contents]
    assert roles[0] == "user" and all(a != b for a, b in pairwise(roles)), roles
    for i, c in enumerate(contents):
        calls = [p["functionCall"] for p in c["parts"] if "functionCall" in p]
        if calls:
            nxt = [
                p["functionResponse"] for p in contents[i + 1]["parts"] if "functionResponse" in p
            ]
            # By order and name; no ids (Vertex AI refuses them).
            assert [r["name"] for r in nxt] == [c["name"] for c in calls]
            assert not any("id" in x for x in (*nxt, *calls))
    assert body["systemInstruction"]["parts"][0]["text"].startswith("You are a coding agent")


def _cap(fmt: str, body: dict[str, Any]) -> int:
    if fmt == "gemini":
        return int(body["generationConfig"]["maxOutputTokens"])
    key = {"openai_chat": "max_completion_tokens", "openai_responses": "max_output_tokens"}
    return int(body[key.get(fmt, "max_tokens")])


def _system(fmt: str, body: dict[str, Any]) -> str:
    if fmt == "openai_chat":
        return str(body["messages"][0]["content"])
    if fmt == "openai_responses":
        return str(body["instructions"])
    if fmt == "anthropic_messages":
        return "\n\n".join(b["text"] for b in body["system"])
    return str(body["systemInstruction"]["parts"][0]["text"])


def test_every_body_keeps_each_providers_rules(corpus: list[Case]) -> None:
    for case, fmt, body in _all(corpus):
        try:
            if fmt == "openai_chat":
                _chat(body)
            elif fmt == "openai_responses":
                _responses(body)
            elif fmt == "anthropic_messages":
                _anthropic(body, case.view)
            else:
                _gemini(body)
            assert _cap(fmt, body) == case.view.budget.output_cap > 0
            assert _system(fmt, body) == case.view.system_prompt, "whole, in its place"
            assert json.dumps(KERNEL[:2000])[1:-1] in json.dumps(body)
        except AssertionError as exc:
            raise AssertionError(f"{case.name} / {fmt}: {exc}") from exc


def test_the_output_cap_is_the_callers_or_the_models(corpus: list[Case]) -> None:
    by = {c.name: c for c in corpus}
    after = by["after a short reply was reported"]
    assert after.view.budget.output_reserve <= 1_024  # the local reserve shrank...
    caps = {_cap(f, b) for f, b in after.bodies.items()}
    assert caps == {MODEL_MAX_OUTPUT}  # ...the provider's cap did not
    assert after.view.budget.output_cap_source == view_pb2.OUTPUT_CAP_SOURCE_MODEL_MAX
    own = by["caller's own output cap"]
    assert {_cap(f, b) for f, b in own.bodies.items()} == {8_000}
    assert own.view.budget.output_cap_source == view_pb2.OUTPUT_CAP_SOURCE_CALLER
    small = by["over budget, compaction asked"].view.budget
    assert small.output_cap_source == view_pb2.OUTPUT_CAP_SOURCE_FITTED_TO_WINDOW
    assert small.output_cap < MODEL_MAX_OUTPUT


def test_content_survives_in_every_format(corpus: list[Case]) -> None:
    by = {c.name: c for c in corpus}
    for fmt, body in by["text"].bodies.items():
        assert CJK in json.dumps(body, ensure_ascii=False), fmt
    for fmt, body in by["images inline"].bodies.items():
        assert "iVBORw0KGgo" in json.dumps(body), fmt
    # Reference mode keeps bytes out of the view; a body must be sendable, so it has them.
    ref = by["images by reference"]
    assert all(not p.attachment.data for m in ref.view.messages for p in m.parts)
    for fmt, body in ref.bodies.items():
        assert "iVBORw0KGgo" in json.dumps(body), fmt
    for fmt, body in by["images to a model without vision"].bodies.items():
        text = json.dumps(body)
        assert "iVBORw0KGgo" not in text and "the model does not accept images" in text, fmt
    malformed = by["malformed arguments"]
    assert sum("not a JSON object" in n for n in malformed.view.notes) == 5
    for fmt, body in malformed.bodies.items():
        assert "invalid_arguments" in json.dumps(body), fmt
    before = by["deferred tool not yet active"]
    activated = by["deferred tool activated"]
    assert all(t.definition.name != "grep_logs" for t in before.view.tools)
    assert any(t.definition.name == "grep_logs" for t in activated.view.tools)
    assert activated.view.prefix_digest != before.view.prefix_digest
    assert tool_pb2.TOOL_VISIBILITY_DEFERRED  # the corpus registered it deferred
    assert view_pb2.SECTION_KIND_TOOLS in activated.view.changed_sections


def test_a_real_agents_tool_set_is_registered_compiled_and_rendered(corpus: list[Case]) -> None:
    case = next(c for c in corpus if c.name == "a real agent's tool set")
    real = agent_tools.claude_code_shaped() + agent_tools.openhands()
    bash = real[0]
    assert 9_000 <= len(bash["description"]) <= 12_000
    assert max(agent_tools.schema_depth(t["schema"]) for t in real) > 32
    names = [t.definition.name for t in case.view.tools]
    assert names[: len(real)] == sorted(t["name"] for t in real)
    for fmt, body in case.bodies.items():
        text = json.dumps(body, ensure_ascii=False)
        assert json.dumps(bash["description"], ensure_ascii=False) in text, fmt
        assert json.dumps(real[5]["schema"]["properties"]["filter"]) in json.dumps(body), fmt


async def test_tool_limits_are_settings(short_tmp: Path) -> None:
    daemon = Daemon(make_config(short_tmp / "data", max_tool_description_chars="4096"))
    await daemon.start()
    api = stubs_for(f"unix:{daemon.endpoints.unix}")
    try:
        from ctxcc.v1 import session_pb2
        from ctxcc.v1 import session_service_pb2 as spb

        await api.sessions.CreateSession(
            spb.CreateSessionRequest(session=session_pb2.Session(session_id="t"))
        )
        bash = agent_tools.claude_code_shaped()[0]
        tool = tool_pb2.ToolDefinition(
            name="Bash",
            description=bash["description"],
            input_schema_json=json.dumps(bash["schema"]),
        )
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await api.tools.RegisterTools(tpb.RegisterToolsRequest(session_id="t", tools=[tool]))
        assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error_info(exc.value).reason == "INVALID_FIELD"
        assert "max_tool_description_chars" in (exc.value.details() or "")
    finally:
        await api.channel.close()
        await daemon.stop()


async def test_a_registration_over_max_tools_writes_nothing(short_tmp: Path) -> None:
    """Adding tools past --max-tools is refused with nothing stored (the tools were
    written before the count was checked: refused, yet listed and offered)."""
    daemon = Daemon(make_config(short_tmp / "data", max_tools="2"))
    await daemon.start()
    api = stubs_for(f"unix:{daemon.endpoints.unix}")
    try:
        from ctxcc.v1 import session_pb2
        from ctxcc.v1 import session_service_pb2 as spb

        await api.sessions.CreateSession(
            spb.CreateSessionRequest(session=session_pb2.Session(session_id="t"))
        )

        def tool(name: str) -> tool_pb2.ToolDefinition:
            return tool_pb2.ToolDefinition(name=name, description="d", input_schema_json="{}")

        await api.tools.RegisterTools(
            tpb.RegisterToolsRequest(session_id="t", tools=[tool("a"), tool("b")])
        )
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await api.tools.RegisterTools(
                tpb.RegisterToolsRequest(session_id="t", tools=[tool("c")])
            )
        assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error_info(exc.value).reason == "INVALID_FIELD"
        assert "max_tools" in (exc.value.details() or "")
        listed = await api.tools.ListTools(tpb.ListToolsRequest(session_id="t"))
        assert [t.name for t in listed.tools] == ["a", "b"]
        # Replacing the set stays possible at the limit.
        await api.tools.RegisterTools(
            tpb.RegisterToolsRequest(session_id="t", tools=[tool("c")], replace_all=True)
        )
        listed = await api.tools.ListTools(tpb.ListToolsRequest(session_id="t"))
        assert [t.name for t in listed.tools] == ["c"]
    finally:
        await api.channel.close()
        await daemon.stop()


def test_the_tool_loops_thinking_state_goes_back_in_its_providers_body(
    corpus: list[Case],
) -> None:
    """The corpus's loop carries Claude's blocks on its first assistant message, a
    Gemini signature on its second and OpenAI reasoning items on its third (a user
    message typed between them does not end the loop): each in its own provider's body,
    where the SDK types above took it, and in no other body."""
    case = next(c for c in corpus if c.name == "a tool loop with its thinking state")
    turns = [m["content"] for m in case.bodies["anthropic_messages"]["messages"]]
    assistant_turns = [
        t
        for m, t in zip(case.bodies["anthropic_messages"]["messages"], turns, strict=True)
        if m["role"] == "assistant"
    ]
    assert [b["type"] for b in assistant_turns[0][:2]] == ["thinking", "redacted_thinking"]
    assert all(b["type"] not in {"thinking", "redacted_thinking"} for b in assistant_turns[1])
    calls = [
        (p["functionCall"]["args"], p.get("thoughtSignature"))
        for c in case.bodies["gemini"]["contents"]
        for p in c["parts"]
        if "functionCall" in p
    ]
    view_calls = [c for m in case.view.messages for c in m.tool_calls]
    assert [c.call_id for c in view_calls] == ["t1", "t2", "t3", "t4"]
    assert calls == [
        (json.loads(c.arguments_json), sig)
        for c, sig in zip(view_calls, (None, "CiQBVKhc7s1gn0g=", None, None), strict=True)
    ]
    # Responses: the reasoning item right before the call it led to, with what a
    # stateless request needs of it (its id and encrypted content), not its raw text or
    # status.
    items = case.bodies["openai_responses"]["input"]
    at = next(i for i, item in enumerate(items) if item.get("call_id") == "t4")
    assert items[at - 1] == {
        "type": "reasoning",
        "id": REASONING[0]["id"],
        "summary": REASONING[0]["summary"],
        "encrypted_content": REASONING[0]["encrypted_content"],
    }
    assert [item["type"] for item in items].count("reasoning") == 1
    for fmt in ("openai_chat", "openai_responses"):
        text = json.dumps(case.bodies[fmt])
        assert "The parser drops" not in text and "CiQBVKhc7s1gn0g=" not in text, fmt
    for fmt in ("openai_chat", "anthropic_messages", "gemini"):
        text = json.dumps(case.bodies[fmt])
        assert "gAAAAABpZ2VuY3J5cHRlZA" not in text and "lexer splits" not in text, fmt
    before = next(c for c in corpus if c.name == "a tool loop before its thinking state")
    assert before.view.route_id == case.view.route_id


def test_a_screenshot_logged_before_its_result_keeps_the_call_whole(corpus: list[Case]) -> None:
    """The attachment waits for the result of the call that took it (projection 8): one
    call, its own result, then the image, and Claude's turn keeps its thinking in front
    of its only tool_use. Before, the attachment closed the call with a made-up failure
    and the real result came back under a restored call `shot1~2` with no thinking."""
    case = next(c for c in corpus if c.name == "a screenshot logged before its call's result")
    messages = case.bodies["anthropic_messages"]["messages"]
    uses = [b for m in messages for b in m["content"] if b["type"] == "tool_use"]
    assert [u["id"] for u in uses] == ["shot1"]
    last_assistant = next(m for m in reversed(messages) if m["role"] == "assistant")
    assert [b["type"] for b in last_assistant["content"]] == ["thinking", "tool_use"]
    assert messages[-1]["role"] == "user"
    assert [b["type"] for b in messages[-1]["content"]] == ["tool_result", "image"]
    assert messages[-1]["content"][0]["content"] == "saved"
    assert not any(m.synthetic for m in case.view.messages)
    chat = case.bodies["openai_chat"]["messages"]
    roles = [m["role"] for m in chat if m["role"] != "system"]
    assert roles[-3:] == ["assistant", "tool", "user"]
    calls = [
        p for c in case.bodies["gemini"]["contents"] for p in c["parts"] if "functionCall" in p
    ]
    assert len(calls) == 1


def test_each_imported_tool_message_reaches_every_body(corpus: list[Case]) -> None:
    """Two tool messages imported in a row (no call ids): each with a stand-in call of
    its own. The second was dropped from every body as a second result."""
    case = next(c for c in corpus if c.name == "two tool messages imported in a row")
    for fmt, body in case.bodies.items():
        text = json.dumps(body)
        assert "cart: 2 items" in text and "total: 41.90 EUR" in text, fmt
    results = [m.tool_call_id for m in case.view.messages if m.origin_session_id]
    assert len(results) == len(set(results)) == 2
