"""Protobuf <-> domain for checkpoints and usage."""

from __future__ import annotations

from ctxcc.v1 import checkpoint_pb2
from ctxcc.v1 import compile_service_pb2 as pb
from server.domain.errors import invalid
from server.domain.model import Route
from server.domain.records import Checkpoint, CheckpointKind, DamagedCheckpoint, Usage
from server.service.compile_types import UsageResult
from server.transport.convert_events import route_in, route_out, timestamp


def checkpoint_out(c: Checkpoint | DamagedCheckpoint) -> checkpoint_pb2.Checkpoint:
    if isinstance(c, DamagedCheckpoint):
        return checkpoint_pb2.Checkpoint(
            checkpoint_id=c.checkpoint_id,
            session_id=c.session_id,
            create_time=timestamp(c.create_time_ns),
            damaged=True,
        )
    out = checkpoint_pb2.Checkpoint(
        checkpoint_id=c.checkpoint_id,
        session_id=c.session_id,
        covers_through_seq=c.covers_through_seq,
        summary=c.summary,
        portable=c.portable,
        covered_digest=c.covered_digest,
        kind=checkpoint_pb2.CheckpointKind.ValueType(int(c.kind)),
        create_time=timestamp(c.create_time_ns),
        origin_session_id=c.origin_session_id,
    )
    if c.source_route is not None:
        out.source_route.CopyFrom(route_out(c.source_route))
    return out


def checkpoint_in(msg: checkpoint_pb2.Checkpoint) -> Checkpoint:
    kind = msg.kind or checkpoint_pb2.CHECKPOINT_KIND_MODEL_SUMMARY
    if kind not in {int(k) for k in CheckpointKind}:
        raise invalid("checkpoint.kind", f"unknown checkpoint kind {msg.kind}")
    return Checkpoint(
        checkpoint_id="",
        session_id=msg.session_id,
        covers_through_seq=msg.covers_through_seq,
        summary=msg.summary,
        source_route=route_in(msg.source_route) if msg.HasField("source_route") else None,
        portable=msg.portable,
        covered_digest=msg.covered_digest,
        kind=CheckpointKind(kind),
        create_time_ns=0,
        origin_session_id=msg.origin_session_id,
    )


def usage_in(msg: pb.ReportUsageRequest) -> tuple[Usage, Route | None]:
    """A usage report's counts and the route it names (None: not given)."""
    usage = Usage(
        input_tokens=msg.input_tokens,
        output_tokens=msg.output_tokens,
        cached_input_tokens=msg.cached_input_tokens,
        reasoning_tokens=msg.reasoning_tokens,
    )
    return usage, route_in(msg.route) if msg.HasField("route") else None


def usage_out(result: UsageResult) -> pb.ReportUsageResponse:
    return pb.ReportUsageResponse(
        estimated_input_tokens=result.estimated_input_tokens,
        error_tokens=result.error_tokens,
        relative_error=result.relative_error,
        replayed=result.replayed,
        next_output_reserve=result.next_output_reserve,
    )
