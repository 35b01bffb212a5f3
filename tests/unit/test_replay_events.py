"""Trace markers turned back into tool calls and results, and tool-call arguments counted
as the provider reads them."""

from __future__ import annotations

import json

from server.adapters.tokenizer import CL100K, BpeCounter, ClaudeCounter
from server.compiler.projection import message_tokens
from server.compiler.tokens import arguments_text
from server.compiler.view import Layer, ViewMessage, ViewPart
from server.compiler.work import checked
from server.domain.model import Role, ToolCall
from server.replay_events import events_of


def test_assistant_markers_become_tool_calls() -> None:
    args = {"command": "create", "file_text": 'print("hi")\nprint(2)\n'}
    text = (
        "I'll write it.\n[tool_use name=Write id=toolu_01A]\n"
        + json.dumps(args)
        + "\n[tool_use name=Bash id=toolu_01B]\n"
        + json.dumps({"command": "ls"})
    )
    (ev,) = events_of({"role": "assistant", "content": text})
    msg = ev.assistant_message
    assert [p.text for p in msg.parts] == ["I'll write it."]
    assert [(c.call_id, c.name, json.loads(c.arguments_json)) for c in msg.tool_calls] == [
        ("toolu_01A", "Write", args),
        ("toolu_01B", "Bash", {"command": "ls"}),
    ]
    # OpenHands' spelling, and a marker without JSON stays text.
    (oh,) = events_of({"role": "assistant", "content": '[tool_call name=x id=c1]\n{"a": 1}'})
    assert oh.assistant_message.tool_calls[0].call_id == "c1"
    (plain,) = events_of({"role": "assistant", "content": "[tool_use name=x id=y]\nnot json"})
    assert not plain.assistant_message.tool_calls
    assert plain.assistant_message.parts[0].text == "[tool_use name=x id=y]\nnot json"


def test_result_markers_become_tool_results() -> None:
    text = "see below\n[tool_result id=a]\nfile one\n[tool_result id=b name=Bash]\nok\n"
    user, first, second = events_of({"role": "user", "content": text})
    assert user.user_message.parts[0].text == "see below"
    assert (first.tool_result.call_id, first.tool_result.text) == ("a", "file one")
    assert (second.tool_result.call_id, second.tool_result.tool_name) == ("b", "Bash")
    assert second.tool_result.text == "ok"
    # A failed call's result (Claude Code marks it after the id) is a tool result too,
    # not user text that leaves its call unanswered.
    failed = (
        "[tool_result id=d is_error=true]\n<tool_use_error>File has not been read</tool_use_error>"
    )
    (err,) = events_of({"role": "user", "content": failed})
    assert err.WhichOneof("payload") == "tool_result"
    assert (err.tool_result.call_id, err.tool_result.is_error) == ("d", True)
    assert err.tool_result.text == "<tool_use_error>File has not been read</tool_use_error>"
    assert not first.tool_result.is_error
    # A result the daemon would store as a blob (a preview in the view) stays text.
    big = "[tool_result id=c]\n" + "x" * ((16 << 10) + 1)
    (kept,) = events_of({"role": "user", "content": big})
    assert kept.user_message.parts[0].text == big
    (only,) = events_of({"role": "tool", "content": "no marker"})
    assert only.user_message.parts[0].text == "no marker"
    assert events_of({"role": "user", "content": ""}) == []


def test_arguments_are_counted_as_parameters_for_claude() -> None:
    code = 'def f():\n    return "quoted"\n' * 40
    args = json.dumps({"path": "/tmp/a.py", "content": code, "mode": 420})
    assert arguments_text(args, True) == f"path: /tmp/a.py\ncontent: {code}\nmode: 420"
    assert arguments_text(args, False) == args
    for odd in ("", "[1, 2]", "{not json"):
        assert arguments_text(odd, True) == odd
    # Nested values: compact JSON, non-ASCII escaped.
    todos = json.dumps({"todos": [{"content": "tree ├── a", "done": False}], "n": 2})
    expected = 'todos: [{"content":"tree \\u251c\\u2500\\u2500 a","done":false}]\nn: 2'
    assert arguments_text(todos, True) == expected
    msg = ViewMessage(
        role=Role.ASSISTANT,
        parts=(ViewPart(text="writing"),),
        layer=Layer.WORKING_SET,
        tokens=0,
        tool_calls=(ToolCall(call_id="toolu_1", name="Write", arguments_json=args),),
    )
    claude, cl100k = ClaudeCounter(), BpeCounter(CL100K)
    # A compile with a CPU budget wraps the counter: it still counts the same.
    budgeted = checked(claude, lambda: None)
    assert budgeted is not claude
    assert message_tokens(msg, budgeted) == message_tokens(msg, claude)
    # The escaped JSON (\\n, \\") costs more than the values; the OpenAI-style counter
    # keeps the JSON string, which those APIs take as is.
    assert message_tokens(msg, claude) < claude.count(args) + claude.count("writing")
    assert message_tokens(msg, cl100k) >= cl100k.count(args) + cl100k.count("writing")
