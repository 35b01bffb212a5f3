"""The basis of a compile: everything it read besides the log, stored with its record.

A compile reads the event log (immutable) and sources that change over time: the tool
registry and this turn's activations, memory, rules, skills, instruction files, the
daemon's view-shaping settings, the model catalog, the route's baseline and learned
model, the previous compile's sections and the clock. Each compile stores what it read,
as versions named by content digest: the large, rarely changing parts (sources, tools,
settings) once per session and content, the small per-step rest in a basis part the
compile record names. Each text of the sources (an instruction file's, a rule's, a memory
entry's) is a part of its own, which the sources part names by digest: an edit of one
file stores that file's text again, not every text the compile read.
A past view is then rebuilt from the store alone, byte for byte (exact time travel).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import ClassVar, TypeVar, cast

from server.adapters.msgpack_pieces import msgpack_pieces, sha256_of_pieces
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

T = TypeVar("T")

# How a basis stores its sources (CompileBasis.source_texts): 0, one SourceInputs part
# holding every text (bases stored before texts were parts of their own); 1, a
# SourcesPart naming a TextPart per text.
SOURCE_TEXTS = 1


@dataclass(frozen=True, slots=True)
class ToolsPart:
    """The session's tool registry as a compile saw it."""

    # Up to --max-tools definitions of schemas up to 256 KiB: hashed and stored a tool a
    # MessagePack call (msgpack_pieces.py).
    ENCODED_IN_PIECES: ClassVar[bool] = True

    tools: tuple[ToolSpec, ...]


@dataclass(frozen=True, slots=True)
class TextPart:
    """One text of a compile's sources (an instruction file's, a rule's, a memory
    entry's), stored once per session and content."""

    text: str


@dataclass(frozen=True, slots=True)
class SourcesPart:
    """A compile's sources with their texts taken out (left empty in `sources`), each
    named by the digest of its TextPart, in the order of its entries."""

    sources: SourceInputs
    instruction_texts: tuple[str, ...]
    rule_texts: tuple[str, ...]
    memory_texts: tuple[str, ...]


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
    # SOURCE_TEXTS of the daemon that recorded it: how `sources` is stored (0 for bases
    # stored before it was kept: one SourceInputs part with every text).
    source_texts: int = 0


@dataclass(frozen=True, slots=True)
class Recalled:
    """A stored basis with its parts read back."""

    basis: CompileBasis
    sources: SourceInputs
    tools: tuple[ToolSpec, ...]
    settings: SettingsPart


def digest_of(value: object) -> str:
    # MessagePack of frozen dataclasses and tuples is deterministic; the digest only has
    # to name equal content equally within one data directory. Hashed in pieces, the same
    # digest: one encoding call over a registry of 200 tools of 250 KB schemas held the
    # GIL ~50-90 ms at every compile (msgpack_pieces.py).
    return sha256_of_pieces(msgpack_pieces(value)).hexdigest()[:32]


class PartDigests:
    """`digest_of` of the large parts, remembered by the identity of the value each holds.
    A session's sources and tools are the very objects kept between writes of their
    tables (kept.py) and the settings one object for the daemon's life, so nearly every
    compile would encode and hash the same instruction files, rules and tool schemas
    again. An entry holds its value, so its id cannot name another value meanwhile."""

    def __init__(self, size: int = 32) -> None:
        self._size = size
        self._lock = threading.Lock()
        self._known: OrderedDict[tuple[int, str], tuple[object, object]] = OrderedDict()
        # The sources last digested, with the digest of each of their texts: a compile
        # reads its sources into new objects, nearly always equal to the last ones (~0.2
        # ms to compare 1,000 rules, ~4 ms to digest them again) or one text edited.
        self._last: tuple[SourceInputs, tuple[tuple[str, object], ...], dict[str, str]] | None
        self._last = None

    def of(self, held: object, part: object) -> str:
        """The digest of `part`, a function of `held` alone (the value it wraps)."""
        return self._kept(held, "digest", lambda: digest_of(part))

    def sources(self, held: SourceInputs) -> tuple[tuple[str, object], ...]:
        """`sources_parts(held)`, the SourcesPart last."""
        return self._kept(held, "sources", lambda: self._sources_like(held))

    def _sources_like(self, held: SourceInputs) -> tuple[tuple[str, object], ...]:
        """`sources_parts(held)`, taken from the sources last digested when they are
        equal, else with the digests of the texts they had."""
        with self._lock:
            last = self._last
        if last is not None and last[0] == held:
            return last[1]
        made = sources_parts(held, last[2] if last is not None else None)
        if self._size:
            texts = {p.text: d for d, p in made if isinstance(p, TextPart)}
            with self._lock:
                self._last = (held, made, texts)
        return made

    def _kept(self, held: object, kind: str, make: Callable[[], T]) -> T:
        key = (id(held), kind)
        with self._lock:
            known = self._known.get(key)
        if known is not None and known[0] is held:
            return cast(T, known[1])
        made = make()
        if self._size:
            with self._lock:
                self._known[key] = (held, made)
                self._known.move_to_end(key)
                while len(self._known) > self._size:
                    self._known.popitem(last=False)
        return made


def sources_parts(
    sources: SourceInputs, known: dict[str, str] | None = None
) -> tuple[tuple[str, object], ...]:
    """The parts `sources` is stored as: a TextPart per distinct text, then the
    SourcesPart naming them. `known`: digests of TextParts by their text."""
    texts: dict[str, tuple[str, object]] = {}
    digests = known or {}

    def named(text: str) -> str:
        part = TextPart(text)
        digest = digests.get(text) or digest_of(part)
        texts.setdefault(digest, (digest, part))
        return digest

    emptied = replace(
        sources,
        instruction_files=tuple(replace(f, text="") for f in sources.instruction_files),
        rules=tuple(replace(r, text="") for r in sources.rules),
        memory=tuple(replace(m, text="") for m in sources.memory),
    )
    part = SourcesPart(
        emptied,
        tuple(named(f.text) for f in sources.instruction_files),
        tuple(named(r.text) for r in sources.rules),
        tuple(named(m.text) for m in sources.memory),
    )
    return (*texts.values(), (digest_of(part), part))


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
    known = digests or PartDigests(0)
    parts: list[tuple[str, object]] = list(known.sources(inputs.sources))
    sources_digest = parts[-1][0]
    parts += [(known.of(h, p), p) for h, p in ((inputs.tools, tools), (settings, settings))]
    tools_digest, settings_digest = parts[-2][0], parts[-1][0]
    route_state, chunks = (
        stored(inputs.route_state, splitter) if inputs.route_state is not None else (None, ())
    )
    parts += chunks
    basis = CompileBasis(
        sources=sources_digest,
        tools=tools_digest,
        settings=settings_digest,
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
        source_texts=SOURCE_TEXTS,
    )
    digest = digest_of(basis)
    parts.append((digest, basis))
    return digest, tuple(parts)


def recall(store: EventStore, session_id: str, digest: str) -> Recalled:
    """Blocking: a stored basis and its parts; RECORD_CORRUPT when any is missing."""
    basis = store.get_compile_part(session_id, digest, CompileBasis)
    if basis is not None:
        sources = _recalled_sources(store, session_id, basis)
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


def _recalled_sources(
    store: EventStore, session_id: str, basis: CompileBasis
) -> SourceInputs | None:
    """The sources a stored basis names, in the way its daemon stored them; None when a
    part is missing."""
    if basis.source_texts == 0:
        return store.get_compile_part(session_id, basis.sources, SourceInputs)
    part = store.get_compile_part(session_id, basis.sources, SourcesPart)
    if part is None:
        return None
    read: dict[str, str] = {}
    for name in (*part.instruction_texts, *part.rule_texts, *part.memory_texts):
        if name not in read:
            text = store.get_compile_part(session_id, name, TextPart)
            if text is None:
                return None
            read[name] = text.text
    s = part.sources
    if not (
        len(part.instruction_texts) == len(s.instruction_files)
        and len(part.rule_texts) == len(s.rules)
        and len(part.memory_texts) == len(s.memory)
    ):
        raise _incomplete()
    files = zip(s.instruction_files, part.instruction_texts, strict=True)
    rules = zip(s.rules, part.rule_texts, strict=True)
    memory = zip(s.memory, part.memory_texts, strict=True)
    return replace(
        s,
        instruction_files=tuple(replace(f, text=read[n]) for f, n in files),
        rules=tuple(replace(r, text=read[n]) for r, n in rules),
        memory=tuple(replace(m, text=read[n]) for m, n in memory),
    )


def _incomplete() -> CtxccError:
    return CtxccError(Reason.RECORD_CORRUPT, "a stored compile basis is incomplete")
