"""Model-written compaction (R-MISC-5 b): when the budget recommends it, the view carries a
ready summarisation prompt for the events before the protected working set. The agent
sends it to a model and submits the summary with CreateCheckpoint, quoting the digest;
the daemon verifies the digest before the checkpoint is ever used."""

from __future__ import annotations

from collections.abc import Sequence

from server.compiler.view import CompactionRequest, ViewMessage
from server.domain.records import Checkpoint, CheckpointKind

INSTRUCTIONS = (
    "Summarise the conversation below so that an assistant can continue the work without "
    "it. Keep: the user's goals and constraints, decisions and their reasons, files and "
    "commands that matter, results of tool calls that are still relevant, errors and how "
    "they were resolved, and open questions. Drop pleasantries and superseded attempts. "
    "Write plain text, at most a few hundred words."
)


def transcript(messages: Sequence[ViewMessage]) -> str:
    lines: list[str] = []
    for m in messages:
        body = "\n".join(p.text for p in m.parts if p.text)
        for call in m.tool_calls:
            body += f"\n[tool call {call.name} {call.arguments_json}]"
        label = m.role.name.lower()
        if m.tool_call_id:
            label += f" (result of {m.tool_call_id})"
        lines.append(f"--- {label} (seq {m.first_seq})\n{body.strip()}")
    return "\n".join(lines)


def compaction_request(
    messages: Sequence[ViewMessage],
    checkpoint: Checkpoint | None,
    working_set_seq: int | None,
    boundary: int,
) -> CompactionRequest | None:
    """Covers everything before the current user message (the protected working set)."""
    through = working_set_seq - 1 if working_set_seq is not None else boundary
    model_summary = checkpoint is not None and checkpoint.kind != CheckpointKind.BUILTIN
    start = checkpoint.covers_through_seq + 1 if model_summary and checkpoint else 1
    if through < start:
        return None
    covered = [m for m in messages if not m.synthetic and start <= m.first_seq <= through]
    if not covered:
        return None
    parts = [INSTRUCTIONS]
    if model_summary and checkpoint is not None:
        parts.append(f"Summary of the conversation before seq {start}:\n{checkpoint.summary}")
    parts.append(f"Conversation, seq {start} to {through}:\n{transcript(covered)}")
    return CompactionRequest(
        from_seq=start, through_seq=through, prompt="\n\n".join(parts), covered_digest=""
    )
