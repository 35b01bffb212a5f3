"""A 20-step agent loop against a running ctxcc: append -> compile (stream) -> call a
fake provider -> queue its usage for the next step -> append the reply: one round trip per
step. Usage: CTXCC_TARGET=... python agent_loop.py"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

from ctxcc_client import AsyncClient, CtxccError, assistant, user

from ctxcc.v1 import common_pb2
from ctxcc.v1 import compile_service_pb2 as cpb

ROUTE = common_pb2.Route(connection="example", protocol="fake", endpoint="local", model="gpt-4o")


def fake_provider(view_chars: int, messages: int, step: int) -> tuple[str, int, int]:
    """Pretends to be a model: a reply and the tokens a provider would report, counted
    from the request it was sent (about 4 characters a token, a few per message), as a
    real provider counts them: never from ctxcc's estimate, which after a report is that
    report plus what is new (reporting the estimate with a margin compounds, step after
    step)."""
    return f"reply {step}", view_chars // 4 + 4 * messages + 7, 40 + step


def wait_for_file(path: str) -> None:
    while not os.path.exists(path):
        time.sleep(0.05)


async def main(
    target: str, steps: int = 20, big_step: int = -1, pause_at: int = -1, resume_file: str = ""
) -> int:
    async with AsyncClient(target) as ctx:
        session = await ctx.create_session()
        print(f"session {session.session_id}", flush=True)
        stream = ctx.stream()
        try:
            pending = [user("start the task")]
            largest = 0
            carried = 0  # steps whose answer says the usage they carried was recorded
            for step in range(steps):
                if step == big_step:  # ~5 MB of text: the view arrives in chunks
                    pending += [user(f"chunk {i} line. " * 60000) for i in range(6)]
                started = time.perf_counter()
                view, appended = await stream.step(
                    cpb.CompileRequest(session_id=session.session_id, route=ROUTE), pending
                )
                ms = (time.perf_counter() - started) * 1000
                first, last = (appended.first_seq, appended.last_seq) if appended else (0, 0)
                replayed = str(bool(appended and appended.replayed)).lower()
                print(
                    f"step {step} append {first}-{last} replayed {replayed} ms {ms:.2f} "
                    f"estimate {view.budget.estimated_input_tokens}",
                    flush=True,
                )
                size = sum(len(p.text) for m in view.messages for p in m.parts)
                largest = max(largest, size)
                reply, used_in, used_out = fake_provider(
                    size + len(view.system_prompt), len(view.messages), step
                )
                if stream.last_usage is not None and not stream.last_usage.replayed:
                    carried += 1
                # Rides on the next step (the last one goes by ReportUsage at close).
                await stream.report_usage(
                    view.compile_id, input_tokens=used_in, output_tokens=used_out, route=ROUTE
                )
                pending = [assistant(reply), user(f"next step {step + 1}")]
                if step == pause_at:  # the interop tests restart the daemon here
                    print("paused", flush=True)
                    await asyncio.to_thread(wait_for_file, resume_file)
        finally:
            await stream.close()
        reason = ""
        try:
            await ctx.get_session("no-such-session")
        except CtxccError as err:
            reason = err.reason
        print(
            f"ok {steps} steps session {session.session_id} seq {view.event_boundary} "
            f"largest_view_bytes {largest} missing_reason {reason} usage_carried {carried}"
        )
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--big-step", type=int, default=-1)
    parser.add_argument("--pause-at", type=int, default=-1)
    parser.add_argument("--resume-file", default="")
    args = parser.parse_args()
    target = os.environ.get("CTXCC_TARGET", "127.0.0.1:50551")
    sys.exit(asyncio.run(main(target, args.steps, args.big_step, args.pause_at, args.resume_file)))
