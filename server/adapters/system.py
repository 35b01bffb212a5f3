"""Clock and id sources: the only places the daemon reads time or randomness."""

from __future__ import annotations

import secrets
import time


class SystemClock:
    def now_ns(self) -> int:
        return time.time_ns()


class RandomIds:
    def new_id(self, prefix: str) -> str:
        # 96 random bits, hex: unique without coordination, safe in keys and URLs.
        return f"{prefix}{secrets.token_hex(12)}"
