"""StreamReads: a CompileStream's next message, ended by shutdown only while it waits.

The stream's own task awaits the read, and shutdown cancels that task only when it
waits there: these pin what the read in a task of its own did (SHUTTING_DOWN for an
idle stream, a step in progress left alone, the client's own cancel kept a cancel)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from ctxcc.v1 import compile_service_pb2 as pb
from server.domain.errors import CtxccError, Reason
from server.transport.compile_stream import StreamReads


def _msg(step_id: str) -> pb.CompileStreamRequest:
    return pb.CompileStreamRequest(step=pb.StepRequest(step_id=step_id))


class _Client:
    """A request stream whose messages the test sends one by one."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[pb.CompileStreamRequest | None] = asyncio.Queue()

    async def requests(self) -> AsyncIterator[pb.CompileStreamRequest]:
        while (item := await self.queue.get()) is not None:
            yield item


async def test_messages_in_order_then_none_when_the_client_ends() -> None:
    client, closed = _Client(), asyncio.get_running_loop().create_future()
    reads = StreamReads(client.requests(), closed)
    for k in ("1", "2"):
        client.queue.put_nowait(_msg(k))
    client.queue.put_nowait(None)
    assert [(await reads.next()), (await reads.next())] == [_msg("1"), _msg("2")]
    assert await reads.next() is None


async def test_an_idle_stream_ends_with_shutting_down_and_its_task_is_not_left_cancelled() -> None:
    client, closed = _Client(), asyncio.get_running_loop().create_future()
    reads = StreamReads(client.requests(), closed)
    after: list[int] = []

    async def stream() -> None:
        try:
            await reads.next()
        finally:
            task = asyncio.current_task()
            assert task is not None
            # What follows (the error table's abort) must not be cancelled in turn.
            after.append(task.cancelling())
            await asyncio.sleep(0)

    call = asyncio.ensure_future(stream())
    await asyncio.sleep(0.01)
    closed.set_result(None)
    with pytest.raises(CtxccError) as ended:
        await asyncio.wait_for(call, 5)
    assert ended.value.reason == Reason.SHUTTING_DOWN
    assert after == [0]


async def test_shutdown_during_a_step_lets_the_step_finish_and_ends_the_next_read() -> None:
    client, closed = _Client(), asyncio.get_running_loop().create_future()
    reads = StreamReads(client.requests(), closed)
    client.queue.put_nowait(_msg("1"))
    answered: list[str] = []

    async def stream() -> None:
        while (msg := await reads.next()) is not None:
            closed.set_result(None)  # the daemon stops while this step is answered
            await asyncio.sleep(0.05)  # the step's awaits are not cancelled
            answered.append(msg.step.step_id)

    with pytest.raises(CtxccError) as ended:
        await asyncio.wait_for(stream(), 5)
    assert answered == ["1"]
    assert ended.value.reason == Reason.SHUTTING_DOWN


async def test_the_clients_cancel_stays_a_cancel_also_when_shutdown_comes_with_it() -> None:
    for with_shutdown in (False, True):
        client, closed = _Client(), asyncio.get_running_loop().create_future()
        reads = StreamReads(client.requests(), closed)
        call = asyncio.ensure_future(reads.next())
        await asyncio.sleep(0.01)
        if with_shutdown:  # its cancel of the read comes first, then the client's
            closed.set_result(None)
        call.cancel()  # what grpc does when the client goes away
        with pytest.raises(asyncio.CancelledError):
            await call


async def test_a_stream_reading_when_closed_is_cancelled_keeps_reading() -> None:
    """The servicer cancels `closed` when the stream ends: that is no shutdown."""
    client, closed = _Client(), asyncio.get_running_loop().create_future()
    reads = StreamReads(client.requests(), closed)
    call = asyncio.ensure_future(reads.next())
    await asyncio.sleep(0.01)
    closed.cancel()
    await asyncio.sleep(0.01)
    assert not call.done()
    client.queue.put_nowait(_msg("2"))
    assert await asyncio.wait_for(call, 5) == _msg("2")
