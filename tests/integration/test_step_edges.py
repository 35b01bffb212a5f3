"""CompileStream steps at the edges of what a step may ask, against a real daemon (the
raw stream of test_step_usage.py)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest

from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_service_pb2 as spb
from server.app import Daemon
from server.domain.records import CompileRecord
from storage import open_rocks
from storage.codec import decode_value, encode_value
from storage.keys import session_key, split_compile_id
from storage.kv import Batch
from tests.conftest import Stubs, make_config, stubs_for
from tests.helpers import usage_counts, user
from tests.integration.test_repeat_compiles import _repeats
from tests.integration.test_resume import _one
from tests.integration.test_step_usage import Steps, _compile, _head, _new_session, _usage


async def test_a_rebuild_step_appends_its_events_to_the_rebuilt_compiles_session(
    api: Stubs,
) -> None:
    """A rebuild step may leave compile.session_id empty (the compile id names the
    session), and its events then go to that session, like its report. Before, the
    append was made for the empty session id: the step failed with INVALID_FIELD
    `session_id` after its report had been recorded."""
    await _new_session(api, "rb")
    steps = Steps(api)
    try:
        v1, _ = await steps.view(_compile("rb"), [user("one")])
        rebuild = cpb.CompileRequest(rebuild_compile_id=v1.compile_id)
        again, answer = await steps.view(rebuild, [user("two")], usage=_usage(v1, 7, 10))
        assert again.SerializeToString() == v1.SerializeToString()
        assert answer.append.first_seq == answer.append.last_seq == 2
        assert answer.usage.error_tokens == 7 and not answer.usage.replayed
        assert await _head(api, "rb") == 2
        listed = await api.sessions.ListEvents(spb.ListEventsRequest(session_id="rb"))
        assert [e.user_message.parts[0].text for e in listed.events] == ["one", "two"]
    finally:
        await steps.close()


async def test_a_rebuild_step_of_a_compile_that_is_not_there_writes_nothing(
    api: Stubs,
) -> None:
    """A rebuild step naming a compile of a session since deleted and made again under
    its id, or one never made, is refused before its append: the new conversation gets
    no event of the old one's client."""
    await _new_session(api, "rg")
    steps = Steps(api)
    try:
        old, _ = await steps.view(_compile("rg"), [user("old conversation")])
        await api.sessions.DeleteSession(spb.DeleteSessionRequest(session_id="rg"))
        await _new_session(api, "rg")
        await api.sessions.AppendEvents(
            spb.AppendEventsRequest(session_id="rg", events=[user("new conversation")])
        )
        for named in (old.compile_id, "rg:000000000000000000000000"):
            rebuild = cpb.CompileRequest(rebuild_compile_id=named)
            (answer,) = await steps.step(rebuild, [user("stray")])
            assert answer.error.reason == "COMPILE_NOT_FOUND", answer
            assert not answer.HasField("append")
        listed = await api.sessions.ListEvents(spb.ListEventsRequest(session_id="rg"))
        assert [e.user_message.parts[0].text for e in listed.events] == ["new conversation"]
        # The stream goes on: a step of the new session is answered.
        new, _ = await steps.view(_compile("rg"), [user("next")])
        assert new.event_boundary == 2
    finally:
        await steps.close()


async def test_a_rebuild_step_of_a_compile_recorded_without_its_basis_writes_nothing(
    short_tmp: Path,
) -> None:
    """A compile recorded without its basis (by a daemon before exact time travel) cannot
    be rebuilt: a rebuild step naming it is refused before its report and its append."""
    cfg = make_config(short_tmp)
    d = Daemon(cfg)
    await d.start()
    api = stubs_for(f"unix:{d.endpoints.unix}")
    try:
        await _new_session(api, "nb")
        await api.sessions.AppendEvents(
            spb.AppendEventsRequest(session_id="nb", events=[user("one")])
        )
        view = (await api.compiles.Compile(_compile("nb"))).view
    finally:
        await api.channel.close()
        await d.stop()
    # As such a daemon wrote it: the record without a basis digest.
    kv = open_rocks(cfg.db_path)
    sid, suffix = split_compile_id(view.compile_id)
    key = session_key(sid, suffix)
    raw = kv.get("compiles", key)
    assert raw is not None
    batch = Batch()
    batch.put(
        "compiles", key, encode_value(replace(decode_value(raw, CompileRecord), basis_digest=""))
    )
    kv.write(batch)
    kv.close()
    d = Daemon(cfg)
    await d.start()
    api = stubs_for(f"unix:{d.endpoints.unix}")
    steps = Steps(api)
    try:
        rebuild = cpb.CompileRequest(rebuild_compile_id=view.compile_id)
        (answer,) = await steps.step(rebuild, [user("stray")], usage=_usage(view, 7, 10))
        assert answer.error.reason == "COMPILE_NOT_FOUND", answer
        assert "without its basis" in answer.error.message
        assert not answer.HasField("append") and not answer.HasField("usage")
        assert await _head(api, "nb") == 1
    finally:
        await steps.close()
        await api.channel.close()
        await d.stop()


async def _watched(api: Stubs, sid: str) -> tuple[Any, Any]:
    """A new session with events 1 and 2, and a watch (its call and its updates) that
    has seen 2 live, so it is subscribed."""
    await _new_session(api, sid)
    await api.sessions.AppendEvents(spb.AppendEventsRequest(session_id=sid, events=[user("1")]))
    watch = api.sessions.WatchSession(spb.WatchSessionRequest(session_id=sid, after_seq=1))
    updates = watch.__aiter__()
    await api.sessions.AppendEvents(spb.AppendEventsRequest(session_id=sid, events=[user("2")]))
    assert (await asyncio.wait_for(updates.__anext__(), 30)).event.seq == 2
    return watch, updates


async def _cut_step(api: Stubs) -> None:
    """A step whose client goes away while its append waits, then resent (a replay)."""
    cut = Steps(api)
    stepping = asyncio.ensure_future(cut.step(_compile("w"), [user("3")], request_id="cut"))
    await asyncio.sleep(0.3)  # the append waits for the lock, on a storage thread
    assert not stepping.done()
    await cut.close()  # the client goes away mid-step
    with contextlib.suppress(grpc.aio.AioRpcError, asyncio.CancelledError):
        await stepping


async def _resent_step(api: Stubs) -> None:
    again = Steps(api)
    try:
        answers = await again.step(_compile("w"), [user("3")], request_id="cut")
        assert answers[0].append.replayed and answers[0].append.last_seq == 3
    finally:
        await again.close()


async def _cut_append(api: Stubs) -> None:
    """A unary append whose deadline passes while it waits."""
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await api.sessions.AppendEvents(
            spb.AppendEventsRequest(session_id="w", events=[user("3")]), timeout=0.3
        )
    assert failed.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


async def _nothing(api: Stubs) -> None:
    pass


@pytest.mark.parametrize("how", ["stream", "unary"])
async def test_an_append_cut_off_by_its_caller_still_tells_watchers_its_events(
    daemon: Daemon, api: Stubs, how: str
) -> None:
    """An append whose caller goes away while it waits for the session's store lock (a
    stream step whose client reconnects, then resends it; a unary append past its
    deadline) lands anyway. Watchers must still get its events, in order (or a
    resync): before, they reached no watcher (the cut call never took its append's
    result, and a replay publishes nothing) and the appended-events metrics missed
    them."""
    cut, resend = (_cut_step, _resent_step) if how == "stream" else (_cut_append, _nothing)
    watch, updates = await _watched(api, "w")
    store = daemon._store
    assert store is not None
    lock = store._lock("w")
    await asyncio.to_thread(lock.acquire)
    try:
        await cut(api)
        await asyncio.sleep(0.2)
    finally:
        lock.release()
    await resend(api)
    await api.sessions.AppendEvents(spb.AppendEventsRequest(session_id="w", events=[user("4")]))
    seen: list[str] = []
    while "event 4" not in seen:
        update = await asyncio.wait_for(updates.__anext__(), 30)
        kind = update.WhichOneof("update")
        if kind == "event":
            seen.append(f"event {update.event.seq}")
        elif kind == "resync":
            seen.append(f"resync {update.resync.head_seq}")
    watch.cancel()
    assert seen[0] in ("event 3", "resync 3", "resync 4"), seen


async def test_resume_after_the_session_was_deleted_and_made_again_compiles_afresh(
    api: Stubs,
) -> None:
    """The view a ResumeRequest names belongs to a session that was deleted and created
    again under the same id, with as many events: that view is of a conversation that is
    gone (its compile no longer exists, a usage report for it is COMPILE_NOT_FOUND), so
    the answer is a fresh compile of the session as it is. Before, the gone view was
    resent because the head had the same seq."""

    await _new_session(api, "rd")
    step = cpb.StepRequest(step_id="1", events=[user("old ask")], compile=_compile("rd"))
    old = (await _one(api, cpb.CompileStreamRequest(step=step))).view
    await api.sessions.DeleteSession(spb.DeleteSessionRequest(session_id="rd"))
    await _new_session(api, "rd")
    await api.sessions.AppendEvents(
        spb.AppendEventsRequest(session_id="rd", events=[user("new ask")])
    )
    resume = cpb.ResumeRequest(compile_id=old.compile_id, compile=_compile("rd"))
    got = (await _one(api, cpb.CompileStreamRequest(resume=resume))).view
    assert got.compile_id != old.compile_id
    assert [p.text for m in got.messages for p in m.parts] == ["new ask"]


async def test_resume_and_usage_of_a_repeated_view(daemon: Daemon, api: Stubs) -> None:
    """A step's view repeated (nothing written since the last compile: sent again under
    a new compile id without compiling) is a view like any other: a ResumeRequest naming
    it on a new stream gets it back byte for byte, and its usage report is recorded and
    becomes the next compile's baseline."""
    await _new_session(api, "rp")
    steps = Steps(api)
    try:
        await steps.view(_compile("rp"), [user("one")])
        await steps.view(_compile("rp"), [])  # its previous sections are its own
        before = await asyncio.to_thread(usage_counts, str(daemon.endpoints.metrics))
        repeated, _ = await steps.view(_compile("rp"), [])
    finally:
        await steps.close()
    assert await _repeats(daemon) == 1
    resume = cpb.ResumeRequest(compile_id=repeated.compile_id, compile=_compile("rp"))
    got = await _one(api, cpb.CompileStreamRequest(resume=resume))
    assert got.view.SerializeToString() == repeated.SerializeToString()
    answer = await api.compiles.ReportUsage(_usage(repeated, 9, 10))
    assert not answer.replayed and answer.error_tokens == 9
    after = await asyncio.to_thread(usage_counts, str(daemon.endpoints.metrics))
    assert after[0] == before[0] + 1
    nxt = await api.compiles.Compile(_compile("rp"))
    assert nxt.view.budget.baseline_tokens == repeated.budget.estimated_input_tokens + 9


async def test_reports_of_one_compile_racing_each_other_are_recorded_once(
    daemon: Daemon, api: Stubs
) -> None:
    """The same compile's usage reported at once by two streams' steps and a unary
    ReportUsage (a client resending on a new stream while its flush goes by the unary
    call): one is recorded, the others are replays answered from it, and the metrics
    count it once."""
    await _new_session(api, "race")
    one, two = Steps(api), Steps(api)
    try:
        view, _ = await one.view(_compile("race"), [user("hello")], request_id="a")
        before = await asyncio.to_thread(usage_counts, str(daemon.endpoints.metrics))
        first, unary, second = await asyncio.gather(
            one.step(_compile("race"), [], usage=_usage(view, 5, 1)),
            api.compiles.ReportUsage(_usage(view, 6, 1)),
            two.step(_compile("race"), [], usage=_usage(view, 8, 1), request_id="b"),
        )
    finally:
        await one.close()
        await two.close()
    answers = [first[0].usage, unary, second[0].usage]
    assert sorted(a.replayed for a in answers) == [False, True, True]
    recorded = next(a for a in answers if not a.replayed)
    assert {a.error_tokens for a in answers} == {recorded.error_tokens}
    after = await asyncio.to_thread(usage_counts, str(daemon.endpoints.metrics))
    assert after[0] == before[0] + 1


async def test_an_append_published_after_a_later_one_still_reaches_watchers_in_order(
    daemon: Daemon, api: Stubs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two appends to one session at once: the first writes seq 3, then its storage
    thread is descheduled before handing its result back, while the second writes seq 4
    and is answered (published) first. A watcher must still get 3 then 4: before, 4
    went out and 3, arriving later, was dropped as already sent (no resync), so the
    watcher never saw it."""
    watch, updates = await _watched(api, "o")
    store = daemon._store
    assert store is not None
    append = store.append
    slowed: list[int] = []
    wrote, release = threading.Event(), threading.Event()

    def descheduled_after_the_first_write(batch: Any) -> Any:
        written = append(batch)
        if not slowed:
            slowed.append(written.first_seq)
            wrote.set()
            # The GIL elsewhere (a long count), this thread waiting: until the other
            # append was answered, so published.
            release.wait(30)
        return written

    monkeypatch.setattr(store, "append", descheduled_after_the_first_write)

    def one(text: str) -> Any:
        request = spb.AppendEventsRequest(session_id="o", events=[user(text)])
        return api.sessions.AppendEvents(request)

    first = asyncio.ensure_future(one("3"))
    assert await asyncio.to_thread(wrote.wait, 30)
    second = await one("4")
    release.set()
    assert second.last_seq == 4 and slowed == [3], "3 was written first"
    assert (await first).last_seq == 3
    seen = [(await asyncio.wait_for(updates.__anext__(), 30)).event.seq for _ in range(2)]
    watch.cancel()
    assert seen == [3, 4]


@pytest.mark.parametrize("where", ["same stream", "new stream"])
@pytest.mark.parametrize("unrecorded", ["dry_run", "as_of_seq"])
async def test_resume_of_an_unrecorded_view_of_a_deleted_life_compiles_afresh(
    api: Stubs, unrecorded: str, where: str
) -> None:
    """A dry run's or time travel's view has no record whose absence tells that its
    session was deleted and made again under its id: with as many events, a resume naming
    it resent the gone conversation to the new one (on the stream that sent it, or on a
    new stream after a reconnect). Views are kept with their session's create time."""
    await _new_session(api, "ru")
    await api.sessions.AppendEvents(
        spb.AppendEventsRequest(session_id="ru", events=[user("OLD secret"), user("OLD more")])
    )
    looked = _compile("ru")
    if unrecorded == "dry_run":
        looked.dry_run = True
    else:
        looked.as_of_seq = 2
    steps = Steps(api)
    try:
        old, _ = await steps.view(looked, [])
        assert old.event_boundary == 2
        await api.sessions.DeleteSession(spb.DeleteSessionRequest(session_id="ru"))
        await _new_session(api, "ru")
        await api.sessions.AppendEvents(
            spb.AppendEventsRequest(session_id="ru", events=[user("NEW ask"), user("NEW more")])
        )
        resume = cpb.ResumeRequest(compile_id=old.compile_id, compile=_compile("ru"), step_id="r")
        msg = cpb.CompileStreamRequest(resume=resume)
        if where == "new stream":
            got = (await _one(api, msg)).view
        else:
            await steps._queue.put(msg)
            got = (await steps._it.__anext__()).view
    finally:
        await steps.close()
    assert got.compile_id != old.compile_id
    assert [p.text for m in got.messages for p in m.parts] == ["NEW ask", "NEW more"]


async def test_a_delta_base_of_a_deleted_life_is_no_base(api: Stubs) -> None:
    """A step naming, as its delta base, a view its stream got before the session was
    deleted and made again under its id is answered with the whole view: a delta would
    be against a conversation that is gone."""
    await _new_session(api, "rl")
    steps = Steps(api)
    try:
        old, _ = await steps.view(_compile("rl"), [user("same words")])
        await api.sessions.DeleteSession(spb.DeleteSessionRequest(session_id="rl"))
        await _new_session(api, "rl")
        answers = await steps.step(
            _compile("rl"), [user("same words")], delta_base_compile_id=old.compile_id
        )
    finally:
        await steps.close()
    assert answers[0].WhichOneof("response") == "view"
    assert [p.text for m in answers[0].view.messages for p in m.parts] == ["same words"]
