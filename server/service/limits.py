"""Limits the service enforces before anything is written; each answers with a reason."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ServiceLimits:
    max_events_per_append: int = 1_000
    # Encoded size of one event after large tool results moved to blobs.
    max_event_bytes: int = 1 << 20
    # A tool result larger than this becomes a content-addressed blob with a preview.
    blob_threshold_bytes: int = 16 << 10
    blob_preview_chars: int = 2_000
    max_tool_result_bytes: int = 32 << 20
    max_artifact_bytes: int = 20 << 20
    max_page_size: int = 1_000
    default_page_size: int = 100
    watch_queue_size: int = 256
    # Every append is offered to each watcher of its session on the event loop, and each
    # holds a queue: 8,000 watches of one session made its appends spend seconds there.
    max_watchers_per_session: int = 64
    max_watchers: int = 4_096
