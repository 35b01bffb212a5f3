"""Memory, rules and skills registered over the API, and what a session sees of them."""

from __future__ import annotations

import dataclasses
import threading
from typing import TypeVar

from server.compiler.sources import SourceCaps, SourceInputs
from server.compiler.textscan import globs_problem
from server.compiler.view import SectionKind
from server.domain.errors import CtxccError, Reason, invalid
from server.domain.model import Session
from server.domain.sources import (
    MemoryEntry,
    RuleActivation,
    RuleEntry,
    Scope,
    SkillEntry,
    SourceEntry,
    SourceKind,
    entry_id,
)
from server.domain.validation import check_id
from server.service.blocking import Blocking
from server.service.lanes import PendingWork, entry_text_bytes
from server.service.ports import Clock, EventStore, Workspace

MAX_SOURCE_TEXT = 64 << 10
MAX_ENTRIES_PER_SCOPE = 256
# Projects holding entries: each holds up to MAX_ENTRIES_PER_SCOPE of each kind, outside
# any session's quota; project ids come from clients.
MAX_PROJECT_SCOPES = 1_024
T = TypeVar("T")


def _only(cls: type[T], entries: list[SourceEntry]) -> tuple[T, ...]:
    return tuple(e for e in entries if isinstance(e, cls))


class SourceUseCases:
    def __init__(
        self,
        store: EventStore,
        blocking: Blocking,
        clock: Clock,
        workspace: Workspace,
        pending: PendingWork | None = None,
    ) -> None:
        self._store = store
        self._blocking = blocking
        self._clock = clock
        self._workspace = workspace
        # Shared with the compiles: a session's own entries are text its next compile
        # counts, as its appended events are (lanes.py).
        self._pending = pending or PendingWork()
        self._projects_lock = threading.Lock()

    async def _check_scope(self, scope: Scope | None, scope_id: str, *, required: bool) -> None:
        if scope is None:
            if required:
                raise invalid("scope", "scope must be GLOBAL, PROJECT or SESSION")
            return
        if scope == Scope.GLOBAL:
            if scope_id:
                raise invalid("scope_id", "GLOBAL entries take no scope_id")
            return
        check_id("scope_id", scope_id)
        if scope == Scope.SESSION:
            await self._blocking.run(self._store.get_session, scope_id)

    async def put(self, entry: SourceEntry) -> SourceEntry:
        kind = {MemoryEntry: "memory", RuleEntry: "rule", SkillEntry: "skill"}[type(entry)]
        check_id(f"{kind}.{kind}_id", entry_id(entry))
        await self._check_scope(entry.scope, entry.scope_id, required=True)
        texts = dataclasses.asdict(entry)
        for field in ("text", "name", "description", "load_hint"):
            value = texts.get(field)
            if isinstance(value, str) and len(value) > MAX_SOURCE_TEXT:
                raise CtxccError(
                    Reason.FIELD_TOO_LARGE,
                    f"{kind}.{field} is over {MAX_SOURCE_TEXT} characters",
                    field=f"{kind}.{field}",
                )
        if isinstance(entry, MemoryEntry) and not entry.text.strip():
            raise invalid("memory.text", "a memory entry needs text")
        if isinstance(entry, RuleEntry | SkillEntry) and not entry.name.strip():
            raise invalid(f"{kind}.name", f"a {kind} needs a name")
        if isinstance(entry, RuleEntry):
            if not entry.text.strip():
                raise invalid("rule.text", "a rule needs text")
            if entry.activation == RuleActivation.MATCHED and not entry.path_globs:
                raise invalid("rule.path_globs", "a MATCHED rule needs at least one glob")
            problem = globs_problem(entry.path_globs)
            if problem is not None:
                raise invalid("rule.path_globs", problem)
        stored = dataclasses.replace(entry, update_time_ns=self._clock.now_ns(), origin="")
        await self._blocking.run(self._checked_put, stored)
        if stored.scope == Scope.SESSION:
            self._pending.landed(stored.scope_id, entry_text_bytes(stored))
        return stored

    def _checked_put(self, entry: SourceEntry) -> None:
        """Blocking: the entry written if its scope has room. A project's first entry is
        checked and written under one lock: two new projects at once could otherwise
        both pass the cap on projects."""
        if entry.scope != Scope.PROJECT:
            self._check_room(entry)
            self._store.put_source(entry)
            return
        with self._projects_lock:
            self._check_room(entry)
            self._store.put_source(entry)

    def _check_room(self, entry: SourceEntry) -> None:
        """Blocking: a scope holds a bounded number of entries of each kind, and at most
        MAX_PROJECT_SCOPES projects hold any. Global and project entries belong to no
        session's byte quota, and every compile reads all it can see, so these caps are
        what bound them."""
        kind = {MemoryEntry: SourceKind.MEMORY, RuleEntry: SourceKind.RULE}.get(
            type(entry), SourceKind.SKILL
        )
        present = self._store.list_sources(kind, entry.scope, entry.scope_id)
        if entry.scope == Scope.PROJECT and not present:
            projects = self._store.project_scopes(MAX_PROJECT_SCOPES + 1)
            if entry.scope_id not in projects and len(projects) >= MAX_PROJECT_SCOPES:
                raise CtxccError(
                    Reason.QUOTA_EXCEEDED,
                    f"{MAX_PROJECT_SCOPES} projects already hold memory, rules or skills: "
                    "delete a project's entries first",
                    quota="max_project_scopes",
                    limit=str(MAX_PROJECT_SCOPES),
                )
        if len(present) >= MAX_ENTRIES_PER_SCOPE and entry_id(entry) not in {
            entry_id(e) for e in present
        }:
            raise CtxccError(
                Reason.QUOTA_EXCEEDED,
                f"this scope already holds {MAX_ENTRIES_PER_SCOPE} entries of this kind",
                quota="max_entries_per_scope",
                limit=str(MAX_ENTRIES_PER_SCOPE),
            )

    async def list_entries(
        self, kind: SourceKind, scope: Scope | None, scope_id: str
    ) -> list[SourceEntry]:
        await self._check_scope(scope, scope_id, required=False)
        return await self._blocking.run(self._store.list_sources, kind, scope, scope_id)

    async def delete(
        self, kind: SourceKind, scope: Scope | None, scope_id: str, ident: str
    ) -> None:
        check_id("id", ident)
        await self._check_scope(scope, scope_id, required=True)
        assert scope is not None
        await self._blocking.run(self._store.delete_source, kind, scope, scope_id, ident)

    def visible(self, kind: SourceKind, project_id: str, session_id: str) -> list[SourceEntry]:
        """Blocking: the API entries a session sees, global then project then session."""
        out = self._store.list_sources(kind, Scope.GLOBAL, "")
        if project_id:
            out += self._store.list_sources(kind, Scope.PROJECT, project_id)
        return out + self._store.list_sources(kind, Scope.SESSION, session_id)

    def reads_files(self, session: Session) -> bool:
        """Whether this session's sources include a read of workspace files (else they
        are the store's entries alone)."""
        return self._workspace.reads_files(session.project_root)

    def session_sources(
        self,
        session: Session,
        working_directory: str,
        caps: SourceCaps,
        exclude: frozenset[SectionKind],
    ) -> SourceInputs:
        """Blocking: API entries and workspace files a compile of this session sees."""
        wanted = {
            SectionKind.INSTRUCTIONS,
            SectionKind.SKILLS,
            SectionKind.RULES,
            SectionKind.RULE_INDEX,
            SectionKind.MEMORY,
        } - exclude
        if not wanted:
            return SourceInputs(caps=caps)
        files = self._workspace.read(session.project_root, working_directory)
        sid, pid = session.session_id, session.project_id
        return SourceInputs(
            instruction_files=files.instruction_files,
            skills=(*files.skills, *_only(SkillEntry, self.visible(SourceKind.SKILL, pid, sid))),
            rules=(*files.rules, *_only(RuleEntry, self.visible(SourceKind.RULE, pid, sid))),
            memory=(*files.memory, *_only(MemoryEntry, self.visible(SourceKind.MEMORY, pid, sid))),
            caps=caps,
            notes=files.notes,
        )

    async def load_rule(self, session_id: str, name: str) -> RuleEntry:
        check_id("session_id", session_id)
        if not name:
            raise invalid("name", "name is required")
        # A workspace read is up to 16 MiB of files read, decoded and parsed: work
        # for the compute pool, as a compile's read is. On the storage threads, a few
        # agents loading rules in a loop took the threads that other sessions' appends
        # make their fsync on (8 such loops put another session's step at a p50 of
        # 0.24 s). One hop for the session, its entries and its files.
        return await self._blocking.compute(self._load_rule, session_id, name)

    def _load_rule(self, session_id: str, name: str) -> RuleEntry:
        """Blocking: the rule `name` of the session, the most specific scope first."""
        session = self._store.get_session(session_id)
        api = self.visible(SourceKind.RULE, session.project_id, session_id)
        files = self._workspace.read(session.project_root, session.working_directory)
        # The most specific scope wins when names repeat.
        for rule in sorted([*api, *files.rules], key=lambda r: -int(r.scope)):
            if isinstance(rule, RuleEntry) and name in (rule.name, rule.rule_id):
                return rule
        raise CtxccError(Reason.SOURCE_NOT_FOUND, f"no rule named {name!r} for this session")
