"""The compile use case's values: a request, its result, a usage report's answer, settings."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from server.compiler.budget import BudgetConfig, ModelLimits
from server.compiler.render import RenderFormat
from server.compiler.route_model import LearningConfig
from server.compiler.sources import SourceCaps
from server.compiler.system import DEFAULT_KERNEL, ApprovalMode
from server.compiler.view import CompiledView, SectionKind
from server.domain.model import Route


def route_fields(route: Route) -> dict[str, str]:
    return {
        "connection": route.connection,
        "protocol": route.protocol,
        "endpoint": route.endpoint,
        "model": route.model,
    }


@dataclass(frozen=True, slots=True)
class CompileOptions:
    """One compile request, transport-neutral."""

    session_id: str
    route: Route
    limits: ModelLimits = ModelLimits()
    as_of_seq: int = 0
    approval_mode: ApprovalMode | None = None
    working_directory: str = ""
    platform: str = ""
    shell: str = ""
    exclude_sections: frozenset[SectionKind] = frozenset()
    # True when the request said whether the model accepts images (else the catalog says).
    images_given: bool = False
    # Inspection only: nothing recorded, published or compacted (as with as_of_seq).
    dry_run: bool = False
    # Provider bodies to render along with the view.
    render_formats: tuple[RenderFormat, ...] = ()
    # Materialize attachment bytes (IMAGE_MODE_INLINE) or send references only.
    inline_images: bool = True
    # Rebuild this recorded compile from its stored basis instead (exact time travel).
    rebuild_compile_id: str = ""


@dataclass(frozen=True, slots=True)
class Prior:
    """Storage work a compile must see done first (a stream step's append): `run` goes on
    the compute thread right before the compile, in one hop of the event loop, its
    fsync made on a storage thread meanwhile (Blocking.run_then_compute); `landed` takes
    its result on the event loop before the compile is published, also when the compile
    then fails. A failure of `run` fails the compile before it starts."""

    run: Callable[[], Any]
    landed: Callable[[Any], None]
    # The request's encoded size: new text the compile will see (lanes.py).
    size: int = 0


@dataclass(frozen=True, slots=True)
class CompileResult:
    view: CompiledView
    # artifact id -> bytes for the view's attachments, when inline images were asked for.
    attachments: tuple[tuple[str, bytes], ...] = ()
    # (format, body JSON, estimated input tokens of that body)
    renderings: tuple[tuple[RenderFormat, str, int], ...] = ()
    # The create time of the session the view is of: a session deleted and made again
    # under its id is another conversation, whose log may reach the same boundary. A
    # stream resends a kept view, or answers a delta against one, only of the same
    # session life. 0 for a rebuild (never resent nor a delta base).
    created_ns: int = 0


@dataclass(frozen=True, slots=True)
class UsageResult:
    estimated_input_tokens: int
    error_tokens: int
    relative_error: float
    replayed: bool
    next_output_reserve: int


@dataclass(frozen=True, slots=True)
class CompilerSettings:
    kernel_text: str = DEFAULT_KERNEL
    default_approval: ApprovalMode = ApprovalMode.ON_REQUEST
    # Time in the environment section is cut to this many seconds so it changes rarely
    # (config_settings: it ends the system prompt, before the whole history).
    time_granularity_s: int = 3600
    budget: BudgetConfig = BudgetConfig()
    caps: SourceCaps = SourceCaps()
    max_images: int = 20
    max_image_bytes: int = 20 << 20
    learning: LearningConfig = LearningConfig()
    # Built-in compaction when the budget asks for it (R-MISC-5 a).
    auto_compact: bool = True
    # Memory for compile memos; 0 compiles every view from scratch.
    memo_bytes: int = 32 << 20
    # CPU one compile may use (loading, projection, renderings); 0 = no limit.
    cpu_budget_ms: int = 30_000
