"""The composition root: the one place that builds and wires everything.

Nothing else in the daemon opens a database, starts a server, loads a tokenizer or
registers a metric. The host-facing steps it takes on the way (the files settings name,
the data directory's mode, binding the addresses and the socket) are functions of the
configuration in server/startup.py, called only from here.

Start order: open the store (fails fast when another daemon owns the data directory),
build use cases, bind gRPC and /metrics, mark health SERVING. Stop order is the reverse,
with in-flight calls given the grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
import resource
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar
from wsgiref.simple_server import WSGIServer

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from ctxcc.v1 import (
    artifact_service_pb2_grpc,
    compile_service_pb2_grpc,
    session_service_pb2_grpc,
    source_service_pb2_grpc,
    tool_service_pb2_grpc,
)
from server import __version__
from server.adapters.catalog import load_catalog
from server.adapters.gc_pauses import COLLECTIONS
from server.adapters.metrics import PrometheusTelemetry
from server.adapters.metrics_http import serve_metrics
from server.adapters.system import RandomIds, SystemClock
from server.adapters.tokenizer import CounterRegistry, loaded_tokenizers, preload_tokenizers
from server.adapters.workspace import WorkspaceConfig, WorkspaceReader
from server.compiler.sources import SourceCaps
from server.config import Config, ConfigError
from server.domain.catalog import TOKENIZER_TABLES
from server.domain.errors import CtxccError, Reason
from server.domain.table_chunks import Splitter
from server.service.artifacts import ArtifactUseCases
from server.service.blocking import Blocking
from server.service.checkpoints import CheckpointUseCases
from server.service.compile_types import CompilerSettings
from server.service.compiling import CompileUseCases
from server.service.inspection import InspectUseCases
from server.service.lanes import PendingWork
from server.service.limits import ServiceLimits
from server.service.retention import RetentionSweep
from server.service.sessions import SessionUseCases
from server.service.sources import SourceUseCases
from server.service.tools import ToolLimits, ToolUseCases
from server.service.watch import WatchBytes, WatchHub
from server.startup import (
    SERVICE_NAMES,
    add_port,
    auth_token,
    bind_tcp,
    bind_unix,
    data_dir_error,
    echo_handler,
    gid,
    kernel_text,
    new_store_on_full_disk,
    prepare_dirs,
    rpc_methods,
)
from server.transport.artifact_servicer import ArtifactServicer
from server.transport.compile_servicer import CompileServicer
from server.transport.drain import Drain
from server.transport.held import HeldBytes
from server.transport.interceptor import BoundaryInterceptor, error_codes
from server.transport.session_servicer import SessionServicer
from server.transport.source_servicer import SourceServicer
from server.transport.tool_servicer import ToolServicer
from server.transport.wire import request_caps
from storage import KVEventStore, RocksKV, StoreLimits, StoreOpenError, open_rocks
from storage.schema import SchemaError

if TYPE_CHECKING:
    from server.web.server import WebServer

log = logging.getLogger("ctxcc")
T = TypeVar("T")
# New calls gRPC holds for the daemon to take (see the server's options).
MAX_PENDING_CALLS = 16_384


def max_connections() -> int:
    """Connections each gRPC listener takes at once (the API's socket and TCP port, the
    health port): an eighth of the process's file descriptors, so that together they
    hold under half. A peer holding idle connections (~20,000, a few bytes each) took
    every descriptor: the agent's own connection still answered, but compiles left the
    instruction files out of the view ("skipped AGENTS.md: Too many open files"), and
    any file opened meanwhile (RocksDB's next table file too) would fail. Past the cap
    gRPC closes a new connection at once (its client sees UNAVAILABLE); the rest stays
    for the store and the workspace."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1 << 17
    return max(16, soft // 8)


@dataclass(frozen=True, slots=True)
class Endpoints:
    tcp: str | None
    unix: str | None
    metrics: str | None
    health: str | None = None
    ui: str | None = None


# A health service name that is SERVING while the process runs, whatever the disk:
# liveness and startup probes ask it, so a full disk (overall NOT_SERVING, reads still
# served) never makes kubelet restart the daemon in a loop.
LIVENESS_SERVICE = "ctxcc.liveness"
# How often a full disk is checked for freed space.
DISK_POLL_S = 1.0
# The retention sweep examines one page of sessions per tick: the next page soon while a
# pass is under way, the next pass after a tenth of the retention (within these bounds),
# so a session is deleted at most about a tenth of the retention after it is due.
SWEEP_PAGE_GAP_S = 0.5
SWEEP_PASS_GAP_S = (1.0, 60.0)
# grpc's own stop, after the drain: only idle streams remain to be cancelled.
STOP_GRACE_S = 0.5


class Daemon:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.telemetry = PrometheusTelemetry(__version__)
        self._server: grpc.aio.Server | None = None
        self._health_server: grpc.aio.Server | None = None
        self._health = health.aio.HealthServicer()
        self._metrics_server: WSGIServer | None = None
        self._web: WebServer | None = None
        self._blocking = Blocking(cfg.workers, cfg.compile_workers, around_compute=COLLECTIONS.held)
        # Appends feed it, compiles read it (their lane): one for both.
        self._pending = PendingWork()
        self._store: KVEventStore | None = None
        self._drain = Drain()
        self._disk_watch: asyncio.Task[None] | None = None
        self._sweep: asyncio.Task[None] | None = None
        limits = ServiceLimits()
        self.hub = WatchHub(
            limits.watch_queue_size, limits.max_watchers_per_session, limits.max_watchers
        )
        self.endpoints = Endpoints(None, None, None)
        self.session_servicer: SessionServicer | None = None
        self.compile_servicer: CompileServicer | None = None

    def _boundary(self) -> BoundaryInterceptor:
        cfg = self.cfg
        boundary = BoundaryInterceptor(
            self.telemetry,
            auth_token(cfg),
            self._drain,
            request_caps(cfg.max_events_per_append, cfg.max_tools),
            cfg.max_request_bytes_in_memory,
            cfg.max_calls_in_progress,
        )
        self.telemetry.watch_requests(lambda: boundary.requests.held)
        return boundary

    def _watch_bytes(self) -> WatchBytes:
        """The bytes the watches hold in flight, together (their pages, unsent messages)."""
        watching = HeldBytes(self.cfg.max_watch_bytes_in_memory, "watches", "watch")
        self.telemetry.watch_watch_bytes(lambda: watching.held)
        return WatchBytes(watching)

    async def start(self) -> Endpoints:
        cfg = self.cfg
        kernel = kernel_text(cfg)
        try:
            catalog = load_catalog(cfg.model_catalog)
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        prepare_dirs(cfg)
        kv, preload = self._open_kv()
        # One splitter for the store and the compiles: see CompileUseCases.
        store = self._open_store(kv, splitter := Splitter())
        self._store = store
        self._watch(store)
        limits = ServiceLimits(
            max_events_per_append=cfg.max_events_per_append,
            max_event_bytes=cfg.max_event_bytes,
            blob_threshold_bytes=cfg.blob_threshold_bytes,
            max_artifact_bytes=cfg.max_artifact_bytes,
        )
        tool_limits = ToolLimits(
            max_tools=cfg.max_tools,
            max_description_chars=cfg.max_tool_description_chars,
            max_schema_bytes=cfg.max_tool_schema_bytes,
            max_schema_depth=cfg.max_tool_schema_depth,
        )
        clock, ids = SystemClock(), RandomIds()
        sessions = SessionUseCases(
            store,
            self._blocking,
            self.hub,
            clock,
            ids,
            limits,
            self.telemetry,
            self._pending,
            self._watch_bytes(),
        )
        checkpoints = CheckpointUseCases(store, self._blocking, self.hub, clock, ids, self._pending)
        workspace = WorkspaceReader(
            WorkspaceConfig(
                roots=cfg.workspace_roots,
                global_dir=cfg.global_dir,
                instruction_names=cfg.instruction_files,
            )
        )
        sources = SourceUseCases(store, self._blocking, clock, workspace, self._pending)
        settings = CompilerSettings(
            kernel_text=kernel,
            time_granularity_s=cfg.time_granularity,
            budget=cfg.budget,
            memo_bytes=cfg.compile_memo_bytes,
            cpu_budget_ms=cfg.compile_cpu_budget_ms,
            caps=SourceCaps(
                instruction_file_chars=cfg.instruction_file_cap,
                instructions_total_chars=cfg.instructions_cap,
                skills_chars=cfg.skills_cap,
                rules_chars=cfg.rules_cap,
                rule_index_chars=cfg.rule_index_cap,
                memory_chars=cfg.memory_cap,
            ),
        )
        compiles = CompileUseCases(
            store,
            self._blocking,
            self.hub,
            clock,
            ids,
            CounterRegistry(),
            catalog,
            settings,
            self.telemetry,
            sources,
            checkpoints,
            splitter,
            self._pending,
            sessions.on_delete,
        )
        # Before any call is served, so that no compile of this daemon's is overwritten.
        await asyncio.to_thread(compiles.restore_over_budget)
        artifacts = ArtifactUseCases(store, self._blocking, clock, ids, cfg.max_artifact_bytes)

        self.telemetry.expect_rpcs(rpc_methods(), error_codes())
        server = grpc.aio.server(
            interceptors=[self._boundary()],
            options=[
                ("grpc.max_receive_message_length", cfg.max_message_bytes),
                ("grpc.max_send_message_length", cfg.max_message_bytes),
                # Without this, a second daemon on the same TCP port would silently share it.
                ("grpc.so_reuseport", 0),
                # Calls that arrived but that the event loop has not taken yet: past
                # grpc's default of 1,000 (3,000 hard) a share of a burst was cancelled
                # at random, a bare CANCELLED before any handler ran (3,000 streams
                # opened at once on one connection: ~700 of them). A pending call holds
                # no more than one taken, and taken ones have no such limit.
                # Uncompressed requests only (bit 0, identity): gRPC inflated a gzip or
                # deflate message on its own threads up to the message cap before
                # refusing it, so a few KB cost 64 MiB of memory and ~0.1 s of a thread
                # that other calls' I/O waits for (two clients sending such messages put
                # another session's append p99 at 0.5-1.1 s). A compressed request is now
                # refused from its headers; a sidecar's socket gains nothing from it.
                ("grpc.compression_enabled_algorithms_bitset", 1),
                ("grpc.max_allowed_incoming_connections", max_connections()),
                ("grpc.server.max_pending_requests", MAX_PENDING_CALLS),
                ("grpc.server.max_pending_requests_hard_limit", MAX_PENDING_CALLS),
                ("grpc.keepalive_time_ms", 30_000),
                ("grpc.keepalive_permit_without_calls", 1),
                ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
            ],
        )
        self._add_core_services(server, sessions, compiles, checkpoints)
        artifact_service_pb2_grpc.add_ArtifactServiceServicer_to_server(
            ArtifactServicer(artifacts), server
        )
        tool_service_pb2_grpc.add_ToolServiceServicer_to_server(
            ToolServicer(
                ToolUseCases(store, self._blocking, tool_limits, self._pending),
                cfg.max_message_bytes,
            ),
            server,
        )
        source_service_pb2_grpc.add_SourceServiceServicer_to_server(
            SourceServicer(sources, cfg.max_message_bytes), server
        )
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        if cfg.debug_echo:
            server.add_generic_rpc_handlers((echo_handler(),))
        reflection.enable_server_reflection(
            (
                *SERVICE_NAMES,
                health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                reflection.SERVICE_NAME,
            ),
            server,
        )
        tcp, unix = await self._bind(server)
        await server.start()
        if unix is not None:
            os.chmod(unix, cfg.socket_mode)
            if cfg.socket_group:
                os.chown(unix, -1, gid(cfg.socket_group))
        self._server = server
        metrics = self._start_metrics()
        if preload is not None:
            await preload
        writable = await asyncio.to_thread(store.writable)
        await self._set_health(writable)
        await self._health.set(LIVENESS_SERVICE, health_pb2.HealthCheckResponse.SERVING)
        self._start_background(store, writable, sessions, clock)
        health_at = await self._start_health()
        ui = await self._start_ui(InspectUseCases(store, self._blocking, sessions, compiles))
        self.endpoints = Endpoints(tcp, unix, metrics, health_at, ui)
        return self.endpoints

    def _watch(self, store: KVEventStore) -> None:
        """The gauges read at scrape time: the store's and the tokenizers'."""
        self.telemetry.watch_store(store.count_sessions, store.footprint, store.bases_dropped)
        self.telemetry.watch_tokenizers(TOKENIZER_TABLES, loaded_tokenizers)

    def _open_store(self, kv: RocksKV, splitter: Splitter) -> KVEventStore:
        cfg = self.cfg
        try:
            limits = StoreLimits(
                cfg.max_sessions, cfg.max_session_bytes, cfg.max_session_basis_bytes
            )
            return KVEventStore(kv, limits, splitter)
        except CtxccError as exc:
            kv.close()
            # A new store writes its schema version at open: on a disk too full to take
            # writes that was a DISK_FULL traceback.
            if exc.reason is Reason.DISK_FULL:
                raise StoreOpenError(new_store_on_full_disk(cfg)) from None
            # What the open reads (the schema, the sessions' count and bytes) damaged on
            # disk, or unreadable: one line with RocksDB's words, not a traceback.
            why = getattr(exc, "detail", exc.message)
            raise StoreOpenError(f"cannot open the store in {cfg.db_path}: {why}") from None
        except SchemaError as exc:
            # A store of a newer ctxcc (a rollback after an upgrade), or one that cannot
            # be migrated: the operator's to decide, with this one line.
            kv.close()
            raise StoreOpenError(f"cannot open the store in {cfg.db_path}: {exc}") from None

    def _open_kv(self) -> tuple[RocksKV, asyncio.Future[None] | None]:
        """The store's engine, and the preloaded tokenizers' build, started once the
        data directory is the daemon's: beside RocksDB's open (a long log replay), and
        never for a directory another daemon holds."""
        cfg = self.cfg
        preloading: list[asyncio.Future[None]] = []
        try:
            kv = open_rocks(
                cfg.db_path,
                sync=cfg.durability == "sync",
                on_write=self.telemetry.storage_write,
                reserve_bytes=cfg.disk_reserve_bytes,
                locked=lambda: preloading.extend(self._preload_tokenizers()),
            )
            return kv, preloading[0] if preloading else None
        except OSError as exc:  # not ours to write (its owner, its mode), not a directory
            raise ConfigError(data_dir_error(cfg, exc)) from None

    def _preload_tokenizers(self) -> list[asyncio.Future[None]]:
        """Tokenizer tables are built by the first compile that needs one, in its worker
        (a sidecar serving Claude routes never holds o200k's). Those the operator asks to
        preload are built beside the store's opening (`_open_kv`), and SERVING waits
        for them."""
        names = self.cfg.preload_tokenizers
        if not names:
            return []
        return [_beside(preload_tokenizers, names)]

    def _add_core_services(
        self,
        server: grpc.aio.Server,
        sessions: SessionUseCases,
        compiles: CompileUseCases,
        checkpoints: CheckpointUseCases,
    ) -> None:
        cfg = self.cfg
        # Kept for benchmarks that call the handlers without gRPC (bench/stepcost.py).
        self.session_servicer = SessionServicer(sessions, cfg.max_message_bytes)
        self.compile_servicer = CompileServicer(
            compiles,
            sessions,
            checkpoints,
            cfg.stream_chunk_bytes,
            self._drain,
            cfg.max_message_bytes,
            COLLECTIONS.held,
            self.telemetry,
        )
        servicer = self.compile_servicer
        self.telemetry.watch_stream_views(lambda: servicer.stream_view_bytes)
        session_service_pb2_grpc.add_SessionServiceServicer_to_server(self.session_servicer, server)
        compile_service_pb2_grpc.add_CompileServiceServicer_to_server(servicer, server)

    async def _set_health(self, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse
        for name in ("", *SERVICE_NAMES):
            await self._health.set(name, status.SERVING if serving else status.NOT_SERVING)

    async def _watch_disk(self, store: KVEventStore, serving: bool) -> None:
        """Health is NOT_SERVING while writes fail for lack of space; once space is freed
        the store recovers in place (no restart) and health turns SERVING again."""
        while True:
            await asyncio.sleep(DISK_POLL_S)
            # Off the loop: a recovery reopens RocksDB once calls in progress finish.
            now = await asyncio.to_thread(store.writable)
            if now != serving:
                serving = now
                await self._set_health(now)

    def _start_background(
        self, store: KVEventStore, writable: bool, sessions: SessionUseCases, clock: SystemClock
    ) -> None:
        """The disk watch, and the retention sweep when a retention is set."""
        self._disk_watch = asyncio.create_task(self._watch_disk(store, writable))
        if self.cfg.session_retention_s:
            sweep = RetentionSweep(
                sessions, clock, self.cfg.session_retention_s * 1_000_000_000, self.telemetry
            )
            self._sweep = asyncio.create_task(self._expire_sessions(sweep))

    async def _expire_sessions(self, sweep: RetentionSweep) -> None:
        low, high = SWEEP_PASS_GAP_S
        pass_gap = min(high, max(low, self.cfg.session_retention_s / 10))
        while True:
            try:
                swept = await sweep.sweep_page()
            except CtxccError as exc:  # a full disk, say: the next pass tries again
                log.warning("session retention sweep: %s", exc)
                swept = None
            await asyncio.sleep(pass_gap if swept is None or swept.wrapped else SWEEP_PAGE_GAP_S)

    async def _start_health(self) -> str | None:
        """A second server with only grpc.health.v1: kubelet probes it over TCP while the
        API itself stays on the socket and loopback."""
        if self.cfg.health_listen == "none":
            return None
        server = grpc.aio.server(
            options=[
                ("grpc.so_reuseport", 0),
                ("grpc.max_allowed_incoming_connections", max_connections()),
            ]
        )
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        host, _, _ = self.cfg.health_listen.rpartition(":")
        try:
            port = add_port(server, self.cfg.health_listen, None, "health_listen")
        except ConfigError:
            # Never started, yet it must be stopped on this loop, or its shutdown runs
            # unawaited once the loop has closed.
            await server.stop(None)
            raise
        await server.start()
        self._health_server = server
        return f"{host}:{port}"

    async def _start_ui(self, inspect: InspectUseCases) -> str | None:
        """The web inspector: another transport over the same use cases, read-only."""
        if self.cfg.ui_listen == "none":
            return None
        # The web stack (aiohttp, Jinja2) takes a good part of a second to import: it
        # loads in a thread once gRPC already serves, never in the daemon's start-up path.
        await asyncio.to_thread(importlib.import_module, "server.web.server")
        from server.web.server import WebSettings, start_web

        settings = WebSettings(self.cfg.ui_listen, auth_token(self.cfg))
        try:
            self._web = await start_web(inspect, settings)
        except OSError as exc:
            raise ConfigError(f"cannot serve the inspector on {self.cfg.ui_listen}: {exc}") from exc
        return self._web.address

    async def _bind(self, server: grpc.aio.Server) -> tuple[str | None, str | None]:
        try:
            return bind_tcp(server, self.cfg), bind_unix(server, self.cfg)
        except ConfigError:
            await server.stop(None)  # see _start_health: an unstarted server needs it too
            raise

    def _start_metrics(self) -> str | None:
        if self.cfg.metrics_listen == "none":
            return None
        host, _, port = self.cfg.metrics_listen.rpartition(":")
        try:
            srv = serve_metrics(host, int(port), self.telemetry.registry)
        except OSError as exc:
            raise ConfigError(f"cannot serve /metrics on {self.cfg.metrics_listen}: {exc}") from exc
        self._metrics_server = srv
        return f"{host}:{srv.server_port}"

    def hurry(self) -> None:
        """Stop waiting for calls in flight (`stop` goes on at once, as at the end of the
        grace period): a second stop signal."""
        self._drain.hurry()

    async def stop(self) -> None:
        """Health NOT_SERVING, drain in-flight calls within the grace period, close RocksDB."""
        if self._disk_watch is not None:
            # Ended before health is set: it could set SERVING again.
            self._disk_watch.cancel()
            await asyncio.wait([self._disk_watch])
        # Not grpc's enter_graceful_shutdown, which turns every service NOT_SERVING:
        # LIVENESS_SERVICE stays SERVING while the process runs, draining included (it
        # answered NOT_SERVING for the whole drain, up to the grace period).
        await self._set_health(False)
        # New calls now answer SHUTTING_DOWN and idle streams end; running calls finish.
        self._drain.close()
        self.hub.close_all()
        if self._sweep is not None:
            # Ended before the store closes: a delete under way finishes, and is logged and
            # counted (after health and the drain: a large delete takes a while).
            self._sweep.cancel()
            await asyncio.wait([self._sweep])
        if self._web is not None:
            await self._web.stop()
        if self._server is not None:
            idle = await self._drain.wait_idle(self.cfg.grace_period)
            # Counted before the cut, which ends idle streams too: a health watch is no call
            # still running (two of a load balancer's made one held call read as three).
            over = self._drain.running
            # What is still in a handler (calls over the grace period; idle streams such as
            # health watches and reflection) answers UNAVAILABLE with SHUTTING_DOWN ("reconnect
            # and resend"), a reason any gRPC client can act on, not grpc's bare CANCELLED.
            cut = await self._drain.cut(STOP_GRACE_S)
            if not idle:
                when = (
                    "at the second stop signal"
                    if self._drain.hurried
                    else f"after the {self.cfg.grace_period}s grace period"
                )
                log.warning(
                    "calls still running %s: %d ended with SHUTTING_DOWN (and %d idle streams)",
                    when,
                    over,
                    max(0, cut - over),
                )
            await self._server.stop(STOP_GRACE_S)
        if self._health_server is not None:
            await self._health_server.stop(0)
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server.server_close()
        await asyncio.to_thread(self._blocking.shutdown)
        if self._store is not None:
            self._store.close()
        if self.endpoints.unix is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.endpoints.unix)


def _beside(fn: Callable[[T], object], arg: T) -> asyncio.Future[None]:
    """`fn(arg)` on a daemon thread of its own, settling the returned future. Not the
    loop's default executor: a start that fails (the data directory in use, a damaged
    store) ends the process at once, where asyncio.run's exit joined that executor's
    threads and waited out a table still being built (~1 s for Claude's), then logged it
    built after the failure."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def settle(failed: BaseException | None) -> None:
        if done.done():
            return
        if failed is None:
            done.set_result(None)
        else:
            done.set_exception(failed)

    def run() -> None:
        failed: BaseException | None = None
        try:
            fn(arg)
        except BaseException as exc:  # raised where the start awaits it
            failed = exc
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
            loop.call_soon_threadsafe(settle, failed)

    threading.Thread(target=run, name="ctxcc-preload", daemon=True).start()
    return done
