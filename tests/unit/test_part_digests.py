"""The basis digests of a compile's large parts are remembered by the identity of the
value each holds (basis.PartDigests): the same value is not encoded again, and any other
value, equal or not, gets the digest its own content has."""

from __future__ import annotations

from typing import Any

import pytest

from server.compiler.sources import SourceInputs
from server.domain.sources import InstructionFile, Scope
from server.service import basis
from server.service.basis import PartDigests, digest_of


def _counted(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every value basis digests from now on, in order (the digests are the real ones)."""
    digested: list[object] = []
    real = basis.digest_of

    def counting(value: Any) -> str:
        digested.append(value)
        return real(value)

    monkeypatch.setattr(basis, "digest_of", counting)
    return digested


def _sources(text: str) -> SourceInputs:
    return SourceInputs(instruction_files=(InstructionFile("AGENTS.md", Scope.PROJECT, text),))


def test_the_same_value_is_digested_once_and_others_by_their_content(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    digested = _counted(monkeypatch)
    known = PartDigests()
    a = _sources("Use tabs.")
    assert known.of(a, a) == digest_of(a)
    assert known.of(a, a) == digest_of(a)
    assert digested == [a], "the same object is not encoded again"
    equal = _sources("Use tabs.")
    assert known.of(equal, equal) == digest_of(a)
    changed = _sources("Use spaces.")
    assert known.of(changed, changed) == digest_of(changed) != digest_of(a)
    assert digested == [a, equal, changed]


def test_an_entry_pushed_out_is_digested_again_and_ids_are_never_confused() -> None:
    known = PartDigests(size=2)
    values = [_sources(f"rule {i}") for i in range(5)]
    for v in values:
        assert known.of(v, v) == digest_of(v)
    # Values dropped (and their ids free for reuse) are never answered from memory.
    for _ in range(50):
        fresh = _sources("another")
        assert known.of(fresh, fresh) == digest_of(fresh)
        del fresh
    assert known.of(values[0], values[0]) == digest_of(values[0])


def test_sources_read_again_are_not_digested_again_text_by_text(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every compile reads its sources into new objects: with 1,000 rules each compile
    digested every text again (sources_parts ~4.4 ms; 0.6 ms for the one part before
    texts were parts). Sources equal to ones digested are not digested again, and of
    sources with one text edited only that text and the sources part are."""
    from server.domain.sources import RuleActivation, RuleEntry

    def read(edited: str = "") -> SourceInputs:
        """The rules as a compile reads them: new objects, texts included."""
        texts = ["".join(["rule ", str(i)]) for i in range(1_000)]
        if edited:
            texts[-1] = edited
        return SourceInputs(
            rules=tuple(
                RuleEntry(f"r{i}", Scope.PROJECT, "p", f"r{i}", "d", t, RuleActivation.ALWAYS)
                for i, t in enumerate(texts)
            )
        )

    digested = _counted(monkeypatch)
    known = PartDigests()
    first = known.sources(read())
    assert len(digested) == 1_001
    digested.clear()
    assert known.sources(read()) == first
    assert digested == []
    edited = known.sources(read("edited"))
    assert [type(v).__name__ for v in digested] == ["TextPart", "SourcesPart"]
    assert edited == basis.sources_parts(read("edited"))
