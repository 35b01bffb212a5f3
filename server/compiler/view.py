"""The compiled request view (R-STEP-2) and its parts. Enum numbers equal the proto's."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from server.compiler.estimate_basis import EstimateBasis
from server.domain.model import ArtifactRef, NativeState, Role, Route, ToolCall
from server.domain.sources import Authority, Scope
from server.domain.tools import ToolSpec, ToolVisibility

__all__ = ["Authority", "Scope", "ToolSpec", "ToolVisibility"]


class SectionKind(enum.IntEnum):
    KERNEL = 1
    INSTRUCTIONS = 2
    SKILLS = 3
    RULES = 4
    RULE_INDEX = 5
    APPROVAL = 6
    MEMORY = 7
    ENVIRONMENT = 8
    # Not a system prompt section: the tool definitions, reported among the changed
    # sections because they sit in front of the system prompt in providers' caches.
    TOOLS = 9


# After the providers' cache breakpoints: these change (the clock ticks) without busting
# any prompt cache, so they are outside prefix_digest and never among changed sections.
VOLATILE_SECTIONS = frozenset({SectionKind.ENVIRONMENT})


class Layer(enum.IntEnum):
    PINNED = 1
    HISTORY = 2
    WORKING_SET = 3
    TOOL_SCHEMA = 4
    NATIVE_STATE = 5


class Decision(enum.IntEnum):
    OK = 1
    COMPACT_RECOMMENDED = 2
    OVER_BUDGET_SEND_ANYWAY = 3


class EstimateMethod(enum.IntEnum):
    FULL = 1
    BASELINE_DELTA = 2
    ROUTE_MODEL = 3


class OutputCapSource(enum.IntEnum):
    CALLER = 1
    MODEL_MAX = 2
    DEFAULT = 3
    FITTED_TO_WINDOW = 4


class FallbackReason(enum.IntEnum):
    CHECKPOINT_DIGEST_MISMATCH = 1
    CHECKPOINT_BOUNDARY_MISSING = 2
    CHECKPOINT_FOREIGN = 3
    ROUTE_MISMATCH = 4
    PROJECTION_CORRUPT = 5


class ToolOrigin(enum.IntEnum):
    DIRECT = 1
    ACTIVATED = 2
    BUILTIN_TOOL_SEARCH = 3
    BUILTIN_READ_TOOL_RESULT = 4
    BUILTIN_LOAD_RULE = 5


@dataclass(frozen=True, slots=True)
class SystemSection:
    kind: SectionKind
    sources: tuple[str, ...]
    scope: Scope
    authority: Authority
    text: str
    tokens: int
    truncated: bool = False
    stable: bool = True


@dataclass(frozen=True, slots=True)
class ViewPart:
    """Exactly one of text and attachment is set."""

    text: str | None = None
    attachment: ArtifactRef | None = None
    authority: Authority = Authority.USER_CONTROLLABLE


# weakref_slot: the transport caches each message's encoding for as long as it lives
# (memos keep the messages of old turns alive from one compile to the next).
@dataclass(frozen=True, slots=True, weakref_slot=True)
class ViewMessage:
    role: Role
    parts: tuple[ViewPart, ...]
    layer: Layer
    tokens: int
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str = ""
    tool_name: str = ""
    first_seq: int = 0
    last_seq: int = 0
    origin_session_id: str = ""
    synthetic: bool = False
    is_error: bool = False


@dataclass(frozen=True, slots=True)
class ViewTool:
    spec: ToolSpec
    origin: ToolOrigin
    tokens: int


@dataclass(frozen=True, slots=True)
class LayerTokens:
    layer: Layer
    tokens: int
    items: int


@dataclass(frozen=True, slots=True)
class RouteParams:
    """The learned route model an estimate used (compiler/route_model.py)."""

    ratio: float
    overhead_tokens: int
    delta_samples: int
    full_samples: int
    # How the local count was made: exact, scaled or conservative.
    counter_kind: str
    # Provider tokens per message that entered the view beyond the local framing.
    framing_tokens: float = 0.0


@dataclass(frozen=True, slots=True)
class Budget:
    context_window: int
    output_reserve: int
    input_budget: int
    history_high_watermark: int
    estimated_input_tokens: int
    estimate_method: EstimateMethod
    utilization: float
    baseline_tokens: int = 0
    window_unknown: bool = False
    # Sum of the layers: the full local estimate of this view.
    ledger_tokens: int = 0
    # What the provider counts that no local item explains: estimated_input_tokens -
    # ledger_tokens (negative when the provider counts fewer tokens than the ledger).
    provider_overhead_tokens: int = 0
    route: RouteParams | None = None
    # The output cap written into provider bodies, and where it came from (output_cap.py).
    output_cap: int = 0
    output_cap_source: OutputCapSource | None = None


@dataclass(frozen=True, slots=True)
class CompactionRequest:
    from_seq: int
    through_seq: int
    prompt: str
    covered_digest: str


@dataclass(frozen=True, slots=True)
class CompiledView:
    compile_id: str
    session_id: str
    event_boundary: int
    route: Route
    system_sections: tuple[SystemSection, ...]
    system_prompt: str
    prefix_digest: str
    # A tuple, or a Grown shared with the projection memo (grown.py).
    messages: Sequence[ViewMessage]
    tools: tuple[ViewTool, ...]
    layers: tuple[LayerTokens, ...]
    pressure_layer: Layer
    budget: Budget
    decision: Decision
    changed_sections: tuple[SectionKind, ...] = ()
    provider_state: NativeState | None = None
    fallback_reasons: tuple[FallbackReason, ...] = ()
    checkpoint_id: str = ""
    compaction: CompactionRequest | None = None
    notes: tuple[str, ...] = ()
    # How the estimate was made; the service stores it with the compile record.
    basis: EstimateBasis | None = None
    # The rendering version its provider bodies are made with (render.RENDERING, or a
    # recorded compile's when it is rebuilt): not part of the view sent.
    rendering: int = 1
    # Thinking state of the current turn's assistant messages that its provider bodies
    # send back (turn_thinking.py): (event seq, native state kind, data as logged). Not
    # part of the view sent: an agent building its own body has it in its log.
    thinking: tuple[tuple[int, str, bytes], ...] = ()
    # Tools the route's tool cap left out of `tools` (offered through tool_search, or
    # activated but not offered; tool_cap.py), for the metrics: not part of the view sent.
    tools_deferred_by_cap: int = 0
