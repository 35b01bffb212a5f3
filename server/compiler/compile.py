"""compile_view: the one entry point of the core. Inputs in, CompiledView out."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

from server.compiler.budget import BudgetConfig, ModelLimits, judge
from server.compiler.builtin_tools import LOAD_RULE
from server.compiler.projection import is_user_turn_start, project
from server.compiler.sources import SourceInputs, build_source_sections, paths_in
from server.compiler.system import (
    DEFAULT_KERNEL,
    ApprovalMode,
    EnvironmentInfo,
    assemble,
    join_sections,
    prefix_digest,
)
from server.compiler.tokens import MESSAGE_OVERHEAD, TokenCounter
from server.compiler.view import (
    CompiledView,
    EstimateMethod,
    Layer,
    LayerTokens,
    SectionKind,
    SystemSection,
    ToolOrigin,
    ToolSpec,
    ToolVisibility,
    ViewTool,
)
from server.domain.model import (
    AssistantMessage,
    Event,
    Route,
    Session,
    ToolCall,
    ToolResult,
    UserMessage,
)
from server.domain.records import RouteState


@dataclass(frozen=True, slots=True)
class CompileInputs:
    compile_id: str
    session: Session
    events: tuple[Event, ...]
    event_boundary: int
    route: Route
    limits: ModelLimits = ModelLimits()
    route_state: RouteState | None = None
    kernel_text: str = DEFAULT_KERNEL
    approval_mode: ApprovalMode = ApprovalMode.ON_REQUEST
    environment: EnvironmentInfo = EnvironmentInfo()
    sources: SourceInputs = SourceInputs()
    # Section digests of the session's previous compile, to report what changed.
    previous_sections: tuple[tuple[int, str], ...] | None = None
    exclude_sections: frozenset[SectionKind] = frozenset()
    tools: tuple[ToolSpec, ...] = ()
    budget_config: BudgetConfig = field(default_factory=BudgetConfig)


def tool_tokens(spec: ToolSpec, counter: TokenCounter) -> int:
    return (
        MESSAGE_OVERHEAD
        + counter.count(spec.name)
        + counter.count(spec.description)
        + counter.count(spec.input_schema_json)
    )


def _tools(
    specs: Sequence[ToolSpec],
    counter: TokenCounter,
    builtins: Sequence[tuple[ToolSpec, ToolOrigin]],
) -> tuple[ViewTool, ...]:
    direct = sorted(
        (s for s in specs if s.visibility == ToolVisibility.DIRECT), key=lambda s: s.name
    )
    tools = [ViewTool(s, ToolOrigin.DIRECT, tool_tokens(s, counter)) for s in direct]
    taken = {s.name for s in direct}
    # Built-ins come last so registry tools keep their cache-friendly positions.
    tools += [
        ViewTool(spec, origin, tool_tokens(spec, counter))
        for spec, origin in builtins
        if spec.name not in taken
    ]
    return tuple(tools)


def section_digests(sections: Sequence[SystemSection]) -> tuple[tuple[int, str], ...]:
    return tuple((int(s.kind), hashlib.sha256(s.text.encode()).hexdigest()[:32]) for s in sections)


def changed_sections(
    now: tuple[tuple[int, str], ...], before: tuple[tuple[int, str], ...] | None
) -> tuple[SectionKind, ...]:
    if before is None:
        return ()
    a, b = dict(now), dict(before)
    return tuple(SectionKind(k) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k))


def active_text(events: Sequence[Event]) -> str:
    """What the model is working on: the latest user message and every step after it."""
    start = max((i for i, e in enumerate(events) if is_user_turn_start(e)), default=len(events))
    chunks: list[str] = []
    for event in events[start:]:
        p = event.payload
        if isinstance(p, UserMessage):
            chunks.extend(part.text for part in p.parts if part.text)
        elif isinstance(p, AssistantMessage):
            chunks.extend(c.arguments_json for c in p.tool_calls)
        elif isinstance(p, ToolCall):
            chunks.append(p.arguments_json)
        elif isinstance(p, ToolResult):
            chunks.append(p.text if p.text is not None else (p.blob.preview if p.blob else ""))
    return "\n".join(chunks)


def compile_view(inputs: CompileInputs, counter: TokenCounter) -> CompiledView:
    built = build_source_sections(inputs.sources, paths_in(active_text(inputs.events)), counter)
    sections = assemble(
        kernel_text=inputs.kernel_text,
        approval_mode=inputs.approval_mode,
        environment=inputs.environment,
        extra=built.sections,
        exclude=inputs.exclude_sections,
        counter=counter,
    )
    builtins: list[tuple[ToolSpec, ToolOrigin]] = []
    if built.loadable_rules and SectionKind.RULE_INDEX not in inputs.exclude_sections:
        builtins.append((LOAD_RULE, ToolOrigin.BUILTIN_LOAD_RULE))
    messages = project(inputs.events, counter)
    tools = _tools(inputs.tools, counter, builtins)
    digests = section_digests(sections)
    ledger = {layer: [0, 0] for layer in Layer}
    for s in sections:
        ledger[Layer.PINNED][0] += s.tokens
        ledger[Layer.PINNED][1] += 1
    for m in messages:
        ledger[m.layer][0] += m.tokens
        ledger[m.layer][1] += 1
    for t in tools:
        ledger[Layer.TOOL_SCHEMA][0] += t.tokens
        ledger[Layer.TOOL_SCHEMA][1] += 1
    layers = tuple(LayerTokens(layer, tok, n) for layer, (tok, n) in ledger.items())
    estimate = sum(row.tokens for row in layers)
    pressure = max(layers, key=lambda row: (row.tokens, -int(row.layer))).layer
    last_output = inputs.route_state.last_output_tokens if inputs.route_state else None
    budget, decision = judge(
        inputs.limits,
        last_output,
        estimate,
        EstimateMethod.FULL,
        ledger[Layer.HISTORY][0],
        inputs.budget_config,
    )
    return CompiledView(
        compile_id=inputs.compile_id,
        session_id=inputs.session.session_id,
        event_boundary=inputs.event_boundary,
        route=inputs.route,
        system_sections=sections,
        system_prompt=join_sections(sections),
        prefix_digest=prefix_digest(sections),
        messages=messages,
        tools=tools,
        layers=layers,
        pressure_layer=pressure,
        budget=budget,
        decision=decision,
        changed_sections=changed_sections(digests, inputs.previous_sections),
        notes=built.notes,
    )
