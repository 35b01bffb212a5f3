"""Python client for the ctxcc daemon.

    async with AsyncClient("unix:///run/ctxcc/ctxcc.sock") as ctx:
        await ctx.create_session("s1")
        await ctx.append("s1", [user("hello")])
        view = await ctx.compile("s1", model="claude-sonnet-4")
        ...  # call the provider with the view
        await ctx.report_usage(view.compile_id, input_tokens=..., output_tokens=...)

Every RPC is reachable with typed requests through `ctx.sessions`, `ctx.compiles`,
`ctx.tools`, `ctx.sources` and `ctx.artifacts`. Errors are `CtxccError` with the daemon's
stable `reason` (e.g. "SESSION_NOT_FOUND"). Calls that are safe to repeat are retried on
UNAVAILABLE for up to `retry_seconds`: appends and checkpoints carry a request id fixed
before the first attempt, so a repeat is a replay, never a duplicate; CreateSession a
session id fixed the same way, and a retry that finds the session an earlier attempt stored
returns it. Deletes are not retried (see ctxcc_client.retry).
"""

from ctxcc_client.client import AsyncClient, Client
from ctxcc_client.errors import CtxccError
from ctxcc_client.events import (
    ANTHROPIC_THINKING,
    GEMINI_THOUGHT_SIGNATURES,
    OPENAI_REASONING,
    assistant,
    assistant_from_anthropic,
    assistant_from_gemini,
    assistant_from_openai_responses,
    tool_result,
    user,
    user_with,
)
from ctxcc_client.retry import new_request_id, new_session_id
from ctxcc_client.stream import CompileStream, StreamStats, ViewAssembler
from ctxcc_client.usage import (
    UsageCounts,
    usage_from_anthropic,
    usage_from_gemini,
    usage_from_openai_chat,
    usage_from_openai_responses,
)

__all__ = [
    "ANTHROPIC_THINKING",
    "GEMINI_THOUGHT_SIGNATURES",
    "OPENAI_REASONING",
    "AsyncClient",
    "Client",
    "CompileStream",
    "CtxccError",
    "StreamStats",
    "UsageCounts",
    "ViewAssembler",
    "assistant",
    "assistant_from_anthropic",
    "assistant_from_gemini",
    "assistant_from_openai_responses",
    "new_request_id",
    "new_session_id",
    "tool_result",
    "usage_from_anthropic",
    "usage_from_gemini",
    "usage_from_openai_chat",
    "usage_from_openai_responses",
    "user",
    "user_with",
]
VERSION = "0.1.0"
