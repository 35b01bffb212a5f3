"""Repeated compiles: the view of a session in which nothing was written since its last
compile, answered without loading or compiling again.

A compile at the head is a function of what it reads (the store's records of the
session, its route's learned model, every source scope), of the request, of the clock
cut to the environment's granularity and of workspace files. The store bumps a write
generation for each write once it landed (the daemon is its only writer), so when the
generation taken before a compile's reads is, after its own record was written, exactly
one write further, the compile saw everything current. While that generation holds and
the request, the clock's time text and the workspace files are the same, the next
compile's view is this one's with another compile id: only the compile id and the
record's time change. A view is remembered only when its changed sections are the ones
a repeat has (its previous sections equal its own), so the repeat is byte for byte what
the full compile would make, and only when no checkpoint in it waits on another session
(an imported one whose origin could not verify it yet). A record is still written for
every compile (usage reports and the inspector read it), from the remembered record.

Bounded (LRU) by entries and by the approximate bytes of their views, which they keep
alive after the memos and lent records that share them are gone; in memory only, so a
restart starts empty."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, fields
from operator import attrgetter
from typing import TYPE_CHECKING, Generic, TypeVar

from server.compiler.compile import CompileInputs
from server.compiler.sources import SourceCaps, SourceInputs
from server.compiler.view import CompiledView, FallbackReason
from server.domain.errors import CtxccError, Reason
from server.domain.generation import Generation
from server.domain.model import Session, of_deleted
from server.domain.records import CompileRecord
from server.service.compile_types import CompileResult
from server.service.ports import Clock, EventStore, IdSource
from server.service.sources import SourceUseCases

if TYPE_CHECKING:
    from server.service.compile_types import CompileOptions

T = TypeVar("T")


class Busy:
    """The session's store lock was held (an append's fsync, say): repeat on a thread."""


BUSY = Busy()

_MAX_ENTRIES = 1024
# A view's size without walking it: ~4 bytes a token, plus its fixed fields.
_BYTES_PER_TOKEN, _ENTRY_BYTES = 4, 2048
# A checkpoint passed over for these may be verified by its origin session later (the
# origin created, or its log grown to the covered range): writes of another session,
# which this session's generation does not count, so such a view is never repeated.
_ORIGIN_PENDING = frozenset(
    {FallbackReason.CHECKPOINT_FOREIGN, FallbackReason.CHECKPOINT_BOUNDARY_MISSING}
)


@dataclass(frozen=True, slots=True)
class Repeatable:
    """A compile whose view the next one may repeat, and what it depended on."""

    opts: CompileOptions
    # The store's generation right after this compile's record was written.
    generation: Generation
    time_text: str
    session: Session
    sources: SourceInputs
    result: CompileResult
    record: CompileRecord

    @property
    def size(self) -> int:
        return _ENTRY_BYTES + _BYTES_PER_TOKEN * self.result.view.budget.ledger_tokens

    def again(self, compile_id: str, now_ns: int) -> tuple[CompileResult, CompileRecord]:
        """This compile's view and record under a new compile id and time (a repeatable
        result has no attachments or renderings)."""
        view = _VIEW.copy(self.result.view, compile_id=compile_id)
        record = _RECORD.copy(self.record, compile_id=compile_id, create_time_ns=now_ns)
        return CompileResult(view), record


class _Copier(Generic[T]):
    """Copies of a frozen dataclass with some fields changed, as `dataclasses.replace`
    makes them but for half its cost (it looks every field up by name on each call):
    a repeat copies a view and a record of some 25 fields each."""

    def __init__(self, cls: type[T]) -> None:
        self._cls = cls
        self._names = tuple(f.name for f in fields(cls))  # type: ignore[arg-type]
        self._get = attrgetter(*self._names)
        self._index = {name: i for i, name in enumerate(self._names)}

    def copy(self, obj: T, **changes: object) -> T:
        values = list(self._get(obj))
        for name, value in changes.items():
            values[self._index[name]] = value
        return self._cls(*values)


_VIEW = _Copier(CompiledView)
_RECORD = _Copier(CompileRecord)
_ENTRY = _Copier(Repeatable)


class Repeats:
    def __init__(
        self,
        store: EventStore,
        sources: SourceUseCases,
        caps: SourceCaps,
        time_text: Callable[[], str],
        ids: IdSource,
        clock: Clock,
        max_bytes: int,
        max_entries: int = _MAX_ENTRIES,
    ) -> None:
        self._store = store
        self._sources = sources
        self._caps = caps
        self._time_text = time_text
        self._ids = ids
        self._clock = clock
        self._entries: OrderedDict[tuple[str, str], Repeatable] = OrderedDict()
        self._max = max_entries
        self._max_bytes = max_bytes
        self._bytes = 0
        self._lock = threading.Lock()

    def candidate(self, opts: CompileOptions) -> Repeatable | None:
        """The remembered compile this request would repeat, if nothing was written since
        (the clock and workspace files are checked by `repeat`)."""
        key = (opts.session_id, opts.route.route_id)
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
        # Equal requests share one options value (transport/options_memo.py): compared by
        # identity first.
        if entry.opts is not opts and entry.opts != opts:
            return None
        if self._store.generation(*key) != entry.generation:
            return None
        return entry

    def reads_files(self, entry: Repeatable) -> bool:
        """Whether checking `entry` reads workspace files (then: not on the event loop)."""
        return self._sources.reads_files(entry.session)

    def repeat(self, entry: Repeatable, wait: bool = True) -> CompileResult | Busy | None:
        """Blocking when `reads_files` or `wait`: the view again under a new compile id,
        its record written, or None when the clock or the workspace files moved on; BUSY
        (nothing written) when not `wait` and the record would wait for the store's
        session lock."""
        opts = entry.opts
        if self._time_text() != entry.time_text:
            return None
        if self._store.generation(opts.session_id, opts.route.route_id) != entry.generation:
            return None  # written since `candidate` (this may run on a thread after it)
        if self._sources.reads_files(entry.session):
            wd = opts.working_directory or entry.session.working_directory
            now = self._sources.session_sources(
                entry.session, wd, self._caps, opts.exclude_sections
            )
            if now != entry.sources:
                return None
        compile_id = f"{opts.session_id}:{self._ids.new_id('')}"
        result, record = entry.again(compile_id, self._clock.now_ns())
        try:
            # The compile repeated made the last write of the session (its generation
            # holds), so the session's current route is this one's.
            if not self._store.put_compile(record, wait=wait, route_since=entry.generation):
                return BUSY
        except CtxccError as err:
            # As for any compile: without its record a usage report answers
            # COMPILE_NOT_FOUND, the view is still sent.
            if err.reason is not Reason.DISK_FULL:
                raise
            self._forget(opts)
            return result
        # The entry keeps its own view and record: a repeat's differ only in what `again`
        # sets anew.
        self._remember(entry, entry.generation)
        return result

    def remember(
        self,
        opts: CompileOptions,
        before: Generation,
        inputs: CompileInputs,
        result: CompileResult,
        record: CompileRecord,
    ) -> None:
        """After a compile at the head wrote `record`: remembers it when a repeat of it is
        exact (see the module's docstring), else forgets what the route had."""
        repeatable = (
            not result.attachments
            and not result.renderings
            and inputs.previous_sections == record.section_digests
            and record.compile_id == result.view.compile_id
            and _ORIGIN_PENDING.isdisjoint(result.view.fallback_reasons)
        )
        if not repeatable:
            self._forget(opts)
            return
        entry = Repeatable(
            opts=opts,
            generation=before,
            time_text=inputs.environment.time_text,
            session=inputs.session,
            sources=inputs.sources,
            result=result,
            record=record,
        )
        self._remember(entry, before)

    def _remember(self, entry: Repeatable, before: Generation) -> None:
        """Keeps `entry` when its record was the only write since `before`."""
        opts = entry.opts
        now = self._store.generation(opts.session_id, opts.route.route_id)
        if now != before.after_own_write():
            self._forget(opts)
            return
        entry = _ENTRY.copy(entry, generation=now)
        key = (opts.session_id, opts.route.route_id)
        with self._lock:
            old = self._entries.pop(key, None)
            self._bytes += entry.size - (old.size if old is not None else 0)
            self._entries[key] = entry
            while self._entries and (
                len(self._entries) > self._max or self._bytes > self._max_bytes
            ):
                _, dropped = self._entries.popitem(last=False)
                self._bytes -= dropped.size

    def _forget(self, opts: CompileOptions) -> None:
        with self._lock:
            old = self._entries.pop((opts.session_id, opts.route.route_id), None)
            if old is not None:
                self._bytes -= old.size

    def forget_session(self, session_id: str, created: int = 0) -> None:
        """The session made at `created` (0: whichever) was deleted: its views (of every
        route) go now. A deleted session's generation is gone too, so they could never be
        repeated, and each holds a whole view until the LRU reaches it (see
        `MemoCache.forget`). Those of a session made again under its id since stay."""
        with self._lock:
            for key, entry in list(self._entries.items()):
                if key[0] != session_id:
                    continue
                if not of_deleted(entry.session.create_time_ns, created):
                    continue
                self._bytes -= self._entries.pop(key).size

    def __len__(self) -> int:
        """Views kept (for tests: a deleted session's are not)."""
        return len(self._entries)

    @property
    def size_bytes(self) -> int:
        return self._bytes
