"""Records the daemon keeps beside the event log: checkpoints, compiles, usage, route state."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from server.domain.model import Route


class CheckpointKind(enum.IntEnum):
    MODEL_SUMMARY = 1
    BUILTIN = 2


# Bytes of each message's digest kept in a stored per-message table (`message_digests`):
# collisions among one session's messages are negligible at 64 bits.
MESSAGE_DIGEST_BYTES = 8


@dataclass(frozen=True, slots=True)
class Checkpoint:
    checkpoint_id: str
    session_id: str
    covers_through_seq: int
    summary: str
    source_route: Route | None
    portable: bool
    covered_digest: str
    kind: CheckpointKind
    create_time_ns: int
    origin_session_id: str = ""


@dataclass(frozen=True, slots=True)
class DamagedCheckpoint:
    """A checkpoint record that no longer decodes. Its id and creation time survive in
    its key; compiles pass over it to the next older checkpoint, listings mark it."""

    checkpoint_id: str
    session_id: str
    create_time_ns: int


@dataclass(frozen=True, slots=True)
class Usage:
    input_tokens: int
    output_tokens: int
    cached_input_tokens: int = 0
    reasoning_tokens: int = 0


@dataclass(frozen=True, slots=True)
class CompileRecord:
    """What a compile promised, kept so a later usage report can be matched to it."""

    compile_id: str
    session_id: str
    route: Route
    event_boundary: int
    estimated_input_tokens: int
    estimate_method: int
    create_time_ns: int
    usage: Usage | None = None
    # (section kind, digest) of the view's system sections, to report changes next time.
    section_digests: tuple[tuple[int, str], ...] = ()
    # Estimate basis (see compiler/estimate.py): lets this compile's usage become a baseline.
    message_count: int = 0
    messages_digest: str = ""
    fixed_tokens: int = 0
    raw_delta: int | None = None
    baseline_tokens: int = 0
    # The local count of the whole view (sum of its layers).
    ledger_tokens: int = 0
    # Per message of the view: an 8-byte digest prefix each, and its tokens, so a later
    # estimate can subtract what left the view (baseline - removed + added).
    message_digests: bytes = b""
    message_tokens: tuple[int, ...] = ()
    # Tokens of the baseline's messages that had left the view (0: a pure append).
    removed_tokens: int = 0
    # Messages that entered the view since the baseline minus those that left it. None
    # in records written before it was kept, by daemons that counted neither tool calls'
    # ids nor their results' (see before_call_ids).
    message_change: int | None = None
    # What the inspector's timeline draws. Records written before these fields existed
    # read with the defaults (empty layers, zero budget) and are shown as "not recorded".
    layer_tokens: tuple[tuple[int, int], ...] = ()  # (layer number, tokens)
    context_window: int = 0
    # The most the model may write, as the compile had it (a request's `limits` may set
    # it): a usage report answers the next reserve with it. 0: none known, or a record
    # written before it was kept.
    max_output_tokens: int = 0
    input_budget: int = 0
    decision: int = 0
    changed_sections: tuple[int, ...] = ()
    checkpoint_id: str = ""
    fallback_reasons: tuple[int, ...] = ()
    # Content digest of the stored basis (everything the compile read besides the log),
    # from which the view can be rebuilt; empty in records written before bases existed.
    basis_digest: str = ""
    # The create time of the session the compile read: a session deleted and created
    # again under its id while the compile ran is another one, and must not take its
    # record. 0 (not checked) in records written before it was kept.
    session_create_time_ns: int = 0
    # On disk only: the stored chunks the per-message table starts with (its rest is in
    # message_digests/message_tokens; see domain/table_chunks.py). The store joins them
    # on reading, so a record in memory holds its whole table and none.
    table_chunks: tuple[str, ...] = ()

    @property
    def before_call_ids(self) -> bool:
        """Written by a daemon that counted neither tool calls' ids nor their results'
        (records without message_change): a rebuild counts its messages that way
        (tokens.BEFORE_CALL_IDS)."""
        return self.message_change is None


@dataclass(frozen=True, slots=True)
class RouteState:
    """Per (session, route): the real-token baseline and the output reserve (R-BUD-2, R-EST-1)."""

    route_id: str
    baseline_input_tokens: int
    baseline_compile_id: str
    last_output_tokens: int
    update_time_ns: int
    # The baseline view's message prefix and fixed tokens (pure-append check).
    message_count: int = 0
    messages_digest: str = ""
    fixed_tokens: int = 0
    # Reported change / estimated change, smoothed. Older records carry it; the
    # daemon-wide RouteModel's ratio is used instead.
    calibration: float = 1.0
    samples: int = 0
    # The baseline view's per-message digests and tokens (see CompileRecord).
    message_digests: bytes = b""
    message_tokens: tuple[int, ...] = ()
    # On disk only, as CompileRecord.table_chunks.
    table_chunks: tuple[str, ...] = ()
    # On disk only: the table is the baseline compile's (a usage report's state), so it
    # is read from that record instead of being stored twice (none of it inline).
    table_of_baseline: bool = False
    # The baseline compile's event boundary and creation time: a report for an older
    # compile, arriving late (a client's retry), does not take the baseline back to it
    # (R-EST-1: the last request's usage). 0 in states written before they were kept.
    baseline_seq: int = 0
    baseline_create_ns: int = 0


@dataclass(frozen=True, slots=True)
class RouteModel:
    """Daemon-wide, per route: reported ~ ratio * local + overhead (compiler/route_model.py)."""

    route_id: str
    ratio: float = 1.0
    # Models written before `changes` existed: (reported / local, weight) per change.
    # They seed the fit as changes without message counts until new changes replace them.
    ratio_observations: tuple[tuple[float, float], ...] = ()
    delta_samples: int = 0
    overhead: float = 0.0
    overhead_spread: float = 0.0
    full_samples: int = 0
    # Smoothed local count of the requests the overhead was learned from.
    full_local: float = 0.0
    update_time_ns: int = 0
    # Provider tokens per message beyond the local count's framing (chat templates,
    # tool-call blocks), learned with the ratio.
    framing: float = 0.0
    # The latest in-session changes behind ratio and framing:
    # (local change, reported change, messages added).
    changes: tuple[tuple[int, int, int], ...] = ()


# What a usage report teaches its route's model (called once, inside the store's write).
Learn = Callable[[RouteModel | None], RouteModel]
# A usage report's route state (None: the report leaves the session's baseline as it is)
# and learner, made from the compile's record as the store reads it for the report.
UsagePlan = Callable[[CompileRecord], tuple[RouteState | None, Learn | None]]


@dataclass(frozen=True, slots=True)
class ArtifactRecord:
    session_id: str
    artifact_id: str
    mime_type: str
    size_bytes: int
    sha256: str
    width: int
    height: int
    create_time_ns: int
