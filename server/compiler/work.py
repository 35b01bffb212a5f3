"""Cooperative limits on a compile's work, injected so the core stays pure.

The core never reads a clock. The service hands it a `Check`, a function the core calls
between units of work (each token count, each scanned text, between phases); the check
raises when the request's budget is spent, and the exception leaves the core untouched
(nothing is half-built: the view is only made at the end). With `unchecked`, the default,
nothing is ever interrupted and the view is the same.
"""

from __future__ import annotations

from collections.abc import Callable

from server.compiler.tokens import COUNTING, TokenCounter

Check = Callable[[], None]


def unchecked() -> None:
    """The check of a compile without a budget."""


class CheckedCounter:
    """A token counter that runs `check` before each count: counting is most of a first
    compile's work, one message at a time. It counts tool-call arguments as `counting`
    says (tokens.COUNTING): a rebuild counts as the daemon that recorded the compile."""

    def __init__(self, counter: TokenCounter, check: Check, counting: int = COUNTING) -> None:
        self._counter = counter
        self._check = check
        self.arguments_counting = counting

    @property
    def name(self) -> str:
        return self._counter.name

    @property
    def arguments_as_parameters(self) -> bool:
        """How the wrapped counter counts tool-call arguments (tokens.arguments_text)."""
        return bool(getattr(self._counter, "arguments_as_parameters", False))

    def count(self, text: str) -> int:
        self._check()
        return self._counter.count(text)


def checked(counter: TokenCounter, check: Check, counting: int = COUNTING) -> TokenCounter:
    if check is unchecked and counting == COUNTING:
        return counter
    return CheckedCounter(counter, check, counting)
