"""On-disk schema version and migrations.

At open the stored version is compared with SCHEMA_VERSION: an empty store is
stamped, an older one is migrated step by step inside one batch per step, a newer
one is refused (an old binary must never write a layout it does not understand).
"""

from __future__ import annotations

from collections.abc import Callable

from storage.kv import KV, Batch

SCHEMA_VERSION = 1
_KEY = b"schema_version"

# version N -> function that fills a batch moving the store from N to N + 1.
MIGRATIONS: dict[int, Callable[[KV, Batch], None]] = {}


class SchemaError(RuntimeError):
    """The store's layout cannot be used by this binary."""


def stored_version(kv: KV) -> int | None:
    raw = kv.get("meta", _KEY)
    if raw is None:
        return None
    try:
        return int(raw.decode())
    except (UnicodeDecodeError, ValueError):
        raise SchemaError(f"the store's schema version {raw[:32]!r} is damaged") from None


def ensure_schema(kv: KV, *, target: int = SCHEMA_VERSION) -> int:
    """Bring the store to `target`; returns the version found at open."""
    found = stored_version(kv)
    if found is None:
        if next(kv.scan("sessions", b"", b"\xff"), None) is not None:
            raise SchemaError("store holds sessions but no schema version; refusing to guess")
        batch = Batch()
        batch.put("meta", _KEY, str(target).encode())
        kv.write(batch)
        return target
    if found > target:
        raise SchemaError(
            f"store schema version {found} is newer than this ctxcc supports ({target}); "
            "upgrade ctxcc or use another data directory"
        )
    version = found
    while version < target:
        step = MIGRATIONS.get(version)
        if step is None:
            raise SchemaError(f"no migration from schema version {version}")
        batch = Batch()
        step(kv, batch)
        batch.put("meta", _KEY, str(version + 1).encode())
        kv.write(batch)
        version += 1
    return found
