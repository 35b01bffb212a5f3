"""What every servicer shares: where RPC metrics go."""

from __future__ import annotations

from collections.abc import Callable

RpcObserver = Callable[[str, str, float], None]


class ObservedServicer:
    def __init__(self, observer: RpcObserver) -> None:
        self._observer = observer

    def observe_rpc(self, method: str, code: str, seconds: float) -> None:
        self._observer(method, code, seconds)
