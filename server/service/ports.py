"""Ports the service owns and storage implements (RocksDB and the in-memory twin).

Contract (checked by tests/contract for every implementation):
- `append` is atomic: all events, the new head, blobs and the idempotency record land
  together or not at all; per session it is linearizable.
- a repeated request_id with the same digest returns the first result with
  `replayed=True` and writes nothing; with another digest it raises REQUEST_ID_REUSED.
- seqs start at 1 and are contiguous; events are never rewritten.
- `delete_session` removes the session's events and records, and blobs no other
  session references.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Protocol, TypeVar

from server.compiler.tokens import TokenCounter
from server.compiler.view import CompiledView
from server.domain.catalog import ModelInfo
from server.domain.generation import Generation
from server.domain.model import (
    AppendBatch,
    AppendResult,
    DeleteResult,
    Event,
    EventKind,
    EventPage,
    Session,
)
from server.domain.records import (
    ArtifactRecord,
    Checkpoint,
    CompileRecord,
    DamagedCheckpoint,
    RouteModel,
    RouteState,
    Usage,
    UsagePlan,
)
from server.domain.sources import Scope, SourceEntry, SourceKind, WorkspaceSources
from server.domain.tools import ToolSpec

T = TypeVar("T")


class OwedSync(Protocol):
    """The fsync owed by appends made in `EventStore.deferring_sync`."""

    def owes(self) -> bool: ...

    def sync(self) -> None: ...


class EventStore(Protocol):
    def create_session(self, session: Session) -> Session: ...

    def get_session(self, session_id: str) -> Session: ...

    def generation(self, session_id: str, route_id: str) -> Generation:
        """Where the write counters stand for what a compile of this session on this
        route reads: every write bumps them once it landed, so an equal generation
        later means nothing the compile read was written since."""
        ...

    def table_generation(self, session_id: str, table: str) -> tuple[int, int]:
        """The same for one kind of the session's records (`checkpoints`, `tools`,
        `artifacts`): equal later means none of them was written since (nor any session
        deleted, nor any source written)."""
        ...

    def list_sessions(self, after: str, limit: int, project_id: str = "") -> list[Session]: ...

    def page_sessions(
        self, after: str, limit: int, project_id: str = "", examine: int = 0
    ) -> tuple[list[Session], str]:
        """`list_sessions` examining at most `examine` records (0: any number), and the
        id of the last one examined when that stopped it ("" otherwise)."""
        ...

    def count_sessions(self) -> int: ...

    def delete_session(self, session_id: str) -> DeleteResult: ...

    def delete_idle_session(self, session_id: str, before_ns: int) -> DeleteResult | None:
        """`delete_session` if nothing was appended to the session or compiled of it
        since `before_ns` (checked under its lock), else None; None too when it is gone."""
        ...

    def append(self, batch: AppendBatch) -> AppendResult: ...

    def deferring_sync(self) -> AbstractContextManager[OwedSync]:
        """Appends this thread makes inside are written but not yet fsynced: the `sync`
        of what it yields makes them durable, on any thread, before they are
        acknowledged (a step syncs its append while its compile runs)."""
        ...

    def reads_synced(self) -> bool:
        """Whether everything readable is durable already (no I/O)."""
        ...

    def sync_reads(self) -> None:
        """What was read so far is durable once this returns (a step's append is synced
        beside its compile, and others may read it meanwhile); DISK_FULL when a write
        in the log failed its sync for space (until the engine is reopened)."""
        ...

    def read_events(
        self,
        session_id: str,
        after_seq: int = 0,
        limit: int | None = None,
        kinds: frozenset[EventKind] = frozenset(),
        through_seq: int | None = None,
        session_created_ns: int = 0,
    ) -> list[Event]: ...

    def read_event_page(
        self,
        session_id: str,
        after_seq: int,
        limit: int,
        kinds: frozenset[EventKind],
        max_bytes: int,
        session_created_ns: int = 0,
    ) -> EventPage:
        """Like read_events, for a client's page: also stops once the events read hold
        more than `max_bytes` as stored (at least one event), so a page of large events
        never reads and decodes `limit` of them to send a few."""
        ...

    def get_blob(self, sha256: str) -> bytes | None: ...

    def last_turn_start(self, session_id: str, through_seq: int) -> Event | None: ...

    def find_tool_result(self, session_id: str, call_id: str) -> Event | None: ...

    def put_tools(
        self, session_id: str, specs: tuple[ToolSpec, ...], replace_all: bool, most: int
    ) -> tuple[int, tuple[ToolSpec, ...]]:
        """How many tools the session holds now, and those of `specs` it did not hold as
        they are (new or changed); INVALID_FIELD (tools), with nothing written, if that
        would be more than `most`."""
        ...

    def list_tools(self, session_id: str) -> list[ToolSpec]: ...

    def add_activations(
        self,
        session_id: str,
        turn_seq: int,
        names: tuple[str, ...],
        session_created_ns: int = 0,
    ) -> None: ...

    def get_activations(self, session_id: str, turn_seq: int) -> tuple[str, ...]: ...

    def put_artifact(
        self, record: ArtifactRecord, data: bytes, session_created_ns: int = 0
    ) -> ArtifactRecord: ...

    def get_artifact(self, session_id: str, artifact_id: str) -> tuple[ArtifactRecord, bytes]: ...

    def get_artifact_record(self, session_id: str, artifact_id: str) -> ArtifactRecord | None: ...

    def put_checkpoint(self, checkpoint: Checkpoint, session_created_ns: int = 0) -> Checkpoint: ...

    def list_checkpoints(self, session_id: str) -> list[Checkpoint]: ...

    def list_checkpoint_entries(self, session_id: str) -> list[Checkpoint | DamagedCheckpoint]: ...

    def find_checkpoint(self, session_id: str, checkpoint_id: str) -> Checkpoint | None: ...

    def get_checkpoint(
        self, session_id: str, create_time_ns: int, checkpoint_id: str
    ) -> Checkpoint | None: ...

    def list_checkpoint_heads(self, session_id: str) -> list[Checkpoint | DamagedCheckpoint]: ...

    def page_checkpoint_entries(
        self, session_id: str, left: int | None, size: int, max_bytes: int
    ) -> tuple[list[Checkpoint | DamagedCheckpoint], int]: ...

    def put_compile(
        self,
        record: CompileRecord,
        parts: tuple[tuple[str, object], ...] = (),
        wait: bool = True,
        route_since: Generation | None = None,
    ) -> bool:
        """True once written; without `wait`, False (nothing written) when the session's
        lock is held or the engine would stall the write, so a caller on the event loop
        never waits behind an fsync or a RocksDB write stall. While the store's
        generation is still `route_since`, the session's current route is taken to be
        the record's already (not read again)."""
        ...

    def get_compile_part(self, session_id: str, digest: str, cls: type[T]) -> T | None: ...

    def compile_at(self, session_id: str, boundary: int) -> CompileRecord | None: ...

    def get_compile(self, compile_id: str) -> CompileRecord: ...

    def record_usage(
        self,
        compile_id: str,
        usage: Usage,
        plan: UsagePlan,
    ) -> tuple[CompileRecord, bool]:
        """`plan` is called with the compile's record as read under the session's lock,
        also for a repeated report (it may refuse it), and makes the route state and the
        learner from it: the record is read once."""
        ...

    def try_record_usage(
        self,
        compile_id: str,
        usage: Usage,
        plan: UsagePlan,
    ) -> tuple[CompileRecord, bool] | None:
        """record_usage, or None (nothing written; the plan's learner is pure, so a call of it is
        lost with nothing else) when it would wait for a lock or for a write stall: a
        caller on the event loop never waits behind an append's fsync or the engine."""
        ...

    def get_route_state(self, session_id: str, route_id: str) -> RouteState | None: ...

    def get_route_model(self, route_id: str) -> RouteModel | None: ...

    def get_last_compile(self, session_id: str) -> CompileRecord | None: ...

    def last_compile_outcome(self, session_id: str) -> tuple[int, int] | None:
        """(decision, create time in ns) of the latest compile, its table left unread."""
        ...

    def list_compiles(self, session_id: str) -> list[CompileRecord]:
        """Every compile record of a session, oldest first (by create time)."""
        ...

    def list_compile_heads(self, session_id: str) -> list[CompileRecord]:
        """list_compiles without each record's per-message table (message_digests and
        message_tokens empty): what listing compiles needs. Each table is as long as its
        view and stored in chunks shared from step to step; joining every one read
        O(compiles x messages) entries (a session of 8,000 compiles: ~5 s a listing)."""
        ...

    def put_source(self, entry: SourceEntry) -> None: ...

    def project_scopes(self, most: int) -> frozenset[str]:
        """The projects holding entries of any kind (at most `most` of them)."""
        ...

    def list_sources(
        self, kind: SourceKind, scope: Scope | None = None, scope_id: str = ""
    ) -> list[SourceEntry]: ...

    def delete_source(self, kind: SourceKind, scope: Scope, scope_id: str, ident: str) -> None: ...

    def approximate_size(self) -> int: ...

    def close(self) -> None: ...


class Clock(Protocol):
    def now_ns(self) -> int: ...


class IdSource(Protocol):
    def new_id(self, prefix: str) -> str: ...


class Telemetry(Protocol):
    """What the service reports; the Prometheus adapter implements it."""

    def compiled(
        self,
        seconds: float,
        view: CompiledView,
        model_family: str,
        session_id: str,
        created_ns: int = 0,
    ) -> None:
        """A recorded compile at the head of `session_id`, made at `created_ns` (never a
        label: the adapter keeps which sessions are over budget now)."""
        ...

    def session_deleted(self, session_id: str, created_ns: int = 0) -> None:
        """DeleteSession of the session made at `created_ns` (0: unknown): what is kept
        about it goes, and a compile of it that finishes later does not bring it back."""
        ...

    def over_budget_restored(self, ages: Sequence[tuple[str, float]]) -> None:
        """At start: (session id, seconds since) of each session whose latest recorded
        compile was over budget; the adapter keeps the recent ones."""
        ...

    def appended(self, events: int, size_bytes: int) -> None: ...

    def usage_reported(
        self, estimated: int, actual: int, model_family: str, method: str, model: str
    ) -> None:
        """`model` is the route model's catalog key ("other" when the catalog lacks it):
        bounded, and the entry an operator corrects when its estimates drift."""
        ...

    def watchers_changed(self, delta: int) -> None: ...

    def compaction(self, kind: str, performed: bool) -> None: ...

    def memo_used(self, outcome: str) -> None:
        """A compile's memo lookup: hit, miss (none kept) or stale (kept, not valid); repeat
        when the last view was sent again, nothing written since (repeats.py)."""

    def memo_changed(self, evicted: int, size_bytes: int) -> None: ...

    def compile_abandoned(self) -> None:
        """A compile stopped mid-work because its caller went away."""

    def session_expired(self) -> None:
        """The retention sweep deleted an idle session."""


class Workspace(Protocol):
    """Reads instruction files, skills, rules and memory files under configured roots."""

    def read(self, project_root: str, working_directory: str) -> WorkspaceSources: ...

    def reads_files(self, project_root: str) -> bool:
        """Whether `read` looks at the disk for this project root: when not, what it
        returns follows from its arguments alone."""
        ...


class Tokenizers(Protocol):
    """Token counters per tokenizer family (the tiktoken adapter)."""

    def ready(self, info: ModelInfo) -> bool:
        """Whether counting for `info` is ready (no table to build first)."""
        ...

    def for_model(self, info: ModelInfo, counting: int = ...) -> TokenCounter: ...
