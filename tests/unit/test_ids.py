"""The daemon's ids: unique across threads and across daemon runs, 96 bits in hex."""

from __future__ import annotations

import re
import threading

from server.adapters.system import RandomIds


def test_ids_are_unique_across_threads_and_runs() -> None:
    ids = RandomIds()
    made: list[list[str]] = [[] for _ in range(4)]

    def make(out: list[str]) -> None:
        out.extend(ids.new_id("e-") for _ in range(5_000))

    threads = [threading.Thread(target=make, args=(out,)) for out in made]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [i for out in made for i in out]
    assert len(set(every)) == len(every) == 20_000
    assert all(re.fullmatch(r"e-[0-9a-f]{24}", i) for i in every)
    # Another run (a restart) draws another key: its ids are not this run's again.
    again = RandomIds()
    later = {again.new_id("e-") for _ in range(1_000)}
    assert not later & set(every)
    # Nothing of a counter shows through: consecutive ids share no common prefix.
    first = [ids.new_id("")[:6] for _ in range(50)]
    assert len(set(first)) > 45
