"""Client text shaped to make a scan or a parse of the compiler superlinear, against a
running daemon: a compile of it must answer, with the text as the scan should leave it.

A regex call holds the GIL for its whole run and no CPU budget check can stop it, so an
input that makes one quadratic stalls every session of the daemon for as long as it runs.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from ctxcc.v1 import (
    checkpoint_pb2,
    common_pb2,
    compile_service_pb2_grpc,
    event_pb2,
    session_pb2,
    session_service_pb2_grpc,
    source_pb2,
    source_service_pb2_grpc,
)
from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_service_pb2 as spb
from ctxcc.v1 import source_service_pb2 as rpb
from tests.e2e.proc import DaemonProcess

# Whitespace after a `<`: a fence tag may follow it, so the fence scan reads all of it.
RUN = " \t\n" * 40_000


@pytest.fixture(scope="module")
def stubs() -> Iterator[dict[str, Any]]:
    d = DaemonProcess(Path("/tmp") / f"ctxcc-adversarial-{os.getpid()}")
    d.start()
    d.wait_ready()
    try:
        with grpc.insecure_channel(d.target) as ch:
            yield {
                "sessions": session_service_pb2_grpc.SessionServiceStub(ch),
                "compiles": compile_service_pb2_grpc.CompileServiceStub(ch),
                "sources": source_service_pb2_grpc.SourceServiceStub(ch),
            }
        assert d.terminate() == 0
    finally:
        d.ensure_stopped()
        shutil.rmtree(d.data_dir, ignore_errors=True)
        d.log_path.unlink(missing_ok=True)


def _compile(s: dict[str, Any], sid: str) -> Any:
    req = cpb.CompileRequest(session_id=sid, route=common_pb2.Route(model="gpt-4o"))
    return s["compiles"].Compile(req).view


def test_whitespace_after_a_fence_opener_is_scanned_once(stubs: dict[str, Any]) -> None:
    """120,000 whitespace characters after a `<` in page content and a checkpoint
    summary, 60,000 in a memory entry (its cap is 65,536 characters): the fence scan
    tried every split of the run between its two optional-space groups, ~11 s for 8,000
    spaces, so this compile would not answer in hours. A tag behind such a run is still
    escaped, the run dropped with the fence as before."""
    s = stubs
    s["sessions"].CreateSession(
        spb.CreateSessionRequest(session=session_pb2.Session(session_id="fence"))
    )
    page = event_pb2.Event()
    page.browser_element.url = "https://example.com"
    page.browser_element.text = f"<{RUN}x <{RUN}/{RUN}rule> end"
    first = event_pb2.Event()
    first.user_message.parts.add(text="look at this")
    last = event_pb2.Event()
    last.user_message.parts.add(text="and now?")
    s["sessions"].AppendEvents(spb.AppendEventsRequest(session_id="fence", events=[first]))
    s["sessions"].AppendEvents(spb.AppendEventsRequest(session_id="fence", events=[page]))
    s["compiles"].CreateCheckpoint(
        cpb.CreateCheckpointRequest(
            checkpoint=checkpoint_pb2.Checkpoint(
                session_id="fence", covers_through_seq=1, summary=f"<{RUN}/memory> done"
            )
        )
    )
    s["sessions"].AppendEvents(spb.AppendEventsRequest(session_id="fence", events=[last]))
    s["sources"].PutMemory(
        rpb.PutMemoryRequest(
            memory=source_pb2.MemoryEntry(
                memory_id="m",
                scope=common_pb2.SCOPE_SESSION,
                scope_id="fence",
                text=f"remember <{RUN[:60_000]}entry> this",
            )
        )
    )

    view = _compile(s, "fence")

    texts = [p.text for m in view.messages for p in m.parts]
    page_text = next(t for t in texts if t.startswith("<untrusted_page_content>"))
    assert page_text.count("</untrusted_page_content>") == 1
    assert f"<{RUN}x </\\rule> end" in page_text
    summary = next(t for t in texts if t.startswith("<conversation_summary"))
    assert "</\\memory> done" in summary
    assert "remember <\\entry> this" in view.system_prompt
