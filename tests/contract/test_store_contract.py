"""One contract, two engines: the in-memory twin and RocksDB must behave the same."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from server.domain.errors import CtxccError, Reason
from server.domain.model import (
    AppendBatch,
    BlobRef,
    ContentPart,
    EventKind,
    EventPage,
    NewEvent,
    Route,
    Session,
    ToolResult,
    UserMessage,
)
from server.domain.records import (
    ArtifactRecord,
    Checkpoint,
    CheckpointKind,
    CompileRecord,
    Learn,
    RouteModel,
    RouteState,
    Usage,
    UsagePlan,
)
from server.domain.sources import MemoryEntry, Scope, SourceKind
from server.domain.tools import ToolSpec
from server.service.ports import EventStore
from storage import KVEventStore, MemoryKV, StoreLimits, open_rocks
from storage.codec import encode_value


@pytest.fixture(params=["memory", "rocksdb"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[object]:
    opened: list[KVEventStore] = []

    def make(limits: StoreLimits | None = None) -> KVEventStore:
        kv = MemoryKV() if request.param == "memory" else open_rocks(tmp_path / "db")
        store = KVEventStore(kv, limits)
        opened.append(store)
        return store

    yield make
    for s in opened:
        s.close()


def msg(text: str, eid: str) -> NewEvent:
    return NewEvent(eid, UserMessage((ContentPart(text=text),)))


def batch(sid: str, *events: NewEvent, **kw: object) -> AppendBatch:
    return AppendBatch(sid, tuple(events), now_ns=1, **kw)  # type: ignore[arg-type]


def planned(state: RouteState, learn: Learn | None = None) -> UsagePlan:
    """A usage plan whose baseline and learner do not depend on the record."""
    return lambda _record: (state, learn)


def new_store(make_store: object, **kw: int) -> KVEventStore:
    store = make_store(StoreLimits(**kw) if kw else None)  # type: ignore[operator]
    assert isinstance(store, KVEventStore)
    return store


def test_appends_are_contiguous_and_ordered(make_store: object) -> None:
    st = new_store(make_store)
    st.create_session(Session("s", 1, 1))
    r1 = st.append(batch("s", msg("a", "e1"), msg("b", "e2")))
    r2 = st.append(batch("s", msg("c", "e3")))
    assert (r1.first_seq, r1.last_seq, r2.first_seq, r2.last_seq) == (1, 2, 3, 3)
    events = st.read_events("s")
    assert [e.seq for e in events] == [1, 2, 3]
    assert [e.event_id for e in events] == ["e1", "e2", "e3"]
    assert st.get_session("s").head_seq == 3
    assert [e.seq for e in st.read_events("s", after_seq=1, limit=1)] == [2]
    assert [e.seq for e in st.read_events("s", through_seq=2)] == [1, 2]


def test_an_append_made_deferring_its_sync_reads_back_before_and_after_the_sync(
    make_store: object,
) -> None:
    """A step's append is written inside `deferring_sync` and its compile reads it while
    the log is synced: what the append wrote is readable before the sync, and the sync
    (made once, on another thread, as the step's storage thread does) changes nothing
    of it; a second sync owes nothing."""
    st = new_store(make_store)
    st.create_session(Session("s", 1, 1))
    with st.deferring_sync() as owed:
        result = st.append(batch("s", msg("a", "e1"), msg("b", "e2"), request_id="r1"))
    assert (result.first_seq, result.last_seq) == (1, 2)
    assert [e.event_id for e in st.read_events("s")] == ["e1", "e2"]
    assert st.get_session("s").head_seq == 2
    synced = threading.Thread(target=owed.sync)
    synced.start()
    synced.join(5)
    owed.sync()
    assert [e.event_id for e in st.read_events("s")] == ["e1", "e2"]
    replay = st.append(batch("s", msg("a", "e1"), msg("b", "e2"), request_id="r1"))
    assert replay.replayed and replay.last_seq == 2


def test_put_tools_says_which_definitions_are_new_or_changed(make_store: object) -> None:
    """What a registration adds for the next compile to count: tools registered again as
    stored (read back from the store, decoded) are not new; a changed one is, and a
    registration over the limit writes nothing."""
    st = new_store(make_store)
    st.create_session(Session("s", 1, 1))
    a, b = ToolSpec("a", "reads", '{"type":"object"}'), ToolSpec("b", "writes", "{}")
    assert st.put_tools("s", (a, b), False, 8) == (2, (a, b))
    assert st.put_tools("s", (a, b), True, 8) == (2, ())
    changed = ToolSpec("b", "writes files", "{}")
    assert st.put_tools("s", (a, changed), False, 8) == (2, (changed,))
    with pytest.raises(CtxccError):
        st.put_tools("s", (ToolSpec("c", "c", "{}"),), False, 2)
    assert [t.name for t in st.list_tools("s")] == ["a", "b"]


def test_sessions_do_not_bleed_into_each_other(make_store: object) -> None:
    # "a" is a prefix of "ab": keys must still keep their events apart.
    st = new_store(make_store)
    st.create_session(Session("a", 1, 1))
    st.create_session(Session("ab", 1, 1))
    st.append(batch("a", msg("x", "e1")))
    st.append(batch("ab", msg("y", "e1"), msg("z", "e2")))
    assert len(st.read_events("a")) == 1
    assert len(st.read_events("ab")) == 2
    st.delete_session("a")
    assert len(st.read_events("ab")) == 2


def test_retry_replays_and_reuse_is_refused(make_store: object) -> None:
    st = new_store(make_store)
    st.create_session(Session("s", 1, 1))
    b = batch("s", msg("a", "e1"), request_id="r", request_digest="d1")
    first = st.append(b)
    again = st.append(batch("s", msg("a", "e-other"), request_id="r", request_digest="d1"))
    assert again.replayed and (again.first_seq, again.last_seq) == (first.first_seq, first.last_seq)
    assert again.event_ids == ("e1",)
    assert st.get_session("s").head_seq == 1
    with pytest.raises(CtxccError) as exc:
        st.append(batch("s", msg("b", "e2"), request_id="r", request_digest="d2"))
    assert exc.value.reason is Reason.REQUEST_ID_REUSED
    assert st.get_session("s").head_seq == 1


def test_expected_last_seq_and_event_id_conflicts_write_nothing(make_store: object) -> None:
    st = new_store(make_store)
    st.create_session(Session("s", 1, 1))
    st.append(batch("s", msg("a", "e1")))
    with pytest.raises(CtxccError) as exc:
        st.append(batch("s", msg("b", "e2"), expected_last_seq=0))
    assert exc.value.reason is Reason.SEQUENCE_MISMATCH
    assert exc.value.metadata["head_seq"] == "1"
    with pytest.raises(CtxccError) as exc:
        st.append(batch("s", msg("b", "e2"), msg("c", "e1")))
    assert exc.value.reason is Reason.EVENT_ID_CONFLICT
    with pytest.raises(CtxccError) as exc:
        st.append(batch("s", msg("b", "e9"), msg("c", "e9")))
    assert exc.value.reason is Reason.EVENT_ID_CONFLICT
    assert st.get_session("s").head_seq == 1
    assert [e.event_id for e in st.read_events("s")] == ["e1"]
    assert st.append(batch("s", msg("b", "e2"), expected_last_seq=1)).last_seq == 2


def test_quotas(make_store: object) -> None:
    st = new_store(make_store, max_sessions=2, max_session_bytes=400)
    st.create_session(Session("a", 1, 1))
    st.create_session(Session("b", 1, 1))
    with pytest.raises(CtxccError) as exc:
        st.create_session(Session("c", 1, 1))
    assert exc.value.reason is Reason.QUOTA_EXCEEDED
    with pytest.raises(CtxccError) as exc:
        st.create_session(Session("a", 1, 1))
    assert exc.value.reason is Reason.SESSION_ALREADY_EXISTS
    st.append(batch("a", msg("x" * 100, "e1")))
    with pytest.raises(CtxccError) as exc:
        st.append(batch("a", msg("x" * 300, "e2")))
    assert exc.value.reason is Reason.QUOTA_EXCEEDED
    assert exc.value.metadata["quota"] == "max_session_bytes"
    assert st.get_session("a").head_seq == 1
    st.delete_session("b")
    st.create_session(Session("c", 1, 1))
    assert st.count_sessions() == 2


def test_tool_definitions_count_against_the_session_byte_quota(make_store: object) -> None:
    """A session's registered tools are stored bytes like its events: over the quota a
    registration is refused with nothing written, and replacing or dropping tools gives
    their bytes back."""
    st = new_store(make_store, max_session_bytes=600)
    st.create_session(Session("s", 1, 1))
    small = ToolSpec("a", "reads", "{}")
    st.put_tools("s", (small,), False, 8)
    held = st.get_session("s").stored_bytes
    assert held > 0
    big = ToolSpec("b", "x" * 700, "{}")
    with pytest.raises(CtxccError) as exc:
        st.put_tools("s", (big,), False, 8)
    assert exc.value.metadata["quota"] == "max_session_bytes"
    assert [t.name for t in st.list_tools("s")] == ["a"]
    assert st.get_session("s").stored_bytes == held
    # The same tool again holds as much; a larger one more; replacing all gives back.
    st.put_tools("s", (small,), False, 8)
    assert st.get_session("s").stored_bytes == held
    st.put_tools("s", (ToolSpec("a", "r" * 300, "{}"),), False, 8)
    assert st.get_session("s").stored_bytes > held + 250
    st.put_tools("s", (ToolSpec("c", "c", "{}"),), True, 8)
    assert [t.name for t in st.list_tools("s")] == ["c"]
    assert st.get_session("s").stored_bytes < held + 10
    # What the replaced tools held is free for events again (not what is over the quota).
    st.append(batch("s", msg("x" * 400, "e1")))
    with pytest.raises(CtxccError):
        st.append(batch("s", msg("x" * 200, "e2")))


def _blob_event(sha: str, eid: str) -> NewEvent:
    return NewEvent(eid, ToolResult("c", blob=BlobRef(sha, 5, "he")))


def test_blobs_are_shared_and_collected_with_their_last_session(make_store: object) -> None:
    st = new_store(make_store)
    sha = "a" * 64
    for sid in ("s1", "s2"):
        st.create_session(Session(sid, 1, 1))
        st.append(batch(sid, _blob_event(sha, "e1"), blobs=((sha, b"hello"),)))
    assert st.get_blob(sha) == b"hello"
    assert st.delete_session("s1").deleted_blobs == 0
    assert st.get_blob(sha) == b"hello"
    result = st.delete_session("s2")
    assert (result.deleted_events, result.deleted_blobs) == (1, 1)
    assert st.get_blob(sha) is None
    with pytest.raises(CtxccError) as exc:
        st.get_session("s2")
    assert exc.value.reason is Reason.SESSION_NOT_FOUND
    assert st.read_events("s2") == []


def test_artifacts_checkpoints_compiles_routes(make_store: object) -> None:
    st = new_store(make_store)
    st.create_session(Session("s", 1, 1))
    art = ArtifactRecord("s", "a-1", "image/png", 3, "b" * 64, 1, 1, 5)
    st.put_artifact(art, b"png")
    assert st.get_artifact("s", "a-1") == (art, b"png")
    with pytest.raises(CtxccError) as exc:
        st.get_artifact("s", "a-2")
    assert exc.value.reason is Reason.ARTIFACT_NOT_FOUND
    for t in (10, 20):
        st.put_checkpoint(
            Checkpoint(f"c{t}", "s", 1, "sum", None, False, "d", CheckpointKind.BUILTIN, t)
        )
    assert [c.checkpoint_id for c in st.list_checkpoints("s")] == ["c20", "c10"]
    rec = CompileRecord("s:x1", "s", Route(model="m"), 1, 100, 1, 5)
    st.put_compile(rec)
    assert st.get_compile("s:x1") == rec
    state = RouteState(Route(model="m").route_id, 120, "s:x1", 30, 6)
    stored, replayed = st.record_usage("s:x1", Usage(120, 30), planned(state))
    assert not replayed and stored.usage == Usage(120, 30)
    stored2, replayed2 = st.record_usage("s:x1", Usage(999, 1), planned(state))
    assert replayed2 and stored2.usage == Usage(120, 30)
    assert st.get_route_state("s", state.route_id) == state
    with pytest.raises(CtxccError) as exc:
        st.get_compile("s:nope")
    assert exc.value.reason is Reason.COMPILE_NOT_FOUND
    st.delete_session("s")
    with pytest.raises(CtxccError):
        st.get_compile("s:x1")
    assert st.list_checkpoints("s") == []
    assert st.get_route_state("s", state.route_id) is None


def test_a_report_belongs_to_its_compile_only_and_goes_with_its_session(
    make_store: object,
) -> None:
    """A report is found for its own compile, after a restart too (a second store over
    the engine), never for a compile whose id it starts or ends (x1 / x10 / x); once a
    report is recorded a second one is a repeat, however the first is read; a deleted
    session's reports go with it."""
    st = new_store(make_store)
    st.create_session(Session("s", 1, 1))
    route = Route(model="m")
    state = RouteState(route.route_id, 120, "s:x1", 30, 6)
    records = [
        CompileRecord(f"s:{c}", "s", route, 1, 100, 1, 5 + i)
        for i, c in enumerate(["x", "x1", "x10"])
    ]
    for rec in records:
        st.put_compile(rec)
    assert not st.record_usage("s:x1", Usage(120, 30), planned(state))[1]
    expected = [None, Usage(120, 30), None]
    for reader in (st, KVEventStore(st._kv)):
        assert [reader.get_compile(r.compile_id).usage for r in records] == expected
        assert [r.usage for r in reader.list_compiles("s")] == expected
        again, replayed = reader.record_usage("s:x1", Usage(7, 7), planned(state))
        assert replayed and again.usage == Usage(120, 30)
    assert not st.record_usage("s:x10", Usage(130, 30), planned(state))[1]
    for reader in (st, KVEventStore(st._kv)):
        assert [r.usage for r in reader.list_compiles("s")] == [
            None,
            *expected[1:2],
            Usage(130, 30),
        ]
    st.delete_session("s")
    st.create_session(Session("s", 2, 2))
    st.put_compile(records[1])
    for reader in (st, KVEventStore(st._kv)):
        assert reader.get_compile("s:x1").usage is None
        assert [r.usage for r in reader.list_compiles("s")] == [None]
    assert not st.record_usage("s:x1", Usage(140, 30), planned(state))[1]


def test_a_usage_plan_is_made_from_the_stored_record_and_may_refuse_a_repeat(
    make_store: object,
) -> None:
    """A plan instead of a route state: called with the record as stored (the one read
    of it), for a repeated report too, where its refusal is raised and nothing moves."""
    st = new_store(make_store)
    st.create_session(Session("s", 1, 1))
    route = Route(model="m")
    rec = CompileRecord("s:x1", "s", route, 1, 100, 1, 5, message_tokens=(7, 8))
    st.put_compile(rec)
    seen: list[CompileRecord] = []

    def plan(record: CompileRecord) -> tuple[RouteState, Learn | None]:
        seen.append(record)
        state = RouteState(route.route_id, 120, record.compile_id, 30, 6)
        state = replace(state, message_tokens=record.message_tokens)
        return state, lambda m: RouteModel(route.route_id, overhead=float(len(seen)))

    stored, replayed = st.record_usage("s:x1", Usage(120, 30), plan)
    assert not replayed and seen == [rec] and stored == replace(rec, usage=Usage(120, 30))
    assert st.get_route_state("s", route.route_id) == replace(
        RouteState(route.route_id, 120, "s:x1", 30, 6), message_tokens=(7, 8)
    )
    assert st.get_route_model(route.route_id) == RouteModel(route.route_id, overhead=1.0)
    generation = st.generation("s", route.route_id)

    def refuse(record: CompileRecord) -> tuple[RouteState, Learn | None]:
        seen.append(record)
        raise CtxccError(Reason.ROUTE_MISMATCH, "another route")

    with pytest.raises(CtxccError) as exc:
        st.record_usage("s:x1", Usage(120, 30), refuse)
    assert exc.value.reason is Reason.ROUTE_MISMATCH and seen[-1].usage == Usage(120, 30)
    assert st.generation("s", route.route_id) == generation
    assert st.get_route_model(route.route_id) == RouteModel(route.route_id, overhead=1.0)


def test_records_read_back_after_a_write_are_what_is_stored(make_store: object) -> None:
    """The store keeps the compile records, route states and sessions it wrote, decoded,
    for the reads that follow (a usage report, the next compile): after every kind of
    write to them its answers are those of a second store over the same engine, which
    decodes what is stored."""
    st = new_store(make_store)
    twin = KVEventStore(st._kv)
    route, other = Route(model="m"), Route(model="n")
    st.create_session(Session("s", 1, 1))

    def same() -> None:
        for cid in ("s:x1", "s:x2", "s:x3"):
            try:
                mine: CompileRecord | str = st.get_compile(cid)
            except CtxccError as err:
                mine = err.reason.value
            try:
                theirs: CompileRecord | str = twin.get_compile(cid)
            except CtxccError as err:
                theirs = err.reason.value
            assert mine == theirs, cid
        assert st.get_last_compile("s") == twin.get_last_compile("s")
        # What a restarting daemon reads of every session: the same, without the table.
        last = st.get_last_compile("s")
        outcome = None if last is None else (last.decision, last.create_time_ns)
        assert st.last_compile_outcome("s") == twin.last_compile_outcome("s") == outcome
        try:
            assert st.get_session("s") == twin.get_session("s")
        except CtxccError as err:
            assert err.reason is Reason.SESSION_NOT_FOUND
            with pytest.raises(CtxccError):
                twin.get_session("s")
        for r in (route, other):
            assert st.get_route_state("s", r.route_id) == twin.get_route_state("s", r.route_id)
            assert st.get_route_model(r.route_id) == twin.get_route_model(r.route_id)

    def state(cid: str, tokens: int) -> RouteState:
        return RouteState(route.route_id, tokens, cid, 30, 6, message_tokens=(tokens, 1))

    st.append(batch("s", msg("a", "e1")))
    same()
    table = {"message_digests": b"d" * 16, "message_tokens": (5, 6)}
    st.put_compile(CompileRecord("s:x1", "s", route, 1, 100, 1, 5, **table))  # type: ignore[arg-type]
    same()
    st.append(batch("s", msg("b", "e2")))
    st.put_checkpoint(Checkpoint("c1", "s", 1, "sum", None, False, "d", CheckpointKind.BUILTIN, 9))
    same()
    st.record_usage("s:x1", Usage(120, 30), planned(state("s:x1", 120)))
    same()
    assert st.get_compile("s:x1").usage == Usage(120, 30)
    assert st.put_compile(CompileRecord("s:x2", "s", route, 2, 110, 1, 6), wait=False)
    same()
    models = iter((1.0, 2.0, float("nan")))

    def learn(model: RouteModel | None) -> RouteModel:
        return RouteModel(route.route_id, overhead=next(models), full_samples=1)

    st.record_usage("s:x2", Usage(130, 30), planned(state("s:x2", 130), learn))
    st.record_usage(
        "s:x2", Usage(999, 1), planned(state("s:x2", 999), learn)
    )  # a repeat: nothing moves
    same()
    assert st.get_route_model(route.route_id) == RouteModel(route.route_id, 1.0, (), 0, 1.0, 0.0, 1)
    st.put_compile(CompileRecord("s:x4", "s", route, 2, 110, 1, 6))
    st.record_usage("s:x4", Usage(150, 30), planned(state("s:x4", 150), learn))
    same()
    st.put_compile(CompileRecord("s:x5", "s", route, 2, 110, 1, 6))
    st.record_usage(
        "s:x5", Usage(160, 30), planned(state("s:x5", 160), learn)
    )  # a model not finite
    same()
    assert st.get_route_model(route.route_id) is None  # a read finds it damaged: relearned
    st.record_usage("s:x1", Usage(1, 1), planned(state("s:x1", 1)))  # a repeat again: nothing moves
    same()
    assert st.get_route_state("s", route.route_id) == state("s:x5", 160)
    st.put_compile(CompileRecord("s:x3", "s", other, 3, 120, 1, 7))
    st.record_usage(
        "s:x3", Usage(140, 30), planned(replace(state("s:x3", 140), route_id=other.route_id))
    )
    same()
    st.delete_session("s")
    same()
    assert st.get_last_compile("s") is None and st.get_route_state("s", route.route_id) is None
    st.create_session(Session("s", 2, 2))  # the same id again starts empty
    same()
    st.append(batch("s", msg("c", "e3")))
    st.put_compile(CompileRecord("s:x1", "s", other, 1, 100, 1, 5))  # moves current_route
    same()
    assert st.get_session("s").current_route == other and st.get_session("s").head_seq == 1


def test_records_kept_decoded_stay_within_their_byte_budget(
    make_store: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The decoded records the store keeps are bounded by their encoded bytes, not only by
    their count: long sessions' compile records (a row per message) must not pile up
    in memory. Records pushed out, and one larger than the whole budget, are read from
    the engine as written."""
    import storage.store_core as core

    monkeypatch.setattr(core, "DECODED_BYTES", 6_000)
    st = new_store(make_store)
    route = Route(model="m")
    records = []
    # ~1.3, 1.3, 2.2, 2.2 and 7.7 KB encoded, each kept twice (as itself and as its
    # session's latest compile): the third already pushes the first out.
    for k, rows in enumerate((50, 50, 100, 100, 400)):
        sid = f"s{k}"
        st.create_session(Session(sid, 1, 1))
        st.append(batch(sid, msg("a", "e1")))
        table = {"message_digests": bytes(16 * rows), "message_tokens": tuple(range(rows))}
        record = CompileRecord(f"{sid}:x", sid, route, 1, 100, 1, 5, **table)  # type: ignore[arg-type]
        st.put_compile(record)
        records.append(record)
        kept, kept_bytes = st.decoded_footprint()
        assert 0 < kept_bytes <= 6_000, (k, kept, kept_bytes)
    assert len(encode_value(records[-1])) > 6_000
    # The last record is over the budget by itself: it is not kept, and nothing is pushed
    # out for it. What is left is the one before it, twice (the session records went with
    # the writes of their current route).
    assert st.decoded_footprint() == (2, 2 * len(encode_value(records[3])))
    for record in records:
        assert st.get_compile(record.compile_id) == record
        assert st.get_last_compile(record.session_id) == record


def test_route_models_are_learned_once_per_report_and_outlive_sessions(
    make_store: object,
) -> None:
    st = new_store(make_store)
    route = Route(model="m")
    calls: list[RouteModel | None] = []

    def learn(model: RouteModel | None) -> RouteModel:
        calls.append(model)
        n = model.full_samples if model else 0
        return RouteModel(route.route_id, overhead=1_000.0 * (n + 1), full_samples=n + 1)

    for sid in ("a", "b"):
        st.create_session(Session(sid, 1, 1))
        st.put_compile(CompileRecord(f"{sid}:x", sid, route, 1, 100, 1, 5))
        state = RouteState(route.route_id, 120, f"{sid}:x", 30, 6)
        assert not st.record_usage(f"{sid}:x", Usage(120, 30), planned(state, learn))[1]
        assert st.record_usage(f"{sid}:x", Usage(120, 30), planned(state, learn))[1]  # a repeat
    assert calls == [None, RouteModel(route.route_id, overhead=1_000.0, full_samples=1)]
    assert st.get_route_model(route.route_id) == RouteModel(
        route.route_id, overhead=2_000.0, full_samples=2
    )
    assert st.get_route_model(Route(model="other").route_id) is None
    # Daemon-wide: deleting the sessions that taught it keeps what the route learned.
    st.delete_session("a")
    st.delete_session("b")
    assert st.get_route_model(route.route_id) is not None


def test_list_sessions_pages_in_id_order(make_store: object) -> None:
    st = new_store(make_store)
    for sid, project in (("c", "p"), ("a", "p"), ("b", "q"), ("d", "p")):
        st.create_session(Session(sid, 1, 1, project_id=project))
    assert [s.session_id for s in st.list_sessions("", 2)] == ["a", "b"]
    assert [s.session_id for s in st.list_sessions("b", 10)] == ["c", "d"]
    assert [s.session_id for s in st.list_sessions("", 10, "p")] == ["a", "c", "d"]


def test_a_filtered_page_examines_at_most_what_it_is_given(make_store: object) -> None:
    """Each page reads at most `examine` sessions and says where the next starts: the
    pages together hold every match once, in id order."""
    st = new_store(make_store)
    for i in range(10):
        st.create_session(Session(f"s{i}", 1, 1, project_id="p" if i in (2, 8) else "q"))
    pages, after = [], ""
    while True:
        found, resume = st.page_sessions(after, 5, "p", examine=3)
        pages.append([s.session_id for s in found])
        if not resume:
            break
        after = resume
    assert pages == [["s2"], [], ["s8"], []]
    assert [s.session_id for s in st.page_sessions("", 1, "p", examine=9)[0]] == ["s2"]
    # A page filled before the budget, and an unfiltered one, say nothing of where to go on.
    assert st.page_sessions("", 1, "p", examine=9)[1] == ""
    assert [s.session_id for s in st.page_sessions("", 4)[0]] == ["s0", "s1", "s2", "s3"]
    assert st.page_sessions("s8", 5, "p", examine=3) == ([], "")


def test_kind_filter(make_store: object) -> None:
    st = new_store(make_store)
    st.create_session(Session("s", 1, 1))
    st.append(batch("s", msg("a", "e1"), NewEvent("e2", ToolResult("c", text="out"))))
    only = st.read_events("s", kinds=frozenset({EventKind.TOOL_RESULT}))
    assert [e.seq for e in only] == [2]


def test_a_page_of_events_stops_at_its_count_or_its_bytes(make_store: object) -> None:
    """A client's page is read until it holds `limit` events or more than `max_bytes` as
    stored (at least one event, whatever its size), saying whether any are left: a page
    of 1 MiB events was read 1,000 events deep to send three."""
    st = new_store(make_store)
    st.create_session(Session("s", 1, 1))
    for k in range(10):
        st.append(batch("s", msg(f"{k} " + "x" * 100_000, f"e{k}")))
    st.append(batch("s", NewEvent("t", ToolResult("c", text="out"))))
    everything = frozenset[EventKind]()
    page = st.read_event_page("s", 0, 1_000, everything, 250_000)
    assert ([e.seq for e in page.events], page.more) == ([1, 2, 3], True)
    page = st.read_event_page("s", 0, 1_000, everything, 1)
    assert ([e.seq for e in page.events], page.more) == ([1], True)
    page = st.read_event_page("s", 3, 2, everything, 10 << 20)
    assert ([e.seq for e in page.events], page.more) == ([4, 5], True)
    page = st.read_event_page("s", 8, 1_000, everything, 10 << 20)
    assert ([e.seq for e in page.events], page.more) == ([9, 10, 11], False)
    # Events of other kinds are read (and count) but not returned.
    results = frozenset({EventKind.TOOL_RESULT})
    page = st.read_event_page("s", 0, 1_000, results, 10 << 20)
    assert ([e.seq for e in page.events], page.more) == ([11], False)
    assert st.read_event_page("s", 11, 10, everything, 1) == EventPage((), False)
    with pytest.raises(CtxccError) as err:
        st.read_event_page("s", 0, 10, everything, 1, session_created_ns=2)
    assert err.value.reason is Reason.SESSION_NOT_FOUND


def test_a_page_of_checkpoints_stops_at_its_count_or_its_bytes(make_store: object) -> None:
    """Newest first from `left` places from the oldest end, until `size` checkpoints or
    more than `max_bytes` as stored (at least one), with how many older ones are left;
    a checkpoint is found by its id without a list of them all, and by its key from
    the heads a compile chooses from (every summary left out)."""
    st = new_store(make_store)
    st.create_session(Session("s", 1, 1))
    for t in range(1, 6):
        summary = f"{t} " + "x" * 100_000
        st.put_checkpoint(
            Checkpoint(f"c{t}", "s", 1, summary, None, False, "d", CheckpointKind.MODEL_SUMMARY, t)
        )

    def page(left: int | None, size: int, most: int) -> tuple[list[str], int]:
        found, after = st.page_checkpoint_entries("s", left, size, most)
        return [c.checkpoint_id for c in found], after

    assert page(None, 2, 10 << 20) == (["c5", "c4"], 3)
    assert page(3, 2, 10 << 20) == (["c3", "c2"], 1)
    assert page(1, 2, 10 << 20) == (["c1"], 0)
    assert page(None, 100, 150_000) == (["c5", "c4"], 3)  # the one that went over ends it
    assert page(None, 100, 1) == (["c5"], 4)
    assert page(0, 100, 1) == ([], 0)
    assert page(None, 100, 10 << 20)[0] == [f"c{t}" for t in range(5, 0, -1)]
    assert page(99, 1, 10 << 20) == (["c5"], 4)  # a position past the oldest: the newest
    found = st.find_checkpoint("s", "c2")
    assert found is not None and found.summary.startswith("2 ")
    heads = [c for c in st.list_checkpoint_heads("s") if isinstance(c, Checkpoint)]
    assert [(c.checkpoint_id, c.summary) for c in heads] == [(f"c{t}", "") for t in range(5, 0, -1)]
    assert st.get_checkpoint("s", 2, "c2") == found
    assert st.get_checkpoint("s", 3, "c2") is None
    assert st.find_checkpoint("s", "c9") is None
    assert st.find_checkpoint("other", "c2") is None


def test_concurrent_appends_never_duplicate_or_skip(make_store: object) -> None:
    st = new_store(make_store)
    st.create_session(Session("s", 1, 1))
    errors: list[BaseException] = []

    def worker(w: int) -> None:
        try:
            for i in range(25):
                st.append(batch("s", msg(f"{w}-{i}", f"e-{w}-{i}")))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    events = st.read_events("s")
    assert [e.seq for e in events] == list(range(1, 201))
    assert len({e.event_id for e in events}) == 200


def test_list_compiles_is_oldest_first_and_per_session(make_store: object) -> None:
    st = new_store(make_store)
    for sid in ("s", "s2"):
        st.create_session(Session(sid, 1, 1))
    # suffixes sort the other way round from the create times
    for suffix, t in (("ff", 10), ("aa", 30), ("cc", 20)):
        st.put_compile(CompileRecord(f"s:{suffix}", "s", Route(model="m"), 1, t, 1, t))
    st.put_compile(CompileRecord("s2:ab", "s2", Route(model="m"), 1, 5, 1, 5))
    assert [r.compile_id for r in st.list_compiles("s")] == ["s:ff", "s:cc", "s:aa"]
    assert [r.compile_id for r in st.list_compiles("s2")] == ["s2:ab"]
    assert st.list_compiles("nobody") == []


def test_source_lists_follow_every_write_although_kept_decoded(make_store: object) -> None:
    """Compiles read source lists from memory: a put, a delete and a session's removal
    must each show in the next read."""
    st = new_store(make_store)
    st.create_session(Session("s", 1, 1))
    kind, scope = SourceKind.MEMORY, Scope.SESSION
    assert st.list_sources(kind, scope, "s") == []
    first = MemoryEntry("m1", scope, "s", "use tabs")
    st.put_source(first)
    assert st.list_sources(kind, scope, "s") == [first]
    changed = MemoryEntry("m1", scope, "s", "use spaces")
    st.put_source(changed)
    st.put_source(MemoryEntry("g1", Scope.GLOBAL, "", "be brief"))
    assert st.list_sources(kind, scope, "s") == [changed]
    assert st.list_sources(kind) == [MemoryEntry("g1", Scope.GLOBAL, "", "be brief"), changed]
    st.delete_source(kind, Scope.GLOBAL, "", "g1")
    assert st.list_sources(kind, Scope.GLOBAL, "") == []
    assert st.list_sources(kind, scope, "s") == [changed]
    st.delete_session("s")
    assert st.list_sources(kind, scope, "s") == []


def test_a_source_write_is_read_by_whoever_sees_its_generation_move(
    make_store: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A compile takes the generation before it reads and is repeated while it holds
    (service/repeats.py): one that takes it just after a source write's bump, on another
    thread, must read that write, not the decoded list kept from before it; else its
    stale view is repeated until the next write. Reading at each bump stands for it."""
    st = new_store(make_store)
    st.create_session(Session("s", 1, 1))
    kind = SourceKind.MEMORY
    gens = st._generations
    seen: list[tuple[list[object], list[object]]] = []

    def read() -> tuple[list[object], list[object]]:
        return list(st.list_sources(kind, Scope.GLOBAL, "")), list(
            st.list_sources(kind, Scope.SESSION, "s")
        )

    wrote, forget = gens.wrote, gens.forget

    def wrote_then_read(
        session_id: str = "",
        route_id: str = "",
        everything: bool = False,
        tables: Iterable[str] = (),
    ) -> None:
        wrote(session_id, route_id, everything, tables)
        seen.append(read())

    def forget_then_read(session_id: str) -> None:
        forget(session_id)
        seen.append(read())

    monkeypatch.setattr(gens, "wrote", wrote_then_read)
    monkeypatch.setattr(gens, "forget", forget_then_read)
    glob = MemoryEntry("g1", Scope.GLOBAL, "", "be brief", 1)
    mine = MemoryEntry("m1", Scope.SESSION, "s", "tabs", 1)
    read()  # the lists are kept decoded from here on
    st.put_source(glob)
    assert seen[-1] == ([glob], [])
    st.put_source(mine)
    assert seen[-1] == ([glob], [mine])
    st.delete_source(kind, Scope.GLOBAL, "", "g1")
    assert seen[-1] == ([], [mine])
    st.delete_session("s")
    assert seen[-1] == ([], [])


def test_compile_parts_are_stored_again_after_their_session_is_deleted(
    make_store: object,
) -> None:
    """Parts already stored are not written twice; a recreated session has none."""
    st = new_store(make_store)
    st.create_session(Session("s", 1, 1))
    part = RouteModel(route_id="r")
    st.put_compile(CompileRecord("s:x1", "s", Route(model="m"), 1, 100, 1, 5), (("d1", part),))
    assert st.get_compile_part("s", "d1", RouteModel) == part
    st.delete_session("s")
    st.create_session(Session("s", 2, 2))
    st.put_compile(CompileRecord("s:x2", "s", Route(model="m"), 1, 100, 1, 5), (("d1", part),))
    assert st.get_compile_part("s", "d1", RouteModel) == part


def test_a_compile_of_a_deleted_session_is_not_recorded_in_the_one_created_after_it(
    make_store: object,
) -> None:
    """A record names the create time of the session its compile read: the session made
    again under that id after a deletion refuses it, writing nothing (no record, no part)."""
    st = new_store(make_store)
    st.create_session(Session("s", 1, 1))
    st.delete_session("s")
    st.create_session(Session("s", 2, 2))
    old = CompileRecord("s:x1", "s", Route(model="m"), 1, 100, 1, 5, session_create_time_ns=1)
    with pytest.raises(CtxccError) as raised:
        st.put_compile(old, (("d1", RouteModel(route_id="r")),))
    assert raised.value.reason is Reason.SESSION_NOT_FOUND
    assert st.list_compiles("s") == [] and st.get_last_compile("s") is None
    assert st.get_compile_part("s", "d1", RouteModel) is None
    assert st.get_session("s").current_route is None
    ok = replace(old, compile_id="s:x2", session_create_time_ns=2)
    assert st.put_compile(ok, (("d1", RouteModel(route_id="r")),))
    assert [r.compile_id for r in st.list_compiles("s")] == ["s:x2"]


# Every method of the store that writes, with a call that makes it write, and what its
# write must bump: "s" (the session's generation), "r" (the route's), "*" (every
# session's). Methods of the port not listed here must be reads: the test below fails
# for a new write method until it is listed (and bumps what it changes).
_READS = frozenset(
    {
        "get_session",
        "generation",
        "table_generation",
        "list_sessions",
        "page_sessions",
        "count_sessions",
        "read_events",
        "read_event_page",
        "sync_reads",
        "reads_synced",
        "get_blob",
        "last_turn_start",
        "find_tool_result",
        "list_tools",
        "get_activations",
        "get_artifact",
        "get_artifact_record",
        "list_checkpoints",
        "list_checkpoint_entries",
        "find_checkpoint",
        "get_checkpoint",
        "list_checkpoint_heads",
        "page_checkpoint_entries",
        "get_compile_part",
        "compile_at",
        "get_compile",
        "get_route_state",
        "get_route_model",
        "get_last_compile",
        "last_compile_outcome",
        "list_compiles",
        "list_compile_heads",
        "list_sources",
        "project_scopes",
        "approximate_size",
        "close",
        # Writes nothing itself: the appends made inside it do (checked on their own).
        "deferring_sync",
    }
)


def _writes(st: KVEventStore) -> dict[str, tuple[object, str]]:
    route = Route(model="m")
    memory = MemoryEntry("m1", Scope.GLOBAL, "", "text", 1)
    art = ArtifactRecord("s", "a-1", "image/png", 3, "b" * 64, 1, 1, 5)
    ck = Checkpoint("c1", "s", 1, "sum", None, True, "d", CheckpointKind.MODEL_SUMMARY, 7)
    rec = CompileRecord("s:x2", "s", route, 1, 100, 1, 5)
    state = RouteState(route.route_id, 120, "s:x1", 30, 6)
    return {
        "create_session": (lambda: st.create_session(Session("s3", 1, 1)), "s3"),
        "append": (lambda: st.append(batch("s", msg("b", "e2"))), "s"),
        "put_tools": (lambda: st.put_tools("s", (ToolSpec("t", "d", "{}"),), False, 512), "s"),
        "add_activations": (lambda: st.add_activations("s", 1, ("t",)), "s"),
        "put_artifact": (lambda: st.put_artifact(art, b"abc"), "s"),
        "put_checkpoint": (lambda: st.put_checkpoint(ck), "s"),
        "put_compile": (lambda: st.put_compile(rec), "s"),
        "record_usage": (lambda: st.record_usage("s:x1", Usage(130, 5), planned(state)), "s"),
        "try_record_usage": (
            lambda: st.try_record_usage("s:x2", Usage(130, 5), planned(state)),
            "s",
        ),
        "put_source": (lambda: st.put_source(memory), "*"),
        "delete_source": (lambda: st.delete_source(SourceKind.MEMORY, Scope.GLOBAL, "", "m1"), "*"),
        "delete_session": (lambda: st.delete_session("s2"), "*"),
        # s3, made above, idle since: the sweep deletes it.
        "delete_idle_session": (lambda: st.delete_idle_session("s3", 10), "*"),
    }


def test_every_write_bumps_the_generation_of_what_it_changes(make_store: object) -> None:
    """Compiles are repeated while the generation they read at holds (service/repeats.py):
    a write that bumped nothing would leave a stale view repeated."""
    st = new_store(make_store)
    for sid in ("s", "s2"):
        st.create_session(Session(sid, 1, 1))
    st.append(batch("s", msg("a", "e1")))
    route = Route(model="m")
    st.put_compile(CompileRecord("s:x1", "s", route, 1, 100, 1, 5))
    writes = _writes(st)
    port = {n for n in vars(EventStore) if not n.startswith("_")}
    assert port - _READS == set(writes), "a write method of the store is not checked here"
    for name, (call, bumps) in writes.items():
        sid = bumps if bumps != "*" else "s"
        before = {x: st.generation(x, route.route_id) for x in ("s", "s3")}
        call()  # type: ignore[operator]
        after = {x: st.generation(x, route.route_id) for x in ("s", "s3")}
        if bumps == "*":
            assert after["s"].everything > before["s"].everything, name
        else:
            assert after[sid].session == before[sid].session + 1, name
            assert after[sid].everything == before[sid].everything, name
    # Usage that teaches the route model moves every session's generation on the route.
    st.put_compile(CompileRecord("s:x3", "s", route, 1, 100, 1, 5))
    other = st.generation("s2", route.route_id)
    state = RouteState(route.route_id, 140, "s:x3", 5, 8)
    st.record_usage(
        "s:x3", Usage(140, 5), planned(state, lambda _: RouteModel(route_id=route.route_id))
    )
    assert st.generation("s2", route.route_id).route == other.route + 1


# The tables a compile's reads are kept by (service/loading.py), and the writes that change
# them: each must move that table's count; writes of the session's other records must not.
_TABLE_WRITES = {
    "put_tools": "tools",
    "add_activations": "tools",
    "put_checkpoint": "checkpoints",
    "put_artifact": "artifacts",
}
_TABLES = ("tools", "checkpoints", "artifacts")


def test_a_write_moves_the_count_of_the_tables_it_changes(make_store: object) -> None:
    st = new_store(make_store)
    for sid in ("s", "s2"):
        st.create_session(Session(sid, 1, 1))
    st.append(batch("s", msg("a", "e1")))
    st.put_compile(CompileRecord("s:x1", "s", Route(model="m"), 1, 100, 1, 5))
    for name, (call, bumps) in _writes(st).items():
        before = {t: st.table_generation("s", t) for t in _TABLES}
        call()  # type: ignore[operator]
        after = {t: st.table_generation("s", t) for t in _TABLES}
        for table, count in before.items():
            moved = after[table] != count
            assert moved == (_TABLE_WRITES.get(name) == table or bumps == "*"), (name, table)
    # A session deleted and made again under its id: no count taken before matches.
    kept = st.table_generation("s", "checkpoints")
    st.delete_session("s")
    st.create_session(Session("s", 2, 2))
    assert st.table_generation("s", "checkpoints") != kept


def test_a_compile_record_need_not_wait_for_the_session_lock(make_store: object) -> None:
    """A caller on the event loop writes a compile record only if it need not wait (an
    append may hold the session's lock through its fsync)."""
    st = new_store(make_store)
    st.create_session(Session("s", 1, 1))
    rec = CompileRecord("s:x1", "s", Route(model="m"), 1, 100, 1, 5)
    with st._lock("s"):
        assert st.put_compile(rec, wait=False) is False
    with pytest.raises(CtxccError):
        st.get_compile("s:x1")  # nothing was written
    assert st.put_compile(rec, wait=False) is True
    assert st.get_compile("s:x1") == rec


def test_a_usage_report_need_not_wait_for_a_lock(make_store: object) -> None:
    """try_record_usage declines (nothing written, nothing learned) while the session's
    lock or the route models' lock is held, and records as record_usage otherwise."""
    st = new_store(make_store)
    st.create_session(Session("s", 1, 1))
    route = Route(model="m")
    st.put_compile(CompileRecord("s:x1", "s", route, 1, 100, 1, 5))
    state = RouteState(route.route_id, 120, "s:x1", 30, 6)
    learned: list[RouteModel | None] = []

    def learn(model: RouteModel | None) -> RouteModel:
        learned.append(model)
        return RouteModel(route_id=route.route_id)

    for lock in (st._lock("s"), st._models_lock):
        with lock:
            assert st.try_record_usage("s:x1", Usage(120, 30), planned(state, learn)) is None
        assert st.get_compile("s:x1").usage is None and not learned
        assert st.get_route_state("s", route.route_id) is None
    done = st.try_record_usage("s:x1", Usage(120, 30), planned(state, learn))
    assert done is not None and done[0].usage == Usage(120, 30) and not done[1]
    assert len(learned) == 1 and st.get_route_model(route.route_id) is not None
    assert st.get_route_state("s", route.route_id) == state


def test_a_compile_record_keeps_the_current_route_while_its_generation_holds(
    make_store: object,
) -> None:
    """A repeat names the generation after the compile it repeats (`route_since`): while
    nothing wrote since, the session's current route is the record's without reading
    the session; once another route's compile moved it, the record moves it back."""
    st = new_store(make_store)
    st.create_session(Session("s", 1, 1))
    a, b = Route(model="a"), Route(model="b")
    st.put_compile(CompileRecord("s:x1", "s", a, 1, 100, 1, 5))
    since = st.generation("s", a.route_id)

    def unread(session_id: str) -> Session:
        raise AssertionError("the session was read although its generation held")

    reads = st.get_session
    st.get_session = unread  # type: ignore[method-assign]
    assert st.put_compile(CompileRecord("s:x2", "s", a, 1, 100, 1, 6), route_since=since)
    st.get_session = reads  # type: ignore[method-assign]
    assert st.get_session("s").current_route == a
    assert st.get_compile("s:x2").create_time_ns == 6
    st.put_compile(CompileRecord("s:x3", "s", b, 1, 100, 1, 7))
    assert st.get_session("s").current_route == b
    st.put_compile(CompileRecord("s:x4", "s", a, 1, 100, 1, 8), route_since=since)
    assert st.get_session("s").current_route == a, "a stale generation reads the session"


def test_project_scopes_names_each_project_once_up_to_a_bound(make_store: object) -> None:
    """The projects holding entries of any kind: one whose id starts another's is its
    own project, global and session entries are none, and the walk stops at `most`."""
    st = new_store(make_store)
    st.create_session(Session("s", 1, 1))
    for pid in ("p1", "p10", "p2"):
        for i in range(3):
            st.put_source(MemoryEntry(f"m{i}", Scope.PROJECT, pid, "fact"))
    st.put_source(MemoryEntry("g", Scope.GLOBAL, "", "fact"))
    st.put_source(MemoryEntry("x", Scope.SESSION, "s", "fact"))
    assert st.project_scopes(10) == {"p1", "p10", "p2"}
    assert len(st.project_scopes(2)) == 2
    st.delete_source(SourceKind.MEMORY, Scope.PROJECT, "p10", "m0")
    assert "p10" in st.project_scopes(10)
    for i in (1, 2):
        st.delete_source(SourceKind.MEMORY, Scope.PROJECT, "p10", f"m{i}")
    assert st.project_scopes(10) == {"p1", "p2"}


def test_an_idle_session_is_deleted_only_if_nothing_landed_since_the_cutoff(
    make_store: object,
) -> None:
    """The retention sweep reads a page of sessions, then deletes each idle one; the store
    checks again under the session's lock, with its last compile, so an append or a
    compile that landed meanwhile keeps it."""
    st = new_store(make_store)
    st.create_session(Session("idle", 10, 10))
    st.append(AppendBatch("idle", (msg("a", "e1"),), now_ns=20))
    st.create_session(Session("appended", 10, 10))
    st.append(AppendBatch("appended", (msg("a", "e1"),), now_ns=100))
    st.create_session(Session("compiled", 10, 10))
    st.append(AppendBatch("compiled", (msg("a", "e1"),), now_ns=20))
    st.put_compile(CompileRecord("compiled:x1", "compiled", Route(model="m"), 1, 100, 1, 100))
    st.create_session(Session("fresh", 100, 100))

    deleted = st.delete_idle_session("idle", before_ns=100)
    assert deleted is not None and deleted.deleted_events == 1
    for sid in ("appended", "compiled", "fresh"):  # activity at the cutoff counts
        assert st.delete_idle_session(sid, before_ns=100) is None, sid
        assert st.get_session(sid).head_seq == (0 if sid == "fresh" else 1)
    assert st.delete_idle_session("idle", before_ns=100) is None  # gone: nothing to do
    assert st.delete_idle_session("compiled", before_ns=101) is not None
    assert [s.session_id for s in st.list_sessions("", 10)] == ["appended", "fresh"]
    assert st.count_sessions() == 2


def test_a_late_report_of_an_older_compile_leaves_the_newer_baseline(make_store: object) -> None:
    """Only a report of the baseline's compile or a later one (later boundary, or the
    same boundary compiled later) replaces the session's baseline on a route; an older
    one is still recorded. States that keep no boundary are ordered by their record."""
    st = new_store(make_store)
    route = Route("c", "p", "e", "m")
    st.create_session(Session("s", 0, 0))
    st.append(batch("s", msg("a", "e1"), msg("b", "e2")))
    for cid, boundary, created in (("s:o1", 1, 5), ("s:o2", 2, 6), ("s:o3", 2, 7)):
        st.put_compile(CompileRecord(cid, "s", route, boundary, 100, 1, created))

    def state(cid: str, seq: int, created: int) -> RouteState:
        return RouteState(
            route.route_id, 100, cid, 30, 9, baseline_seq=seq, baseline_create_ns=created
        )

    st.record_usage("s:o2", Usage(200, 30), planned(state("s:o2", 2, 6)))
    st.record_usage("s:o1", Usage(100, 30), planned(state("s:o1", 1, 5)))
    assert st.get_compile("s:o1").usage == Usage(100, 30)
    held = st.get_route_state("s", route.route_id)
    assert held is not None and held.baseline_compile_id == "s:o2"
    # The same boundary compiled later is newer; a state without its boundary (written
    # before states kept it) is ordered by its compile's record.
    st.record_usage("s:o3", Usage(300, 30), planned(state("s:o3", 0, 0)))
    st.record_usage("s:o2", Usage(200, 30), planned(state("s:o2", 2, 6)))  # a repeat
    held = st.get_route_state("s", route.route_id)
    assert held is not None and held.baseline_compile_id == "s:o3"
    st.put_compile(CompileRecord("s:o4", "s", route, 1, 100, 1, 8))
    st.record_usage("s:o4", Usage(50, 30), planned(state("s:o4", 1, 8)))
    held = st.get_route_state("s", route.route_id)
    assert held is not None and held.baseline_compile_id == "s:o3"
