"""A CompileStream step's one hop off the event loop (its append on a storage thread, its
compile on a compute thread, one callback back on the loop), against a real daemon: what
lands must be answered and published whatever the compile then does."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import grpc
import pytest

from ctxcc.v1 import event_pb2
from ctxcc.v1 import session_service_pb2 as spb
from server.app import Daemon
from server.transport import session_servicer
from server.transport.convert_events import events_in
from tests.conftest import Stubs
from tests.helpers import error_info, user
from tests.integration.test_step_usage import Steps, _compile, _head, _new_session, _usage


async def test_a_step_whose_compile_fails_after_its_append_still_answers_the_append(
    daemon: Daemon, api: Stubs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The append was written before the compile failed: the step's answer carries the
    error and the append's result (its client must not resend it as new), watchers get
    its event, and the stream goes on."""
    await _new_session(api, "f")
    servicer = daemon.compile_servicer
    assert servicer is not None
    compiles = servicer._c
    watch = api.sessions.WatchSession(spb.WatchSessionRequest(session_id="f", after_seq=0))
    updates = watch.__aiter__()
    steps = Steps(api)
    try:
        first = await steps.step(_compile("f"), [user("one")])
        assert first[0].append.last_seq == 1
        prepare = compiles._prepare_and_finish

        def failing(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("the compile broke")

        monkeypatch.setattr(compiles, "_prepare_and_finish", failing)
        [answer] = await steps.step(_compile("f"), [user("two"), user("three")])
        assert answer.error.reason == "INTERNAL", answer
        assert (answer.append.first_seq, answer.append.last_seq) == (2, 3)
        assert not answer.append.replayed
        assert await _head(api, "f") == 3
        assert await _events(updates, 3) == [1, 2, 3]

        monkeypatch.setattr(compiles, "_prepare_and_finish", prepare)
        view, after = await steps.view(_compile("f"), [user("four")])
        assert after.append.first_seq == 4 and view.event_boundary == 4
    finally:
        watch.cancel()
        await steps.close()


async def _events(updates: Any, count: int) -> list[int]:
    """The seqs of the next `count` events a watch gets (compile notices skipped)."""
    seqs: list[int] = []
    while len(seqs) < count:
        update = await asyncio.wait_for(updates.__anext__(), 30)
        if update.WhichOneof("update") == "event":
            seqs.append(update.event.seq)
    return seqs


async def test_a_failed_append_fails_its_step_and_compiles_nothing(
    daemon: Daemon, api: Stubs
) -> None:
    """An append refused on its storage thread (a stale expected_last_seq) is the step's
    error: no append result, no compile, and the next step works."""
    await _new_session(api, "m")
    steps = Steps(api)
    try:
        await steps.step(_compile("m"), [user("one")])
        [answer] = await steps.step(_compile("m"), [user("two")], expected_last_seq=0)
        assert answer.error.reason == "SEQUENCE_MISMATCH", answer
        assert not answer.HasField("append")
        assert answer.WhichOneof("response") == "error"
        assert await _head(api, "m") == 1
        view, after = await steps.view(_compile("m"), [user("two")], expected_last_seq=1)
        assert after.append.first_seq == 2 and view.event_boundary == 2
    finally:
        await steps.close()


async def test_a_step_with_an_invalid_event_is_refused_in_band_after_its_report(
    api: Stubs,
) -> None:
    """A step's events are converted and checked on the storage thread, with its append:
    an event without a payload, or a malformed event id, is still refused with
    INVALID_FIELD naming it, after the report the step carries was recorded (as
    before), with nothing appended and the stream open."""
    await _new_session(api, "iv")
    steps = Steps(api)
    try:
        v1, _ = await steps.view(_compile("iv"), [user("one")])
        empty = event_pb2.Event(event_id="e-empty")
        bad_id = user("two", event_id="bad id\x00")
        for events, named in (([user("two"), empty], "events[1]"), ([bad_id], "events[0]")):
            [answer] = await steps.step(_compile("iv"), events, usage=_usage(v1, 5, 10))
            assert answer.error.reason == "INVALID_FIELD", answer
            assert named in answer.error.message, answer
            assert not answer.error.usage_refused and answer.HasField("usage")
            assert not answer.HasField("append")
            assert await _head(api, "iv") == 1
        view, after = await steps.view(_compile("iv"), [user("two")])
        assert after.append.first_seq == 2 and view.event_boundary == 2
    finally:
        await steps.close()


async def test_a_unary_append_converts_its_events_off_the_event_loop(
    api: Stubs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """AppendEvents converts and checks its events on the storage thread with the write,
    as a stream step does (a 32 MiB tool result's text is copied there, not on the event
    loop that every session's calls share); its refusals are what they were: the session
    and request ids and an empty or too long list before the hop, a bad event named after
    it, nothing appended either way."""
    seen: list[int] = []

    def recording(events: list[event_pb2.Event]) -> Any:
        seen.append(threading.get_ident())
        return events_in(events)

    monkeypatch.setattr(session_servicer, "events_in", recording)
    await _new_session(api, "ua")
    out = await api.sessions.AppendEvents(
        spb.AppendEventsRequest(session_id="ua", events=[user("one")])
    )
    assert (out.first_seq, out.last_seq) == (1, 1)
    assert seen and threading.get_ident() not in seen, "converted on the event loop"
    refused = [
        (spb.AppendEventsRequest(session_id="ua", events=[]), "events"),
        (spb.AppendEventsRequest(session_id="bad id\x00", events=[user("x")]), "session_id"),
        (
            spb.AppendEventsRequest(session_id="ua", events=[user("x"), event_pb2.Event()]),
            "events[1]",
        ),
    ]
    for request, named in refused:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await api.sessions.AppendEvents(request)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value
        info = error_info(err.value)
        assert info.reason == "INVALID_FIELD" and named in info.metadata["field"], info
    assert await _head(api, "ua") == 1


class _HeldSync:
    """The daemon's RocksDB handle with its log sync held until `release`: records the
    order of writes and syncs (a write is an unsynced batch, `sync` the log's fsync)."""

    def __init__(self, db: Any) -> None:
        self._db = db
        self.calls: list[str] = []
        self.syncing = threading.Event()
        self.release = threading.Event()

    def write(self, batch: object, opts: Any) -> None:
        assert not opts.sync, "every batch is written unsynced"
        self.calls.append("write")
        self._db.write(batch, opts)

    def flush_wal(self, sync: bool) -> None:
        self.calls.append("sync")
        self.syncing.set()
        assert self.release.wait(10)
        self._db.flush_wal(sync)


async def test_a_step_is_answered_after_its_append_is_synced_and_compiles_meanwhile(
    daemon: Daemon, api: Stubs
) -> None:
    """With durability `sync` (the default), a step's append is fsynced while its compile
    runs: the compile writes its record while the sync is still held, and the answer
    (append result and view) comes only once the sync is done."""
    assert daemon.cfg.durability == "sync"
    await _new_session(api, "d")
    steps = Steps(api)
    assert daemon._store is not None
    kv: Any = daemon._store._kv
    held = _HeldSync(kv._db)
    try:
        await steps.step(_compile("d"), [user("one")])
        kv._db = held
        step = asyncio.ensure_future(steps.step(_compile("d"), [user("two")]))
        assert await asyncio.to_thread(held.syncing.wait, 10)
        # The compile's record is written while the append's sync is held.
        for _ in range(200):
            if held.calls.count("write") >= 2:
                break
            await asyncio.sleep(0.05)
        # (Which of the compute and the storage thread takes the GIL first decides the
        # order of the two: the compile did not wait for the sync either way.)
        assert sorted(held.calls) == ["sync", "write", "write"], held.calls
        await asyncio.sleep(0.2)
        assert not step.done(), "answered before its append was durable"
        held.release.set()
        [answer] = await step
        assert answer.append.last_seq == 2 and answer.WhichOneof("response") == "view"
        assert answer.view.event_boundary == 2
    finally:
        held.release.set()
        kv._db = held._db
        await steps.close()
