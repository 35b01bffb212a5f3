"""A write generation: where the store's write counters stood (see storage/generations.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Generation:
    """What one session's compile on one route reads, as of some moment: the counts of
    writes that concern every session, this session, and this route's learned model."""

    everything: int
    session: int
    route: int

    def after_own_write(self) -> Generation:
        """The generation after exactly one more write to the session (and none else)."""
        return Generation(self.everything, self.session + 1, self.route)
