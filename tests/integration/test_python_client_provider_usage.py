"""Reports made from the SDKs' own usage objects with the Python client's mappings are
accepted by a real daemon, and the next view is estimated from the whole input the
provider read: with Anthropic's prompt cache, the cached tokens included."""

from __future__ import annotations

import anthropic.types as at
import openai.types as ot
import openai.types.completion_usage as ocu
import openai.types.responses.response_usage as oru
from ctxcc_client import (
    AsyncClient,
    UsageCounts,
    usage_from_anthropic,
    usage_from_gemini,
    usage_from_openai_chat,
    usage_from_openai_responses,
    user,
)
from google.genai import _extra_utils as genai_merge
from google.genai import types as gt

from ctxcc.v1 import common_pb2
from ctxcc.v1 import compile_service_pb2 as cpb
from server.app import Daemon


def _route(protocol: str, model: str) -> common_pb2.Route:
    return common_pb2.Route(connection="t", protocol=protocol, endpoint="api", model=model)


async def _reported(daemon: Daemon, route: common_pb2.Route, counts: UsageCounts) -> int:
    """Reports `counts` on a stream step for a view of a fresh session; the baseline the
    next view was estimated from (after checking the daemon recorded the report)."""
    async with AsyncClient(str(daemon.endpoints.tcp)) as ctx:
        session = await ctx.create_session()
        req = cpb.CompileRequest(session_id=session.session_id, route=route)
        stream = ctx.stream()
        try:
            view, _ = await stream.step(req, [user("summarize the repository layout")])
            await stream.report_usage(view.compile_id, route=route, **counts)
            after, _ = await stream.step(req, [user("now the tests")])
            answer = stream.last_usage
            assert answer is not None and not answer.replayed
            est = view.budget.estimated_input_tokens
            assert answer.estimated_input_tokens == est
            assert answer.error_tokens == counts["input_tokens"] - est
            return after.budget.baseline_tokens
        finally:
            await stream.close()


async def test_anthropic_cache_reads_count_in_the_reported_input(daemon: Daemon) -> None:
    usage = at.Usage(
        input_tokens=35,
        cache_creation_input_tokens=1200,
        cache_read_input_tokens=30_000,
        output_tokens=500,
        output_tokens_details=at.OutputTokensDetails(thinking_tokens=200),
    )
    route = _route("anthropic-messages", "claude-sonnet-4")
    baseline = await _reported(daemon, route, usage_from_anthropic(usage))
    assert baseline == 35 + 1200 + 30_000, "the next view starts from the whole input"


async def test_openai_and_gemini_reports_are_accepted(daemon: Daemon) -> None:
    chat = ot.CompletionUsage(
        prompt_tokens=2006,
        completion_tokens=300,
        total_tokens=2306,
        prompt_tokens_details=ocu.PromptTokensDetails(cached_tokens=1920),
        completion_tokens_details=ocu.CompletionTokensDetails(reasoning_tokens=256),
    )
    responses = ot.responses.ResponseUsage(
        input_tokens=5200,
        input_tokens_details=oru.InputTokensDetails(cached_tokens=4096, cache_write_tokens=0),
        output_tokens=700,
        output_tokens_details=oru.OutputTokensDetails(reasoning_tokens=512),
        total_tokens=5900,
    )
    gemini = gt.GenerateContentResponseUsageMetadata(
        prompt_token_count=3000,
        cached_content_token_count=2048,
        candidates_token_count=90,
        thoughts_token_count=400,
        tool_use_prompt_token_count=650,
        total_token_count=4140,
    )
    # Merged continuation hops: their cached counts add up past the first hop's prompt,
    # which the daemon would refuse (USAGE_INVALID) were the cached count not capped.
    merged = genai_merge.merge_continuation_responses(
        [
            gt.GenerateContentResponse(
                usage_metadata=gt.GenerateContentResponseUsageMetadata(
                    prompt_token_count=p, cached_content_token_count=c, candidates_token_count=8
                )
            )
            for p, c in ((1000, 900), (1100, 1000))
        ]
    ).usage_metadata
    cases = [
        (_route("openai-chat", "gpt-4o"), usage_from_openai_chat(chat), 2006),
        (_route("openai-responses", "o3"), usage_from_openai_responses(responses), 5200),
        (_route("gemini", "gemini-2.5-pro"), usage_from_gemini(gemini), 3000),
        (_route("gemini", "gemini-2.5-flash"), usage_from_gemini(merged), 1000),
    ]
    for route, counts, want in cases:
        assert await _reported(daemon, route, counts) == want, route.model
