"""Durable storage for ctxcc: one store logic over two key-value engines.

`KVEventStore` implements the service's `EventStore` port over an ordered
key-value interface; `RocksKV` (rocksdict, the product) and `MemoryKV` (unit tests)
are its engines, and one contract suite runs against both.
"""

from storage.kv import MemoryKV
from storage.rocks import RocksKV, StoreLockedError, StoreOpenError, open_rocks
from storage.store import KVEventStore, StoreLimits

__all__ = [
    "KVEventStore",
    "MemoryKV",
    "RocksKV",
    "StoreLimits",
    "StoreLockedError",
    "StoreOpenError",
    "open_rocks",
]
