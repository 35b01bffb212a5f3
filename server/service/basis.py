"""The basis of a compile: everything it read besides the log, stored with its record.

A compile reads the event log (immutable) and sources that change over time: the tool
registry and this turn's activations, memory, rules, skills, instruction files, the
daemon's view-shaping settings, the model catalog, the route's baseline and learned
model, the previous compile's sections and the clock. Each compile stores what it read,
as versions named by content digest: the large, rarely changing parts (sources, tools,
settings) once per session and content, the small per-step rest in a basis part the
compile record names.
A past view is then rebuilt from the store alone, byte for byte (exact time travel).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass, replace

import msgspec

from server.compiler.budget import BudgetConfig, ModelLimits
from server.compiler.compile import CompileInputs
from server.compiler.sources import SourceInputs
from server.compiler.system import ApprovalMode, EnvironmentInfo
from server.compiler.view import FallbackReason, SectionKind
from server.domain.catalog import ModelInfo
from server.domain.errors import CtxccError, Reason
from server.domain.model import Route
from server.domain.records import RouteModel, RouteState
from server.domain.table_chunks import Splitter, TableChunk, stored, whole
from server.domain.tools import ToolSpec
from server.service.ports import EventStore

_encoder = msgspec.msgpack.Encoder()


@dataclass(frozen=True, slots=True)
class ToolsPart:
    """The session's tool registry as a compile saw it."""

    tools: tuple[ToolSpec, ...]


@dataclass(frozen=True, slots=True)
class SettingsPart:
    """Daemon settings that shape a view (the caps travel inside SourceInputs)."""

    kernel_text: str
    budget: BudgetConfig
    max_images: int
    max_image_bytes: int


@dataclass(frozen=True, slots=True)
class CompileBasis:
    """One compile's versions: digests of its parts, and the small per-step inputs."""

    sources: str
    tools: str
    settings: str
    route: Route
    model: ModelInfo
    limits: ModelLimits
    route_state: RouteState | None
    route_model: RouteModel | None
    approval_mode: ApprovalMode
    environment: EnvironmentInfo
    exclude_sections: tuple[SectionKind, ...]
    activated_tools: tuple[str, ...]
    checkpoint_id: str
    fallback_reasons: tuple[FallbackReason, ...]
    previous_sections: tuple[tuple[int, str], ...] | None
    requested_max_output: int = 0
    # tokens.COUNTING of the daemon that recorded it; bases stored before it was kept
    # were counted the first way (0).
    counting: int = 0
    # projection.PROJECTION of the daemon that recorded it; bases stored before it was
    # kept were projected the first way (0: only attachments' and user messages' images).
    projection: int = 0
    # render.RENDERING of the daemon that recorded it; bases stored before it was kept
    # were rendered the first way (0: render0).
    rendering: int = 0
    # tool_cap.TOOL_CAPPING of the daemon that recorded it; bases stored before it was
    # kept were compiled without a tool cap (0).
    tool_capping: int = 0


@dataclass(frozen=True, slots=True)
class Recalled:
    """A stored basis with its parts read back."""

    basis: CompileBasis
    sources: SourceInputs
    tools: tuple[ToolSpec, ...]
    settings: SettingsPart


def digest_of(value: object) -> str:
    # MessagePack of frozen dataclasses and tuples is deterministic; the digest only has
    # to name equal content equally within one data directory.
    return hashlib.sha256(_encoder.encode(value)).hexdigest()[:32]


class PartDigests:
    """`digest_of` of the large parts, remembered by the identity of the value each holds.
    A session's sources and tools are the very objects kept between writes of their
    tables (kept.py) and the settings one object for the daemon's life, so nearly every
    compile would encode and hash the same instruction files, rules and tool schemas
    again. An entry holds its value, so its id cannot name another value meanwhile."""

    def __init__(self, size: int = 32) -> None:
        self._size = size
        self._lock = threading.Lock()
        self._known: OrderedDict[int, tuple[object, str]] = OrderedDict()

    def of(self, held: object, part: object) -> str:
        """The digest of `part`, a function of `held` alone (the value it wraps)."""
        with self._lock:
            known = self._known.get(id(held))
        if known is not None and known[0] is held:
            return known[1]
        digest = digest_of(part)
        with self._lock:
            self._known[id(held)] = (held, digest)
            self._known.move_to_end(id(held))
            while len(self._known) > self._size:
                self._known.popitem(last=False)
        return digest


def basis_of(
    inputs: CompileInputs,
    model: ModelInfo,
    settings: SettingsPart,
    splitter: Splitter,
    digests: PartDigests | None = None,
) -> tuple[str, tuple[tuple[str, object], ...]]:
    """The basis digest of a compile and the parts to store with its record: the route
    state's per-message table goes as chunks (`splitter`), stored once, not in every
    basis (it is the baseline view's, thousands of entries in a long session);
    `digests` remembers the digests of the sources, tools and settings parts."""
    tools = ToolsPart(inputs.tools)
    held = ((inputs.sources, inputs.sources), (inputs.tools, tools), (settings, settings))
    known = digests or PartDigests(0)
    parts: list[tuple[str, object]] = [(known.of(h, p), p) for h, p in held]
    route_state, chunks = (
        stored(inputs.route_state, splitter) if inputs.route_state is not None else (None, ())
    )
    parts += chunks
    basis = CompileBasis(
        sources=parts[0][0],
        tools=parts[1][0],
        settings=parts[2][0],
        route=inputs.route,
        model=model,
        limits=inputs.limits,
        route_state=route_state,
        route_model=inputs.route_model,
        approval_mode=inputs.approval_mode,
        environment=inputs.environment,
        exclude_sections=tuple(sorted(inputs.exclude_sections)),
        activated_tools=inputs.activated_tools,
        checkpoint_id=inputs.checkpoint.checkpoint_id if inputs.checkpoint else "",
        fallback_reasons=inputs.fallback_reasons,
        previous_sections=inputs.previous_sections,
        requested_max_output=inputs.requested_max_output,
        counting=inputs.counting,
        projection=inputs.projection,
        rendering=inputs.rendering,
        tool_capping=inputs.tool_capping,
    )
    digest = digest_of(basis)
    parts.append((digest, basis))
    return digest, tuple(parts)


def recall(store: EventStore, session_id: str, digest: str) -> Recalled:
    """Blocking: a stored basis and its parts; RECORD_CORRUPT when any is missing."""
    basis = store.get_compile_part(session_id, digest, CompileBasis)
    if basis is not None:
        sources = store.get_compile_part(session_id, basis.sources, SourceInputs)
        tools = store.get_compile_part(session_id, basis.tools, ToolsPart)
        settings = store.get_compile_part(session_id, basis.settings, SettingsPart)
        if sources is not None and tools is not None and settings is not None:
            rs = basis.route_state
            if rs is not None and rs.table_chunks:

                def chunk(name: str) -> TableChunk | None:
                    return store.get_compile_part(session_id, name, TableChunk)

                basis = replace(basis, route_state=whole(rs, chunk, _incomplete))
            return Recalled(basis, sources, tools.tools, settings)
    raise _incomplete()


def _incomplete() -> CtxccError:
    return CtxccError(Reason.RECORD_CORRUPT, "a stored compile basis is incomplete")
