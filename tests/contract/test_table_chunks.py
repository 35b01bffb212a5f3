"""A view's per-message table in compile records and route states: long tables are
written as content-named chunks plus an inline rest, and read back whole; records written
before chunks existed (the whole table inline, no `table_chunks` key) read as they are.
Both engines, each read also by a second store that decodes what is on disk."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import msgspec
import pytest

from ctxcc.storage.v1 import records_pb2
from server.domain.errors import CtxccError, Reason
from server.domain.model import Route, Session
from server.domain.records import CompileRecord, RouteState, Usage, UsagePlan
from server.domain.table_chunks import CHUNK, TableChunk
from storage import KVEventStore, MemoryKV, open_rocks
from storage.codec import encode_value
from storage.keys import AT_BOUNDARY, LAST_COMPILE, PART, be64, session_key
from storage.kv import KV, Batch

ROUTE = Route(model="m")


@pytest.fixture(params=["memory", "rocksdb"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[KVEventStore]:
    kv = MemoryKV() if request.param == "memory" else open_rocks(tmp_path / "db")
    st = KVEventStore(kv)
    st.create_session(Session("s", 1, 1))
    yield st
    st.close()


def table(n: int, seed: int = 1) -> tuple[bytes, tuple[int, ...]]:
    rnd = random.Random(seed)
    return rnd.randbytes(8 * n), tuple(rnd.randrange(1, 70_000) for _ in range(n))


def record(cid: str, digests: bytes, tokens: tuple[int, ...], boundary: int = 1) -> CompileRecord:
    return CompileRecord(
        cid,
        "s",
        ROUTE,
        boundary,
        100,
        1,
        5 + boundary,
        message_count=len(tokens),
        messages_digest="f" * 64,
        message_digests=digests,
        message_tokens=tokens,
    )


def state_of(rec: CompileRecord) -> RouteState:
    return RouteState(
        ROUTE.route_id,
        120,
        rec.compile_id,
        30,
        9,
        message_count=rec.message_count,
        messages_digest=rec.messages_digest,
        message_digests=rec.message_digests,
        message_tokens=rec.message_tokens,
    )


def plan(rec: CompileRecord) -> tuple[RouteState, None]:
    return state_of(rec), None


PLAN: UsagePlan = plan


def body(raw: bytes) -> dict[str, object]:
    """The MessagePack body of a stored record, as a map."""
    decoded = msgspec.msgpack.decode(records_pb2.Record.FromString(raw).body)
    assert isinstance(decoded, dict)
    return decoded


def as_main_wrote(value: object) -> bytes:
    """A record as written before chunks existed: its whole table inline and no
    `table_chunks` key at all."""
    envelope = records_pb2.Record.FromString(encode_value(value))
    fields = msgspec.msgpack.decode(envelope.body)
    del fields["table_chunks"]
    envelope.body = msgspec.msgpack.encode(fields)
    return envelope.SerializeToString()


def reads(st: KVEventStore, cid: str, boundary: int) -> tuple[object, ...]:
    return (
        st.get_compile(cid),
        st.get_last_compile("s"),
        st.compile_at("s", boundary),
        tuple(st.list_compiles("s")),
        st.get_route_state("s", ROUTE.route_id),
    )


def test_a_long_table_is_stored_in_chunks_and_read_whole(store: KVEventStore) -> None:
    n = 3 * CHUNK + 40
    digests, tokens = table(n + 3)
    first = record("s:a1", digests[: 8 * n], tokens[:n])
    store.put_compile(first)
    store.record_usage("s:a1", Usage(120, 30), PLAN)
    # The next step: three more messages. Only its rest is written inline, and the
    # chunks it shares with the step before are named, not stored again.
    parts_before = sum(1 for _ in store._kv.scan("compiles", b"s\x00" + PART, b"s\x00\xff"))
    second = record("s:a2", digests, tokens, boundary=2)
    store.put_compile(second)
    store.record_usage("s:a2", Usage(140, 30), PLAN)
    parts_after = sum(1 for _ in store._kv.scan("compiles", b"s\x00" + PART, b"s\x00\xff"))
    assert parts_after == parts_before == 3
    raw = store._kv.get("compiles", session_key("s", b"a2"))
    assert raw is not None
    stored = body(raw)
    assert len(stored["table_chunks"]) == 3  # type: ignore[arg-type]
    assert len(stored["message_tokens"]) == 43  # type: ignore[arg-type]
    assert len(raw) < 2_000  # inline, the table alone would be ~9 KB
    state_raw = store._kv.get("routes", session_key("s", ROUTE.route_id.encode()))
    assert state_raw is not None and len(state_raw) < 2_000
    with_usage = replace(second, usage=Usage(140, 30))
    twin = KVEventStore(store._kv)  # decodes what is stored
    for st in (store, twin):
        got = reads(st, "s:a2", 2)
        assert got[0] == with_usage and got[1] == second and got[2] == with_usage
        assert got[3] == (replace(first, usage=Usage(120, 30)), with_usage)
        assert got[4] == state_of(second)
        assert got[0].message_digests == digests and got[0].message_tokens == tokens


def test_records_written_before_chunks_read_as_they_are(store: KVEventStore) -> None:
    """A data directory of the daemon before chunks: records, the latest copy and a route
    state with 700-message tables inline. They read as written; a usage report on such a
    record leaves it as it was written (the report is stored beside it), and the route
    state it writes names the record's table instead of holding it; both read whole."""
    digests, tokens = table(700)
    old = record("s:b1", digests, tokens, boundary=1)
    batch = Batch()
    batch.put("compiles", session_key("s", b"b1"), as_main_wrote(old))
    batch.put("compiles", session_key("s", LAST_COMPILE), as_main_wrote(old))
    batch.put("compiles", session_key("s", AT_BOUNDARY + be64(1)), b"b1")
    batch.put("routes", session_key("s", ROUTE.route_id.encode()), as_main_wrote(state_of(old)))
    store._kv.write(batch)
    for st in (store, KVEventStore(store._kv)):
        assert reads(st, "s:b1", 1) == (old, old, old, (old,), state_of(old))
    store.record_usage("s:b1", Usage(120, 30), PLAN)
    assert store._kv.get("compiles", session_key("s", b"b1")) == as_main_wrote(old)
    raw = store._kv.get("routes", session_key("s", ROUTE.route_id.encode()))
    assert raw is not None and body(raw)["table_of_baseline"] is True
    assert not body(raw)["message_tokens"] and not body(raw)["table_chunks"]
    reported = replace(old, usage=Usage(120, 30))
    for st in (store, KVEventStore(store._kv)):
        assert reads(st, "s:b1", 1) == (reported, old, reported, (reported,), state_of(old))


def test_a_missing_chunk_is_a_damaged_record_not_a_shorter_table(store: KVEventStore) -> None:
    digests, tokens = table(2 * CHUNK + 1)
    store.put_compile(record("s:c1", digests, tokens))
    names = body(store._kv.get("compiles", session_key("s", b"c1")) or b"")["table_chunks"]
    assert isinstance(names, list)
    batch = Batch()
    batch.delete("compiles", session_key("s", PART + names[1].encode()))
    store._kv.write(batch)
    twin = KVEventStore(store._kv)
    with pytest.raises(CtxccError) as err:
        twin.get_compile("s:c1")
    assert err.value.reason is Reason.RECORD_CORRUPT
    # The latest compile's copy is derived: damaged, it is ignored (the next compile
    # replaces it) rather than failing every compile of the session.
    assert twin.get_last_compile("s") is None


def test_a_route_state_whose_baseline_record_is_gone_is_damaged(store: KVEventStore) -> None:
    """A report's route state reads its table from the reported compile's record: without
    that record it is a damaged record, not a state with a shorter (or no) table."""
    digests, tokens = table(CHUNK + 9)
    store.put_compile(record("s:f1", digests, tokens))
    store.record_usage("s:f1", Usage(120, 30), PLAN)
    assert KVEventStore(store._kv).get_route_state("s", ROUTE.route_id) == state_of(
        record("s:f1", digests, tokens)
    )
    batch = Batch()
    batch.delete("compiles", session_key("s", b"f1"))
    store._kv.write(batch)
    with pytest.raises(CtxccError) as err:
        KVEventStore(store._kv).get_route_state("s", ROUTE.route_id)
    assert err.value.reason is Reason.RECORD_CORRUPT


def test_a_table_that_is_not_one_digest_per_count_stays_inline(store: KVEventStore) -> None:
    """Tables the daemon never writes (a record of another shape) are stored as given."""
    digests, tokens = table(CHUNK * 2)
    odd = record("s:d1", digests[:-8], tokens)
    store.put_compile(odd)
    raw = store._kv.get("compiles", session_key("s", b"d1"))
    assert raw is not None and body(raw)["table_chunks"] == []
    assert KVEventStore(store._kv).get_compile("s:d1") == odd


def test_chunks_are_stored_again_for_a_session_made_again(store: KVEventStore) -> None:
    """A session deleted and made again under its id holds none of the chunks its
    predecessor wrote: the same table is stored anew with its records."""
    digests, tokens = table(3 * CHUNK + 5)
    rec = record("s:e1", digests, tokens)
    store.put_compile(rec)
    store.record_usage("s:e1", Usage(120, 30), PLAN)
    store.delete_session("s")
    store.create_session(Session("s", 2, 2))
    again = replace(rec, compile_id="s:e2")
    store.put_compile(again)
    store.record_usage("s:e2", Usage(120, 30), PLAN)
    twin = KVEventStore(store._kv)
    assert twin.get_compile("s:e2") == replace(again, usage=Usage(120, 30))
    assert twin.get_route_state("s", ROUTE.route_id) == state_of(again)


class _CountedGets:
    """The store's engine, with the keys it was asked for and the batches it wrote."""

    def __init__(self, kv: KV) -> None:
        self.kv = kv
        self.asked: list[bytes] = []
        self.written: list[Batch] = []

    def get(self, cf: str, key: bytes) -> bytes | None:
        self.asked.append(key)
        return self.kv.get(cf, key)

    def write(self, batch: Batch) -> None:
        self.written.append(batch)
        self.kv.write(batch)

    def __getattr__(self, name: str) -> object:
        return getattr(self.kv, name)


def test_a_compiles_basis_is_written_without_looking_for_it(store: KVEventStore) -> None:
    """A compile's basis (new with nearly every compile) is put without a read of its key;
    one stored already is written again as the same bytes. Other parts are looked for,
    and a part stored already is not written again."""
    counted = _CountedGets(store._kv)
    st = KVEventStore(counted)  # type: ignore[arg-type]
    other = ("0" * 32, Usage(1, 1))
    basis = ("b" * 32, Usage(7, 3))
    rec = replace(record("s:f1", *table(10)), basis_digest=basis[0])
    st.put_compile(rec, (other, basis))
    other_key = session_key("s", PART + other[0].encode())
    basis_key = session_key("s", PART + basis[0].encode())
    assert other_key in counted.asked and basis_key not in counted.asked
    assert counted.kv.get("compiles", basis_key) == encode_value(basis[1])
    # A store that does not know the parts are stored (a restart): the basis is put again
    # with the same bytes, the other part is read and not written again.
    counted.written.clear()
    again = KVEventStore(counted)  # type: ignore[arg-type]
    again.put_compile(replace(rec, compile_id="s:f2"), (other, basis))
    puts = {key: value for b in counted.written for _, key, value in b.puts}
    assert puts[basis_key] == encode_value(basis[1]) and other_key not in puts
    assert counted.kv.get("compiles", basis_key) == encode_value(basis[1])


def test_a_basis_names_the_chunks_its_record_before_wrote_once(store: KVEventStore) -> None:
    """The chunks of the route state's table a basis names are those the record the
    step before wrote: they are not looked for again; chunks of another table are."""
    from server.domain.table_chunks import pending

    digests, tokens = table(2 * CHUNK + 9)
    first = record("s:g1", digests, tokens)
    store.put_compile(first)
    split = store._splitter.split(digests, tokens)
    staged = pending(split)
    counted = _CountedGets(store._kv)
    store._kv = counted  # type: ignore[assignment]
    store._parts.clear()  # else found known, read or not
    store.put_compile(record("s:g2", digests, tokens, boundary=2), staged)
    chunk_keys = {session_key("s", PART + name.encode()) for name in split.names}
    assert not chunk_keys & set(counted.asked)
    # A table whose chunks the session did not just write: its chunks are stored.
    other_digests, other_tokens = table(2 * CHUNK, seed=5)
    other = pending(store._splitter.split(other_digests, other_tokens))
    store.put_compile(record("s:g3", digests, tokens, boundary=3), other)
    for name, _ in other:
        assert store.get_compile_part("s", name, TableChunk) is not None


def test_compile_heads_are_the_records_without_their_tables_and_read_no_chunk(
    store: KVEventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the inspector lists: every record as list_compiles gives it (usage reports
    included, oldest first), its per-message table left out and none of its chunks
    read. Joining every record's table read O(compiles x messages) entries."""
    n = 3 * CHUNK + 40
    digests, tokens = table(n + 5)
    for i, size in enumerate((n, n + 2, n + 5, 7)):
        store.put_compile(record(f"s:a{i}", digests[: 8 * size], tokens[:size], boundary=i + 1))
    store.record_usage("s:a1", Usage(120, 30), PLAN)
    whole = store.list_compiles("s")
    assert [len(r.message_tokens) for r in whole] == [n, n + 2, n + 5, 7]
    parts: list[str] = []
    get_part = store.get_compile_part

    def counted(sid: str, digest: str, cls: type[TableChunk]) -> TableChunk | None:
        parts.append(digest)
        return get_part(sid, digest, cls)

    monkeypatch.setattr(store, "get_compile_part", counted)
    heads = store.list_compile_heads("s")
    assert parts == []
    assert heads == [replace(r, message_digests=b"", message_tokens=()) for r in whole]
    assert heads[1].usage == Usage(120, 30)
    assert store.list_compile_heads("nobody") == []
