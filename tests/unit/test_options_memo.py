"""Compile requests converted once (transport/options_memo.py): equal requests share one
options value, different ones never do, refused requests are refused every time."""

from __future__ import annotations

import pytest

from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import view_pb2
from server.compiler.view import SectionKind
from server.domain.errors import CtxccError, Reason
from server.transport.convert_view import compile_options_in
from server.transport.options_memo import OptionsMemo
from tests.helpers import ROUTE


def _request(**kw: object) -> cpb.CompileRequest:
    return cpb.CompileRequest(session_id="s", route=ROUTE, **kw)  # type: ignore[arg-type]


def test_equal_requests_share_their_options_and_others_get_their_own() -> None:
    memo = OptionsMemo()
    plain = memo.options(_request())
    assert plain == compile_options_in(_request())
    assert memo.options(_request()) is plain
    excluded = memo.options(_request(exclude_sections=[view_pb2.SECTION_KIND_ENVIRONMENT]))
    assert excluded.exclude_sections == frozenset({SectionKind.ENVIRONMENT})
    assert memo.options(_request(dry_run=True)).dry_run
    assert memo.options(_request()) is plain and not plain.dry_run


def test_a_refused_request_is_refused_each_time() -> None:
    memo = OptionsMemo()
    bad = _request(approval_mode=99)
    for _ in range(2):
        with pytest.raises(CtxccError) as err:
            memo.options(bad)
        assert err.value.reason is Reason.INVALID_FIELD
    assert memo.options(_request()).session_id == "s"


def test_the_memo_is_bounded() -> None:
    memo = OptionsMemo(max_entries=2)
    first = memo.options(_request())
    memo.options(_request(dry_run=True))
    memo.options(_request(as_of_seq=3))
    again = memo.options(_request())
    assert again == first and again is not first, "the oldest request was dropped"
