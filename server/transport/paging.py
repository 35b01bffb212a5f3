"""Opaque page tokens: base64 of the last key plus a fingerprint of the query, so a
token cannot be replayed against a different query."""

from __future__ import annotations

import base64
import hashlib
import json

from google.protobuf.message import Message

from server.domain.errors import CtxccError, Reason

# Pages of listings are cut by size as well as by count, so that any page fits a client
# with gRPC's default 4 MiB receive limit (the rest of the response is a few bytes). A
# single item larger than this still goes alone on its page.
MAX_PAGE_BYTES = 3 << 20


def page_bytes(max_message_bytes: int) -> int:
    """A page's size budget: MAX_PAGE_BYTES, or half the daemon's own message limit when
    that is set lower (the first item of a page always goes in, whatever its size)."""
    return min(MAX_PAGE_BYTES, max_message_bytes // 2)


def check_fits(response: Message, limit: int, what: str) -> None:
    """An unpaged listing over the daemon's message limit: refused with a reason, where
    gRPC would fail the call with a bare RESOURCE_EXHAUSTED (no ErrorInfo) when sending."""
    size = response.ByteSize()
    if size > limit:
        raise too_large(size, limit, what)


def too_large(
    size: int, limit: int, what: str, hint: str = "list one scope at a time, or delete entries"
) -> CtxccError:
    return CtxccError(
        Reason.QUOTA_EXCEEDED,
        f"{what} is {size} bytes, more than the {limit}-byte message limit; {hint}",
        quota="max_message_bytes",
        limit=str(limit),
    )


def _fingerprint(query: object) -> str:
    return hashlib.sha256(json.dumps(query, sort_keys=True).encode()).hexdigest()[:12]


def encode_token(last: str | int, query: object, created_ns: int = 0) -> str:
    """`created_ns`: the create time of the session listed (0: none), for a listing that
    must not go on into a session made again under its id (`token_created`)."""
    fields: dict[str, object] = {"l": last, "q": _fingerprint(query)}
    if created_ns:
        fields["c"] = created_ns
    raw = json.dumps(fields).encode()
    return base64.urlsafe_b64encode(raw).decode()


def token_created(token: str) -> int:
    """The create time of the session a token's listing was of (0: none, or a token that
    predates it). For a token `decode_token` already took, so it decodes."""
    if not token:
        return 0
    created = json.loads(base64.urlsafe_b64decode(token.encode())).get("c", 0)
    if type(created) is not int or not 0 <= created < 1 << 64:
        raise CtxccError(Reason.INVALID_PAGE_TOKEN, "page_token is malformed or from another query")
    return created


def decode_token(token: str, query: object) -> str | int | None:
    if not token:
        return None
    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode()))
        last = data["l"]
        ok = data["q"] == _fingerprint(query) and isinstance(last, str | int)
    except (ValueError, KeyError, TypeError, RecursionError):
        # RecursionError: a client's token of JSON nested past the interpreter's limit.
        ok, last = False, None
    if not ok:
        raise CtxccError(Reason.INVALID_PAGE_TOKEN, "page_token is malformed or from another query")
    assert isinstance(last, str | int)
    return last


def decode_position(token: str, query: object) -> int | None:
    """A token's position for listings that page by a number (a seq, an index). The
    fingerprint is no secret (it hashes the query), so a client can forge a token: one
    whose position is no whole number from 0 to 2^64-1 is malformed, never an INTERNAL
    from int() or from a negative seq."""
    last = decode_token(token, query)
    if last is None:
        return None
    if type(last) is not int or not 0 <= last < 1 << 64:
        raise CtxccError(Reason.INVALID_PAGE_TOKEN, "page_token is malformed or from another query")
    return last
