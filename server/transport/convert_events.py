"""Protobuf <-> domain for sessions, events and their parts. Validation of wire shape
(required oneofs, enum ranges) happens here; limits are the service's."""

from __future__ import annotations

from google.protobuf import timestamp_pb2

from ctxcc.v1 import common_pb2, event_pb2, session_pb2
from server.domain.errors import invalid
from server.domain.model import (
    ArtifactRef,
    AssistantMessage,
    Attachment,
    BrowserElement,
    BrowserSelection,
    ContentPart,
    Event,
    ImportedMessage,
    NativeState,
    NewEvent,
    Payload,
    Role,
    Route,
    Session,
    ToolCall,
    ToolResult,
    TurnCancelled,
    TurnCompleted,
    TurnStarted,
    UserMessage,
)
from server.domain.thinking import GEMINI_KIND, KIND, OPENAI_KIND, loggable_state


def timestamp(ns: int) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromNanoseconds(ns)
    return ts


# -- routes and references ------------------------------------------------------------


def route_in(msg: common_pb2.Route) -> Route:
    return Route(msg.connection, msg.protocol, msg.endpoint, msg.model)


def route_out(route: Route) -> common_pb2.Route:
    return common_pb2.Route(
        connection=route.connection,
        protocol=route.protocol,
        endpoint=route.endpoint,
        model=route.model,
    )


def artifact_in(msg: common_pb2.ArtifactRef, field: str) -> ArtifactRef:
    if not msg.artifact_id:
        raise invalid(f"{field}.artifact_id", f"{field}.artifact_id is required")
    return ArtifactRef(
        artifact_id=msg.artifact_id,
        mime_type=msg.mime_type,
        size_bytes=msg.size_bytes,
        sha256=msg.sha256,
        width=msg.width,
        height=msg.height,
    )


def artifact_out(ref: ArtifactRef) -> common_pb2.ArtifactRef:
    return common_pb2.ArtifactRef(
        artifact_id=ref.artifact_id,
        mime_type=ref.mime_type,
        size_bytes=ref.size_bytes,
        sha256=ref.sha256,
        width=ref.width,
        height=ref.height,
    )


def element_in(msg: common_pb2.BrowserElement, field: str) -> BrowserElement:
    if not msg.url:
        raise invalid(f"{field}.url", f"{field}.url is required")
    return BrowserElement(
        url=msg.url,
        selector=msg.selector,
        tag=msg.tag,
        text=msg.text,
        attributes=tuple(sorted(msg.attributes.items())),
    )


def element_out(el: BrowserElement) -> common_pb2.BrowserElement:
    return common_pb2.BrowserElement(
        url=el.url, selector=el.selector, tag=el.tag, text=el.text, attributes=dict(el.attributes)
    )


def parts_in(parts: list[common_pb2.ContentPart], field: str) -> tuple[ContentPart, ...]:
    out: list[ContentPart] = []
    for i, part in enumerate(parts):
        f = f"{field}[{i}]"
        match part.WhichOneof("part"):
            case "text":
                out.append(ContentPart(text=part.text))
            case "attachment":
                out.append(ContentPart(attachment=artifact_in(part.attachment, f"{f}.attachment")))
            case "browser_element":
                el = element_in(part.browser_element, f"{f}.browser_element")
                out.append(ContentPart(browser_element=el))
            case _:
                raise invalid(f, f"{f} has no content")
    return tuple(out)


def parts_out(parts: tuple[ContentPart, ...]) -> list[common_pb2.ContentPart]:
    out: list[common_pb2.ContentPart] = []
    for part in parts:
        if part.text is not None:
            out.append(common_pb2.ContentPart(text=part.text))
        elif part.attachment is not None:
            out.append(common_pb2.ContentPart(attachment=artifact_out(part.attachment)))
        elif part.browser_element is not None:
            out.append(common_pb2.ContentPart(browser_element=element_out(part.browser_element)))
    return out


def call_in(msg: common_pb2.ToolCall, field: str) -> ToolCall:
    if not msg.call_id:
        raise invalid(f"{field}.call_id", f"{field}.call_id is required")
    if not msg.name:
        raise invalid(f"{field}.name", f"{field}.name is required")
    return ToolCall(msg.call_id, msg.name, msg.arguments_json)


def call_out(call: ToolCall) -> common_pb2.ToolCall:
    return common_pb2.ToolCall(
        call_id=call.call_id, name=call.name, arguments_json=call.arguments_json
    )


def _has_text(parts: tuple[ContentPart, ...]) -> bool:
    return any(p.text or p.attachment or p.browser_element for p in parts)


# -- events ---------------------------------------------------------------------------


# What the native state kinds that providers take back must hold (domain/thinking.py).
_STATE_SHAPES = {
    KIND: (
        "the JSON array of the thinking and redacted_thinking blocks the API returned, "
        "each with its signature (or data)"
    ),
    GEMINI_KIND: "a JSON object from each signed call's call id to its base64 thoughtSignature",
    OPENAI_KIND: (
        "the JSON array of the response's reasoning items, each with its summary and "
        "encrypted_content"
    ),
}


def payload_in(ev: event_pb2.Event, field: str) -> Payload:
    kind = ev.WhichOneof("payload")
    match kind:
        case "user_message":
            parts = parts_in(list(ev.user_message.parts), f"{field}.user_message.parts")
            if not _has_text(parts):
                raise invalid(f"{field}.user_message", "a user message needs non-empty content")
            return UserMessage(parts)
        case "assistant_message":
            m = ev.assistant_message
            parts = parts_in(list(m.parts), f"{field}.assistant_message.parts")
            calls = tuple(
                call_in(c, f"{field}.assistant_message.tool_calls[{i}]")
                for i, c in enumerate(m.tool_calls)
            )
            # A response that holds only thinking state (it stopped at its output cap while
            # the model reasoned) is logged as it came; like one with reasoning text only,
            # it leaves nothing in a view, so its state is sent nowhere.
            if (
                not _has_text(parts)
                and not calls
                and not m.reasoning
                and not m.HasField("native_state")
            ):
                raise invalid(f"{field}.assistant_message", "an assistant message is empty")
            native = None
            if m.HasField("native_state"):
                s = m.native_state
                if not loggable_state(s.kind, s.data):
                    # Sent on, malformed state fails every request of its turn.
                    raise invalid(
                        f"{field}.assistant_message.native_state.data",
                        f"native state of kind {s.kind!r} must be {_STATE_SHAPES[s.kind]}",
                    )
                native = NativeState(s.route_id, s.kind, s.data)
            route = route_in(m.route) if m.HasField("route") else None
            return AssistantMessage(parts, calls, m.reasoning, native, route)
        case "tool_call":
            return call_in(ev.tool_call, f"{field}.tool_call")
        case "tool_result":
            r = ev.tool_result
            if not r.call_id:
                raise invalid(f"{field}.tool_result.call_id", "tool_result.call_id is required")
            if r.WhichOneof("content") == "blob":
                raise invalid(
                    f"{field}.tool_result.blob",
                    "send results as text; the daemon decides what becomes a blob",
                )
            return ToolResult(r.call_id, r.tool_name, text=r.text, is_error=r.is_error)
        case "imported_message":
            m2 = ev.imported_message
            if not m2.origin_session_id:
                raise invalid(f"{field}.imported_message.origin_session_id", "origin is required")
            if m2.role not in {int(r) for r in Role}:
                raise invalid(f"{field}.imported_message.role", "role must be set")
            parts = parts_in(list(m2.parts), f"{field}.imported_message.parts")
            if not _has_text(parts):
                # As a user message: with nothing in it, a view of only imports would
                # send no message at all, which every provider refuses.
                raise invalid(f"{field}.imported_message", "an imported message needs content")
            return ImportedMessage(m2.origin_session_id, m2.origin_seq, Role(m2.role), parts)
        case "attachment":
            return Attachment(artifact_in(ev.attachment, f"{field}.attachment"))
        case "browser_element":
            return BrowserSelection(element_in(ev.browser_element, f"{field}.browser_element"))
        case "turn_started":
            return TurnStarted(ev.turn_started.turn_id)
        case "turn_cancelled":
            c = ev.turn_cancelled
            return TurnCancelled(c.reason, c.keep_reasoning)
        case "turn_completed":
            return TurnCompleted()
        case _:
            raise invalid(f"{field}.payload", f"{field} has no payload")


def events_in(events: list[event_pb2.Event]) -> tuple[NewEvent, ...]:
    return tuple(
        NewEvent(ev.event_id, payload_in(ev, f"events[{i}]")) for i, ev in enumerate(events)
    )


def event_out(event: Event) -> event_pb2.Event:
    out = event_pb2.Event(
        seq=event.seq, event_id=event.event_id, create_time=timestamp(event.create_time_ns)
    )
    p = event.payload
    match p:
        case UserMessage(parts=parts):
            out.user_message.parts.extend(parts_out(parts))
        case AssistantMessage():
            m = out.assistant_message
            m.parts.extend(parts_out(p.parts))
            m.tool_calls.extend(call_out(c) for c in p.tool_calls)
            m.reasoning = p.reasoning
            if p.native_state is not None:
                s = p.native_state
                m.native_state.CopyFrom(
                    common_pb2.ProviderNativeState(route_id=s.route_id, kind=s.kind, data=s.data)
                )
            if p.route is not None:
                m.route.CopyFrom(route_out(p.route))
        case ToolCall():
            out.tool_call.CopyFrom(call_out(p))
        case ToolResult():
            r = out.tool_result
            r.call_id, r.tool_name, r.is_error = p.call_id, p.tool_name, p.is_error
            if p.blob is not None:
                b = p.blob
                r.blob.CopyFrom(
                    common_pb2.BlobRef(sha256=b.sha256, size_bytes=b.size_bytes, preview=b.preview)
                )
            else:
                r.text = p.text or ""
        case ImportedMessage():
            i = out.imported_message
            i.origin_session_id, i.origin_seq = p.origin_session_id, p.origin_seq
            i.role = event_pb2.MessageRole.ValueType(int(p.role))
            i.parts.extend(parts_out(p.parts))
        case Attachment(ref=ref):
            out.attachment.CopyFrom(artifact_out(ref))
        case BrowserSelection(element=el):
            out.browser_element.CopyFrom(element_out(el))
        case TurnStarted(turn_id=turn_id):
            out.turn_started.turn_id = turn_id
        case TurnCancelled():
            out.turn_cancelled.reason = p.reason
            out.turn_cancelled.keep_reasoning = p.keep_reasoning
        case TurnCompleted():
            out.turn_completed.SetInParent()
    return out


# -- sessions -------------------------------------------------------------------------


def session_in(msg: session_pb2.Session) -> Session:
    return Session(
        session_id=msg.session_id,
        create_time_ns=0,
        update_time_ns=0,
        workspace_id=msg.workspace_id,
        project_id=msg.project_id,
        labels=tuple(sorted(msg.labels.items())),
        project_root=msg.project_root,
        working_directory=msg.working_directory,
    )


def session_out(s: Session) -> session_pb2.Session:
    out = session_pb2.Session(
        session_id=s.session_id,
        create_time=timestamp(s.create_time_ns),
        update_time=timestamp(s.update_time_ns),
        workspace_id=s.workspace_id,
        project_id=s.project_id,
        labels=dict(s.labels),
        head_seq=s.head_seq,
        project_root=s.project_root,
        working_directory=s.working_directory,
        stored_bytes=s.stored_bytes,
        basis_bytes=s.basis_bytes,
    )
    if s.current_route is not None:
        out.current_route.CopyFrom(route_out(s.current_route))
    return out
