"""CompiledView (domain) -> ctxcc.v1.CompiledView, and compile requests in."""

from __future__ import annotations

import enum
import functools
import weakref
from collections.abc import Callable, Iterable
from typing import TypeVar

from ctxcc.v1 import common_pb2, compile_service_pb2, event_pb2, tool_pb2, view_pb2
from server.adapters.protowire import tagged, varint
from server.compiler.budget import ModelLimits
from server.compiler.render import RenderFormat
from server.compiler.system import ApprovalMode
from server.compiler.view import (
    Budget,
    CompactionRequest,
    CompiledView,
    Decision,
    FallbackReason,
    Layer,
    LayerTokens,
    SectionKind,
    SystemSection,
    ViewMessage,
    ViewTool,
)
from server.domain.catalog import MAX_LIMIT_TOKENS
from server.domain.errors import invalid
from server.domain.model import NativeState, Route
from server.service.compile_types import CompileOptions, CompileResult
from server.transport.convert_events import artifact_out, call_out, route_in, route_out

E = TypeVar("E", bound=enum.IntEnum)


def enums_in(field: str, values: Iterable[int], cls: type[E]) -> list[E]:
    """Proto enum values to domain enums; unknown numbers are refused, not dropped."""
    known = {int(v) for v in cls}
    out = []
    for value in values:
        if value not in known:
            raise invalid(field, f"unknown {field} value {value}")
        out.append(cls(value))
    return out


def compile_options_in(req: compile_service_pb2.CompileRequest) -> CompileOptions:
    if not req.HasField("route") and not req.rebuild_compile_id:
        raise invalid("route", "route is required (at least route.model)")
    approval = None
    if req.approval_mode:
        if req.approval_mode not in {int(m) for m in ApprovalMode}:
            raise invalid("approval_mode", f"unknown approval_mode {req.approval_mode}")
        approval = ApprovalMode(req.approval_mode)
    excluded = enums_in("exclude_sections", req.exclude_sections, SectionKind)
    formats = enums_in("render_formats", req.render_formats, RenderFormat)
    lim = req.limits
    for field in ("context_window", "max_output_tokens", "max_input_tokens"):
        if getattr(lim, field) > MAX_LIMIT_TOKENS:
            # No model reads or writes that many, and a rendered body would carry it:
            # Gemini's maxOutputTokens is an int32, so 2^32-1 was refused by the provider
            # in every request.
            raise invalid(
                f"limits.{field}",
                f"limits.{field} is over {MAX_LIMIT_TOKENS}, more than any model reads or "
                "writes (0 takes the model catalog's)",
            )
    limits = ModelLimits(
        context_window=lim.context_window,
        max_output_tokens=lim.max_output_tokens,
        max_input_tokens=lim.max_input_tokens,
        accepts_images=lim.accepts_images if lim.HasField("accepts_images") else True,
    )
    # Unset fields mean "as the model catalog says"; set ones override it.
    return CompileOptions(
        session_id=req.session_id,
        route=route_in(req.route),
        limits=limits,
        as_of_seq=req.as_of_seq,
        approval_mode=approval,
        working_directory=req.environment.working_directory,
        platform=req.environment.platform,
        shell=req.environment.shell,
        exclude_sections=frozenset(excluded),
        inline_images=req.image_mode != compile_service_pb2.IMAGE_MODE_REFERENCE,
        images_given=lim.HasField("accepts_images"),
        dry_run=req.dry_run,
        render_formats=tuple(dict.fromkeys(formats)),
        rebuild_compile_id=req.rebuild_compile_id,
    )


def _message_out(m: ViewMessage) -> view_pb2.ViewMessage:
    out = view_pb2.ViewMessage(
        role=event_pb2.MessageRole.ValueType(int(m.role)),
        tool_call_id=m.tool_call_id,
        tool_name=m.tool_name,
        layer=view_pb2.Layer.ValueType(int(m.layer)),
        first_seq=m.first_seq,
        last_seq=m.last_seq,
        origin_session_id=m.origin_session_id,
        tokens=m.tokens,
        synthetic=m.synthetic,
        is_error=m.is_error,
    )
    for part in m.parts:
        authority = common_pb2.Authority.ValueType(int(part.authority))
        if part.text is not None:
            out.parts.append(view_pb2.ViewPart(text=part.text, authority=authority))
        elif part.attachment is not None:
            att = view_pb2.ViewAttachment(ref=artifact_out(part.attachment))
            out.parts.append(view_pb2.ViewPart(attachment=att, authority=authority))
    out.tool_calls.extend(call_out(c) for c in m.tool_calls)
    return out


# id(message) -> (weak reference to it, its tagged record); an entry leaves with its
# message, so the cache holds what memos and views in flight hold and nothing more.
_RECORDS: dict[int, tuple[weakref.ref[ViewMessage], bytes]] = {}


def _forget(key: int) -> Callable[[object], None]:
    def drop(_: object) -> None:
        _RECORDS.pop(key, None)

    return drop


def message_record(m: ViewMessage) -> bytes:
    """The message as one tagged record of CompiledView.messages (field 10), encoded
    deterministically once per message object: the messages a memo carries over are not
    converted again."""
    key = id(m)
    entry = _RECORDS.get(key)
    if entry is not None and entry[0]() is m:
        return entry[1]
    record = tagged(10, _message_out(m).SerializeToString(deterministic=True))
    _RECORDS[key] = (weakref.ref(m, _forget(key)), record)
    return record


def message_record_inline(m: ViewMessage, data: dict[str, bytes]) -> bytes:
    """message_record with the bytes of inline attachments filled in. Not cached: the
    bytes belong to this compile's result, and messages with images are few."""
    if not any(p.attachment is not None and p.attachment.artifact_id in data for p in m.parts):
        return message_record(m)
    out = _message_out(m)
    for part in out.parts:
        if part.HasField("attachment") and part.attachment.ref.artifact_id in data:
            part.attachment.data = data[part.attachment.ref.artifact_id]
    return tagged(10, out.SerializeToString(deterministic=True))


def _tool_out(t: ViewTool) -> view_pb2.ViewTool:
    spec = t.spec
    return view_pb2.ViewTool(
        definition=tool_pb2.ToolDefinition(
            name=spec.name,
            description=spec.description,
            input_schema_json=spec.input_schema_json,
            visibility=tool_pb2.ToolVisibility.ValueType(int(spec.visibility)),
            search_keywords=list(spec.search_keywords),
        ),
        origin=view_pb2.ToolOrigin.ValueType(int(t.origin)),
        tokens=t.tokens,
    )


def _section_out(s: SystemSection) -> view_pb2.SystemSection:
    return view_pb2.SystemSection(
        kind=view_pb2.SectionKind.ValueType(int(s.kind)),
        sources=list(s.sources),
        scope=common_pb2.Scope.ValueType(int(s.scope)),
        authority=common_pb2.Authority.ValueType(int(s.authority)),
        text=s.text,
        tokens=s.tokens,
        truncated=s.truncated,
        stable=s.stable,
    )


# Sections and tools repeat from step to step as equal values: their encodings are cached
# by value (bounded), so a step encodes only what changed.
@functools.lru_cache(maxsize=512)
def section_record(s: SystemSection) -> bytes:
    """The section as one tagged record of CompiledView.system_sections (field 6)."""
    return tagged(6, _section_out(s).SerializeToString(deterministic=True))


@functools.lru_cache(maxsize=1024)
def tool_record(t: ViewTool) -> bytes:
    """The tool as one tagged record of CompiledView.tools (field 11)."""
    return tagged(11, _tool_out(t).SerializeToString(deterministic=True))


def result_out(result: CompileResult) -> view_pb2.CompiledView:
    out = view_out(result.view, result.attachments)
    out.renderings.extend(renderings_out(result.renderings))
    return out


def renderings_out(
    renderings: Iterable[tuple[RenderFormat, str, int]],
) -> list[view_pb2.ProviderRendering]:
    return [
        view_pb2.ProviderRendering(
            format=view_pb2.RenderFormat.ValueType(int(fmt)),
            body_json=body,
            estimated_input_tokens=tokens,
        )
        for fmt, body, tokens in renderings
    ]


# Characters of a provider body encoded to UTF-8 per call. `str.encode` holds the GIL for
# the whole call (64 MiB: ~105 ms here), and so did building a ProviderRendering and
# serializing the view's renderings (an 18 MB body: ~50-180 ms in three calls); a
# `bytes.join` of 1 MiB or more copies with the GIL released.
BODY_PIECE_CHARS = 1 << 18


def body_pieces(body: str) -> list[bytes]:
    """`body` in UTF-8, as pieces of at most BODY_PIECE_CHARS characters each (a str is
    cut between code points, so the pieces join to `body.encode()`)."""
    n = BODY_PIECE_CHARS
    if len(body) <= n:
        return [body.encode()] if body else []
    return [body[i : i + n].encode() for i in range(0, len(body), n)]


def renderings_bytes(renderings: Iterable[tuple[RenderFormat, str, int]]) -> bytes:
    """The records of CompiledView's field 20 (`renderings`), as the deterministic
    encoding of `renderings_out` writes them (format, body_json, estimated_input_tokens,
    each left out when zero or empty), made of the body's pieces and joined once: no call
    holds the GIL for the whole body. A value the shortcut does not cover (a format or a
    token count outside the one-byte and uint32 ranges) goes through protobuf."""
    out: list[bytes] = []
    for fmt, body, tokens in renderings:
        code = int(fmt)
        if not (0 <= code < 0x80 and 0 <= tokens <= 0xFFFFFFFF):
            whole = view_pb2.CompiledView(renderings=renderings_out([(fmt, body, tokens)]))
            out.append(whole.SerializeToString(deterministic=True))
            continue
        pieces = body_pieces(body)
        size = sum(map(len, pieces))
        head = (b"\x08" + varint(code) if code else b"") + (b"\x12" + varint(size) if size else b"")
        tail = b"\x18" + varint(tokens) if tokens else b""
        out += [_RENDERING_KEY, varint(len(head) + size + len(tail)), head, *pieces, tail]
    return b"".join(out)


_RENDERING_KEY = varint((20 << 3) | 2)


# CompiledView's fields in number order: 1-5 (head_front), 6 system_sections,
# 7 system_prompt, 8-9 (head_middle), 10 messages, 11 tools, 12-21 (head_back). A
# deterministic encoding writes them in that order, so the three head parts and the
# records of fields 6, 7, 10 and 11 concatenate to the encoding of the whole view.
def head_front(v: CompiledView) -> view_pb2.CompiledView:
    return view_pb2.CompiledView(
        compile_id=v.compile_id,
        session_id=v.session_id,
        event_boundary=v.event_boundary,
        route=route_out(v.route),
        route_id=v.route.route_id,
    )


def front_bytes(v: CompiledView) -> bytes:
    """head_front's deterministic encoding: the ids and the boundary (new at every step)
    encoded, the route's fields (4, 5) encoded once per route."""
    ids = view_pb2.CompiledView(
        compile_id=v.compile_id, session_id=v.session_id, event_boundary=v.event_boundary
    )
    return ids.SerializeToString(deterministic=True) + _route_fields(v.route)


@functools.lru_cache(maxsize=256)
def _route_fields(route: Route) -> bytes:
    out = view_pb2.CompiledView(route=route_out(route), route_id=route.route_id)
    return out.SerializeToString(deterministic=True)


def head_middle(v: CompiledView) -> view_pb2.CompiledView:
    return view_pb2.CompiledView(
        prefix_digest=v.prefix_digest,
        changed_sections=[view_pb2.SectionKind.ValueType(int(k)) for k in v.changed_sections],
    )


def head_back(v: CompiledView) -> view_pb2.CompiledView:
    out = head_back_fields(v)
    if v.compaction is not None:
        out.compaction.CopyFrom(compaction_out(v.compaction))
    out.notes.extend(v.notes)
    return out


def compaction_out(c: CompactionRequest) -> view_pb2.CompactionRequest:
    return view_pb2.CompactionRequest(
        from_seq=c.from_seq,
        through_seq=c.through_seq,
        prompt=c.prompt,
        covered_digest=c.covered_digest,
    )


def head_back_fields(v: CompiledView) -> view_pb2.CompiledView:
    """Fields 12-18 of the view (what precedes its compaction request, 19)."""
    out = view_pb2.CompiledView(
        pressure_layer=view_pb2.Layer.ValueType(int(v.pressure_layer)),
        budget=_budget_out(v.budget),
        decision=view_pb2.Decision.ValueType(int(v.decision)),
        fallback_reasons=[view_pb2.FallbackReason.ValueType(int(r)) for r in v.fallback_reasons],
        checkpoint_id=v.checkpoint_id,
    )
    out.layers.extend(map(_layer_out, v.layers))
    if v.provider_state is not None:
        out.provider_state.CopyFrom(_state_out(v.provider_state))
    return out


def back_fields_bytes(v: CompiledView) -> bytes:
    """head_back_fields' deterministic encoding, joined from the records of its fields in
    number order. What stays from step to step (most layers, the pressure layer, the
    decision, its fallback reasons, the checkpoint) is encoded once per value; the budget,
    whose estimate moves at every step, and a provider state are encoded every time."""
    state = b""
    if v.provider_state is not None:
        encoded = _state_out(v.provider_state).SerializeToString(deterministic=True)
        state = tagged(12, encoded)
    return b"".join(
        (
            state,
            *map(_layer_record, v.layers),
            _pressure_record(v.pressure_layer),
            tagged(15, _budget_out(v.budget).SerializeToString(deterministic=True)),
            _decision_records(v.decision, v.fallback_reasons, v.checkpoint_id),
        )
    )


def _budget_out(b: Budget) -> view_pb2.Budget:
    return view_pb2.Budget(
        context_window=b.context_window,
        output_reserve=b.output_reserve,
        input_budget=b.input_budget,
        history_high_watermark=b.history_high_watermark,
        estimated_input_tokens=b.estimated_input_tokens,
        estimate_method=view_pb2.EstimateMethod.ValueType(int(b.estimate_method)),
        utilization=b.utilization,
        baseline_tokens=b.baseline_tokens,
        window_unknown=b.window_unknown,
        ledger_tokens=b.ledger_tokens,
        provider_overhead_tokens=b.provider_overhead_tokens,
        route_model=None
        if b.route is None
        else view_pb2.RouteModel(
            ratio=b.route.ratio,
            overhead_tokens=b.route.overhead_tokens,
            delta_samples=b.route.delta_samples,
            full_samples=b.route.full_samples,
            counter_kind=b.route.counter_kind,
            framing_tokens=b.route.framing_tokens,
        ),
        output_cap=b.output_cap,
        output_cap_source=view_pb2.OutputCapSource.ValueType(int(b.output_cap_source or 0)),
    )


def _layer_out(row: LayerTokens) -> view_pb2.LayerTokens:
    layer = view_pb2.Layer.ValueType(int(row.layer))
    return view_pb2.LayerTokens(layer=layer, tokens=row.tokens, items=row.items)


def _state_out(ps: NativeState) -> common_pb2.ProviderNativeState:
    return common_pb2.ProviderNativeState(route_id=ps.route_id, kind=ps.kind, data=ps.data)


@functools.lru_cache(maxsize=1024)
def _layer_record(row: LayerTokens) -> bytes:
    """One record of CompiledView.layers (field 13)."""
    return tagged(13, _layer_out(row).SerializeToString(deterministic=True))


@functools.lru_cache(maxsize=16)
def _pressure_record(layer: Layer) -> bytes:
    """CompiledView.pressure_layer (field 14) encoded: nothing for 0, as proto3 leaves it."""
    out = view_pb2.CompiledView(pressure_layer=view_pb2.Layer.ValueType(int(layer)))
    return out.SerializeToString(deterministic=True)


@functools.lru_cache(maxsize=256)
def _decision_records(
    decision: Decision, reasons: tuple[FallbackReason, ...], checkpoint_id: str
) -> bytes:
    """Fields 16-18 (decision, fallback_reasons, checkpoint_id) encoded."""
    out = view_pb2.CompiledView(
        decision=view_pb2.Decision.ValueType(int(decision)),
        fallback_reasons=[view_pb2.FallbackReason.ValueType(int(r)) for r in reasons],
        checkpoint_id=checkpoint_id,
    )
    return out.SerializeToString(deterministic=True)


def view_out(
    v: CompiledView, attachments: tuple[tuple[str, bytes], ...] = ()
) -> view_pb2.CompiledView:
    out = head_front(v)
    out.MergeFrom(head_middle(v))
    out.MergeFrom(head_back(v))
    out.system_prompt = v.system_prompt
    out.system_sections.extend(_section_out(s) for s in v.system_sections)
    # One parse of the concatenated records instead of a Python object per message.
    out.MergeFromString(b"".join(message_record(m) for m in v.messages))
    if attachments:
        data = dict(attachments)
        for msg in out.messages:
            for part in msg.parts:
                if part.HasField("attachment") and part.attachment.ref.artifact_id in data:
                    part.attachment.data = data[part.attachment.ref.artifact_id]
    out.tools.extend(_tool_out(t) for t in v.tools)
    return out
