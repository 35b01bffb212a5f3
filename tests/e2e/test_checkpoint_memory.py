"""A session's checkpoints are not held in memory at once by the calls that write and
list them, nor by its compiles, which need only the newest one that holds. A session
may store a gigabyte (`--max-session-bytes`), and each checkpoint a summary of up to
1 MiB characters: creating one, retrying one by its request id, or listing a page of one
decoded every summary of the session, so a daemon in a sidecar's memory limit grew by
hundreds of megabytes for a page of one checkpoint; and every compile read every summary
(a list that large is never kept between compiles) for a view that holds one, as did
the inspector's timeline and step pages, which show one summary at most."""

from __future__ import annotations

import threading
import urllib.request
from pathlib import Path
from typing import Any

import grpc

from ctxcc.v1 import checkpoint_pb2, compile_service_pb2_grpc, session_pb2, session_service_pb2_grpc
from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_service_pb2 as spb
from tests.e2e.proc import DaemonProcess
from tests.helpers import ROUTE, assistant, user

CHECKPOINTS = 100
SUMMARY_CHARS = 1 << 20  # the most a summary may hold; ~100 MiB in all
LISTINGS = 6  # pages of one checkpoint, at once


def _peak_rss(pid: int) -> int:
    """The process's peak resident set so far, in bytes (VmHWM)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc")


def test_checkpoints_are_written_and_listed_a_page_at_a_time(short_tmp: Path) -> None:
    daemon = DaemonProcess(short_tmp / "data")
    with daemon.serving(), grpc.insecure_channel(daemon.target) as channel:
        assert daemon.proc is not None
        sessions: Any = session_service_pb2_grpc.SessionServiceStub(channel)
        compiles: Any = compile_service_pb2_grpc.CompileServiceStub(channel)
        sessions.CreateSession(
            spb.CreateSessionRequest(session=session_pb2.Session(session_id="m"))
        )
        sessions.AppendEvents(
            spb.AppendEventsRequest(session_id="m", events=[user("hi"), assistant("hello")])
        )
        before = _peak_rss(daemon.proc.pid)

        def create(n: int, request_id: str = "") -> str:
            summary = f"{n} " + "s" * (SUMMARY_CHARS - 8)
            ck = checkpoint_pb2.Checkpoint(session_id="m", covers_through_seq=1, summary=summary)
            req = cpb.CreateCheckpointRequest(checkpoint=ck, request_id=request_id)
            return str(compiles.CreateCheckpoint(req).checkpoint.checkpoint_id)

        first = create(0, request_id="r0")
        for n in range(1, CHECKPOINTS):
            create(n, request_id=f"r{n}" if n % 10 == 0 else "")
        assert create(0, request_id="r0") == first  # a retry finds the first
        pages: list[list[str]] = []

        def first_page() -> None:
            page = compiles.ListCheckpoints(cpb.ListCheckpointsRequest(session_id="m", page_size=1))
            pages.append([c.summary.split(" ", 1)[0] for c in page.checkpoints])

        threads = [threading.Thread(target=first_page) for _ in range(LISTINGS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert pages == [[str(CHECKPOINTS - 1)]] * LISTINGS
        grown = _peak_rss(daemon.proc.pid) - before
        # The agent's latest summary is a short one; its compiles read that one whole.
        ck = checkpoint_pb2.Checkpoint(session_id="m", covers_through_seq=1, summary="latest")
        latest = compiles.CreateCheckpoint(cpb.CreateCheckpointRequest(checkpoint=ck))
        before = _peak_rss(daemon.proc.pid)
        for step in range(3):
            sessions.AppendEvents(
                spb.AppendEventsRequest(session_id="m", events=[user(f"step {step}")])
            )
            view = compiles.Compile(cpb.CompileRequest(session_id="m", route=ROUTE)).view
            assert view.checkpoint_id == latest.checkpoint.checkpoint_id
            assert "latest" in view.messages[0].parts[0].text
        compiled = _peak_rss(daemon.proc.pid) - before
        # The inspector's timeline and the step page of that view.
        before = _peak_rss(daemon.proc.pid)
        shown = {}
        for path in ("/s/m", "/s/m/step"):
            with urllib.request.urlopen(f"http://{daemon.endpoints['ui']}{path}") as page:
                shown[path] = page.read()
        assert b"latest" in shown["/s/m/step"]  # the view's summary, on its step page
        inspected = _peak_rss(daemon.proc.pid) - before
    # What the store and its write buffers hold is well under the summaries' ~100 MiB
    # once more; the whole list decoded for each call grew the peak by over 500 MB.
    assert grown < 250 << 20, f"the peak grew by {grown >> 20} MiB"
    # Reading every summary at each compile grew the peak by ~150 MB.
    assert compiled < 64 << 20, f"compiles grew the peak by {compiled >> 20} MiB"
    assert inspected < 64 << 20, f"the inspector grew the peak by {inspected >> 20} MiB"
