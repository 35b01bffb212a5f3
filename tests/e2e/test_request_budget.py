"""Large requests in progress hold their bytes of one budget, `--max-request-bytes-in-memory`:
a request of 64 KiB or more that would pass it is refused before it is parsed
(RESOURCE_EXHAUSTED, QUOTA_EXCEEDED, `quota=request_bytes_in_memory`), one alone always
passes, small ones are never counted, and every call gives its bytes back when it ends,
however it ends (else the budget would shrink until every large request was refused).

A request holds ~6 copies of its bytes while the daemon works on it: without the budget,
four concurrent 60 MB appends peaked at 1.15 GB, past the 768 MiB limit of the pod."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import compile_service_pb2_grpc, session_pb2, session_service_pb2_grpc
from ctxcc.v1 import session_service_pb2 as spb
from tests.e2e.proc import DaemonProcess
from tests.helpers import ROUTE, error_info, padded_watch, user, varint

BUDGET = 1 << 20
# Events of 600 KB: two make a request over the budget (each event is under the 1 MiB cap).
BIG_TEXT = "x" * 600_000


@pytest.fixture
def daemon(short_tmp: Path) -> Iterator[DaemonProcess]:
    d = DaemonProcess(
        short_tmp / "data",
        "--max-request-bytes-in-memory",
        str(BUDGET),
        "--ui-listen",
        "none",
    )
    with d.serving():
        yield d


def _create(stub: Any, *ids: str) -> None:
    for sid in ids:
        stub.CreateSession(spb.CreateSessionRequest(session=session_pb2.Session(session_id=sid)))


def _wait_nothing_held(daemon: DaemonProcess, timeout: float = 60) -> None:
    """Until no call holds any bytes of the budget (what a leak would never reach)."""
    deadline = time.monotonic() + timeout
    while (held := daemon.metric("ctxcc_request_bytes_in_memory")) != 0:
        assert time.monotonic() < deadline, f"{held} bytes still held after {timeout}s"
        time.sleep(0.05)


def test_a_large_request_waits_for_the_budget_a_held_one_takes(daemon: DaemonProcess) -> None:
    with grpc.insecure_channel(daemon.target) as ch:
        sessions: Any = session_service_pb2_grpc.SessionServiceStub(ch)
        _create(sessions, "watched", "big")
        watch = padded_watch(ch, "watched", 2 * BUDGET // 3)
        try:
            daemon.wait_in_flight("SessionService/WatchSession", 1)
            big = spb.AppendEventsRequest(session_id="big", events=[user(BIG_TEXT)] * 2)
            with pytest.raises(grpc.RpcError) as refused:
                sessions.AppendEvents(big)
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            info = error_info(refused.value)
            assert info.reason == "QUOTA_EXCEEDED"
            assert info.metadata["quota"] == "request_bytes_in_memory"
            assert info.metadata["limit"] == str(BUDGET)
            # Small requests are not counted: appends and steps go on.
            small = sessions.AppendEvents(
                spb.AppendEventsRequest(session_id="big", events=[user("hi")])
            )
            assert small.last_seq == 1

            compiles: Any = compile_service_pb2_grpc.CompileServiceStub(ch)
            req = cpb.CompileRequest(session_id="big", route=ROUTE)

            def steps() -> Iterator[cpb.CompileStreamRequest]:
                yield cpb.CompileStreamRequest(
                    step=cpb.StepRequest(step_id="large", events=[user(BIG_TEXT)] * 2, compile=req)
                )
                yield cpb.CompileStreamRequest(
                    step=cpb.StepRequest(step_id="small", events=[user("go on")], compile=req)
                )

            answers = list(compiles.CompileStream(steps(), timeout=60))
            # Refused in-band under its step id; the stream stays open for the next step.
            assert answers[0].step_id == "large"
            assert answers[0].error.reason == "QUOTA_EXCEEDED"
            assert answers[-1].step_id == "small"
            assert not answers[-1].HasField("error")
            assert answers[-1].append.last_seq == 2
        finally:
            watch.cancel()
        _wait_nothing_held(daemon)
        # The watch's bytes are given back: the same append alone passes.
        assert sessions.AppendEvents(big).last_seq == 4
        listed = sessions.ListEvents(spb.ListEventsRequest(session_id="big"))
        texts = [e.user_message.parts[0].text for e in listed.events]
        # Nothing of a refused request was written.
        assert texts == ["hi", "go on", BIG_TEXT, BIG_TEXT]
    assert daemon.metric("ctxcc_errors_total", reason="QUOTA_EXCEEDED") == 2


def test_every_call_gives_its_bytes_back_however_it_ends(daemon: DaemonProcess) -> None:
    """Concurrent large appends, some cut by a deadline that may pass before, during or
    after their handler: each is answered OK or refused, the log holds exactly the OK
    ones, and afterwards nothing is held (a large append alone passes, and a second one
    beside a held watch is refused only by that watch's bytes)."""
    outcomes: Counter[str] = Counter()
    written: Counter[str] = Counter()
    lock = threading.Lock()
    with grpc.insecure_channel(daemon.target) as ch:
        sessions: Any = session_service_pb2_grpc.SessionServiceStub(ch)
        _create(sessions, *(f"s{i}" for i in range(8)))

        def agent(i: int) -> None:
            for round_ in range(6):
                big = spb.AppendEventsRequest(
                    session_id=f"s{i}",
                    events=[user(BIG_TEXT)],
                    request_id=f"{i}-{round_}",
                )
                timeout = 0.002 if round_ % 3 == 2 else 60
                try:
                    sessions.AppendEvents(big, timeout=timeout)
                    outcome = "OK"
                except grpc.RpcError as err:
                    outcome = err.code().name
                    if outcome == "RESOURCE_EXHAUSTED":  # checked below: not raised here
                        outcome += "/" + error_info(err).metadata["quota"]
                with lock:
                    outcomes[outcome] += 1
                    if outcome == "OK":
                        written[f"s{i}"] += 1

        threads = [threading.Thread(target=agent, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        refusal = "RESOURCE_EXHAUSTED/request_bytes_in_memory"
        assert set(outcomes) <= {"OK", refusal, "DEADLINE_EXCEEDED"}, outcomes
        assert outcomes["OK"] > 0
        for i in range(8):
            listed = sessions.ListEvents(spb.ListEventsRequest(session_id=f"s{i}"))
            # A call cut by its deadline may still have been written: never more than
            # answered OK plus those cut.
            assert len(listed.events) >= written[f"s{i}"]
        # Calls cut by their deadline may still be in their handler for a moment.
        _wait_nothing_held(daemon)
        # Nothing is held any more: a request of the whole budget passes alone ...
        whole = spb.AppendEventsRequest(session_id="s0", events=[user(BIG_TEXT)] * 2)
        sessions.AppendEvents(whole)
        # ... and beside a watch holding a third of it, one of two thirds passes too.
        watch = padded_watch(ch, "s1", BUDGET // 3)
        try:
            daemon.wait_in_flight("SessionService/WatchSession", 1)
            two_thirds = spb.AppendEventsRequest(session_id="s0", events=[user("y" * 650_000)])
            sessions.AppendEvents(two_thirds)
        finally:
            watch.cancel()
    # A refusal may come after its client's deadline: that client saw DEADLINE_EXCEEDED.
    refused = daemon.metric("ctxcc_errors_total", reason="QUOTA_EXCEEDED")
    assert outcomes[refusal] <= refused <= outcomes[refusal] + outcomes["DEADLINE_EXCEEDED"]


def test_an_idle_stream_holds_nothing_of_its_answered_step(daemon: DaemonProcess) -> None:
    """A CompileStream step's bytes are given back once it is answered, not when the next
    step arrives: an agent's stream idles between steps (its model call, its tools), and
    one that had sent a large step held it for as long as it stayed open, refusing every
    other large request beside it (36 MB steps: one idle stream refused all others)."""
    with grpc.insecure_channel(daemon.target) as ch:
        sessions: Any = session_service_pb2_grpc.SessionServiceStub(ch)
        compiles: Any = compile_service_pb2_grpc.CompileServiceStub(ch)
        _create(sessions, "streamed", "big")
        req = cpb.CompileRequest(session_id="streamed", route=ROUTE, dry_run=True)
        sent = threading.Event()

        def steps() -> Iterator[cpb.CompileStreamRequest]:
            yield cpb.CompileStreamRequest(
                step=cpb.StepRequest(step_id="large", events=[user(BIG_TEXT)], compile=req)
            )
            sent.wait()  # the stream stays open, idle, until the append below is answered

        answers = compiles.CompileStream(steps(), timeout=120)
        try:
            first = next(answers)
            assert first.step_id == "large"
            assert not first.HasField("error")
            _wait_nothing_held(daemon)
            # Beside the idle stream, a request of the whole budget's size passes.
            big = spb.AppendEventsRequest(session_id="big", events=[user(BIG_TEXT)] * 2)
            assert sessions.AppendEvents(big).last_seq == 2
        finally:
            sent.set()
            answers.cancel()


def test_a_refused_reflection_message_answers_with_its_reason(daemon: DaemonProcess) -> None:
    """Server reflection's stream has no handler guard of ours: a message the boundary
    refused (over the budget, or not a valid message) was raised through it and answered
    UNKNOWN with the exception's text, no ErrorInfo, and an ERROR in the daemon's log."""
    reflection = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
    with grpc.insecure_channel(daemon.target) as ch:
        sessions: Any = session_service_pb2_grpc.SessionServiceStub(ch)
        _create(sessions, "watched")
        info = ch.stream_stream(
            reflection, request_serializer=lambda b: b, response_deserializer=lambda b: b
        )
        with pytest.raises(grpc.RpcError) as malformed:
            list(info(iter([b"\x0a\xff\xff"]), timeout=60))  # a string field cut short
        assert malformed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error_info(malformed.value).reason == "INVALID_FIELD"
        watch = padded_watch(ch, "watched", 2 * BUDGET // 3)
        try:
            daemon.wait_in_flight("SessionService/WatchSession", 1)
            host = b"h" * (BUDGET // 2)  # ServerReflectionRequest.host
            large = varint(1 << 3 | 2) + varint(len(host)) + host
            with pytest.raises(grpc.RpcError) as refused:
                list(info(iter([large]), timeout=60))
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert error_info(refused.value).metadata["quota"] == "request_bytes_in_memory"
        finally:
            watch.cancel()
