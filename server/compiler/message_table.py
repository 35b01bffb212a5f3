"""A view's per-message fingerprints and token counts, with what the estimate and the
compile record derive from them: the 8-byte digest prefixes joined (the record's removal
table) and the sha256 of the joined digests (`messages_digest`, of the whole view or of
its first n messages: the baseline check).

The incremental projection extends the table of the memo it continued (whose messages
are the view's first messages) by the new messages: the prefixes joined and the hash
states are carried over, so a step costs what its new messages cost, and the hash of the
baseline's messages (usually the previous step's view) continues from a state kept where
an earlier table was extended. The result is the same as building it in one piece (the
property tests compare views and tables)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from server.domain.records import MESSAGE_DIGEST_BYTES

if TYPE_CHECKING:
    from hashlib import _Hash

# Bytes of each message digest kept for removal accounting (the stored table's width).
DIGEST_PREFIX = MESSAGE_DIGEST_BYTES


# Hash states kept at the lengths a table was continued from (the latest few).
_MARKS = 4


@dataclass(frozen=True, slots=True)
class MessageTable:
    digests: tuple[bytes, ...]
    tokens: tuple[int, ...]
    # The first DIGEST_PREFIX bytes of each digest, joined.
    table: bytes
    # sha256 over all `digests` joined, and (n, sha256 over the first n) at the lengths
    # this table was continued from, ascending. Hash states are copied, never updated.
    state: _Hash
    marks: tuple[tuple[int, _Hash], ...] = ()

    def fold(self, n: int | None = None) -> str:
        """sha256 (hex) of the first `n` digests joined (all of them by default)."""
        if n is None or n >= len(self.digests):
            return self.state.copy().hexdigest()
        at, state = next(((k, h) for k, h in reversed(self.marks) if k <= n), (0, None))
        h = state.copy() if state is not None else hashlib.sha256()
        h.update(b"".join(self.digests[at:n]))
        return h.hexdigest()

    def extend(self, digests: Sequence[bytes], tokens: Sequence[int]) -> MessageTable:
        """The table of these messages and `digests`/`tokens` after them."""
        if not digests:
            return self
        state = self.state.copy()
        state.update(b"".join(digests))
        marks = (*self.marks, (len(self.digests), self.state))[-_MARKS:]
        return MessageTable(
            self.digests + tuple(digests),
            self.tokens + tuple(tokens),
            self.table + b"".join(d[:DIGEST_PREFIX] for d in digests),
            state,
            marks,
        )


EMPTY = MessageTable((), (), b"", hashlib.sha256())


def message_table(digests: Sequence[bytes], tokens: Sequence[int]) -> MessageTable:
    """The table of messages with these digests and tokens, in one piece."""
    return EMPTY.extend(digests, tokens)
