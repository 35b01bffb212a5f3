"""Artifact use cases: verified uploads into the session's artifact store (R-CTX-3)."""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass

from server.domain.errors import CtxccError, Reason, invalid
from server.domain.image_size import actual_type, image_size, measurable
from server.domain.records import ArtifactRecord
from server.domain.validation import check_id
from server.service.blocking import Blocking
from server.service.ports import Clock, EventStore, IdSource

_SHA = re.compile(r"[0-9a-f]{64}")
log = logging.getLogger("ctxcc.artifacts")

_MIME = re.compile(r"[a-z0-9][a-z0-9!#$&^_.+-]{0,63}/[a-z0-9][a-z0-9!#$&^_.+-]{0,63}")


@dataclass(frozen=True, slots=True)
class ArtifactHeader:
    session_id: str
    mime_type: str
    size_bytes: int
    sha256: str
    width: int = 0
    height: int = 0
    request_id: str = ""


class ArtifactUseCases:
    def __init__(
        self, store: EventStore, blocking: Blocking, clock: Clock, ids: IdSource, max_bytes: int
    ) -> None:
        self._store = store
        self._blocking = blocking
        self._clock = clock
        self._ids = ids
        self.max_bytes = max_bytes

    def check_header(self, h: ArtifactHeader) -> None:
        check_id("header.session_id", h.session_id)
        check_id("header.request_id", h.request_id, required=False)
        if not _MIME.fullmatch(h.mime_type):
            raise invalid("header.mime_type", "mime_type must look like 'image/png'")
        if not _SHA.fullmatch(h.sha256):
            raise invalid("header.sha256", "sha256 must be 64 lower-case hex digits")
        if h.size_bytes > self.max_bytes:
            raise self.too_large(h.size_bytes)

    async def begin(self, h: ArtifactHeader) -> int:
        """Checks an upload's header and returns the create time of the session it names
        (SESSION_NOT_FOUND before any bytes are sent when there is none). The bytes
        follow in the same stream, which can outlast the session: `put` is given this
        time so an upload never lands in a session made again under the id meanwhile."""
        self.check_header(h)
        session = await self._blocking.run(self._store.get_session, h.session_id)
        return session.create_time_ns

    def too_large(self, size: int) -> CtxccError:
        return CtxccError(
            Reason.ARTIFACT_TOO_LARGE,
            f"artifact of {size} bytes is over the limit of {self.max_bytes}",
            limit=str(self.max_bytes),
        )

    async def put(self, h: ArtifactHeader, data: bytes, life: int = 0) -> ArtifactRecord:
        """`life`: the create time `begin` read, when the caller read it; the session
        deleted (and perhaps made again) since is SESSION_NOT_FOUND."""
        self.check_header(h)
        # Hashing and measuring read the bytes (up to the artifact limit): off the loop.
        actual, mime_type, measured = await self._blocking.run(
            _digest_type_and_size, h.mime_type, data
        )
        if len(data) != h.size_bytes or actual != h.sha256:
            raise CtxccError(
                Reason.ARTIFACT_CHECKSUM_MISMATCH,
                f"received {len(data)} bytes that do not match the declared size and sha256",
            )
        if h.request_id:
            # The id derives from the request id, so a retried upload finds the first one.
            key = f"{h.session_id}\x00{h.request_id}".encode()
            artifact_id = "a-" + hashlib.sha256(key).hexdigest()[:24]
        else:
            artifact_id = self._ids.new_id("a-")
        if mime_type != h.mime_type:
            log.info(
                "artifact %s in session %s: declared %s, its bytes are %s (stored)",
                artifact_id,
                h.session_id,
                h.mime_type,
                mime_type,
            )
        width, height = _dimensions(h, artifact_id, measured)
        record = ArtifactRecord(
            session_id=h.session_id,
            artifact_id=artifact_id,
            mime_type=mime_type,
            size_bytes=h.size_bytes,
            sha256=h.sha256,
            width=width,
            height=height,
            create_time_ns=self._clock.now_ns(),
        )
        return await self._blocking.run(self._store.put_artifact, record, data, life)

    async def record(self, session_id: str, artifact_id: str) -> ArtifactRecord:
        """The artifact's record without its bytes: a download takes its memory budget
        from the recorded size before `data` reads anything."""
        check_id("session_id", session_id)
        check_id("artifact_id", artifact_id)
        await self._blocking.run(self._store.get_session, session_id)
        record = await self._blocking.run(self._store.get_artifact_record, session_id, artifact_id)
        if record is None:
            raise _not_found(session_id, artifact_id)
        return record

    async def data(self, record: ArtifactRecord) -> bytes:
        """The bytes of `record` (by its sha256, so they match the record whatever was
        stored under its id since); gone with a session deleted meanwhile."""
        data = await self._blocking.run(self._store.get_blob, record.sha256)
        if data is None:
            raise _not_found(record.session_id, record.artifact_id)
        return data


def _digest_type_and_size(mime_type: str, data: bytes) -> tuple[str, str, tuple[int, int] | None]:
    """Blocking: the bytes' sha256 (hex), their type (the declared one, or the one they
    are when declared as another image type the daemon reads: actual_type) and the size
    their header states (image_size)."""
    mime_type = actual_type(mime_type, data) or mime_type
    return hashlib.sha256(data).hexdigest(), mime_type, image_size(mime_type, data)


def _dimensions(
    h: ArtifactHeader, artifact_id: str, measured: tuple[int, int] | None
) -> tuple[int, int]:
    """The width and height stored for an upload: `measured` (what its bytes state when
    they are a PNG, JPEG, GIF or WebP; the client's claim is not checked against it, only
    logged when it differs: providers refuse by the real size); else the client's claim,
    with a warning when the bytes do not read as the image type they were declared as."""
    if measured is not None:
        if (h.width or h.height) and (h.width, h.height) != measured:
            log.info(
                "artifact %s in session %s: declared %dx%d, its bytes are %dx%d (stored)",
                artifact_id,
                h.session_id,
                h.width,
                h.height,
                *measured,
            )
        return measured
    if measurable(h.mime_type):
        log.warning(
            "artifact %s in session %s: its bytes are not a readable %s; the declared "
            "%dx%d is stored",
            artifact_id,
            h.session_id,
            h.mime_type,
            h.width,
            h.height,
        )
    return h.width, h.height


def _not_found(session_id: str, artifact_id: str) -> CtxccError:
    return CtxccError(
        Reason.ARTIFACT_NOT_FOUND,
        f"artifact {artifact_id!r} does not exist in session {session_id!r}",
        artifact_id=artifact_id,
    )
