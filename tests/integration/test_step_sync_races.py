"""Races around a step's deferred sync, on a real daemon."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from ctxcc.v1 import session_service_pb2 as spb
from server.app import Daemon
from tests.conftest import Stubs, make_config, stubs_for
from tests.contract.test_rocks import NoSpaceOnSync
from tests.helpers import user
from tests.integration.test_step_hop import _events as _seqs
from tests.integration.test_step_hop import _HeldSync
from tests.integration.test_step_usage import Steps, _compile, _head, _new_session


async def test_two_streams_and_unary_appends_on_one_session(daemon: Daemon, api: Stubs) -> None:
    await _new_session(api, "two")
    watch = api.sessions.WatchSession(spb.WatchSessionRequest(session_id="two", after_seq=0))
    updates = watch.__aiter__()
    a, b = Steps(api), Steps(api)

    async def stream(s: Steps, tag: str) -> None:
        for i in range(15):
            [ans] = await s.step(
                _compile("two"), [user(f"{tag}{i}", f"{tag}{i}")], request_id=f"{tag}{i}"
            )
            assert ans.WhichOneof("response") == "view", ans

    async def unary() -> None:
        for i in range(15):
            await api.sessions.AppendEvents(
                spb.AppendEventsRequest(session_id="two", events=[user(f"u{i}", f"u{i}")])
            )

    try:
        await asyncio.gather(stream(a, "a"), stream(b, "b"), unary())
        assert await _head(api, "two") == 45
        assert await _seqs(updates, 45) == list(range(1, 46))
    finally:
        watch.cancel()
        await a.close()
        await b.close()


async def test_a_stream_cancelled_during_the_sync_still_lands_and_a_retry_replays(
    daemon: Daemon, api: Stubs
) -> None:
    await _new_session(api, "cx")
    watch = api.sessions.WatchSession(spb.WatchSessionRequest(session_id="cx", after_seq=0))
    updates = watch.__aiter__()
    first, retry = Steps(api), Steps(api)
    assert daemon._store is not None
    kv: Any = daemon._store._kv
    held = _HeldSync(kv._db)
    try:
        await first.step(_compile("cx"), [user("one", "e1")], request_id="a")
        kv._db = held
        step = asyncio.ensure_future(
            first.step(_compile("cx"), [user("two", "e2")], request_id="b")
        )
        assert await asyncio.to_thread(held.syncing.wait, 10)
        await first.close()
        await asyncio.sleep(0.3)
        held.release.set()
        kv._db = held._db
        assert await _seqs(updates, 2) == [1, 2]
        [ans] = await retry.step(_compile("cx"), [user("two", "e2")], request_id="b")
        assert ans.append.replayed and ans.append.last_seq == 2, ans
        [ans] = await retry.step(_compile("cx"), [user("three", "e3")], request_id="c")
        assert ans.append.last_seq == 3 and ans.view.event_boundary == 3, ans
        step.cancel()
    finally:
        held.release.set()
        kv._db = held._db
        watch.cancel()
        await retry.close()


async def test_a_step_whose_sync_failed_is_settled_by_its_retry(daemon: Daemon, api: Stubs) -> None:
    """The step's sync fails for space: DISK_FULL (may not have been kept); its retry is
    refused while the disk is full (not answered as a replay of a write that may be
    lost), and once space is back it is a replay or a new append, never both."""
    await _new_session(api, "fs")
    # The daemon's disk poll (every second) would reopen the engine on its own between
    # the failed step and its retry: the test reopens it itself, when it means to.
    assert daemon._disk_watch is not None
    daemon._disk_watch.cancel()
    steps = Steps(api)
    assert daemon._store is not None
    kv: Any = daemon._store._kv
    real = kv._db
    try:
        await steps.step(_compile("fs"), [user("one", "e1")], request_id="a")
        kv._db = NoSpaceOnSync(real)
        [ans] = await steps.step(_compile("fs"), [user("two", "e2")], request_id="b")
        assert ans.error.reason == "DISK_FULL" and "may not" in ans.error.message, ans
        assert not ans.HasField("append")
        kv._db = real
        [again] = await steps.step(_compile("fs"), [user("two", "e2")], request_id="b")
        assert again.error.reason == "DISK_FULL", again
        assert daemon._store.writable()  # space is back: reopened
        [settled] = await steps.step(_compile("fs"), [user("two", "e2")], request_id="b")
        assert settled.WhichOneof("response") == "view", settled
        assert settled.append.last_seq == 2
        [nxt] = await steps.step(_compile("fs"), [user("three", "e3")], request_id="c")
        assert nxt.append.first_seq == 3 and nxt.view.event_boundary == 3, nxt
        assert await _head(api, "fs") == 3
    finally:
        if kv._db is not None and kv._db is not real and isinstance(kv._db, NoSpaceOnSync):
            kv._db = real
        await steps.close()


async def test_a_stop_while_a_steps_sync_is_held_answers_it_and_keeps_it(
    short_tmp: Path,
) -> None:
    d = Daemon(make_config(short_tmp))
    await d.start()
    api = stubs_for(str(d.endpoints.tcp))
    steps = Steps(api)
    assert d._store is not None
    kv: Any = d._store._kv
    held = _HeldSync(kv._db)
    try:
        await _new_session(api, "st")
        await steps.step(_compile("st"), [user("one", "e1")], request_id="a")
        kv._db = held
        step = asyncio.ensure_future(
            steps.step(_compile("st"), [user("two", "e2")], request_id="b")
        )
        assert await asyncio.to_thread(held.syncing.wait, 10)
        stopping = asyncio.ensure_future(d.stop())
        await asyncio.sleep(0.5)
        assert not stopping.done()
        held.release.set()
        kv._db = held._db  # what the store closes
        [ans] = await asyncio.wait_for(step, 10)
        assert ans.append.last_seq == 2 and ans.view.event_boundary == 2, ans
        await asyncio.wait_for(stopping, 20)
    finally:
        held.release.set()
        await api.channel.close()
    again = Daemon(make_config(short_tmp))
    await again.start()
    api = stubs_for(str(again.endpoints.tcp))
    try:
        assert await _head(api, "st") == 2
    finally:
        await api.channel.close()
        await again.stop()


def _writes(daemon: Daemon) -> float:
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    url = f"http://{daemon.endpoints.metrics}/metrics"
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    for family in text_string_to_metric_families(text):
        if family.name == "ctxcc_storage_write_duration_seconds":
            return sum(s.value for s in family.samples if s.name.endswith("_count"))
    return 0.0


async def test_a_step_counts_one_storage_write_for_its_append_and_sync(
    daemon: Daemon, api: Stubs
) -> None:
    """A step's deferred append is one sample, fsync included, as a unary append's is:
    a step makes as many samples as a unary append followed by a compile."""
    await _new_session(api, "m1")
    await _new_session(api, "m2")
    steps = Steps(api)
    try:
        await steps.step(_compile("m1"), [user("one", "e1")], request_id="a")
        await api.sessions.AppendEvents(
            spb.AppendEventsRequest(session_id="m2", events=[user("one", "e1")])
        )
        await api.compiles.Compile(_compile("m2"))
        before = _writes(daemon)
        await steps.step(_compile("m1"), [user("two", "e2")], request_id="b")
        by_step = _writes(daemon) - before
        before = _writes(daemon)
        await api.sessions.AppendEvents(
            spb.AppendEventsRequest(session_id="m2", events=[user("two", "e2")])
        )
        await api.compiles.Compile(_compile("m2"))
        by_unary = _writes(daemon) - before
        assert by_step == by_unary, (by_step, by_unary)
    finally:
        await steps.close()
