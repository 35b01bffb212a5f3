"""Client text shaped to make the compiler's work on it superlinear (a scan, a
normalization, a schema's flattening), against a running daemon: a compile of it must
answer, with the text as that work should leave it.

A regex or a C call holds the GIL for its whole run and no CPU budget check can stop it,
so an input that makes one quadratic stalls every session of the daemon for as long as
it runs; work in Python is stopped by the budget, and then the session cannot compile.
"""

from __future__ import annotations

import json
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
    tool_pb2,
    tool_service_pb2_grpc,
    view_pb2,
)
from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_service_pb2 as spb
from ctxcc.v1 import source_service_pb2 as rpb
from ctxcc.v1 import tool_service_pb2 as tpb
from tests.e2e.proc import DaemonProcess

# Whitespace after a `<`: a fence tag may follow it, so the fence scan reads all of it.
RUN = " \t\n" * 40_000

BIG = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]


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
                "tools": tool_service_pb2_grpc.ToolServiceStub(ch),
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


def test_a_union_of_thousands_of_branches_is_flattened_in_one_pass(short_tmp: Path) -> None:
    """OpenAI and Anthropic take no union at a schema's top level, so every render of
    one flattens it, collecting each property's distinct shapes. Finding a repeat
    compared a shape with every shape kept before it: ~0.5 s for the 7,000 branches
    of one 256 KiB schema, and a 4 MiB schema (its cap raised) of 100,000 branches
    would take minutes, past the default 30 s CPU budget (RESOURCE_EXHAUSTED at every
    compile). The shapes kept are still the distinct ones, each once, in order, with
    equal numbers (1, 1.0) the same shape as before."""
    distinct = 50_000
    branches = [{"properties": {"a": {"const": i}}} for i in range(distinct)]
    repeats = [{"properties": {"a": {"const": float(i)}}} for i in range(distinct)]
    union = json.dumps({"anyOf": branches + repeats}, separators=(",", ":"))
    d = DaemonProcess(short_tmp / "data", "--max-tool-schema-bytes", str(4 << 20))
    with d.serving(), grpc.insecure_channel(d.target, options=BIG) as ch:
        sessions: Any = session_service_pb2_grpc.SessionServiceStub(ch)
        compiles: Any = compile_service_pb2_grpc.CompileServiceStub(ch)
        tools: Any = tool_service_pb2_grpc.ToolServiceStub(ch)
        sessions.CreateSession(
            spb.CreateSessionRequest(session=session_pb2.Session(session_id="union"))
        )
        user = event_pb2.Event()
        user.user_message.parts.add(text="pick one")
        sessions.AppendEvents(spb.AppendEventsRequest(session_id="union", events=[user]))
        tool = tool_pb2.ToolDefinition(
            name="pick",
            input_schema_json=union,
            visibility=tool_pb2.TOOL_VISIBILITY_DIRECT,
        )
        tools.RegisterTools(tpb.RegisterToolsRequest(session_id="union", tools=[tool]))
        req = cpb.CompileRequest(
            session_id="union",
            route=common_pb2.Route(model="gpt-4.1"),
            render_formats=[view_pb2.RENDER_FORMAT_OPENAI_CHAT],
        )
        view = compiles.Compile(req).view
    body = json.loads(view.renderings[0].body_json)
    shapes = body["tools"][0]["function"]["parameters"]["properties"]["a"]["anyOf"]
    assert shapes == [{"const": i} for i in range(distinct)]


def test_a_logged_tool_search_of_marks_out_of_order_is_replayed(stubs: dict[str, Any]) -> None:
    """Every compile of a turn runs its logged tool_search queries again, NFKC first, and
    no cap holds a logged query (its event is up to 1 MiB). CPython's NFKC sorts a run of
    combining marks by insertion: 32,000 marks in reverse class order held every session
    ~2.6 s at each compile of the turn; 400,000 would hold them for minutes. The search
    still finds the tool by the query's word."""
    s = stubs
    sid = "marks"
    s["sessions"].CreateSession(
        spb.CreateSessionRequest(session=session_pb2.Session(session_id=sid))
    )
    deploy = tool_pb2.ToolDefinition(
        name="deployer",
        description="Deploys a service",
        input_schema_json='{"type": "object"}',
        visibility=tool_pb2.TOOL_VISIBILITY_DEFERRED,
    )
    s["tools"].RegisterTools(tpb.RegisterToolsRequest(session_id=sid, tools=[deploy]))
    query = "deploys a" + "\u0301" * 200_000 + "\u0316" * 200_000
    user = event_pb2.Event()
    user.user_message.parts.add(text="ship it")
    call = event_pb2.Event()
    call.tool_call.call_id = "c1"
    call.tool_call.name = "tool_search"
    call.tool_call.arguments_json = json.dumps({"query": query}, ensure_ascii=False)
    result = event_pb2.Event()
    result.tool_result.call_id = "c1"
    result.tool_result.tool_name = "tool_search"
    result.tool_result.text = "deployer"
    s["sessions"].AppendEvents(spb.AppendEventsRequest(session_id=sid, events=[user, call, result]))

    view = _compile(s, sid)

    assert "deployer" in [t.definition.name for t in view.tools]
