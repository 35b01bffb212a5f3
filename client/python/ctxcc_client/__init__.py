"""Python client for the ctxcc daemon.

    async with AsyncClient("unix:///run/ctxcc/ctxcc.sock") as ctx:
        await ctx.create_session("s1")
        await ctx.append("s1", [user("hello")])
        view = await ctx.compile("s1", model="claude-sonnet-4")
        ...  # call the provider with the view
        await ctx.report_usage(view.compile_id, input_tokens=..., output_tokens=...)

Errors are `CtxccError` with the daemon's stable `reason` (e.g. "SESSION_NOT_FOUND").
Only idempotent calls are retried on UNAVAILABLE: appends (they always carry a
request_id), usage reports, reads and compiles.
"""

from ctxcc_client.client import AsyncClient, Client
from ctxcc_client.errors import CtxccError
from ctxcc_client.events import assistant, tool_result, user
from ctxcc_client.stream import CompileStream, ViewAssembler

__all__ = [
    "AsyncClient",
    "Client",
    "CompileStream",
    "CtxccError",
    "ViewAssembler",
    "assistant",
    "tool_result",
    "user",
]
VERSION = "0.1.0"
