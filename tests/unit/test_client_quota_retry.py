"""The Python client retries the daemon's four transient quotas (what calls in progress
hold at once: nothing of a refused call was done) as after UNAVAILABLE, deletes included,
and fails at once on every other quota."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from ctxcc_client.errors import CtxccError, from_step_error, transient_quota
from ctxcc_client.retry import retried, retry_sync
from google.rpc import error_details_pb2, status_pb2

from ctxcc.v1 import compile_service_pb2 as cpb

TRANSIENT = [
    "request_bytes_in_memory",
    "calls_in_progress",
    "upload_bytes_in_memory",
    "download_bytes_in_memory",
    "watch_bytes_in_memory",
]
LASTING = [
    "max_session_bytes",
    "max_sessions",
    "max_message_bytes",
    "compile_cpu_budget_ms",
    "watchers",
    "",
]


class Refused(grpc.RpcError):
    """A call's status as grpc raises it: code, details and the ErrorInfo trailer."""

    def __init__(self, quota: str, code: grpc.StatusCode = grpc.StatusCode.RESOURCE_EXHAUSTED):
        info = error_details_pb2.ErrorInfo(
            reason="QUOTA_EXCEEDED", domain="ctxcc.dev", metadata={"quota": quota, "limit": "2"}
        )
        status = status_pb2.Status(code=code.value[0], message="retry later")
        status.details.add().Pack(info)
        self._code = code
        self._trailer = (("grpc-status-details-bin", status.SerializeToString()),)

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return "retry later"

    def trailing_metadata(self) -> Any:
        return self._trailer


@pytest.mark.parametrize("quota", TRANSIENT)
def test_transient_quotas_are_retried_by_any_call(quota: str) -> None:
    assert retried(Refused(quota), idempotent=True)
    assert retried(Refused(quota), idempotent=False)  # a delete: none of it was done
    step = cpb.StepError(
        code=grpc.StatusCode.RESOURCE_EXHAUSTED.value[0],
        reason="QUOTA_EXCEEDED",
        metadata={"quota": quota},
    )
    err = from_step_error(step)
    assert transient_quota(err.code, err.reason, err.metadata)


@pytest.mark.parametrize("quota", LASTING)
def test_other_quotas_fail_at_once(quota: str) -> None:
    assert not retried(Refused(quota), idempotent=True)
    assert not transient_quota(
        grpc.StatusCode.RESOURCE_EXHAUSTED, "QUOTA_EXCEEDED", {"quota": quota}
    )


def test_another_code_under_a_transient_quota_is_not_one() -> None:
    assert not retried(Refused("calls_in_progress", grpc.StatusCode.FAILED_PRECONDITION), True)


def test_retry_sync_waits_out_a_refusal_and_not_another() -> None:
    calls = 0

    def twice_refused() -> str:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise Refused("calls_in_progress")
        return "done"

    assert retry_sync(twice_refused, False, 5.0) == "done"
    assert calls == 3
    calls = 0

    def over_budget() -> str:
        nonlocal calls
        calls += 1
        raise Refused("compile_cpu_budget_ms")

    with pytest.raises(CtxccError) as err:
        retry_sync(over_budget, True, 5.0)
    assert err.value.metadata["quota"] == "compile_cpu_budget_ms"
    assert calls == 1
