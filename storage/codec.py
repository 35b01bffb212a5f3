"""Encoding of domain values into versioned on-disk envelopes.

Bodies are MessagePack produced by msgspec from the frozen domain dataclasses and
decoded with type validation, so a torn or foreign record fails loudly as
`CorruptRecordError` instead of yielding a half-filled value.
"""

from __future__ import annotations

import threading
from typing import Any, TypeVar

import msgspec
from google.protobuf.message import DecodeError as ProtoDecodeError

from ctxcc.storage.v1 import records_pb2
from server.adapters.msgpack_pieces import msgpack_pieces
from server.adapters.protowire import varint
from server.domain.errors import CtxccError, Reason
from server.domain.model import KIND_PAYLOADS, Event, EventKind, Payload, kind_of
from storage.schema import SCHEMA_VERSION

T = TypeVar("T")

_encoder = msgspec.msgpack.Encoder()
_decoders: dict[type[Any], msgspec.msgpack.Decoder[Any]] = {}
# msgspec (0.22) builds a dataclass's type info lazily and caches it on the class while
# building it; two threads building it at once crash the process (SIGSEGV in worker
# threads reading records right after a restart). Decoders are built one at a time;
# a built decoder is safe to share.
_decoders_lock = threading.Lock()


class CorruptRecordError(CtxccError):
    """A stored record does not decode as the type its key promises."""

    def __init__(self, message: str) -> None:
        super().__init__(Reason.RECORD_CORRUPT, "a stored record is damaged")
        self.detail = message  # for the daemon's log, not for the wire


def _decoder(cls: type[T]) -> msgspec.msgpack.Decoder[T]:
    dec = _decoders.get(cls)
    if dec is None:
        with _decoders_lock:
            dec = _decoders.get(cls)
            if dec is None:
                dec = _decoders[cls] = msgspec.msgpack.Decoder(cls)
    return dec


def encode_value(value: object) -> bytes:
    body = msgpack_pieces(value)
    if len(body) == 1:
        rec = records_pb2.Record(
            schema_version=SCHEMA_VERSION, type=type(value).__name__, body=body[0]
        )
        return rec.SerializeToString()
    # A value of many members (a compile's tools part: 200 tools of 250 KB schemas are
    # ~50 MB): the same bytes as the Record's encoding, its body (field 3, written last)
    # joined from the pieces rather than encoded, then copied into the Record, by calls
    # that each held the GIL ~50-90 ms (msgpack_pieces.py).
    head = records_pb2.Record(schema_version=SCHEMA_VERSION, type=type(value).__name__)
    size = sum(map(len, body))
    return b"".join((head.SerializeToString(), _BODY_TAG, varint(size), *body))


# Record.body: field 3, length-delimited.
_BODY_TAG = varint((3 << 3) | 2)


def decode_value(data: bytes, cls: type[T]) -> T:
    try:
        rec = records_pb2.Record.FromString(data)
        if rec.type != cls.__name__:
            raise CorruptRecordError(f"expected a {cls.__name__} record, found {rec.type!r}")
        return _decoder(cls).decode(rec.body)
    except (msgspec.DecodeError, ProtoDecodeError, ValueError) as exc:
        raise CorruptRecordError(f"undecodable {cls.__name__} record: {exc}") from exc


def encode_payload(payload: Payload) -> bytes:
    return _encoder.encode(payload)


def encode_event(seq: int, event_id: str, create_time_ns: int, payload: Payload) -> bytes:
    rec = records_pb2.EventRecord(
        schema_version=SCHEMA_VERSION,
        seq=seq,
        event_id=event_id,
        create_time_ns=create_time_ns,
        kind=int(kind_of(payload)),
        payload=encode_payload(payload),
    )
    return rec.SerializeToString()


def decode_event(data: bytes, expected_seq: int) -> Event:
    try:
        rec = records_pb2.EventRecord.FromString(data)
        cls = KIND_PAYLOADS[EventKind(rec.kind)]
        payload: Payload = _decoder(cls).decode(rec.payload)
    except (msgspec.DecodeError, ProtoDecodeError, ValueError, KeyError) as exc:
        raise CorruptRecordError(f"undecodable event record at seq {expected_seq}: {exc}") from exc
    if rec.seq != expected_seq:
        raise CorruptRecordError(f"event record says seq {rec.seq}, key says {expected_seq}")
    return Event(
        seq=rec.seq, event_id=rec.event_id, create_time_ns=rec.create_time_ns, payload=payload
    )
