"""Artifact references in appended events are checked against the session's own store.

An attachment must name an artifact uploaded to the same session; its MIME type, size,
digest and dimensions are then taken from the stored record, never from the client's
claim, so views and budgets see what will actually be sent (R-IMG-1). References never
cross sessions: another session's artifact id is simply unknown here.
"""

from __future__ import annotations

import dataclasses

from server.domain.errors import CtxccError, Reason
from server.domain.model import (
    ArtifactRef,
    AssistantMessage,
    Attachment,
    ContentPart,
    ImportedMessage,
    Payload,
    UserMessage,
)
from server.service.ports import EventStore


def _resolved(store: EventStore, session_id: str, ref: ArtifactRef, field: str) -> ArtifactRef:
    record = store.get_artifact_record(session_id, ref.artifact_id)
    if record is None:
        store.get_session(session_id)  # a missing session is reported as such
        raise CtxccError(
            Reason.ARTIFACT_NOT_FOUND,
            f"{field}: artifact {ref.artifact_id!r} was not uploaded to session {session_id!r}; "
            "upload it with ArtifactService.UploadArtifact first",
            artifact_id=ref.artifact_id,
            field=field,
        )
    return ArtifactRef(
        artifact_id=record.artifact_id,
        mime_type=record.mime_type,
        size_bytes=record.size_bytes,
        sha256=record.sha256,
        width=record.width,
        height=record.height,
    )


def _parts(
    store: EventStore, session_id: str, parts: tuple[ContentPart, ...], field: str
) -> tuple[ContentPart, ...]:
    out = []
    for i, part in enumerate(parts):
        if part.attachment is None:
            out.append(part)
            continue
        ref = _resolved(store, session_id, part.attachment, f"{field}.parts[{i}].attachment")
        out.append(dataclasses.replace(part, attachment=ref))
    return tuple(out)


def names_artifacts(payload: Payload) -> bool:
    """Whether `resolve_references` reads the session's artifact store for `payload`."""
    match payload:
        case Attachment():
            return True
        case (
            UserMessage(parts=parts) | AssistantMessage(parts=parts) | ImportedMessage(parts=parts)
        ):
            return any(p.attachment for p in parts)
    return False


def resolve_references(store: EventStore, session_id: str, payload: Payload, field: str) -> Payload:
    """Blocking: the payload with every artifact reference checked and filled from the store."""
    match payload:
        case Attachment(ref=ref):
            return Attachment(_resolved(store, session_id, ref, f"{field}.attachment"))
        case UserMessage(parts=parts) if any(p.attachment for p in parts):
            return UserMessage(_parts(store, session_id, parts, f"{field}.user_message"))
        case AssistantMessage(parts=parts) if any(p.attachment for p in parts):
            fixed = _parts(store, session_id, parts, f"{field}.assistant_message")
            return dataclasses.replace(payload, parts=fixed)
        case ImportedMessage(parts=parts) if any(p.attachment for p in parts):
            fixed = _parts(store, session_id, parts, f"{field}.imported_message")
            return dataclasses.replace(payload, parts=fixed)
    return payload
