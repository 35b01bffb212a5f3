"""Domain values of the event log.

Rules this module keeps:
- every value is a frozen, slotted dataclass of immutable fields (tuples, not lists);
- nothing here knows protobuf, gRPC or storage; transport and storage convert;
- enum numbers equal the proto enum numbers, so conversion is a plain cast.
"""

from __future__ import annotations

import enum
import functools
import hashlib
from dataclasses import dataclass, field


class Role(enum.IntEnum):
    USER = 1
    ASSISTANT = 2
    TOOL = 3
    SYSTEM = 4


class EventKind(enum.IntEnum):
    USER_MESSAGE = 1
    ASSISTANT_MESSAGE = 2
    TOOL_CALL = 3
    TOOL_RESULT = 4
    IMPORTED_MESSAGE = 5
    ATTACHMENT = 6
    BROWSER_ELEMENT = 7
    TURN_STARTED = 8
    TURN_CANCELLED = 9
    TURN_COMPLETED = 10


@dataclass(frozen=True, slots=True)
class Route:
    """Where a request goes (R-ROUTE-1). Its id binds baselines and native state."""

    connection: str = ""
    protocol: str = ""
    endpoint: str = ""
    model: str = ""

    @property
    def route_id(self) -> str:
        # Asked for several times per compile (keys, records, states): hashed once per
        # distinct route.
        return _route_id(self.connection, self.protocol, self.endpoint, self.model)


@functools.lru_cache(maxsize=1024)
def _route_id(connection: str, protocol: str, endpoint: str, model: str) -> str:
    # A unit separator keeps ("a", "bc") and ("ab", "c") apart.
    raw = "\x1f".join((connection, protocol, endpoint, model))
    return hashlib.sha256(raw.encode()).hexdigest()[:24]


@dataclass(frozen=True, slots=True)
class ArtifactRef:
    artifact_id: str
    mime_type: str
    size_bytes: int
    sha256: str
    width: int = 0
    height: int = 0


@dataclass(frozen=True, slots=True)
class BlobRef:
    sha256: str
    size_bytes: int
    preview: str


@dataclass(frozen=True, slots=True)
class BrowserElement:
    url: str
    selector: str = ""
    tag: str = ""
    text: str = ""
    attributes: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class ContentPart:
    """Exactly one of the fields is set (a oneof; transport validates)."""

    text: str | None = None
    attachment: ArtifactRef | None = None
    browser_element: BrowserElement | None = None


@dataclass(frozen=True, slots=True)
class NativeState:
    route_id: str
    kind: str
    data: bytes


@dataclass(frozen=True, slots=True)
class ToolCall:
    call_id: str
    name: str
    arguments_json: str = ""


@dataclass(frozen=True, slots=True)
class UserMessage:
    parts: tuple[ContentPart, ...]


@dataclass(frozen=True, slots=True)
class AssistantMessage:
    parts: tuple[ContentPart, ...] = ()
    tool_calls: tuple[ToolCall, ...] = ()
    reasoning: str = ""
    native_state: NativeState | None = None
    route: Route | None = None


@dataclass(frozen=True, slots=True)
class ToolResult:
    """Exactly one of text and blob is set; large results arrive as text and leave
    the service as a blob reference."""

    call_id: str
    tool_name: str = ""
    text: str | None = None
    blob: BlobRef | None = None
    is_error: bool = False


@dataclass(frozen=True, slots=True)
class ImportedMessage:
    origin_session_id: str
    origin_seq: int
    role: Role
    parts: tuple[ContentPart, ...]


@dataclass(frozen=True, slots=True)
class Attachment:
    ref: ArtifactRef


@dataclass(frozen=True, slots=True)
class BrowserSelection:
    element: BrowserElement


@dataclass(frozen=True, slots=True)
class TurnStarted:
    turn_id: str = ""


@dataclass(frozen=True, slots=True)
class TurnCancelled:
    reason: str = ""
    keep_reasoning: bool = False


@dataclass(frozen=True, slots=True)
class TurnCompleted:
    pass


Payload = (
    UserMessage
    | AssistantMessage
    | ToolCall
    | ToolResult
    | ImportedMessage
    | Attachment
    | BrowserSelection
    | TurnStarted
    | TurnCancelled
    | TurnCompleted
)

PAYLOAD_KINDS: dict[type[Payload], EventKind] = {
    UserMessage: EventKind.USER_MESSAGE,
    AssistantMessage: EventKind.ASSISTANT_MESSAGE,
    ToolCall: EventKind.TOOL_CALL,
    ToolResult: EventKind.TOOL_RESULT,
    ImportedMessage: EventKind.IMPORTED_MESSAGE,
    Attachment: EventKind.ATTACHMENT,
    BrowserSelection: EventKind.BROWSER_ELEMENT,
    TurnStarted: EventKind.TURN_STARTED,
    TurnCancelled: EventKind.TURN_CANCELLED,
    TurnCompleted: EventKind.TURN_COMPLETED,
}
KIND_PAYLOADS: dict[EventKind, type[Payload]] = {k: t for t, k in PAYLOAD_KINDS.items()}


def kind_of(payload: Payload) -> EventKind:
    return PAYLOAD_KINDS[type(payload)]


@dataclass(frozen=True, slots=True)
class NewEvent:
    """An event as the agent sends it, before the log assigns seq and time."""

    event_id: str
    payload: Payload


@dataclass(frozen=True, slots=True)
class Event:
    seq: int
    event_id: str
    create_time_ns: int
    payload: Payload

    @property
    def kind(self) -> EventKind:
        return kind_of(self.payload)


@dataclass(frozen=True, slots=True)
class EventPage:
    """A page of a session's log read for a client: `more` when the read stopped at its
    count or bytes with events left after it (which may all be of other kinds)."""

    events: tuple[Event, ...]
    more: bool
    # Bytes of the events read as stored (those of other kinds included): what the page
    # holds in memory, about (a watch's pages count against --max-watch-bytes-in-memory).
    stored_bytes: int = 0
    # The largest of the events returned, as stored: what one message of the page comes
    # to, about (a watch sets aside twice that for its message in flight).
    largest_bytes: int = 0


@dataclass(frozen=True, slots=True)
class Session:
    session_id: str
    create_time_ns: int
    update_time_ns: int
    workspace_id: str = ""
    project_id: str = ""
    labels: tuple[tuple[str, str], ...] = ()
    current_route: Route | None = None
    head_seq: int = 0
    project_root: str = ""
    working_directory: str = ""
    # Bytes of the session's events, blobs, artifacts, checkpoints and tool definitions:
    # what --max-session-bytes bounds.
    stored_bytes: int = 0
    # Bytes of the parts its compiles stored for their bases: --max-session-basis-bytes.
    basis_bytes: int = 0


@dataclass(frozen=True, slots=True)
class AppendResult:
    first_seq: int
    last_seq: int
    event_ids: tuple[str, ...]
    replayed: bool = False
    # The create time of the session the events went to: which of the sessions ever made
    # under its id (0: not said). Its watchers are told of them, never another one's.
    session_create_ns: int = 0


@dataclass(frozen=True, slots=True)
class AppendBatch:
    """Everything one append writes, prepared by the service, written atomically by the store.

    `blobs` holds the content of large tool results already replaced by references in
    `events`; `request_digest` lets a retried request_id be told from a reused one.
    """

    session_id: str
    events: tuple[NewEvent, ...]
    now_ns: int
    request_id: str = ""
    request_digest: str = ""
    expected_last_seq: int | None = None
    blobs: tuple[tuple[str, bytes], ...] = field(default=())
    added_bytes: int = 0
    # The create time of the session the events' artifact references were checked
    # against (0: nothing to check): a session made again under the id since holds none
    # of those artifacts, and the append must not land in it.
    session_created_ns: int = 0


@dataclass(frozen=True, slots=True)
class DeleteResult:
    deleted_events: int
    deleted_blobs: int
    # The create time of the session deleted (0: unknown, its record was damaged): what
    # is kept of it in memory goes, never what a session made again under its id since
    # keeps (a delete's result can reach the event loop after that one was made).
    create_time_ns: int = 0


def of_deleted(created_ns: int, deleted_ns: int) -> bool:
    """Whether what is kept in memory of the session made at `created_ns` goes with the
    deletion of the one made at `deleted_ns` (a DeleteResult's). Either 0, unknown (a
    damaged record, state not keyed by it), goes with any: only a session made again
    under the id, known to be another, keeps its own."""
    return not deleted_ns or not created_ns or created_ns == deleted_ns


def starts_turn(payload: Payload) -> bool:
    """The one definition of a turn's start, for tool activations, the working set, the
    re-injected request and kept reasoning: a user message (original or imported) or an
    explicit TurnStarted marker. A marker followed by a user message makes an empty turn
    and then the user's, which changes nothing a view shows."""
    return isinstance(payload, (UserMessage, TurnStarted)) or (
        isinstance(payload, ImportedMessage) and payload.role == Role.USER
    )
