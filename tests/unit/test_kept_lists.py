"""The values a compile reads that are kept between compiles (service/kept.py): read
again whenever the store's write count of their table moved, apart per incarnation of a
session id, and bounded by entries and by bytes."""

from __future__ import annotations

import pytest

from server.domain.model import Session
from server.domain.tools import ToolSpec
from server.service import kept as kept_module
from server.service.kept import KeptReads, approx_bytes


class _Counts:
    def __init__(self) -> None:
        self.gen: dict[str, int] = {}

    def table_generation(self, session_id: str, table: str) -> tuple[int, int]:
        return 0, self.gen.get(session_id, 0)


def _reader(value: tuple[ToolSpec, ...], reads: list[str], sid: str):  # type: ignore[no-untyped-def]
    def read() -> tuple[ToolSpec, ...]:
        reads.append(sid)
        return value

    return read


def test_a_kept_list_is_read_again_when_its_table_was_written() -> None:
    counts = _Counts()
    kept = KeptReads("tools", counts)  # type: ignore[arg-type]
    s = Session("s", 1, 1)
    reads: list[str] = []
    one = (ToolSpec("a", "A", "{}"),)
    assert kept.get(s, (), _reader(one, reads, "s")) is one
    assert kept.get(s, (), _reader((), reads, "s")) is one and reads == ["s"]
    counts.gen["s"] = 1  # a write landed
    assert kept.get(s, (), _reader((), reads, "s")) == () and reads == ["s", "s"]
    # The same id made again (another creation time) is another session.
    again = Session("s", 2, 2)
    assert kept.get(again, (), _reader(one, reads, "s")) is one and len(reads) == 3


def test_kept_lists_are_bounded_by_sessions_and_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kept_module, "MAX_ENTRIES", 3)
    monkeypatch.setattr(kept_module, "MAX_BYTES", 40_000)
    kept = KeptReads("tools", _Counts())  # type: ignore[arg-type]
    reads: list[str] = []
    small = (ToolSpec("a", "A", "{}"),)
    for sid in "abcd":
        kept.get(Session(sid, 1, 1), (), _reader(small, reads, sid))
    assert len(kept._entries) == 3  # "a" went first
    kept.get(Session("a", 1, 1), (), _reader(small, reads, "a"))
    assert reads[-1] == "a" and len(reads) == 5
    big = (ToolSpec("b", "B", "x" * 12_000),)
    for sid in "xyz":
        kept.get(Session(sid, 1, 1), (), _reader(big, reads, sid))
    assert kept._bytes <= 40_000 and len(kept._entries) <= 3
    huge = (ToolSpec("h", "H", "x" * 20_000),)  # over a quarter of the bytes: not kept
    kept.get(Session("h", 1, 1), (), _reader(huge, reads, "h"))
    kept.get(Session("h", 1, 1), (), _reader(huge, reads, "h"))
    assert reads[-2:] == ["h", "h"]


def test_a_values_size_counts_its_texts() -> None:
    small = approx_bytes((ToolSpec("a", "A", "{}"),))
    big = approx_bytes((ToolSpec("a", "A", "x" * 10_000),))
    assert big - small == 10_000 - 2
