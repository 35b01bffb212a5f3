"""RPC metrics for every service the server hosts (ctxcc's, health, reflection), taken
in one server interceptor: count, latency and status code by method."""

from __future__ import annotations

import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

RpcObserver = Callable[[str, str, float], None]


def _code(context: Any, failed: bool) -> str:
    code = context.code()
    if code is None:
        return "UNKNOWN" if failed else "OK"
    if isinstance(code, grpc.StatusCode):
        return code.name
    return str(code)


def _wrap(behavior: Any, name: str, observe: RpcObserver) -> Any:
    if inspect.isasyncgenfunction(behavior):

        async def stream(request: Any, context: Any) -> AsyncIterator[Any]:
            started, failed = time.perf_counter(), False
            try:
                async for item in behavior(request, context):
                    yield item
            except BaseException:
                failed = True
                raise
            finally:
                observe(name, _code(context, failed), time.perf_counter() - started)

        return stream

    async def unary(request: Any, context: Any) -> Any:
        started, failed = time.perf_counter(), False
        try:
            return await behavior(request, context)
        except BaseException:
            failed = True
            raise
        finally:
            observe(name, _code(context, failed), time.perf_counter() - started)

    return unary


class MetricsInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, observe: RpcObserver) -> None:
        self._observe = observe

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        # "/ctxcc.v1.SessionService/AppendEvents" -> "SessionService/AppendEvents"
        full = handler_call_details.method or ""
        name = full.rsplit(".", 1)[-1] if "." in full else full.strip("/")
        kw = {
            "request_deserializer": handler.request_deserializer,
            "response_serializer": handler.response_serializer,
        }
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(
                _wrap(handler.unary_unary, name, self._observe), **kw
            )
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(
                _wrap(handler.unary_stream, name, self._observe), **kw
            )
        if handler.stream_unary:
            return grpc.stream_unary_rpc_method_handler(
                _wrap(handler.stream_unary, name, self._observe), **kw
            )
        return grpc.stream_stream_rpc_method_handler(
            _wrap(handler.stream_stream, name, self._observe), **kw
        )
