"""AsyncClient (grpc.aio) and Client (blocking) with the same methods."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from ctxcc.v1 import (
    common_pb2,
    compile_service_pb2_grpc,
    event_pb2,
    session_pb2,
    session_service_pb2_grpc,
    view_pb2,
)
from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_service_pb2 as spb
from ctxcc_client.errors import CtxccError, from_rpc_error
from ctxcc_client.stream import CompileStream

T = TypeVar("T")
RETRIES = 5
OPTIONS = [
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.keepalive_time_ms", 30_000),
]


def _route(model: str, route: common_pb2.Route | None) -> common_pb2.Route:
    return route if route is not None else common_pb2.Route(model=model)


def _retryable(err: grpc.RpcError) -> bool:
    return err.code() == grpc.StatusCode.UNAVAILABLE


class AsyncClient:
    def __init__(self, target: str) -> None:
        self._channel = grpc.aio.insecure_channel(target, options=OPTIONS)
        self.sessions: Any = session_service_pb2_grpc.SessionServiceStub(self._channel)
        self.compiles: Any = compile_service_pb2_grpc.CompileServiceStub(self._channel)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    async def _call(self, fn: Callable[[], Awaitable[T]], idempotent: bool) -> T:
        for attempt in range(RETRIES):
            try:
                return await fn()
            except grpc.aio.AioRpcError as err:
                if not (idempotent and _retryable(err)) or attempt == RETRIES - 1:
                    raise from_rpc_error(err) from None
                await asyncio.sleep(min(2.0, 0.05 * 2**attempt))
        raise AssertionError("unreachable")

    async def create_session(self, session_id: str = "", **fields: Any) -> session_pb2.Session:
        req = spb.CreateSessionRequest(session=session_pb2.Session(session_id=session_id, **fields))
        resp = await self._call(lambda: self.sessions.CreateSession(req), idempotent=False)
        return resp.session  # type: ignore[no-any-return]

    async def get_session(self, session_id: str) -> session_pb2.Session:
        req = spb.GetSessionRequest(session_id=session_id)
        resp = await self._call(lambda: self.sessions.GetSession(req), idempotent=True)
        return resp.session  # type: ignore[no-any-return]

    async def append(
        self,
        session_id: str,
        events: list[event_pb2.Event],
        *,
        request_id: str = "",
        expected_last_seq: int | None = None,
    ) -> spb.AppendEventsResponse:
        req = spb.AppendEventsRequest(
            session_id=session_id, events=events, request_id=request_id or uuid.uuid4().hex
        )
        if expected_last_seq is not None:
            req.expected_last_seq = expected_last_seq
        # Safe to retry: the request_id makes a repeat a replay, never a duplicate.
        return await self._call(lambda: self.sessions.AppendEvents(req), idempotent=True)

    async def compile(
        self,
        session_id: str,
        model: str = "",
        *,
        route: common_pb2.Route | None = None,
        **fields: Any,
    ) -> view_pb2.CompiledView:
        req = cpb.CompileRequest(session_id=session_id, route=_route(model, route), **fields)
        resp = await self._call(lambda: self.compiles.Compile(req), idempotent=True)
        return resp.view  # type: ignore[no-any-return]

    async def report_usage(
        self,
        compile_id: str,
        *,
        input_tokens: int,
        output_tokens: int,
        cached_input_tokens: int = 0,
        route: common_pb2.Route | None = None,
    ) -> cpb.ReportUsageResponse:
        req = cpb.ReportUsageRequest(
            compile_id=compile_id,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            cached_input_tokens=cached_input_tokens,
            route=route,
        )
        return await self._call(lambda: self.compiles.ReportUsage(req), idempotent=True)

    def stream(self) -> CompileStream:
        return CompileStream(self.compiles)


class Client:
    """The blocking twin of AsyncClient, for agents without an event loop."""

    def __init__(self, target: str) -> None:
        self._channel = grpc.insecure_channel(target, options=OPTIONS)
        self.sessions: Any = session_service_pb2_grpc.SessionServiceStub(self._channel)
        self.compiles: Any = compile_service_pb2_grpc.CompileServiceStub(self._channel)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self._channel.close()

    def _call(self, fn: Callable[[], T], idempotent: bool) -> T:
        for attempt in range(RETRIES):
            try:
                return fn()
            except grpc.RpcError as err:
                if not (idempotent and _retryable(err)) or attempt == RETRIES - 1:
                    raise from_rpc_error(err) from None
                time.sleep(min(2.0, 0.05 * 2**attempt))
        raise AssertionError("unreachable")

    def create_session(self, session_id: str = "", **fields: Any) -> session_pb2.Session:
        req = spb.CreateSessionRequest(session=session_pb2.Session(session_id=session_id, **fields))
        return self._call(lambda: self.sessions.CreateSession(req), idempotent=False).session  # type: ignore[no-any-return]

    def append(
        self,
        session_id: str,
        events: list[event_pb2.Event],
        *,
        request_id: str = "",
        expected_last_seq: int | None = None,
    ) -> spb.AppendEventsResponse:
        req = spb.AppendEventsRequest(
            session_id=session_id, events=events, request_id=request_id or uuid.uuid4().hex
        )
        if expected_last_seq is not None:
            req.expected_last_seq = expected_last_seq
        return self._call(lambda: self.sessions.AppendEvents(req), idempotent=True)  # type: ignore[no-any-return]

    def compile(
        self,
        session_id: str,
        model: str = "",
        *,
        route: common_pb2.Route | None = None,
        **fields: Any,
    ) -> view_pb2.CompiledView:
        req = cpb.CompileRequest(session_id=session_id, route=_route(model, route), **fields)
        return self._call(lambda: self.compiles.Compile(req), idempotent=True).view  # type: ignore[no-any-return]

    def report_usage(
        self,
        compile_id: str,
        *,
        input_tokens: int,
        output_tokens: int,
        cached_input_tokens: int = 0,
        route: common_pb2.Route | None = None,
    ) -> cpb.ReportUsageResponse:
        req = cpb.ReportUsageRequest(
            compile_id=compile_id,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            cached_input_tokens=cached_input_tokens,
            route=route,
        )
        return self._call(lambda: self.compiles.ReportUsage(req), idempotent=True)  # type: ignore[no-any-return]


__all__ = ["AsyncClient", "Client", "CtxccError"]
