"""Key layout of the event store: how session-scoped records sort in each column family.

Every session-scoped key is `<session id> 0x00 <suffix>`, so one session's records form a
contiguous range that a single range delete removes.
"""

from __future__ import annotations

from server.domain.errors import CtxccError, Reason
from server.domain.sources import Scope, SourceKind

SEP = b"\x00"
END = b"\x01"  # sid + END sorts right after every key with prefix sid + SEP
# Daemon-wide route models in `routes`: no session id starts with 0x00, so these keys
# never fall inside a session's key range (and survive its deletion).
ROUTE_MODEL = SEP + b"model" + SEP
COUNT_KEY = b"session_count"

# Key suffix of the copy of a session's latest compile record; compile suffixes are hex.
LAST_COMPILE = b"\xff"
# Key infix of the parts compiles read (sources, tools, settings), by content digest.
PART = b"\xfe"
# Key infix of "latest compile at event boundary N" (big-endian N -> compile suffix).
AT_BOUNDARY = b"\xfd"
# Key infix of a compile's usage report (compile suffix -> Usage), kept beside its record
# so that a report writes a few bytes instead of the record again; records written
# before hold their usage inside and have none.
USAGE = b"\xfc"
# (UTF-8 never yields 0xfc-0xff, so no client-given compile id can name these keys.)
# Key infix of tool activations; tool names never start with 0xff.
ACTIVATIONS = b"\xff"

MAX_SEQ = (1 << 64) - 1


def source_prefix(kind: SourceKind, scope: Scope | None = None, scope_id: str = "") -> bytes:
    key = kind.value.encode() + SEP
    if scope is not None:
        key += str(int(scope)).encode() + SEP + scope_id.encode() + SEP
    return key


def be64(n: int) -> bytes:
    return n.to_bytes(8, "big")


def session_prefix(session_id: str) -> bytes:
    return session_id.encode() + SEP


def session_key(session_id: str, suffix: bytes) -> bytes:
    return session_prefix(session_id) + suffix


def key_after(prefix: bytes) -> bytes:
    """The smallest key greater than every key starting with `prefix` (ends in 0x00)."""
    return prefix[:-1] + bytes([prefix[-1] + 1])


def split_compile_id(compile_id: str) -> tuple[str, bytes]:
    """Compile ids are `<session id>:<suffix>`, so usage reports find their session."""
    session_id, sep, suffix = compile_id.partition(":")
    if not sep or not session_id or not suffix:
        raise CtxccError(
            Reason.COMPILE_NOT_FOUND,
            f"compile {compile_id!r} does not exist",
            compile_id=compile_id,
        )
    return session_id, suffix.encode()
