"""Model-written compaction (R-MISC-5 b): when the budget recommends it, the view carries a
ready summarisation prompt for the events before the protected working set. The agent
sends it to a model and submits the summary with CreateCheckpoint, quoting the digest;
the daemon verifies the digest before the checkpoint is ever used.

The prompt must itself fit the window of the model that reads it, so it covers the
oldest messages that fit the view's input budget, not always everything before the
working set: a history too long for one summary is compacted in rounds, each next
prompt starting with the summary so far. Building it costs what it holds, never the
whole history (a session of tens of MB would otherwise copy all of it on every compile).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import compress, repeat
from operator import attrgetter, is_

from server.compiler.tokens import MESSAGE_OVERHEAD, TokenCounter
from server.compiler.view import CompactionRequest, Layer, ViewMessage
from server.domain.model import ArtifactRef, Role
from server.domain.records import Checkpoint, CheckpointKind

INSTRUCTIONS = (
    "Summarise the conversation below so that an assistant can continue the work without "
    "it. Keep: the user's goals and constraints, decisions and their reasons, files and "
    "commands that matter, results of tool calls that are still relevant, errors and how "
    "they were resolved, and open questions. Drop pleasantries and superseded attempts. "
    "Write plain text, at most a few hundred words."
)
# Room for a transcript line's label ("--- tool (result of call_7) (seq 12)").
_LABEL_TOKENS = 16


def _label(m: ViewMessage) -> str:
    label = m.role.name.lower()
    if m.tool_call_id:
        label += f" (result of {m.tool_call_id})"
    return f"--- {label} (seq {m.first_seq})"


def prompt_room(input_budget: int, ratio: float, framing: float) -> int:
    """The local tokens a compaction prompt may hold for the route's provider to count it
    within `input_budget` (projection 9 on): the route model's ratio and its framing for
    the one message the prompt is. A ratio below 1 (a counter that runs high) leaves the
    room as it is: the local count already over-states what the provider counts."""
    if ratio <= 1.0 and framing <= 0.0:
        return input_budget
    return max(0, math.floor((input_budget - max(framing, 0.0)) / max(ratio, 1.0)))


def _image(ref: ArtifactRef) -> str:
    size = f", {ref.width}x{ref.height} pixels" if ref.width and ref.height else ""
    return (
        f"[image {ref.artifact_id} ({ref.mime_type}{size}): the model saw it here; it is not "
        "in this transcript and leaves the conversation with the summary, so describe what "
        "matters in it]"
    )


def _body(m: ViewMessage, images: bool = True) -> str:
    """`images`: the images a message holds are named in its place (projection 6 on;
    before, they were left out unsaid)."""
    if images:
        texts = (
            p.text if p.text else _image(p.attachment) if p.attachment is not None else ""
            for p in m.parts
        )
        body = "\n".join(t for t in texts if t)
    else:
        body = "\n".join(p.text for p in m.parts if p.text)
    for call in m.tool_calls:
        body += f"\n[tool call {call.name} {call.arguments_json}]"
    return body.strip()


_first_seq, _layer = attrgetter("first_seq"), attrgetter("layer")


def working_set_start(messages: Sequence[ViewMessage]) -> int | None:
    """The least non-zero first seq of the working set's messages (None: none), walked
    in C: over budget it is looked for at every step, over the whole view. The first
    working-set message is found by the list's own search (identity first), so only the
    messages from there on are compared (half the time at a view of thousands)."""
    layers = list(map(_layer, messages))
    try:
        first = layers.index(Layer.WORKING_SET)
    except ValueError:
        return None
    in_set = map(is_, layers[first:], repeat(Layer.WORKING_SET))
    tail = map(_first_seq, messages[first:])
    return min(filter(None, compress(tail, in_set)), default=None)


def transcript(messages: Sequence[ViewMessage], images: bool = True) -> str:
    return "\n".join(f"{_label(m)}\n{_body(m, images)}" for m in messages)


def _cut(m: ViewMessage, room: int, images: bool = True) -> str:
    """A message longer than a whole prompt may hold, cut to about `room` tokens (by its
    own characters-per-token), with a marker: it could never be summarised whole."""
    body = _body(m, images)
    # 10 % under the message's own ratio, and room for the marker: a cut can split
    # differently (more tokens per character) than the whole did.
    keep = max(1, len(body) * max(room - _LABEL_TOKENS * 2, 1) * 9 // (10 * max(m.tokens, 1)))
    if keep >= len(body):
        return f"{_label(m)}\n{body}"
    return (
        f"{_label(m)}\n{body[:keep]}\n[... {len(body) - keep} more characters of this message "
        "not shown: it is longer than the model's window]"
    )


def _summary_within(summary: str, most: int, counter: TokenCounter) -> str:
    """`summary` when it counts at most `most` tokens; else its start and its end, about
    `most` tokens together (by its own characters-per-token, 10 % under), with a marker
    between them. A summary larger than the window (one written on a route with a larger
    window, or a portable one from another session) made a prompt the model could not
    read: no round could ever shorten the history, and every step stayed over budget. The
    next summary loses what is cut; without the cut no summary could be made at all."""
    tokens = counter.count(summary)
    if tokens <= most:
        return summary
    keep = len(summary) * max(most - _LABEL_TOKENS * 2, 1) * 9 // (10 * max(tokens, 1))
    head = keep * 2 // 3
    tail = keep - head
    return (
        f"{summary[:head]}\n[... {len(summary) - keep} characters of the summary so far not "
        "shown: with them it is longer than half the model's window. Keep what is shown.]\n"
        f"{summary[len(summary) - tail :] if tail else ''}"
    )


@dataclass(frozen=True, slots=True)
class CompactionMemo:
    """A compaction request and what it was made from. Over budget, every step of a long
    turn asks for the same request (the oldest messages that fit, before the same working
    set), and building its prompt costs what the prompt holds, up to the whole window:
    the next compile takes this one when its inputs are the same objects."""

    start: int
    through: int
    room: int
    # messages[:k+1] of the view it was made for, k the index of the last message it
    # looked at: the first covered message that did not fit, or the last covered one
    # when all fit (`whole`; then no later message may be covered either).
    prefix: tuple[ViewMessage, ...]
    whole: bool
    request: CompactionRequest | None
    # The latest first seq among the prefix's messages: when it is within the range, a
    # range that grows at its end takes none of them in or out.
    prefix_last_seq: int = 0


def compaction_request(
    messages: Sequence[ViewMessage],
    checkpoint: Checkpoint | None,
    working_set_seq: int | None,
    boundary: int,
    max_tokens: int,
    counter: TokenCounter,
    previous: CompactionMemo | None = None,
    *,
    images: bool = True,
    summary_cut: bool = False,
) -> tuple[CompactionRequest | None, CompactionMemo | None]:
    """Covers the oldest messages before the current user message (the protected
    working set) that fit `max_tokens` with the instructions and the summary so far;
    with the memo for the next compile (`previous`: the last compile's). `images`: the
    transcript names the images of the covered messages (projection 6 on);
    `summary_cut`: the summary so far takes at most half of `max_tokens` (projection 14
    on, `_summary_within`)."""
    through = working_set_seq - 1 if working_set_seq is not None else boundary
    model_summary = checkpoint is not None and checkpoint.kind != CheckpointKind.BUILTIN
    start = checkpoint.covers_through_seq + 1 if model_summary and checkpoint else 1
    if through < start:
        return None, None
    parts = [INSTRUCTIONS]
    if model_summary and checkpoint is not None:
        summary = checkpoint.summary
        if summary_cut:
            summary = _summary_within(summary, max_tokens // 2, counter)
        parts.append(f"Summary of the conversation before seq {start}:\n{summary}")
    room = max_tokens - sum(counter.count(p) + MESSAGE_OVERHEAD for p in parts) - _LABEL_TOKENS
    if previous is not None and _holds(previous, messages, start, through, room):
        return previous.request, previous
    where = [
        i for i, m in enumerate(messages) if not m.synthetic and start <= m.first_seq <= through
    ]
    if not where:
        return None, None
    covered = [messages[i] for i in where]
    taken, used = 0, 0
    for m in covered:
        if used + m.tokens + _LABEL_TOKENS > room:
            break
        taken, used = taken + 1, used + m.tokens + _LABEL_TOKENS
    whole = taken == len(covered)
    stop = where[-1] if whole else where[taken]
    if 0 < taken < len(covered):
        # End the covered range before a tool call rather than between it and its result
        # (unless that leaves nothing).
        fits = taken
        while taken > 0 and covered[taken].role is Role.TOOL:
            taken -= 1
        taken = taken or fits
        through_seq = covered[taken].first_seq - 1
    else:
        through_seq = through
    if taken:
        text = transcript(covered[:taken], images)
    else:  # not even the oldest message fits whole
        text = _cut(covered[0], room, images)
        through_seq = max(covered[0].last_seq, covered[0].first_seq)
    parts.append(f"Conversation, seq {start} to {through_seq}:\n{text}")
    request = CompactionRequest(
        from_seq=start, through_seq=through_seq, prompt="\n\n".join(parts), covered_digest=""
    )
    prefix = tuple(messages[: stop + 1])
    last = max((m.first_seq for m in prefix if not m.synthetic), default=0)
    return request, CompactionMemo(start, through, room, prefix, whole, request, last)


def _holds(
    memo: CompactionMemo, messages: Sequence[ViewMessage], start: int, through: int, room: int
) -> bool:
    """Whether `memo`'s request is the one these inputs make: the same start and room, the
    same messages up to the last one it looked at (compared in C; carried messages are
    the same objects), and, when every covered message fit, the same range and no
    covered message after. When they did not all fit, the range may have grown at its
    end (a new turn moved the working set on, as every turn of a chat over budget does):
    the messages that fit, and the first that did not, are the same ones, as long as none
    of them falls in the added range."""
    n = len(memo.prefix)
    if (memo.start, memo.room) != (start, room) or len(messages) < n:
        return False
    if through != memo.through and (
        memo.whole or through < memo.through or memo.prefix_last_seq > memo.through
    ):
        return False
    if tuple(messages[:n]) != memo.prefix:
        return False
    return not memo.whole or not any(
        not m.synthetic and start <= m.first_seq <= through for m in messages[n:]
    )
