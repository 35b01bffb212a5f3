"""compile_view: the one entry point of the core. Inputs in, CompiledView out."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from server.compiler.budget import BudgetConfig, ModelLimits, judge
from server.compiler.projection import project
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
from server.domain.model import Event, Route, Session
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
    extra_sections: tuple[SystemSection, ...] = ()
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


def _tools(specs: Sequence[ToolSpec], counter: TokenCounter) -> tuple[ViewTool, ...]:
    direct = sorted(
        (s for s in specs if s.visibility == ToolVisibility.DIRECT), key=lambda s: s.name
    )
    return tuple(ViewTool(s, ToolOrigin.DIRECT, tool_tokens(s, counter)) for s in direct)


def compile_view(inputs: CompileInputs, counter: TokenCounter) -> CompiledView:
    sections = assemble(
        kernel_text=inputs.kernel_text,
        approval_mode=inputs.approval_mode,
        environment=inputs.environment,
        extra=inputs.extra_sections,
        exclude=inputs.exclude_sections,
        counter=counter,
    )
    messages = project(inputs.events, counter)
    tools = _tools(inputs.tools, counter)
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
    )
