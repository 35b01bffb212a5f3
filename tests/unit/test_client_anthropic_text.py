"""The Python client's `assistant_from_anthropic` with a response whose text Claude split
at each citation (web search), and `assistant_from_gemini` with one whose text Gemini split
over parts: adjacent text is one part, since a view joins parts with line breaks
("is \\nPython 3.14.1\\n." otherwise); text on either side of a call, a thinking block or
a thought summary stays apart, and an empty block or part joins nothing."""

from __future__ import annotations

import anthropic.types as at
from ctxcc_client import assistant_from_anthropic, assistant_from_gemini
from google.genai import types as gt


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


def _texts(event: object) -> list[str]:
    return [p.text for p in event.assistant_message.parts]  # type: ignore[attr-defined]


def test_an_empty_block_after_a_call_joins_nothing() -> None:
    message = {
        "content": [
            {"type": "text", "text": "I'll look it up."},
            {"type": "tool_use", "id": "toolu_1", "name": "search", "input": {}},
            {"type": "text", "text": ""},
            {"type": "text", "text": "Then I will summarise."},
            {"type": "text", "text": ""},
            {"type": "text", "text": " Done."},
        ]
    }
    assert _texts(assistant_from_anthropic(message, "r1")) == [
        "I'll look it up.",
        "Then I will summarise. Done.",
    ]


def test_gemini_text_split_over_parts_is_one_part() -> None:
    response = gt.GenerateContentResponse.model_validate(
        {
            "candidates": [
                {
                    "content": {
                        "role": "model",
                        "parts": [
                            {"text": "The answer is 4"},
                            {"text": "2, as computed."},
                            {"text": "", "thought_signature": b"sig"},
                            {"text": " Checking it."},
                            {"text": "planning the check", "thought": True},
                            {"text": "Now the call:"},
                            {"function_call": {"id": "c1", "name": "run", "args": {}}},
                            {"text": "After the call."},
                        ],
                    }
                }
            ]
        }
    )
    event = assistant_from_gemini(response, "r1")
    assert _texts(event) == [
        "The answer is 42, as computed. Checking it.",
        "Now the call:",
        "After the call.",
    ]
    assert assistant_from_gemini(
        response.model_dump(by_alias=True), "r1"
    ).assistant_message.parts == (event.assistant_message.parts)


def test_a_gemini_response_without_candidates_is_an_empty_assistant_message() -> None:
    """As the Go and TypeScript helpers give it (the daemon refuses an empty message the
    same way for all three), not an event without a payload."""
    responses: list[dict[str, list[object]]] = [{}, {"candidates": []}]
    for response in responses:
        event = assistant_from_gemini(response, "r1")
        assert event.WhichOneof("payload") == "assistant_message"
        assert not event.assistant_message.parts and not event.assistant_message.tool_calls
