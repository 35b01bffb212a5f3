"""Which compute lane a compile takes: the light one, or the pool heavy work shares.

A compile's cost follows the text it has not seen: the first compile of a session (or of
a route), or one after megabytes were appended, counts and scans all of it (a first
compile of 34 MB on a Claude route takes ~11 s, and the CPU budget allows 30). Steps of
an agent whose session is warm cost what is new, ~1 ms. On one pool, two heavy compiles
of any two sessions held both its threads and every agent's step waited behind them
(seconds, up to the budget). So a compile that continues a warm memo with little unseen
text runs on a lane of its own, where heavy work never queues; everything else takes the
compute pool as before.

What "little unseen" means is known on the event loop without I/O: the bytes appended to
a session since a compile of it started (this module, fed by each append as it lands),
plus the step's own. A misjudged compile can only make light work wait, as it all did
before.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field

from server.compiler.sources import SourceInputs
from server.compiler.view import ViewMessage
from server.domain.model import (
    AssistantMessage,
    BrowserSelection,
    ContentPart,
    Event,
    ImportedMessage,
    ToolCall,
    ToolResult,
    UserMessage,
    of_deleted,
)
from server.domain.sources import MemoryEntry, RuleActivation, RuleEntry, SkillEntry

# Unseen bytes up to which a compile of a warm session runs on the light lane: ~85 ms of
# counting on the slowest vocabulary (Claude's, ~3 MB/s), so that no light compile holds
# the lane much longer than that; an agent's step appends a few KB.
LIGHT_BYTES = 256 << 10


class _Pending:
    """One session's count: bytes landed, how many of them a finished compile had seen
    when it started, and the compiles running; `whole` while they are all its log has
    (a session made by this daemon that no compile has seen yet)."""

    __slots__ = ("created", "landed", "running", "seen", "whole")

    def __init__(self, whole: bool = False, created: int = 0) -> None:
        self.landed = 0
        self.seen = 0
        self.running = 0
        self.whole = whole
        # The create time of the session `made` it (0: an append or a compile did).
        self.created = created


@dataclass(frozen=True, slots=True)
class Started:
    """A compile's start: what it has not seen, and its place in the session's count."""

    unseen: int
    session_id: str
    entry: _Pending
    mark: int


@dataclass(slots=True)
class _Slot:
    """A session's turn on the compute pool: its lock, and the compiles holding or
    awaiting it."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0


class HeavySlots:
    """One compute-pool compile per session at a time (on the event loop only).

    The compute pool has a few threads (`--compile-workers`, 2 by default): a client
    asking for several heavy compiles of one session at once (time-travel compiles from
    an inspector, a retry storm, first compiles of a 16 MB log) would take all of them,
    and every other session's heavy compile would queue behind that one session. Held
    per session, a session's second heavy compile waits on the event loop, without a
    thread, while other sessions' compiles take the free ones. (A stream step's append
    and the compile it goes with are not held here: once a step is read its append is
    written whatever happens, and one stream's steps run one at a time anyway.)"""

    __slots__ = ("_held",)

    def __init__(self) -> None:
        self._held: dict[str, _Slot] = {}

    @contextlib.asynccontextmanager
    async def slot(self, session_id: str) -> AsyncIterator[None]:
        held = self._held.get(session_id)
        if held is None:
            held = self._held[session_id] = _Slot()
        held.users += 1
        try:
            async with held.lock:
                yield
        finally:
            held.users -= 1
            if not held.users:  # nobody holds or awaits it: forgotten
                del self._held[session_id]

    def sessions(self) -> int:
        """Sessions with a heavy compile running or waiting (for tests and inspection)."""
        return len(self._held)


class PendingWork:
    """Bytes appended to each session that no compile started since has covered. On the
    event loop only: appends land there and compiles start and end there.

    A compile covers what had landed when it started (a mark in a running total), not
    an amount taken off: two compiles of a session at once that both started after the
    same bytes see them once, and bytes landing while they run stay unseen. A session's
    count is dropped once no compile runs and all that landed is seen, or when it is
    deleted (a compile of a session deleted meanwhile ends on a count no longer kept)."""

    __slots__ = ("_sessions",)

    def __init__(self) -> None:
        self._sessions: dict[str, _Pending] = {}

    def made(self, session_id: str, created: int = 0) -> None:
        """The session was just made (at `created`), empty: until a compile sees its
        log, all of it is what lands here (its first compile, cold, may still be light
        work)."""
        entry = self._sessions.get(session_id)
        if entry is None:
            self._sessions[session_id] = _Pending(whole=True, created=created)
        else:
            # An append of another client landed before this ran (the write came first):
            # its bytes are of this log too and stay counted. (A deleted predecessor's
            # count, not yet forgotten, only counts more.)
            entry.whole = True
            entry.created = created

    def whole(self, session_id: str) -> bool:
        """Whether what `unseen` says of the session is its whole log."""
        entry = self._sessions.get(session_id)
        return entry is not None and entry.whole

    def landed(self, session_id: str, size: int) -> None:
        """An append of `size` encoded bytes landed."""
        entry = self._sessions.get(session_id)
        if entry is None:
            entry = self._sessions[session_id] = _Pending()
        entry.landed += size

    def unseen(self, session_id: str) -> int:
        """What a compile starting now will see for the first time (at least)."""
        entry = self._sessions.get(session_id)
        return entry.landed - entry.seen if entry is not None else 0

    def start(self, session_id: str) -> Started:
        """A compile of the session starts; `finish` must follow, whatever happens."""
        entry = self._sessions.get(session_id)
        if entry is None:
            entry = self._sessions[session_id] = _Pending()
        entry.running += 1
        return Started(entry.landed - entry.seen, session_id, entry, entry.landed)

    def finish(self, started: Started, *, compiled: bool) -> None:
        """The compile of `started` ended; with `compiled`, what it saw is seen. (A
        step's own append lands after its compile starts, so it is counted by the next
        compile: one step late, never early.)"""
        entry = started.entry
        entry.running -= 1
        if compiled:
            entry.seen = max(entry.seen, started.mark)
            entry.whole = False  # its memo now holds what was seen
        kept = self._sessions.get(started.session_id)
        if kept is entry and not entry.running and entry.seen >= entry.landed:
            del self._sessions[started.session_id]

    def kept(self) -> int:
        """Sessions with a count kept (for tests: none is kept for nothing)."""
        return len(self._sessions)

    def reprojected(self, session_id: str) -> None:
        """A checkpoint of the session was made: the next compile that chooses it
        projects the log afresh, so it counts as more new text than the light lane takes
        (until a compile that started after this one finishes)."""
        self.landed(session_id, LIGHT_BYTES + 1)
        # Its summary is not counted here: its log is more than what landed.
        self._sessions[session_id].whole = False

    def forget(self, session_id: str, created: int = 0) -> None:
        """The session made at `created` (0: whichever) was deleted. A count of the
        session made again under its id since (the delete's result reached the event
        loop late) stays."""
        entry = self._sessions.get(session_id)
        if entry is not None and of_deleted(entry.created, created):
            del self._sessions[session_id]


# CPU a compile may use on the light lane before it is left for the compute pool (see
# `CompileUseCases._prepare`): a light step takes ~1-2 ms, and the most new text the lane
# takes, counted on the slowest vocabulary, ~85 ms. Work judged light before it ran that
# turns out heavier for a reason no check foresaw (a model's tool_search activating
# deferred tools with schemas of up to 256 KiB each, which only the compile finds) holds
# the lane, and every other session's step, for about this long, not for seconds.
LIGHT_CPU_MS = 100

# Tokens times formats of the provider bodies a light compile renders itself. Rendering
# walks the whole view (~6 ms per 250k tokens per format here), and unlike unseen text,
# which one step counts once, it recurs at every step: past ~7 ms it is the compute pool's.
RENDER_LIGHT_TOKENS = 1 << 18


def is_light(warm: bool, unseen: int, step_bytes: int) -> bool:
    return warm and unseen + step_bytes <= LIGHT_BYTES


# What an event costs a projection besides its text (its message, pairing, counting).
_EVENT_BYTES = 64


def _parts_bytes(parts: Iterable[ContentPart]) -> int:
    return sum(
        len(p.text or "") + (len(p.browser_element.text) if p.browser_element else 0) for p in parts
    )


def tail_is_light(events: Iterable[Event]) -> bool:
    """Whether these events, which a compile projects again after its memo's cut, are
    little text. What was appended since is bounded by PendingWork already; this bounds
    what the memo left behind its cut too (a cut held before an image stays at the
    image, so every step re-projects the log after it). Stops once over."""
    total = 0
    for event in events:
        total += _EVENT_BYTES
        match event.payload:
            case UserMessage(parts=parts) | ImportedMessage(parts=parts):
                total += _parts_bytes(parts)
            case AssistantMessage() as msg:
                total += _parts_bytes(msg.parts) + len(msg.reasoning)
                total += sum(len(c.arguments_json) for c in msg.tool_calls)
            case ToolResult() as result:
                total += len(result.text) if result.text is not None else 0
                total += len(result.blob.preview) if result.blob is not None else 0
            case ToolCall(arguments_json=args):
                total += len(args)
            case BrowserSelection(element=element):
                total += len(element.text)
            case _:
                pass
        if total > LIGHT_BYTES:
            return False
    return True


def entry_text_bytes(entry: MemoryEntry | RuleEntry | SkillEntry) -> int:
    """The text a compile counts of a memory entry, rule or skill."""
    match entry:
        case MemoryEntry(text=text):
            return len(text)
        case RuleEntry() as rule:
            return len(rule.name) + len(rule.description) + len(rule.text)
        case SkillEntry() as skill:
            return len(skill.name) + len(skill.description) + len(skill.load_hint)


def sources_are_light(sources: SourceInputs) -> bool:
    """Whether a compile's sources (instruction files and API entries) are little text:
    a first compile counts them all (a project's rule files can be megabytes)."""
    total = sum(len(f.text) for f in sources.instruction_files)
    total += sum(entry_text_bytes(m) for m in sources.memory)
    total += sum(entry_text_bytes(r) for r in sources.rules)
    total += sum(entry_text_bytes(s) for s in sources.skills)
    return total <= LIGHT_BYTES


# Bytes of named paths that a rule matched by path scans (an RE2 pass over them per rule)
# per byte of source text counted: ~160 MB/s scanned here with 64 globs a rule, against
# ~3 MB/s counted on the slowest vocabulary. 768 such rules against the 4,096 paths a
# turn may name (textscan.MAX_PATHS) scan ~115 MB: ~0.7 s, from a few KB of rule text.
SCANNED_PER_COUNTED = 48


def prompt_is_light(sources: SourceInputs, paths: Sequence[str]) -> bool:
    """Whether making a system prompt is little work: its sources little text (see
    `sources_are_light`), and the paths the turn names, scanned once by each rule matched
    by path, few bytes times those rules."""
    if not sources_are_light(sources):
        return False
    if not paths:
        return True
    matched = sum(1 for r in sources.rules if r.activation == RuleActivation.MATCHED)
    scanned = matched * sum(len(p) + 1 for p in paths)
    return scanned <= SCANNED_PER_COUNTED * LIGHT_BYTES


def renderings_are_light(view_tokens: int, formats: int) -> bool:
    """Whether rendering `formats` provider bodies of a view of `view_tokens` is little
    work."""
    return view_tokens * formats <= RENDER_LIGHT_TOKENS


def images_are_light(messages: Iterable[ViewMessage]) -> bool:
    """Whether the images of these messages of a view, which a compile reads (inline)
    and encodes into its renderings, are few bytes. They sit after the memo's cut, so
    every step reads them again while they stay there, however little is new."""
    sizes = {
        p.attachment.artifact_id: p.attachment.size_bytes
        for m in messages
        for p in m.parts
        if p.attachment is not None
    }
    return sum(sizes.values()) <= LIGHT_BYTES
