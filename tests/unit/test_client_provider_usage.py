"""The Python client's provider usage mappings, fed the SDKs' own response objects (and
the same responses as JSON): each gives ctxcc's counts, the whole input with cached
tokens in it and the whole output with reasoning in it."""

from __future__ import annotations

from typing import Any

import anthropic.types as at
import openai.types as ot
import openai.types.completion_usage as ocu
import openai.types.responses.response_usage as oru
import pytest
from ctxcc_client import (
    UsageCounts,
    usage_from_anthropic,
    usage_from_gemini,
    usage_from_openai_chat,
    usage_from_openai_responses,
)
from google.genai import _extra_utils as genai_merge
from google.genai import types as gt

ANTHROPIC_MESSAGE: dict[str, Any] = {
    "id": "msg_01",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-4-5",
    "content": [{"type": "text", "text": "done"}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {
        "input_tokens": 12,
        "cache_creation_input_tokens": 310,
        "cache_read_input_tokens": 48_000,
        "output_tokens": 420,
        "output_tokens_details": {"thinking_tokens": 300},
    },
}


def counts(i: int, o: int, cached: int, reasoning: int) -> UsageCounts:
    return UsageCounts(
        input_tokens=i, output_tokens=o, cached_input_tokens=cached, reasoning_tokens=reasoning
    )


def test_anthropic_input_adds_the_prompt_cache_to_input_tokens() -> None:
    message = at.Message.model_validate(ANTHROPIC_MESSAGE)
    want = counts(12 + 310 + 48_000, 420, 48_000, 300)
    assert usage_from_anthropic(message.usage) == want
    assert usage_from_anthropic(ANTHROPIC_MESSAGE["usage"]) == want, "the JSON gives the same"
    # Without caching (the fields absent, as older responses and MessageDeltaUsage have them).
    plain = at.Usage(input_tokens=900, output_tokens=40)
    assert plain.cache_read_input_tokens is None and plain.output_tokens_details is None
    assert usage_from_anthropic(plain) == counts(900, 40, 0, 0)
    # A cache write alone: written tokens are input, not cached (read) ones.
    written = at.Usage(input_tokens=7, cache_creation_input_tokens=5000, output_tokens=1)
    assert usage_from_anthropic(written) == counts(5007, 1, 0, 0)


def test_openai_chat_counts_cached_and_reasoning_inside_the_totals() -> None:
    usage = ot.CompletionUsage(
        prompt_tokens=2006,
        completion_tokens=300,
        total_tokens=2306,
        prompt_tokens_details=ocu.PromptTokensDetails(cached_tokens=1920, cache_write_tokens=50),
        completion_tokens_details=ocu.CompletionTokensDetails(reasoning_tokens=256),
    )
    assert usage_from_openai_chat(usage) == counts(2006, 300, 1920, 256)
    assert usage_from_openai_chat(usage.model_dump()) == counts(2006, 300, 1920, 256)
    bare = ot.CompletionUsage(prompt_tokens=15, completion_tokens=3, total_tokens=18)
    assert usage_from_openai_chat(bare) == counts(15, 3, 0, 0)


def test_openai_responses_counts_cached_and_reasoning_inside_the_totals() -> None:
    usage = ot.responses.ResponseUsage(
        input_tokens=5200,
        input_tokens_details=oru.InputTokensDetails(cached_tokens=4096, cache_write_tokens=1000),
        output_tokens=700,
        output_tokens_details=oru.OutputTokensDetails(reasoning_tokens=512),
        total_tokens=5900,
    )
    assert usage_from_openai_responses(usage) == counts(5200, 700, 4096, 512)
    assert usage_from_openai_responses(usage.model_dump()) == counts(5200, 700, 4096, 512)


def test_gemini_output_adds_thoughts_and_leaves_tool_use_prompts_out() -> None:
    meta = gt.GenerateContentResponseUsageMetadata(
        prompt_token_count=1000,
        cached_content_token_count=800,
        candidates_token_count=50,
        thoughts_token_count=120,
        tool_use_prompt_token_count=400,
        total_token_count=1570,
    )
    want = counts(1000, 170, 800, 120)
    assert usage_from_gemini(meta) == want
    assert usage_from_gemini(meta.model_dump(by_alias=True)) == want, "camelCase JSON"
    assert usage_from_gemini(gt.GenerateContentResponseUsageMetadata()) == counts(0, 0, 0, 0)


def test_gemini_continuation_hops_report_the_first_hops_prompt() -> None:
    """google-genai adds merged hops' counts up: the prompt ctxcc compiled is the first
    hop's, and the summed cached count (over it here) is capped at it."""
    hops = [
        gt.GenerateContentResponse(
            usage_metadata=gt.GenerateContentResponseUsageMetadata(
                prompt_token_count=p, cached_content_token_count=c, candidates_token_count=o
            )
        )
        for p, c, o in ((1000, 900, 200), (1250, 1200, 30))
    ]
    merged = genai_merge.merge_continuation_responses(hops).usage_metadata
    assert merged is not None
    assert merged.prompt_token_count == 2250 and merged.cached_content_token_count == 2100
    assert usage_from_gemini(merged) == counts(1000, 230, 1000, 0)


def test_a_count_that_is_not_an_integer_is_refused() -> None:
    with pytest.raises(TypeError, match="prompt_tokens"):
        usage_from_openai_chat({"prompt_tokens": "12", "completion_tokens": 3})
    with pytest.raises(TypeError, match="input_tokens"):
        usage_from_anthropic({"input_tokens": True, "output_tokens": 3})
