"""AsyncClient (grpc.aio) and Client (blocking) with the same methods.

Every RPC of the five services is reachable with typed requests through `sessions`,
`compiles`, `tools`, `sources` and `artifacts` (the generated stubs, wrapped so that unary
calls retry on UNAVAILABLE when safe and every error is a CtxccError); the methods below
cover the calls whose shape is awkward by hand (streams, uploads, idempotency keys)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any, cast

import grpc

from ctxcc.v1 import artifact_service_pb2 as apb
from ctxcc.v1 import (
    artifact_service_pb2_grpc,
    common_pb2,
    compile_service_pb2_grpc,
    event_pb2,
    session_pb2,
    session_service_pb2,
    session_service_pb2_grpc,
    source_service_pb2_grpc,
    tool_service_pb2_grpc,
    view_pb2,
)
from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_service_pb2 as spb
from ctxcc_client import build
from ctxcc_client.errors import CtxccError, from_rpc_error
from ctxcc_client.retry import (
    RETRY_SECONDS,
    Backoff,
    retry_async,
    retry_sync,
    retryable,
)
from ctxcc_client.stream import CompileStream

# WatchSession's response header: the create time of the session the watch follows.
SESSION_CREATE_TIME_KEY = "ctxcc-session-create-time-ns"


class AsyncClient:
    """One channel to the daemon. `retry_seconds` bounds how long an idempotent call or a
    stream step waits out an unavailable daemon before raising CtxccError(UNAVAILABLE)."""

    def __init__(
        self,
        target: str,
        *,
        credentials: grpc.ChannelCredentials | None = None,
        options: list[tuple[str, Any]] | None = None,
        retry_seconds: float = RETRY_SECONDS,
    ) -> None:
        opts = build.channel_options(options)
        self._channel = (
            grpc.aio.secure_channel(target, credentials, options=opts)
            if credentials is not None
            else grpc.aio.insecure_channel(target, options=opts)
        )
        self.retry_seconds = retry_seconds
        ch, s = self._channel, retry_seconds
        self.sessions: session_service_pb2_grpc.SessionServiceAsyncStub = build.async_service(
            session_service_pb2_grpc.SessionServiceStub, ch, s
        )
        self.compiles: compile_service_pb2_grpc.CompileServiceAsyncStub = build.async_service(
            compile_service_pb2_grpc.CompileServiceStub, ch, s
        )
        self.tools: tool_service_pb2_grpc.ToolServiceAsyncStub = build.async_service(
            tool_service_pb2_grpc.ToolServiceStub, ch, s
        )
        self.sources: source_service_pb2_grpc.SourceServiceAsyncStub = build.async_service(
            source_service_pb2_grpc.SourceServiceStub, ch, s
        )
        self.artifacts: artifact_service_pb2_grpc.ArtifactServiceAsyncStub = build.async_service(
            artifact_service_pb2_grpc.ArtifactServiceStub, ch, s
        )
        self._compile_stub = compile_service_pb2_grpc.CompileServiceStub(ch)
        self._artifact_stub = artifact_service_pb2_grpc.ArtifactServiceStub(ch)
        self._session_stub = session_service_pb2_grpc.SessionServiceStub(ch)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    async def create_session(self, session_id: str = "", **fields: Any) -> session_pb2.Session:
        req = spb.CreateSessionRequest(session=session_pb2.Session(session_id=session_id, **fields))
        return (await self.sessions.CreateSession(req)).session

    async def get_session(self, session_id: str) -> session_pb2.Session:
        return (
            await self.sessions.GetSession(spb.GetSessionRequest(session_id=session_id))
        ).session

    async def append(
        self,
        session_id: str,
        events: list[event_pb2.Event],
        *,
        request_id: str = "",
        expected_last_seq: int | None = None,
    ) -> spb.AppendEventsResponse:
        req = build.append_request(session_id, events, request_id, expected_last_seq)
        return await self.sessions.AppendEvents(req)

    async def compile(
        self,
        session_id: str,
        model: str = "",
        *,
        route: common_pb2.Route | None = None,
        **fields: Any,
    ) -> view_pb2.CompiledView:
        """A unary Compile of the session at its head: `model` alone, or a whole `route=`;
        `fields` are CompileRequest's other fields (`render_formats=[...]`, `dry_run=True`,
        `as_of_seq=n`, ...)."""
        if not isinstance(model, str):
            # A Route passed where the model name goes failed deep in the request's build
            # ("bad argument type for built-in operation").
            raise TypeError(
                f"compile(session_id, model='', *, route=None, **fields): model is a model "
                f"name, not {type(model).__name__}; pass a Route as route="
            )
        req = build.compile_request(session_id, model, route, fields)
        return (await self.compiles.Compile(req)).view

    async def report_usage(
        self,
        compile_id: str,
        *,
        input_tokens: int,
        output_tokens: int,
        cached_input_tokens: int = 0,
        reasoning_tokens: int = 0,
        route: common_pb2.Route | None = None,
    ) -> cpb.ReportUsageResponse:
        req = build.usage_request(
            compile_id,
            route,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            cached_input_tokens=cached_input_tokens,
            reasoning_tokens=reasoning_tokens,
        )
        return await self.compiles.ReportUsage(req)

    def stream(self, *, deltas: bool = True, chained_digest: bool = True) -> CompileStream:
        """One long-lived CompileStream; hold one per agent session. With `deltas` (the
        default) steps are answered with only what changed since the last view, rebuilt
        and checked here; `deltas=False` asks for every view whole. `chained_digest=False`
        checks deltas by the whole view's sha256 instead of the chained digest (which
        hashes only what is new). `stream.report_usage` queues a view's usage for the next
        step to carry (one round trip per step)."""
        return CompileStream(
            self._compile_stub,
            self.retry_seconds,
            deltas=deltas,
            chained_digest=chained_digest,
            report=self.compiles.ReportUsage,
        )

    async def upload_artifact(
        self,
        session_id: str,
        data: bytes,
        mime_type: str,
        *,
        width: int = 0,
        height: int = 0,
        request_id: str = "",
    ) -> common_pb2.ArtifactRef:
        """Uploads bytes (e.g. an image) and returns the ref to put in a message (see
        `user_with`). Retried with one request id, so a repeat stores nothing twice."""
        stub: Any = self._artifact_stub
        header = build.upload_header(session_id, data, mime_type, width, height, request_id)
        resp = await retry_async(
            lambda: stub.UploadArtifact(build.upload_requests(header, data)),
            True,
            self.retry_seconds,
        )
        return cast(common_pb2.ArtifactRef, resp.artifact)

    async def download_artifact(
        self, session_id: str, artifact_id: str
    ) -> tuple[common_pb2.ArtifactRef, bytes]:
        req = apb.DownloadArtifactRequest(session_id=session_id, artifact_id=artifact_id)
        stub: Any = self._artifact_stub

        async def once() -> tuple[common_pb2.ArtifactRef, bytes]:
            out = build.Download()
            async for msg in stub.DownloadArtifact(req):
                out.add(msg)
            return out.result()

        return await retry_async(once, True, self.retry_seconds)

    async def watch(
        self, session_id: str, after_seq: int = 0
    ) -> AsyncGenerator[session_service_pb2.WatchSessionResponse, None]:
        """Updates of a session after `after_seq`; reopens after a daemon restart from the
        last event it delivered, so no event is delivered twice or skipped. A session
        deleted (and perhaps made again under its id) while the watch was away ends it with
        NOT_FOUND (SESSION_NOT_FOUND), as an open watch ends: the daemon's header names the
        create time of the session each watch follows, and a reopened watch that follows
        another one ends so, even when nothing was delivered yet. The reopened watch also
        asks for the last event it delivered again, and a log without that very event (its
        id and time) is another session's, never followed as if it went on (the check
        left with a daemon that sends no such header)."""
        stub: Any = self._session_stub
        backoff = Backoff(self.retry_seconds)
        last: event_pb2.Event | None = None  # the last event delivered
        made: str | None = None  # the create time of the session watched, from a header
        while True:
            # From the second call on, start one event early: the first event answered
            # must be the one delivered last, or the log is no longer the one watched.
            anchor = last
            start = after_seq - 1 if anchor is not None else after_seq
            call: Any = None
            try:
                call = stub.WatchSession(
                    spb.WatchSessionRequest(session_id=session_id, after_seq=start)
                )
                # Sent once the daemon subscribed (with an older daemon: with the first
                # update, or none at the end).
                now = _created(await call.initial_metadata())
                if made is None:
                    made = now
                elif now is not None and now != made:
                    call.cancel()
                    raise _session_gone(session_id)
                async for msg in call:
                    if anchor is not None:
                        if not _same_event(msg, anchor):
                            raise _session_gone(session_id)
                        anchor = None
                        continue
                    if msg.HasField("event"):
                        after_seq = msg.event.seq
                        last = msg.event
                    backoff = Backoff(self.retry_seconds)
                    yield msg
                return
            except grpc.aio.AioRpcError as err:
                if anchor is not None and _reason(err) == "SEQ_OUT_OF_RANGE":
                    raise _session_gone(session_id) from None  # a shorter log: another one
                pause = backoff.next_pause() if retryable(err) else None
                if pause is None:
                    raise from_rpc_error(err) from None
                await asyncio.sleep(pause)
            finally:
                # A caller that stops iterating (a break, aclose(), a cancelled task) ends the
                # call: the daemon's watcher goes with it (64 per session at most), and
                # grpc.aio does not cancel a call whose generator was closed.
                if call is not None:
                    call.cancel()


def _same_event(msg: session_service_pb2.WatchSessionResponse, event: event_pb2.Event) -> bool:
    """The same event of the same log: its seq, its id and the time the daemon wrote it."""
    if not msg.HasField("event"):
        return False
    got = msg.event
    return (got.seq, got.event_id, got.create_time) == (
        event.seq,
        event.event_id,
        event.create_time,
    )


def _created(header: Any) -> str | None:
    """The create time of the session a watch follows, from its header (None: not sent)."""
    for key, value in header or ():
        if key == SESSION_CREATE_TIME_KEY:
            return str(value)
    return None


def _reason(err: grpc.aio.AioRpcError) -> str:
    return from_rpc_error(err).reason


def _session_gone(session_id: str) -> CtxccError:
    return CtxccError(
        grpc.StatusCode.NOT_FOUND,
        "SESSION_NOT_FOUND",
        f"session {session_id!r} was deleted while the watch was reconnecting",
        {"session_id": session_id},
    )


class Client:
    """The blocking twin of AsyncClient, for agents without an event loop."""

    def __init__(
        self,
        target: str,
        *,
        credentials: grpc.ChannelCredentials | None = None,
        options: list[tuple[str, Any]] | None = None,
        retry_seconds: float = RETRY_SECONDS,
    ) -> None:
        opts = build.channel_options(options)
        self._channel = (
            grpc.secure_channel(target, credentials, options=opts)
            if credentials is not None
            else grpc.insecure_channel(target, options=opts)
        )
        self.retry_seconds = retry_seconds
        ch, s = self._channel, retry_seconds
        self.sessions: session_service_pb2_grpc.SessionServiceStub = build.sync_service(
            session_service_pb2_grpc.SessionServiceStub, ch, s
        )
        self.compiles: compile_service_pb2_grpc.CompileServiceStub = build.sync_service(
            compile_service_pb2_grpc.CompileServiceStub, ch, s
        )
        self.tools: tool_service_pb2_grpc.ToolServiceStub = build.sync_service(
            tool_service_pb2_grpc.ToolServiceStub, ch, s
        )
        self.sources: source_service_pb2_grpc.SourceServiceStub = build.sync_service(
            source_service_pb2_grpc.SourceServiceStub, ch, s
        )
        self.artifacts: artifact_service_pb2_grpc.ArtifactServiceStub = build.sync_service(
            artifact_service_pb2_grpc.ArtifactServiceStub, ch, s
        )
        self._artifact_stub = artifact_service_pb2_grpc.ArtifactServiceStub(ch)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    def create_session(self, session_id: str = "", **fields: Any) -> session_pb2.Session:
        req = spb.CreateSessionRequest(session=session_pb2.Session(session_id=session_id, **fields))
        return self.sessions.CreateSession(req).session

    def get_session(self, session_id: str) -> session_pb2.Session:
        return self.sessions.GetSession(spb.GetSessionRequest(session_id=session_id)).session

    def append(
        self,
        session_id: str,
        events: list[event_pb2.Event],
        *,
        request_id: str = "",
        expected_last_seq: int | None = None,
    ) -> spb.AppendEventsResponse:
        return self.sessions.AppendEvents(
            build.append_request(session_id, events, request_id, expected_last_seq)
        )

    def compile(
        self,
        session_id: str,
        model: str = "",
        *,
        route: common_pb2.Route | None = None,
        **fields: Any,
    ) -> view_pb2.CompiledView:
        return self.compiles.Compile(build.compile_request(session_id, model, route, fields)).view

    def report_usage(
        self,
        compile_id: str,
        *,
        input_tokens: int,
        output_tokens: int,
        cached_input_tokens: int = 0,
        reasoning_tokens: int = 0,
        route: common_pb2.Route | None = None,
    ) -> cpb.ReportUsageResponse:
        req = build.usage_request(
            compile_id,
            route,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            cached_input_tokens=cached_input_tokens,
            reasoning_tokens=reasoning_tokens,
        )
        return self.compiles.ReportUsage(req)

    def upload_artifact(
        self,
        session_id: str,
        data: bytes,
        mime_type: str,
        *,
        width: int = 0,
        height: int = 0,
        request_id: str = "",
    ) -> common_pb2.ArtifactRef:
        stub: Any = self._artifact_stub
        header = build.upload_header(session_id, data, mime_type, width, height, request_id)
        resp = retry_sync(
            lambda: stub.UploadArtifact(build.upload_requests(header, data)),
            True,
            self.retry_seconds,
        )
        return cast(common_pb2.ArtifactRef, resp.artifact)

    def download_artifact(
        self, session_id: str, artifact_id: str
    ) -> tuple[common_pb2.ArtifactRef, bytes]:
        req = apb.DownloadArtifactRequest(session_id=session_id, artifact_id=artifact_id)
        stub: Any = self._artifact_stub

        def once() -> tuple[common_pb2.ArtifactRef, bytes]:
            out = build.Download()
            for msg in stub.DownloadArtifact(req):
                out.add(msg)
            return out.result()

        return retry_sync(once, True, self.retry_seconds)


__all__ = ["AsyncClient", "Client", "CtxccError"]
