"""The Python client's reassembly of chunked views (`ctxcc_client.ViewAssembler`)."""

from __future__ import annotations

import hashlib

import pytest
from ctxcc_client import ViewAssembler

from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import view_pb2


def _chunks(view: view_pb2.CompiledView, n: int) -> list[cpb.ViewChunk]:
    data = view.SerializeToString()
    sha = hashlib.sha256(data).hexdigest()
    step = -(-len(data) // n)
    return [
        cpb.ViewChunk(
            compile_id="c", index=i, count=n, data=data[i * step : (i + 1) * step], sha256=sha
        )
        for i in range(n)
    ]


def test_chunks_in_order_give_the_view_back() -> None:
    view = view_pb2.CompiledView(compile_id="s:1", session_id="s", event_boundary=7)
    assembler = ViewAssembler()
    got = [assembler.add(c) for c in _chunks(view, 3)]
    assert got[:2] == [None, None] and got[2] == view
    # The assembler is reusable for the next view.
    assert [assembler.add(c) for c in _chunks(view, 2)][1] == view


@pytest.mark.parametrize(
    "chunks",
    [
        [(2, 2)],  # index past count: a wait for chunk 1 of a view that has no chunk 2
        [(0, 0)],
        [(0, (1 << 16) + 1)],
        [(0, 2), (2, 3)],  # the count changes within one view
    ],
)
def test_a_chunk_that_does_not_fit_its_view_is_an_error(chunks: list[tuple[int, int]]) -> None:
    assembler = ViewAssembler()
    with pytest.raises(ValueError, match="does not fit"):
        for index, count in chunks:
            assembler.add(cpb.ViewChunk(compile_id="c", index=index, count=count, data=b"x"))
    # What it held is dropped: the next view assembles cleanly.
    view = view_pb2.CompiledView(compile_id="s:2")
    assert [assembler.add(c) for c in _chunks(view, 2)][1] == view
