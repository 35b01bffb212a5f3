"""What a compile checks before it reads anything, and what it records after: the
request's own checks (`checked`), the CompileRecord of a compile at the head
(`record_of`) and its write, which a full disk may refuse without failing the compile
(`put_record`).

Kept apart from compiling.py, which orchestrates a compile (repeat, load, the pure core,
compaction, rendering, publication): these are the values and rules of the record
itself, which a stream step also uses (`checked`, before its usage report and append).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from server.compiler.compile import CompileInputs, section_digests
from server.compiler.view import CompiledView
from server.domain.catalog import ModelInfo
from server.domain.errors import CtxccError, Reason, invalid
from server.domain.records import CompileRecord
from server.domain.table_chunks import Splitter
from server.domain.validation import (
    check_environment_fields,
    check_id,
    check_path_form,
    check_route_fields,
    is_id,
)
from server.service.basis import PartDigests, SettingsPart, basis_of
from server.service.compile_types import CompileOptions, route_fields
from server.service.inputs import is_recorded
from server.service.ports import Clock, EventStore


def checked(opts: CompileOptions) -> CompileOptions:
    """The request's own checks, which read nothing; `opts` with the session a rebuild
    names. A stream step makes them before its usage report and its append, so a step
    whose compile is refused for what it asks does nothing at all."""
    if opts.rebuild_compile_id:
        # No <session>:<suffix> in it: no compile has it (the answer to an id of that shape
        # never recorded), not "of another session". A malformed session id before the
        # colon is named as the field sent (below).
        sid, sep, suffix = opts.rebuild_compile_id.partition(":")
        if not (sep and suffix):
            raise CtxccError(
                Reason.COMPILE_NOT_FOUND,
                f"compile {opts.rebuild_compile_id!r} does not exist",
                compile_id=opts.rebuild_compile_id,
            )
        if opts.session_id and opts.session_id != sid:
            raise invalid("rebuild_compile_id", "the compile belongs to another session")
        if not is_id(sid):  # named as the field the client sent
            raise invalid(
                "rebuild_compile_id",
                "rebuild_compile_id is <session id>:<suffix>, its session id 1-128 "
                "characters of [A-Za-z0-9._-]",
            )
        opts = replace(opts, session_id=sid)
    check_id("session_id", opts.session_id)
    if not opts.route.model and not opts.rebuild_compile_id:
        raise invalid("route.model", "route.model is required")
    check_path_form("environment.working_directory", opts.working_directory)
    check_environment_fields({"platform": opts.platform, "shell": opts.shell})
    check_route_fields(route_fields(opts.route))
    return opts


def record_of(
    opts: CompileOptions,
    view: CompiledView,
    inputs: CompileInputs,
    info: ModelInfo,
    settings_part: Callable[[], SettingsPart],
    clock: Clock,
    splitter: Splitter,
    digests: PartDigests | None = None,
) -> tuple[CompileRecord | None, tuple[tuple[str, object], ...]]:
    """The record of a compile at the head, with the basis parts it names; none for a
    dry run or time travel, so neither becomes the latest compile or route baseline."""
    if not is_recorded(opts):
        return None, ()
    basis = view.basis
    # What the compile read, for exact time travel.
    basis_digest, parts = basis_of(inputs, info, settings_part(), splitter, digests)
    record = CompileRecord(
        compile_id=view.compile_id,
        session_id=opts.session_id,
        route=opts.route,
        event_boundary=view.event_boundary,
        estimated_input_tokens=view.budget.estimated_input_tokens,
        estimate_method=int(view.budget.estimate_method),
        create_time_ns=clock.now_ns(),
        section_digests=section_digests(view.system_sections, view.tools),
        message_count=basis.message_count if basis else 0,
        messages_digest=basis.messages_digest if basis else "",
        fixed_tokens=basis.fixed_tokens if basis else 0,
        raw_delta=basis.raw_delta if basis else None,
        baseline_tokens=basis.baseline_tokens if basis else 0,
        ledger_tokens=view.budget.ledger_tokens,
        message_digests=basis.message_digests if basis else b"",
        message_tokens=basis.message_tokens if basis else (),
        removed_tokens=basis.removed_tokens if basis else 0,
        message_change=basis.message_change if basis else 0,
        layer_tokens=tuple((int(r.layer), r.tokens) for r in view.layers),
        context_window=view.budget.context_window,
        max_output_tokens=inputs.limits.max_output_tokens,
        input_budget=view.budget.input_budget,
        decision=int(view.decision),
        changed_sections=tuple(int(k) for k in view.changed_sections),
        checkpoint_id=view.checkpoint_id,
        fallback_reasons=tuple(int(r) for r in view.fallback_reasons),
        basis_digest=basis_digest,
        session_create_time_ns=inputs.session.create_time_ns,
    )
    return record, parts


def put_record(
    store: EventStore, record: CompileRecord, parts: tuple[tuple[str, object], ...]
) -> bool:
    """Blocking: writes the record; False when a full disk refused it."""
    try:
        store.put_compile(record, parts)
    except CtxccError as err:
        # A full disk must not keep agents from their views: without the record, a
        # usage report for this compile answers COMPILE_NOT_FOUND, as after a crash.
        if err.reason is not Reason.DISK_FULL:
            raise
        return False
    return True
