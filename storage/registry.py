"""What clients register per scope or session: memory, rules and skills; tools and activations."""

from __future__ import annotations

import dataclasses

from server.domain.errors import CtxccError, Reason, invalid
from server.domain.sources import (
    MemoryEntry,
    RuleEntry,
    Scope,
    SkillEntry,
    SourceEntry,
    SourceKind,
    entry_id,
    kind_of_entry,
)
from server.domain.tools import ToolActivations, ToolSpec
from storage.codec import decode_value, encode_value
from storage.keys import (
    ACTIVATIONS,
    SEP,
    be64,
    key_after,
    session_key,
    session_prefix,
    source_prefix,
)
from storage.kv import Batch
from storage.store_core import StoreCore

_SOURCE_TYPES: dict[SourceKind, type[SourceEntry]] = {
    SourceKind.MEMORY: MemoryEntry,
    SourceKind.RULE: RuleEntry,
    SourceKind.SKILL: SkillEntry,
}

# Source lists kept decoded (three scopes and three kinds per session compiled).
_SOURCE_LISTS = 4_096


class RegistryRecords(StoreCore):
    # -- sources: memory, rules, skills registered over the API ------------------------

    def put_source(self, entry: SourceEntry) -> None:
        kind = kind_of_entry(entry)
        key = source_prefix(kind, entry.scope, entry.scope_id) + entry_id(entry).encode()
        batch = Batch()
        batch.put("sources", key, encode_value(entry))
        if entry.scope != Scope.SESSION:
            self._write(batch)
            return
        # A session's entry is written under the session's lock, which its delete holds
        # too, once the session is found there: written after the delete, it would outlive
        # the session and show in one made again under the id.
        with self._lock(entry.scope_id):
            self.get_session(entry.scope_id)
            self._write(batch)

    def project_scopes(self, most: int) -> frozenset[str]:
        """The projects holding entries of any kind, at most `most` of them: found by
        seeking past each project's entries, not reading them."""
        found: set[str] = set()
        for kind in SourceKind:
            base = source_prefix(kind) + str(int(Scope.PROJECT)).encode() + SEP
            start, end = base, key_after(base)
            while len(found) < most:
                first = next(iter(self._kv.scan("sources", start, end)), None)
                if first is None:
                    break
                project = first[0][len(base) :].split(SEP, 1)[0]
                found.add(project.decode())
                start = key_after(base + project + SEP)
        return frozenset(found)

    def list_sources(
        self, kind: SourceKind, scope: Scope | None = None, scope_id: str = ""
    ) -> list[SourceEntry]:
        prefix = source_prefix(kind, scope, scope_id)
        with self._sources_lock:
            hit = self._sources.get(prefix)
            if hit is not None:
                self._sources.move_to_end(prefix)
                return list(hit)
            gen = self._sources_gen
        cls = _SOURCE_TYPES[kind]
        # A loop, not a comprehension: a damaged record's error must not keep the read
        # open in the comprehension's frame (an engine operation in progress, which a
        # reopen after a full disk waits for) for as long as the error lives.
        decoded: list[SourceEntry] = []
        for _, raw in self._kv.scan("sources", prefix, key_after(prefix)):
            decoded.append(decode_value(raw, cls))
        found = tuple(decoded)
        with self._sources_lock:
            if gen == self._sources_gen:
                self._sources[prefix] = found
                if len(self._sources) > _SOURCE_LISTS:
                    self._sources.popitem(last=False)
        return list(found)

    def delete_source(self, kind: SourceKind, scope: Scope, scope_id: str, ident: str) -> None:
        key = source_prefix(kind, scope, scope_id) + ident.encode()
        if self._kv.get("sources", key) is None:
            raise CtxccError(
                Reason.SOURCE_NOT_FOUND, f"{kind.value} {ident!r} does not exist in that scope"
            )
        batch = Batch()
        batch.delete("sources", key)
        self._write(batch)

    # -- tool registry ------------------------------------------------------------

    def put_tools(
        self, session_id: str, specs: tuple[ToolSpec, ...], replace_all: bool, most: int
    ) -> tuple[int, tuple[ToolSpec, ...]]:
        with self._lock(session_id):
            session = self.get_session(session_id)
            batch = Batch()
            # Each stored definition's encoding by name (from its key): what a
            # registration replaces or deletes is given back from the session's bytes,
            # and a definition registered again as stored is not new.
            prefix = session_prefix(session_id)
            stored = {
                key[len(prefix) :].decode(): raw
                for key, raw in self._kv.scan("tools", prefix, session_key(session_id, ACTIVATIONS))
            }
            current = set(stored)
            freed = 0
            if replace_all:
                for name in current - {s.name for s in specs}:
                    batch.delete("tools", session_key(session_id, name.encode()))
                    freed += len(stored[name])
                current = set()
            count = len(current | {s.name for s in specs})
            if count > most:  # refused before anything is written
                raise invalid("tools", f"at most {most} tools per session (max_tools)")
            added, changed = 0, []
            for spec in specs:
                encoded = encode_value(spec)
                batch.put("tools", session_key(session_id, spec.name.encode()), encoded)
                added += len(encoded)
                old = stored.get(spec.name)
                freed += len(old) if old is not None else 0
                if old != encoded:
                    changed.append(spec)
            if added > freed:
                self._check_quota(session, added - freed)
            # Tools registered before they were counted were never added: not below 0.
            held = max(0, session.stored_bytes + added - freed)
            if held != session.stored_bytes:
                updated = dataclasses.replace(session, stored_bytes=held)
                batch.put("sessions", session_id.encode(), encode_value(updated))
            self._write(batch, session_id)
            return count, tuple(changed)

    def list_tools(self, session_id: str) -> list[ToolSpec]:
        lo, hi = session_prefix(session_id), session_key(session_id, ACTIVATIONS)
        tools: list[ToolSpec] = []
        for _, raw in self._kv.scan("tools", lo, hi):  # a loop: see list_sources
            tools.append(decode_value(raw, ToolSpec))
        return tools

    def add_activations(
        self,
        session_id: str,
        turn_seq: int,
        names: tuple[str, ...],
        session_created_ns: int = 0,
    ) -> None:
        """`session_created_ns`: the create time of the session whose registry and turn
        the search read, when it is checked."""
        key = session_key(session_id, ACTIVATIONS + be64(turn_seq))
        with self._lock(session_id):
            # Not deleted since the search read it (see put_source), nor made again under
            # its id: the new session's turn at the same seq would get tools no search of
            # its own activated.
            self.session_of_life(session_id, session_created_ns)
            old = self.get_activations(session_id, turn_seq)
            merged = ToolActivations(turn_seq, tuple(sorted(set(old) | set(names))))
            batch = Batch()
            batch.put("tools", key, encode_value(merged))
            self._write(batch, session_id)

    def get_activations(self, session_id: str, turn_seq: int) -> tuple[str, ...]:
        raw = self._kv.get("tools", session_key(session_id, ACTIVATIONS + be64(turn_seq)))
        return () if raw is None else decode_value(raw, ToolActivations).names
