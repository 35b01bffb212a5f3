"""How the RPC metrics name a call that ended by its client: cancelled, or past its deadline.

The daemon cannot tell the two apart from the cancel itself (the client's deadline timer
sends a cancel too); it judges by the time the call had left. These cases are the ones a
real CI runner produced: the client's 10 s deadline ran out while the daemon, which
started its timer when the call arrived, still had 0.4 s.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from server.transport.interceptor import _code, _deadline_slack


class _Context:
    """What `_code` reads of a grpc.aio servicer context: no code set, and a clock."""

    def __init__(self, remaining: float | None) -> None:
        self.remaining = remaining
        self.set_code: grpc.StatusCode | None = None

    def code(self) -> grpc.StatusCode | None:
        return self.set_code

    def time_remaining(self) -> float | None:
        return self.remaining


def _ended(at_entry: float | None, at_cancel: float | None) -> str:
    context = _Context(at_entry)
    slack = _deadline_slack(context)
    context.remaining = at_cancel
    return _code(context, asyncio.CancelledError(), slack)


@pytest.mark.parametrize(
    ("at_entry", "at_cancel", "expected"),
    [
        (10.0, 0.4, "DEADLINE_EXCEEDED"),  # the client's timer ran out first
        (10.0, 0.0, "DEADLINE_EXCEEDED"),
        (10.0, -0.01, "DEADLINE_EXCEEDED"),
        (10.0, 3.0, "CANCELLED"),  # a client that gave up early
        (600.0, 1.5, "CANCELLED"),  # the slack stops at a second
        (0.02, 0.01, "DEADLINE_EXCEEDED"),  # a short deadline keeps 0.1 s
        (0.5, 0.2, "CANCELLED"),
        (None, None, "CANCELLED"),  # no deadline: only the client can have ended it
    ],
)
def test_a_cancel_near_the_deadline_is_the_deadline(
    at_entry: float | None, at_cancel: float | None, expected: str
) -> None:
    assert _ended(at_entry, at_cancel) == expected


def test_what_the_handler_or_grpc_answered_is_kept() -> None:
    context = _Context(10.0)
    slack = _deadline_slack(context)
    assert _code(context, None, slack) == "OK"
    assert _code(context, RuntimeError("unguarded"), slack) == "UNKNOWN"
    context.set_code = grpc.StatusCode.NOT_FOUND
    assert _code(context, None, slack) == "NOT_FOUND"
