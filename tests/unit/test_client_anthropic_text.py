"""The Python client's `assistant_from_anthropic` with a response whose text Claude split
at each citation (web search): adjacent text blocks are one part, since a view joins
parts with line breaks ("is \\nPython 3.14.1\\n." otherwise); text on either side of a
call or a thinking block stays apart."""

from __future__ import annotations

import anthropic.types as at
from ctxcc_client import assistant_from_anthropic


def test_adjacent_text_blocks_are_one_part() -> None:
    cited = {
        "type": "web_search_result_location",
        "url": "https://python.org",
        "title": "Python",
        "encrypted_index": "Eo8B",
        "cited_text": "3.14.1",
    }
    message = at.Message.model_validate(
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-4-5",
            "content": [
                {"type": "text", "text": "The latest release is "},
                {"type": "text", "text": "Python 3.14.1", "citations": [cited]},
                {"type": "text", "text": ""},
                {"type": "text", "text": ". I'll save it."},
                {"type": "tool_use", "id": "toolu_1", "name": "save", "input": {}},
                {"type": "text", "text": "Saved."},
                {"type": "thinking", "thinking": "t", "signature": "s"},
                {"type": "text", "text": "Done."},
            ],
            "stop_reason": "tool_use",
            "stop_sequence": None,
            "usage": {"input_tokens": 1, "output_tokens": 1},
        }
    )
    event = assistant_from_anthropic(message, "r1")
    assert [p.text for p in event.assistant_message.parts] == [
        "The latest release is Python 3.14.1. I'll save it.",
        "Saved.",
        "Done.",
    ]
    assert [c.call_id for c in event.assistant_message.tool_calls] == ["toolu_1"]
    # The same response as its JSON (a mapping) logs the same event.
    assert assistant_from_anthropic(message.model_dump(), "r1") == event
