"""The boundary every RPC crosses, in one server interceptor:

- requests that do not decode (invalid UTF-8 in a string, a truncated message) answer
  INVALID_ARGUMENT with reason INVALID_FIELD instead of grpc's UNKNOWN with parser text;
- with an auth token configured, TCP peers must send `authorization: Bearer <token>`
  (Unix-socket peers are trusted: the socket's mode and group guard it; health checks are
  open, as kubelet cannot send headers);
- calls in flight, and count, latency and status code of every RPC, by method;
- during shutdown, new calls answer UNAVAILABLE/SHUTTING_DOWN and running ones are
  counted busy until they return (see `drain.py`; bidirectional streams count their
  own busy steps).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Protocol

import grpc

from server.domain.errors import CtxccError, Reason
from server.transport.drain import Drain, Ticket, cut_short, shutting_down
from server.transport.errors import CODES, ErrorObserver, answered_reason, status_for
from server.transport.held import Charge, HeldBytes
from server.transport.wire import RefusedMessage, RepeatedCap, count_over, passing, string_at


class RpcObserver(ErrorObserver, Protocol):
    """Where the interceptor reports each call: when its handler starts, and when it ends
    (and the ErrorInfo reason of the status it ended with, when it has one)."""

    def rpc_started(self, method: str) -> None: ...

    def rpc_done(self, method: str, code: str, seconds: float) -> None: ...


_OPEN_SERVICES = ("grpc.health.v1.Health",)
# Streams the drain does not wait for: a watch ends when the watch hub closes at shutdown,
# unless its handler is blocked sending to a client that stopped reading (a backlog of
# megabytes, flow control), where only the server's stop ends it.
_NOT_WAITED_FOR = ("/ctxcc.v1.SessionService/WatchSession",)
# Codes the gRPC runtime ends calls with besides the error table's: the client cancels or
# its deadline passes, a message exceeds the size limit, a handler fails unguarded.
_RUNTIME_CODES = ("CANCELLED", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "UNKNOWN", "INTERNAL")


# See _code: a cancel this close to the call's deadline is its deadline passing.
_DEADLINE_SLACK_SECONDS = 0.1
# ... or this share of the time the call had when it reached its handler, up to a second.
_DEADLINE_SLACK_SHARE = 0.1
_DEADLINE_SLACK_MAX_SECONDS = 1.0


def _deadline_slack(context: Any) -> float:
    """How close to its deadline a cancel of this call counts as the deadline passing.

    The client's deadline timer starts when it sends the call, the daemon's when the call
    arrives: on a loaded machine the client's runs out first by that delay and its cancel
    arrives with time still left here. A fixed 0.1 s counted one watch in five of a 10 s
    deadline as cancelled on a loaded CI runner, so the slack grows with the call's
    deadline (a client that cancels in the last tenth of it is rare)."""
    budget: float | None = context.time_remaining()
    if budget is None:
        return _DEADLINE_SLACK_SECONDS
    return max(
        _DEADLINE_SLACK_SECONDS, min(_DEADLINE_SLACK_MAX_SECONDS, budget * _DEADLINE_SLACK_SHARE)
    )


def error_codes() -> tuple[str, ...]:
    """Every status other than OK that an RPC of this server can end with."""
    return tuple(sorted({c.name for c in CODES.values()} | set(_RUNTIME_CODES)))


def method_label(full: str) -> str:
    """ "/ctxcc.v1.SessionService/AppendEvents" -> "SessionService/AppendEvents"."""
    return full.rsplit(".", 1)[-1] if "." in full else full.strip("/")


class _Malformed:
    def __init__(self, error: Exception) -> None:
        self.error = error

    def answer(self) -> CtxccError:
        return self.error if isinstance(self.error, CtxccError) else _malformed()


class _Charged:
    """A decoded request and the bytes it holds of the request budget (see `_safe`)."""

    __slots__ = ("charge", "message")

    def __init__(self, message: Any, charge: Charge) -> None:
        self.message, self.charge = message, charge


# Requests smaller than this are never counted against the request budget: an agent's
# steps and appends are a few KB, and counting them would cost every call for nothing.
UNCOUNTED_REQUEST_BYTES = 64 << 10


def _safe(
    deserializer: Callable[[bytes], Any] | None,
    caps: tuple[RepeatedCap, ...] = (),
    budget: HeldBytes | None = None,
) -> Callable[[bytes], Any] | None:
    if deserializer is None:
        return None
    tries = tuple((cap, cap.trie()) for cap in caps)
    # Where a stream's message names itself, to be refused in-band under that name.
    ids = tuple(dict.fromkeys(cap.id_path for cap in caps if cap.id_path))

    def decode(data: bytes) -> Any:
        for cap, trie in tries:
            over = count_over(data, cap, trie)
            if over is not None and cap.id_path:
                return RefusedMessage(string_at(data, cap.id_path), cap.error(over))
            if over is not None:
                return _Malformed(cap.error(over))
        charge = None
        if budget is not None and len(data) >= UNCOUNTED_REQUEST_BYTES:
            # A request holds ~6 copies of its bytes while it is decoded and worked on
            # (gRPC's, the parsed message, its strings, the stored encoding, RocksDB's
            # batch and memtable): one 60 MB append peaked 386 MB over an idle daemon,
            # four at once 1.15 GB, past a 768 MiB pod's limit. Over the budget a request
            # is refused before it is parsed.
            err = budget.refusal(len(data))
            if err is not None and ids:
                named = next(filter(None, (string_at(data, p) for p in ids)), "")
                return RefusedMessage(named, err)
            if err is not None:
                return _Malformed(err)
            charge = Charge(budget, len(data))
        try:
            message = deserializer(data)
        except Exception as exc:  # the parser's text stays in the daemon
            return _Malformed(exc)
        return message if charge is None else _Charged(message, charge)

    return decode


# What a request holds of the budget when it holds nothing.
_NO_CHARGE = Charge(HeldBytes(0), 0)


def _unwrapped(request: Any) -> tuple[Any, Charge]:
    """A request as its handler takes it, and the budget it holds (see `_safe`)."""
    if type(request) is _Charged:
        return request.message, request.charge
    return request, _NO_CHARGE


async def _checked(requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """A stream's messages: a refused one ends the call with its error. A message's bytes
    are held of the request budget until the handler asks for the next one (a
    CompileStream step: once it is answered), or the call ends."""
    held = _NO_CHARGE
    try:
        async for item in requests:
            message, held = _unwrapped(item)
            if type(item) is _Charged:
                # gRPC's receiver keeps the last message it handed over while it waits
                # for the next: emptied, it keeps nothing of the request.
                item.message = None
            del item
            if isinstance(message, _Malformed):
                raise message.answer()
            yield message
            # The handler asks for the next message: done with this one, given back now,
            # not when the next arrives (an idle CompileStream held its last large step
            # for as long as it stayed open).
            del message
            held.release()
    finally:
        held.release()


def _malformed() -> CtxccError:
    return CtxccError(
        Reason.INVALID_FIELD, "the request is not a valid message of its type", field="request"
    )


def _code(context: Any, failed: BaseException | None, slack: float) -> str:
    code = context.code()
    if code is None:
        if failed is None:
            return "OK"
        if isinstance(failed, asyncio.CancelledError):
            # gRPC cancels the handler when the client cancels, goes away (an agent that
            # exits with a watch open) or its deadline passes: that is what it answered,
            # not a handler that failed unguarded (UNKNOWN). gRPC's deadline timer fires
            # a few milliseconds before the deadline as Python's clock sees it.
            remaining = context.time_remaining()
            if remaining is not None and remaining <= slack:
                return "DEADLINE_EXCEEDED"
            return "CANCELLED"
        return "UNKNOWN"
    if isinstance(code, grpc.StatusCode):
        return code.name
    return str(code)


def _done(
    observer: RpcObserver,
    name: str,
    context: Any,
    failed: BaseException | None,
    slack: float,
    started: float,
) -> None:
    code = _code(context, failed, slack)
    observer.rpc_done(name, code, time.perf_counter() - started)
    if code != "OK":
        # Every status with our ErrorInfo passes here whoever set it (the handler's
        # guard, this interceptor's gate before the handler, the drain's cut), and a call
        # ends once: each is counted once, by the reason it answered.
        reason = answered_reason(context.trailing_metadata())
        if reason is not None:
            observer.error_answered(reason)


class BoundaryInterceptor(grpc.aio.ServerInterceptor):
    def __init__(
        self,
        observe: RpcObserver,
        auth_token: str = "",
        drain: Drain | None = None,
        caps: Mapping[str, tuple[RepeatedCap, ...]] | None = None,
        request_bytes: int = 0,
        max_calls: int = 0,
    ) -> None:
        self._observe = observe
        self._token = auth_token
        self._drain = drain or Drain()
        self._max_calls = max_calls
        self._caps = dict(caps or {})
        # Bytes of large requests decoded and not yet done with, all calls together.
        self.requests = HeldBytes(request_bytes, "large requests", "request")
        self._budget = self.requests if request_bytes > 0 else None
        # (request decoder, response encoder) by method: the same for every call of it.
        self._codecs: dict[str, tuple[Any, Any]] = {}

    def _denied(self, context: Any, service: str) -> CtxccError | None:
        if not self._token or service in _OPEN_SERVICES:
            return None
        if str(context.peer()).startswith("unix:"):
            return None
        sent = dict(context.invocation_metadata() or ()).get("authorization", "")
        # As bytes: compare_digest raises TypeError on a str with non-ASCII characters,
        # which any HTTP/2 peer can send (grpc decodes the header as UTF-8), and that
        # answered UNKNOWN with the exception's text instead of UNAUTHENTICATED.
        expected = f"Bearer {self._token}".encode()
        if hmac.compare_digest(str(sent).encode("utf-8", "surrogatepass"), expected):
            return None
        return CtxccError(Reason.UNAUTHENTICATED, "a valid bearer token is required over TCP")

    def _refused(self, context: Any, service: str) -> CtxccError | None:
        """Why a call is turned away before its handler: no valid token, or too many calls
        (health answers however many there are)."""
        if service in _OPEN_SERVICES:
            return None
        return self._denied(context, service) or self._crowded()

    def _crowded(self) -> CtxccError | None:
        """Each call in its handler costs ~25-30 KB (gRPC's call, its task, its stream's
        state) however little it sends: 5,000 idle CompileStreams or uploads held ~140 MB,
        and nothing else bounded how many a client keeps open. The calling one is among
        those counted."""
        most = self._max_calls
        if not most or self._drain.in_handlers <= most:
            return None
        return CtxccError(
            Reason.QUOTA_EXCEEDED,
            f"the daemon already has {most} calls in progress (open streams and watches "
            "included); retry later, or end streams that are not used",
            quota="calls_in_progress",
            limit=str(most),
        )

    def _wrap(
        self, behavior: Any, name: str, service: str, streaming_in: bool, counted: bool
    ) -> Any:
        observer, refused, drain = self._observe, self._refused, self._drain
        # Health answers NOT_SERVING through the drain; other calls are turned away.
        open_service = service in _OPEN_SERVICES
        ticket: Ticket | None = None
        if not open_service:
            ticket = self._drain.admit(counted)
        running = ticket.running if ticket is not None else contextlib.nullcontext

        async def gate(request: Any, context: Any) -> Any:
            err = shutting_down() if ticket is None and not open_service else None
            err = err or refused(context, service)
            if err is None and not streaming_in and isinstance(request, _Malformed):
                err = request.answer()
            if err is not None:
                await context.abort_with_status(status_for(err))
            return _checked(request) if streaming_in else request

        if inspect.isasyncgenfunction(behavior):

            async def stream(request: Any, context: Any) -> AsyncIterator[Any]:
                started = time.perf_counter()
                slack = _deadline_slack(context)
                failed: BaseException | None = None
                request, charge = _unwrapped(request)  # a charge held until the stream ends
                observer.rpc_started(name)
                try:
                    with running():
                        async with _cut_with_reason(drain, context):
                            request = await gate(request, context)
                            async for item in behavior(request, context):
                                yield item
                except BaseException as exc:
                    failed = exc
                    raise
                finally:
                    charge.release()
                    _done(observer, name, context, failed, slack, started)

            return stream

        async def unary(request: Any, context: Any) -> Any:
            started = time.perf_counter()
            slack = _deadline_slack(context)
            failed: BaseException | None = None
            request, charge = _unwrapped(request)  # a charge held until the handler returns
            observer.rpc_started(name)
            try:
                with running():
                    async with _cut_with_reason(drain, context):
                        request = await gate(request, context)
                        return await behavior(request, context)
            except BaseException as exc:
                failed = exc
                raise
            finally:
                charge.release()
                _done(observer, name, context, failed, slack, started)

        return unary

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        if handler is None:
            # gRPC's own answer carries no ErrorInfo.
            return _not_served(handler_call_details.method or "", self._observe)
        full = handler_call_details.method or ""
        service = full.strip("/").split("/")[0]
        name = method_label(full)
        codecs = self._codecs.get(full)
        if codecs is None:
            codecs = self._codecs[full] = (
                _safe(handler.request_deserializer, self._caps.get(full, ()), self._budget),
                passing(handler.response_serializer),
            )
        kw = {"request_deserializer": codecs[0], "response_serializer": codecs[1]}
        if handler.unary_unary:
            fn = self._wrap(handler.unary_unary, name, service, False, True)
            return grpc.unary_unary_rpc_method_handler(fn, **kw)
        if handler.unary_stream:
            # Watches are not waited for (_NOT_WAITED_FOR): one whose client stopped
            # reading its backlog held the drain for the whole grace period.
            counted = full not in _NOT_WAITED_FOR
            fn = self._wrap(handler.unary_stream, name, service, False, counted)
            return grpc.unary_stream_rpc_method_handler(fn, **kw)
        if handler.stream_unary:
            fn = self._wrap(handler.stream_unary, name, service, True, True)
            return grpc.stream_unary_rpc_method_handler(fn, **kw)
        fn = self._wrap(handler.stream_stream, name, service, True, False)
        return grpc.stream_stream_rpc_method_handler(fn, **kw)


@contextlib.asynccontextmanager
async def _cut_with_reason(drain: Drain, context: Any) -> AsyncIterator[None]:
    """A call the drain cuts (still in its handler when the grace period is over) answers
    UNAVAILABLE with SHUTTING_DOWN ("reconnect and resend"), not grpc's bare CANCELLED
    without a reason. A cancel that is not the drain's (the client's, a deadline)
    passes. A stream message `_checked` refused, raised through a handler without a
    guard of ours (server reflection's), answers with its reason too: grpc answered it
    UNKNOWN with the exception's text, no ErrorInfo, and logged an ERROR."""
    with drain.cuttable():
        try:
            yield
        except asyncio.CancelledError:
            if drain.was_cut:
                await context.abort_with_status(status_for(cut_short()))
            raise
        except CtxccError as err:
            await context.abort_with_status(status_for(err))


def _not_served(full: str, observer: ErrorObserver) -> grpc.RpcMethodHandler[Any, Any]:
    """A handler for `full`, a method no service has, whatever its kind (a stream
    handler fits a call of any kind): UNIMPLEMENTED with METHOD_NOT_FOUND before a
    request is read. Made per call, kept nowhere: any client may send any name."""
    method = full[:200] or "(no method)"

    async def answer(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        err = CtxccError(
            Reason.METHOD_NOT_FOUND,
            f"{method} is not a method this ctxcc daemon serves (a client newer than the "
            "daemon?); server reflection lists what it serves",
            method=method,
        )
        # Outside the calls the interceptor wraps (no method, no rpc_done): counted here.
        observer.error_answered(err.reason.value)
        await context.abort_with_status(status_for(err))
        yield  # never reached: abort raises

    return grpc.stream_stream_rpc_method_handler(answer)
