"""`replaced` makes the value dataclasses.replace makes, for the records it copies on the
usage path and for any frozen dataclass, and refuses what replace refuses."""

from __future__ import annotations

import dataclasses
from dataclasses import InitVar, dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server.domain.model import Route
from server.domain.records import CompileRecord, RouteModel, RouteState, Usage
from server.domain.replacing import replaced


def _changes(cls: type, data: st.DataObject) -> dict[str, Any]:
    """Some of the fields (maybe none, maybe all) with the values of another instance."""
    other = data.draw(st.from_type(cls))
    names = data.draw(st.sets(st.sampled_from([f.name for f in dataclasses.fields(cls)])))
    return {name: getattr(other, name) for name in names}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([CompileRecord, RouteModel, RouteState, Usage]), st.data())
def test_a_record_copy_is_the_value_replace_makes(cls: type, data: st.DataObject) -> None:
    obj = data.draw(st.from_type(cls))
    changes = _changes(cls, data)
    got, want = replaced(obj, **changes), dataclasses.replace(obj, **changes)
    assert type(got) is type(want) and got == want
    # Field by field, so that two fields swapped with equal values cannot hide.
    for f in dataclasses.fields(cls):
        assert getattr(got, f.name) is getattr(want, f.name)


def test_every_field_lands_in_its_own_place() -> None:
    """Each field set alone, to a value no other field holds."""
    rec = CompileRecord("s:c", "s", Route(model="m"), 1, 2, 3, 4)
    for f in dataclasses.fields(CompileRecord):
        marker = object()
        copy = replaced(rec, **{f.name: marker})
        assert [
            g.name for g in dataclasses.fields(CompileRecord) if getattr(copy, g.name) is marker
        ] == [f.name]


@dataclass(frozen=True)
class _Checked:
    low: int
    high: int

    def __post_init__(self) -> None:
        if self.low > self.high:
            raise ValueError("low above high")


@dataclass(frozen=True)
class _KwOnly:
    a: int
    b: int = field(kw_only=True, default=0)


@dataclass(frozen=True)
class _WithInitVar:
    a: int
    b: int
    scale: InitVar[int] = 1


@dataclass(frozen=True)
class _NotInInit:
    a: int
    b: int
    c: int = field(init=False, default=7)


@dataclass(frozen=True, init=False)
class _OwnInit:
    b: int
    a: int

    def __init__(self, a: int, b: int) -> None:  # its own order
        object.__setattr__(self, "a", a)
        object.__setattr__(self, "b", b)


def test_what_replace_refuses_is_refused() -> None:
    checked = _Checked(1, 2)
    with pytest.raises(ValueError, match="low above high"):  # __init__ runs, checks and all
        replaced(checked, low=3)
    with pytest.raises(TypeError):
        replaced(checked, middle=1)
    assert replaced(checked, high=5) == _Checked(1, 5)


@pytest.mark.parametrize(
    ("obj", "changes"),
    [
        (_KwOnly(1, b=2), {"b": 3}),
        (_KwOnly(1, b=2), {"a": 4}),
        (_WithInitVar(1, 2), {"a": 3}),
        (_WithInitVar(1, 2), {"a": 3, "scale": 2}),
        (_NotInInit(1, 2), {"b": 5}),
        (_OwnInit(a=1, b=2), {"a": 3}),
        (Usage(1, 2), {}),  # no change: a copy all the same
    ],
)
def test_classes_it_cannot_copy_positionally_are_copied_as_replace_copies_them(
    obj: object, changes: dict[str, Any]
) -> None:
    assert replaced(obj, **changes) == dataclasses.replace(obj, **changes)  # type: ignore[type-var]
