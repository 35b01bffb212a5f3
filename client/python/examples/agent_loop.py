"""A 20-step agent loop against a running ctxcc: append -> compile (stream) -> call a
fake provider -> report usage -> append the reply. Usage: CTXCC_TARGET=... python agent_loop.py"""

from __future__ import annotations

import asyncio
import os
import sys

from ctxcc_client import AsyncClient, CtxccError, assistant, user

from ctxcc.v1 import common_pb2
from ctxcc.v1 import compile_service_pb2 as cpb

ROUTE = common_pb2.Route(connection="example", protocol="fake", endpoint="local", model="gpt-4o")


def fake_provider(estimate: int, step: int) -> tuple[str, int, int]:
    """Pretends to be a model: a reply and the tokens a provider would report."""
    return f"reply {step}", int(estimate * 1.02) + 7, 40 + step


async def main(target: str, steps: int = 20) -> int:
    async with AsyncClient(target) as ctx:
        session = await ctx.create_session()
        stream = ctx.stream()
        try:
            pending = [user("start the task")]
            for step in range(steps):
                view, _ = await stream.step(
                    cpb.CompileRequest(session_id=session.session_id, route=ROUTE), pending
                )
                reply, used_in, used_out = fake_provider(view.budget.estimated_input_tokens, step)
                await ctx.report_usage(
                    view.compile_id, input_tokens=used_in, output_tokens=used_out, route=ROUTE
                )
                pending = [assistant(reply), user(f"next step {step + 1}")]
            print(f"ok {steps} steps, session {session.session_id}, last seq {view.event_boundary}")
        finally:
            await stream.close()
        try:
            await ctx.get_session("no-such-session")
        except CtxccError as err:
            print(f"errors carry reasons: {err.reason}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(os.environ.get("CTXCC_TARGET", "127.0.0.1:50551"))))
