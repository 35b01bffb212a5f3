"""Defects the stateful cache test (test_cache_oracle.py) found, each placed
deterministically through a real daemon: the interleaving that made the daemon answer
otherwise than a compile from scratch, held in place with a barrier or a hook on the
store."""

from __future__ import annotations

import asyncio
import re
import threading
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from ctxcc.v1 import checkpoint_pb2, session_pb2
from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_service_pb2 as spb
from server.app import Daemon
from tests.conftest import Stubs, make_config, stubs_for
from tests.helpers import ROUTE, assistant, error_info, tool_result, user

SID = "racy"


@pytest.fixture
async def daemon(short_tmp: Path) -> AsyncIterator[tuple[Daemon, Stubs]]:
    d = Daemon(make_config(short_tmp, ui_listen="none"))
    await d.start()
    api = stubs_for(f"unix:{d.endpoints.unix}")
    try:
        await api.sessions.CreateSession(
            spb.CreateSessionRequest(session=session_pb2.Session(session_id=SID))
        )
        yield d, api
    finally:
        await api.channel.close()
        await d.stop()


def _small_window() -> cpb.CompileRequest:
    req = cpb.CompileRequest(session_id=SID, route=ROUTE)
    req.limits.context_window = 3_000
    req.limits.max_output_tokens = 500
    return req


async def test_compiles_at_once_over_the_window_make_one_builtin_checkpoint(
    daemon: tuple[Daemon, Stubs], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two compiles of a session over its window, both asking for the daemon's built-in
    compaction (a unary compile and a stream step, say): each read the history before
    either checkpoint was stored. They must store one checkpoint, as one compile after the
    other does (the second finds the first's), not two of the same range."""
    d, api = daemon
    big = "".join(f"line {i} of a long listing\n" for i in range(400))
    await api.sessions.AppendEvents(
        spb.AppendEventsRequest(
            session_id=SID,
            events=[
                user("List the files"),
                assistant("", ("c1", "shell", '{"cmd": "ls -R"}')),
                tool_result("c1", big),
                user("Now the next directory"),
            ],
        )
    )
    store = d._store
    assert store is not None
    put = store.put_checkpoint
    # Each compile's checkpoint is written once the other compile got there too: both
    # read the history without the other's.
    both_read = threading.Barrier(2, timeout=10)

    def put_when_both_read(checkpoint: Any, *rest: Any) -> Any:
        both_read.wait()
        return put(checkpoint, *rest)

    monkeypatch.setattr(store, "put_checkpoint", put_when_both_read)
    first, second = await asyncio.gather(
        api.compiles.Compile(_small_window()), api.compiles.Compile(_small_window())
    )
    assert not both_read.broken, "both compiles asked for a checkpoint"
    listed = await api.compiles.ListCheckpoints(cpb.ListCheckpointsRequest(session_id=SID))
    builtin = [c for c in listed.checkpoints if c.kind == checkpoint_pb2.CHECKPOINT_KIND_BUILTIN]
    assert len(builtin) == 1, [(c.checkpoint_id, c.covers_through_seq) for c in builtin]
    assert first.view.checkpoint_id == second.view.checkpoint_id == builtin[0].checkpoint_id
    # One compaction stored, one counted.
    url = f"http://{d.endpoints.metrics}/metrics"
    scrape = await asyncio.to_thread(
        lambda: urllib.request.urlopen(url, timeout=30).read().decode()
    )
    performed = re.findall(
        r'ctxcc_compactions_total\{kind="builtin",performed="true"\} (\S+)', scrape
    )
    assert [float(v) for v in performed] == [1.0], performed


async def test_a_session_made_again_during_a_compile_gets_no_memo_of_the_old_one(
    daemon: tuple[Daemon, Stubs], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The compile memo is looked up under the session as the compile first reads it
    (id and create time); the session is then deleted, created again under its id and
    given a conversation of its own before the compile reads it for its inputs. The
    memo of the gone conversation must not be continued with the new one's events: the
    view is the new conversation's only, as a compile from scratch makes it."""
    d, api = daemon
    old = [user("The old conversation"), assistant("Old answer"), user("Old question")]
    await api.sessions.AppendEvents(spb.AppendEventsRequest(session_id=SID, events=old))
    request = cpb.CompileRequest(session_id=SID, route=ROUTE)
    await api.compiles.Compile(request)  # leaves a memo of the old conversation
    store = d._store
    assert store is not None
    loop = asyncio.get_running_loop()
    read_session = store.get_session
    made_again: list[str] = []

    async def make_again() -> None:
        await api.sessions.DeleteSession(spb.DeleteSessionRequest(session_id=SID))
        await api.sessions.CreateSession(
            spb.CreateSessionRequest(session=session_pb2.Session(session_id=SID))
        )
        new = [user(f"New conversation, message {i}") for i in range(4)]
        await api.sessions.AppendEvents(spb.AppendEventsRequest(session_id=SID, events=new))

    def read_then_make_again(session_id: str) -> Any:
        found = read_session(session_id)
        on_loop = threading.current_thread() is threading.main_thread()
        if session_id == SID and not made_again and not on_loop:
            made_again.append(session_id)
            asyncio.run_coroutine_threadsafe(make_again(), loop).result(10)
        return found

    monkeypatch.setattr(store, "get_session", read_then_make_again)
    try:
        view = (await api.compiles.Compile(request)).view
    except grpc.aio.AioRpcError as err:
        # As any compile whose session was deleted and made again while it ran.
        assert error_info(err).reason == "SESSION_NOT_FOUND"
        view = None
    assert made_again, "the session was made again between the compile's reads"
    monkeypatch.undo()
    dry = await api.compiles.Compile(cpb.CompileRequest(session_id=SID, route=ROUTE, dry_run=True))
    after = (await api.compiles.Compile(request)).view
    for got in (view, after):
        if got is None:
            continue
        texts = [p.text for m in got.messages for p in m.parts]
        assert not [t for t in texts if t.startswith("Old") or "old" in t], texts
        assert [m.SerializeToString() for m in got.messages] == [
            m.SerializeToString() for m in dry.view.messages
        ]
