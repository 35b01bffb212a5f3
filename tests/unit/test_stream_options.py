"""A CompileStream step's compile request is converted and checked through the memo the
unary Compile shares (transport/options_memo.py): once while it repeats."""

from __future__ import annotations

import pytest

from ctxcc.v1 import common_pb2
from ctxcc.v1 import compile_service_pb2 as pb
from server.domain.errors import CtxccError, Reason
from server.service.compile_records import checked
from server.transport.convert_view import compile_options_in
from server.transport.options_memo import OptionsMemo


def _request(model: str = "gpt-4o", session_id: str = "s", mode: int = 0) -> pb.CompileRequest:
    route = common_pb2.Route(model=model)
    return pb.CompileRequest(session_id=session_id, route=route, approval_mode=mode)  # type: ignore[arg-type]


def test_the_same_request_reuses_its_options_and_any_change_is_converted_again() -> None:
    stream = OptionsMemo()
    first = stream.checked(_request())
    assert first == checked(compile_options_in(_request()))
    assert stream.checked(_request()) is first  # an equal request, another message
    changed = stream.checked(_request(mode=pb.APPROVAL_MODE_ALWAYS_ASK))
    assert changed is not first and changed.approval_mode is not None
    assert changed == checked(compile_options_in(_request(mode=pb.APPROVAL_MODE_ALWAYS_ASK)))
    assert stream.checked(_request()) == first


def test_a_refused_request_is_refused_after_an_accepted_one() -> None:
    stream = OptionsMemo()
    stream.checked(_request())
    with pytest.raises(CtxccError) as exc:
        stream.checked(_request(model=""))
    assert exc.value.reason is Reason.INVALID_FIELD
    with pytest.raises(CtxccError):
        stream.checked(_request(session_id="bad id with spaces"))


def test_the_kept_request_is_a_copy_of_the_step_s() -> None:
    """The step's message is not kept (it would keep the step's events alive: the memo
    keys its encoding), nor is a later change to it mistaken for the kept request."""
    stream = OptionsMemo()
    step = pb.StepRequest(compile=_request())
    first = stream.checked(step.compile)
    step.compile.route.model = "claude-sonnet-4"
    assert stream.checked(step.compile) is not first
    assert stream.checked(step.compile).route.model == "claude-sonnet-4"
