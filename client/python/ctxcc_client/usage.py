"""A provider response's usage, as the counts ctxcc's usage report takes.

    msg = anthropic.messages.create(...)
    await stream.report_usage(view.compile_id, route=route, **usage_from_anthropic(msg.usage))

ctxcc's `input_tokens` is the whole input the provider read, cached tokens included, and
`output_tokens` all it generated, reasoning included (`cached_input_tokens` and
`reasoning_tokens` are parts of those). The providers count differently:

- Anthropic Messages: `usage.input_tokens` leaves the prompt cache out; the whole input is
  `input_tokens + cache_creation_input_tokens + cache_read_input_tokens` (the SDK's
  `Message.usage` docstring). Reporting `input_tokens` alone reports a fraction of the
  input whenever the cache is used, and every estimate anchored on it is too low.
- OpenAI Chat Completions: `prompt_tokens` counts the cached tokens
  (`prompt_tokens_details.cached_tokens`), `completion_tokens` the reasoning ones
  (`completion_tokens_details.reasoning_tokens`).
- OpenAI Responses: `input_tokens` counts `input_tokens_details.cached_tokens`,
  `output_tokens` counts `output_tokens_details.reasoning_tokens`.
- Gemini: `prompt_token_count` counts `cached_content_token_count`; the output is
  `candidates_token_count + thoughts_token_count`. `tool_use_prompt_token_count` (results
  of tools the provider ran during the call, fed back to the model) is left out: it is not
  part of the request ctxcc compiled.

Each function is duck-typed: it takes the SDK's object (`anthropic.types.Usage`,
`openai.types.CompletionUsage`, `openai.types.responses.ResponseUsage`,
`google.genai.types.GenerateContentResponseUsageMetadata`) or the same fields as a mapping
(the response's JSON), and a field that is missing or None counts 0. The client depends on
none of the SDKs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypedDict

__all__ = [
    "UsageCounts",
    "usage_from_anthropic",
    "usage_from_gemini",
    "usage_from_openai_chat",
    "usage_from_openai_responses",
]


class UsageCounts(TypedDict):
    """The keyword arguments of `report_usage` (stream and unary) that carry the counts."""

    input_tokens: int
    output_tokens: int
    cached_input_tokens: int
    reasoning_tokens: int


def _field(obj: object, *names: str) -> object:
    """The first of `names` that `obj` has and is not None (attribute or mapping key)."""
    if obj is None:
        return None
    for name in names:
        value = obj.get(name) if isinstance(obj, Mapping) else getattr(obj, name, None)
        if value is not None:
            return value
    return None


def _count(obj: object, *names: str) -> int:
    value = _field(obj, *names)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"usage field {names[0]} is {value!r}, not a token count")
    return value


def _counts(input_tokens: int, output_tokens: int, cached: int, reasoning: int) -> UsageCounts:
    return UsageCounts(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cached_input_tokens=cached,
        reasoning_tokens=reasoning,
    )


def usage_from_anthropic(usage: object) -> UsageCounts:
    """From an Anthropic Messages `usage` (`Message.usage`; when streaming, the final
    message's): input = `input_tokens + cache_creation_input_tokens +
    cache_read_input_tokens`, cached = `cache_read_input_tokens`, output = `output_tokens`,
    reasoning = `output_tokens_details.thinking_tokens`."""
    read = _count(usage, "cache_read_input_tokens")
    return _counts(
        _count(usage, "input_tokens") + _count(usage, "cache_creation_input_tokens") + read,
        _count(usage, "output_tokens"),
        read,
        _count(_field(usage, "output_tokens_details"), "thinking_tokens"),
    )


def usage_from_openai_chat(usage: object) -> UsageCounts:
    """From an OpenAI Chat Completions `usage` (`CompletionUsage`): input =
    `prompt_tokens`, cached = `prompt_tokens_details.cached_tokens`, output =
    `completion_tokens`, reasoning = `completion_tokens_details.reasoning_tokens`."""
    return _counts(
        _count(usage, "prompt_tokens"),
        _count(usage, "completion_tokens"),
        _count(_field(usage, "prompt_tokens_details"), "cached_tokens"),
        _count(_field(usage, "completion_tokens_details"), "reasoning_tokens"),
    )


def usage_from_openai_responses(usage: object) -> UsageCounts:
    """From an OpenAI Responses `usage` (`ResponseUsage`): input = `input_tokens`, cached =
    `input_tokens_details.cached_tokens`, output = `output_tokens`, reasoning =
    `output_tokens_details.reasoning_tokens`."""
    return _counts(
        _count(usage, "input_tokens"),
        _count(usage, "output_tokens"),
        _count(_field(usage, "input_tokens_details"), "cached_tokens"),
        _count(_field(usage, "output_tokens_details"), "reasoning_tokens"),
    )


def usage_from_gemini(usage_metadata: object) -> UsageCounts:
    """From a Gemini `usage_metadata` (`GenerateContentResponseUsageMetadata`, or the REST
    JSON's camelCase `usageMetadata`): input = `prompt_token_count`, cached =
    `cached_content_token_count`, output = `candidates_token_count +
    thoughts_token_count`, reasoning = `thoughts_token_count`; `tool_use_prompt_token_count`
    is left out (see the module's docstring).

    google-genai's automatic continuation merges its hops' usage by adding the counts up;
    the input is then the first hop's prompt (`initial_prompt_token_count`, the request
    ctxcc compiled), and the cached count, a sum over the hops, is capped at it."""
    prompt = _count(usage_metadata, "initial_prompt_token_count") or _count(
        usage_metadata, "prompt_token_count", "promptTokenCount"
    )
    thoughts = _count(usage_metadata, "thoughts_token_count", "thoughtsTokenCount")
    cached = _count(usage_metadata, "cached_content_token_count", "cachedContentTokenCount")
    return _counts(
        prompt,
        _count(usage_metadata, "candidates_token_count", "candidatesTokenCount") + thoughts,
        min(cached, prompt),
        thoughts,
    )
