"""How big a compiled view is, cheaply, before it is encoded.

Both CompileService paths (the unary `Compile` in compile_servicer.py and the stream steps
in compile_stream.py) decide by it whether a view is encoded on the event loop or in a
thread, and the unary one whether it can fit in one gRPC message at all.
"""

from __future__ import annotations

from server.service.compile_types import CompileResult

# Views with less text than this are converted on the event loop (a thread hop costs
# more than converting them); larger ones in a thread.
ON_LOOP_CHARS = 256 << 10


def view_chars(result: CompileResult) -> int:
    """Characters and bytes the view carries: a cheap stand-in for its encoded size."""
    view = result.view
    text = len(view.system_prompt) + sum(len(p.text or "") for m in view.messages for p in m.parts)
    return (
        text
        + sum(len(b) for _, b in result.attachments)
        + sum(len(body) for _, body, _ in result.renderings)
    )


def size_hint(result: CompileResult) -> int:
    """About the bytes of the view, without walking its messages: ~4 bytes a token."""
    return (
        4 * result.view.budget.ledger_tokens
        + sum(len(b) for _, b in result.attachments)
        + sum(len(body) for _, body, _ in result.renderings)
    )


def unshared_hint(result: CompileResult) -> int:
    """About the bytes of the view that a delta against the stream's last view encodes or
    hashes besides its new messages: attachments, renderings, the compaction prompt."""
    compaction = result.view.compaction
    return (
        (len(compaction.prompt) if compaction is not None else 0)
        + sum(len(b) for _, b in result.attachments)
        + sum(len(body) for _, body, _ in result.renderings)
    )
