"""A compile's basis stores each source text (an instruction file's, a rule's, a memory
entry's) as a part of its own, named by digest: an edit of one file stores that file's
text again, not every text the compile read (14 rule files of 1 MB with a tiny rule
edited before each compile grew the data directory by ~134 MiB in 10 compiles, the whole
sources part written again each time). What a session's basis parts take counts in its
basis bytes, against `--max-session-basis-bytes` (not `--max-session-bytes`); a compile
whose new parts would pass it is answered and recorded without its basis (it cannot be
rebuilt). Against a daemon on RocksDB in a temp dir."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path

import grpc
import pytest

from ctxcc.v1 import common_pb2, session_pb2, source_pb2, view_pb2
from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_service_pb2 as spb
from ctxcc.v1 import source_service_pb2 as rpb
from server.app import Daemon
from server.compiler.budget import BudgetConfig
from server.compiler.compile import CompileInputs
from server.compiler.sources import SourceInputs
from server.domain.catalog import ModelInfo
from server.domain.model import Route, Session
from server.domain.records import CompileRecord
from server.domain.sources import InstructionFile, MemoryEntry, RuleActivation, RuleEntry, Scope
from server.domain.table_chunks import Splitter
from server.service.basis import (
    SOURCE_TEXTS,
    CompileBasis,
    SettingsPart,
    basis_of,
    digest_of,
    recall,
)
from storage.keys import PART, session_prefix
from storage.rocks import open_rocks
from storage.store import KVEventStore
from tests.conftest import Stubs, make_config, stubs_for
from tests.helpers import ROUTE, compile_request, error_info, user

SID = "texts"
MB = 1_000_000


@dataclass
class Running:
    d: Daemon
    api: Stubs
    data: Path
    proj: Path


@pytest.fixture
async def running(short_tmp: Path, request: pytest.FixtureRequest) -> AsyncIterator[Running]:
    flags: dict[str, str] = getattr(request, "param", {})
    work = short_tmp / "work"
    proj = work / "proj"
    (proj / ".ctxcc" / "rules").mkdir(parents=True)
    data = short_tmp / "data"
    d = Daemon(make_config(data, workspace_roots=str(work), **flags))
    await d.start()
    api = stubs_for(f"unix:{d.endpoints.unix}")
    try:
        yield Running(d, api, data, proj)
    finally:
        await api.channel.close()
        await d.stop()


def _rule(path: Path, text: str, activation: str = "on_demand") -> None:
    name = path.stem
    front = f"---\nname: {name}\ndescription: {name}\nactivation: {activation}\n---\n"
    path.write_text(front + text)


async def _session(api: Stubs, proj: Path, working_directory: Path | None = None) -> None:
    session = session_pb2.Session(
        session_id=SID,
        project_id="p",
        project_root=str(proj),
        working_directory=str(working_directory or proj),
    )
    await api.sessions.CreateSession(spb.CreateSessionRequest(session=session))
    await api.sessions.AppendEvents(spb.AppendEventsRequest(session_id=SID, events=[user("hi")]))


async def _basis_bytes(api: Stubs) -> int:
    got = await api.sessions.GetSession(spb.GetSessionRequest(session_id=SID))
    return got.session.basis_bytes


async def _stored_bytes(api: Stubs) -> int:
    got = await api.sessions.GetSession(spb.GetSessionRequest(session_id=SID))
    return got.session.stored_bytes


def _part_bytes(data: Path) -> int:
    """What the session's compile parts hold in the store (read after the daemon stops)."""
    kv = open_rocks(data / "db")
    try:
        start = session_prefix(SID) + PART
        return sum(len(k) + len(v) for k, v in kv.scan("compiles", start, start + b"\xff"))
    finally:
        kv.close()


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _wire(view: view_pb2.CompiledView) -> bytes:
    return view.SerializeToString(deterministic=True)


async def _rebuilt(api: Stubs, compile_id: str) -> view_pb2.CompiledView:
    got = await api.compiles.Compile(cpb.CompileRequest(rebuild_compile_id=compile_id))
    return got.view


async def test_an_edit_of_one_rule_stores_that_rule_again_not_every_rule(
    running: Running,
) -> None:
    api, proj = running.api, running.proj
    rules = proj / ".ctxcc" / "rules"
    for i in range(14):
        _rule(rules / f"big{i:02d}.md", f"rule {i}: " + "Mind the style. " * (MB // 16))
    tiny = rules / "tiny.md"
    _rule(tiny, "Edit 0.", activation="always")
    await _session(api, proj)
    views = [(await api.compiles.Compile(compile_request(SID))).view]
    first = await _basis_bytes(api)
    dir_first = _dir_bytes(running.data)
    for n in range(1, 11):
        _rule(tiny, f"Edit {n}.", activation="always")
        views.append((await api.compiles.Compile(compile_request(SID))).view)
    grown = await _basis_bytes(api) - first
    dir_grown = _dir_bytes(running.data) - dir_first
    print(f"basis_bytes: first {first}, +{grown} in 10 compiles; data dir +{dir_grown}")
    # The 14 MB of rule texts count once in the basis bytes, each edit a few KB.
    assert first >= 14 * MB
    assert 0 < grown < 200_000, grown
    # Every compile rebuilds byte for byte, with the rule text it read.
    for n, view in enumerate(views):
        rules_text = next(
            s.text for s in view.system_sections if s.kind == view_pb2.SECTION_KIND_RULES
        )
        assert f"Edit {n}." in rules_text
        assert _wire(await _rebuilt(api, view.compile_id)) == _wire(view)
    await running.d.stop()
    parts = _part_bytes(running.data)
    print(f"compile parts in the store: {parts}")
    assert 14 * MB < parts < 14 * MB + 1_000_000, parts


async def test_instruction_files_and_memory_are_stored_once_per_text(running: Running) -> None:
    """Each kind of text: an instruction file at the root and one below it, the
    workspace memory file, API memory and API rules; editing one stores that one again."""
    api, proj = running.api, running.proj
    sub = proj / "src"
    sub.mkdir()
    files = {
        "agents": proj / "AGENTS.md",
        "claude": sub / "CLAUDE.md",
        "memory": proj / ".ctxcc" / "MEMORY.md",
        "rule": proj / ".ctxcc" / "rules" / "style.md",
    }
    for name, path in files.items():
        path.write_text(f"{name} 0\n" + f"{name} says: keep it tidy. " * (MB // 32))
    await _session(api, proj, sub)

    async def put_api(n: int) -> int:
        text = f"api {n}\n" + "api memory fact. " * 3_500  # under the 64 KiB of an entry
        entry = source_pb2.MemoryEntry(
            memory_id="fact", scope=common_pb2.SCOPE_SESSION, scope_id=SID, text=text
        )
        await api.sources.PutMemory(rpb.PutMemoryRequest(memory=entry))
        return len(text)

    texts = await put_api(0) + sum(p.stat().st_size for p in files.values())
    request = compile_request(SID)
    views = [(await api.compiles.Compile(request)).view]
    first = await _basis_bytes(api)
    assert first >= texts
    edited = 0
    for n, name in enumerate(("agents", "claude", "memory", "rule", "api"), start=1):
        if name == "api":
            edited += await put_api(n)
        else:
            path = files[name]
            path.write_text(path.read_text().replace(f"{name} 0\n", f"{name} {n}\n", 1))
            edited += path.stat().st_size
        views.append((await api.compiles.Compile(request)).view)
    grown = await _basis_bytes(api) - first
    print(f"basis_bytes: first {first}, +{grown} for {edited} bytes of edited texts")
    assert edited <= grown < edited + 200_000, (grown, edited)
    for view in views:
        assert _wire(await _rebuilt(api, view.compile_id)) == _wire(view)
    await running.d.stop()
    parts = _part_bytes(running.data)
    print(f"compile parts in the store: {parts}")
    assert texts + edited < parts < texts + edited + 200_000, parts


@pytest.mark.parametrize(
    "running",
    [{"max_session_bytes": str(3 * MB), "max_session_basis_bytes": str(3 * MB)}],
    indirect=True,
)
async def test_basis_parts_count_against_the_session_basis_quota(running: Running) -> None:
    """Rule texts fill the basis quota: the compile whose new texts would pass it is
    answered and recorded (a usage report finds it) without its basis, so it cannot be
    rebuilt; appends are not refused for the bases' bytes (an append that took the
    session's bytes and its bases' past --max-session-bytes was refused QUOTA_EXCEEDED);
    compiles of unchanged sources store nothing new and are kept with their basis."""
    api, proj = running.api, running.proj
    rule = proj / ".ctxcc" / "rules" / "big.md"
    _rule(rule, "first " * (MB // 6))
    _rule(proj / ".ctxcc" / "rules" / "other.md", "other " * (MB // 6))
    await _session(api, proj)
    kept = (await api.compiles.Compile(compile_request(SID))).view
    assert await _basis_bytes(api) > 2 * MB
    assert await _stored_bytes(api) < 1_000
    assert _wire(await _rebuilt(api, kept.compile_id)) == _wire(kept)

    _rule(rule, "second " * (MB // 7))
    over = (await api.compiles.Compile(compile_request(SID))).view
    assert over.compile_id != kept.compile_id
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await _rebuilt(api, over.compile_id)
    assert error_info(exc.value).reason == "COMPILE_NOT_FOUND"
    assert "without its basis" in (exc.value.details() or "")
    # The same request again (a repeat of it, which writes no parts) is no more
    # rebuildable: its record does not name the basis that was not stored.
    repeat = (await api.compiles.Compile(compile_request(SID))).view
    assert repeat.compile_id != over.compile_id
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await _rebuilt(api, repeat.compile_id)
    assert error_info(exc.value).reason == "COMPILE_NOT_FOUND"
    usage = await api.compiles.ReportUsage(
        cpb.ReportUsageRequest(
            compile_id=over.compile_id,
            route=ROUTE,
            input_tokens=1000,
            output_tokens=10,
        )
    )
    assert usage.estimated_input_tokens == over.budget.estimated_input_tokens
    assert 2 * MB < await _basis_bytes(api) <= 3 * MB
    held = await _stored_bytes(api)
    # Events up to the session's quota go in, bases or not.
    for _ in range(3):
        await api.sessions.AppendEvents(
            spb.AppendEventsRequest(session_id=SID, events=[user("x" * (MB - 1_000))])
        )
    assert await _stored_bytes(api) > held + 2.99 * MB
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await api.sessions.AppendEvents(
            spb.AppendEventsRequest(session_id=SID, events=[user("x" * 10_000)])
        )
    assert error_info(exc.value).reason == "QUOTA_EXCEEDED"
    assert error_info(exc.value).metadata["quota"] == "max_session_bytes"

    _rule(rule, "first " * (MB // 6))  # back to texts already stored
    again = (await api.compiles.Compile(compile_request(SID))).view
    assert _wire(await _rebuilt(api, again.compile_id)) == _wire(again)


def test_a_basis_is_recalled_whichever_way_its_sources_were_stored(short_tmp: Path) -> None:
    """A basis of this daemon names a SourcesPart and a TextPart per distinct text; one
    stored before (source_texts 0) names one SourceInputs part with every text. Both are
    read back as the sources the compile read, from RocksDB."""
    text = "Use tabs.\n" * 100
    sources = SourceInputs(
        instruction_files=(
            InstructionFile("AGENTS.md", Scope.PROJECT, text, display="AGENTS.md"),
            InstructionFile("src/AGENTS.md", Scope.PROJECT, "Below.", display="src/AGENTS.md"),
        ),
        rules=(RuleEntry("r", Scope.PROJECT, "p", "r", "d", text, RuleActivation.ALWAYS),),
        memory=(MemoryEntry("m", Scope.SESSION, "s", "A fact."),),
        notes=("a note",),
    )
    session = Session("s", 1, 1)
    inputs = CompileInputs("s:new", session, (), 0, Route(model="m"), sources=sources)
    settings = SettingsPart("kernel", BudgetConfig(), 1, 1)
    digest, parts = basis_of(inputs, ModelInfo("m", "m"), settings, Splitter())
    names = [type(p).__name__ for _, p in parts]
    # The rule's text is the first instruction file's: stored once.
    assert names == ["TextPart"] * 3 + ["SourcesPart", "ToolsPart", "SettingsPart", "CompileBasis"]
    new = parts[-1][1]
    assert isinstance(new, CompileBasis) and new.source_texts == SOURCE_TEXTS
    old = replace(new, sources=digest_of(sources), source_texts=0)
    old_parts = ((digest_of(sources), sources), *parts[4:6], (digest_of(old), old))
    kv = open_rocks(short_tmp / "db")
    try:
        store = KVEventStore(kv)
        store.create_session(session)
        written = (("new", digest, parts), ("old", old_parts[-1][0], old_parts))
        for suffix, basis_digest, stored in written:
            record = CompileRecord(f"s:{suffix}", "s", Route(model="m"), 0, 1, 1, 1)
            store.put_compile(replace(record, basis_digest=basis_digest), stored)
        for suffix, basis_digest, _ in written:
            assert store.get_compile(f"s:{suffix}").basis_digest == basis_digest
            assert recall(store, "s", basis_digest).sources == sources
    finally:
        kv.close()


def test_two_compiles_storing_the_same_new_text_at_once_count_it_once(short_tmp: Path) -> None:
    """Two compiles of a session that read the same new text both find it not stored
    before either takes the session's lock: the one that writes second must not count
    its parts again (they were counted twice: +201,508 bytes for 100 KB of parts)."""
    import threading
    import time

    text = "Use tabs.\n" * 10_000
    sources = SourceInputs(
        rules=(RuleEntry("r", Scope.PROJECT, "p", "r", "d", text, RuleActivation.ALWAYS),)
    )
    session = Session("s", 1, 1)
    settings = SettingsPart("kernel", BudgetConfig(), 1, 1)

    def stored(n: int) -> tuple[CompileRecord, tuple[tuple[str, object], ...]]:
        inputs = CompileInputs(
            f"s:{n}", session, (), 0, Route(model="m"), sources=sources, requested_max_output=n
        )
        digest, parts = basis_of(inputs, ModelInfo("m", "m"), settings, Splitter())
        record = CompileRecord(f"s:{n:04x}", "s", Route(model="m"), 0, 1, 1, 1)
        return replace(record, basis_digest=digest), parts

    kv = open_rocks(short_tmp / "db")
    try:
        store = KVEventStore(kv)
        store.create_session(session)
        alone_kv = open_rocks(short_tmp / "alone")
        try:
            alone = KVEventStore(alone_kv)
            alone.create_session(session)
            alone.put_compile(*stored(1))
            once = alone.get_session("s").basis_bytes
        finally:
            alone_kv.close()
        assert once > len(text)
        lock = store._lock("s")  # both compiles find the parts unstored, then wait
        lock.acquire()
        threads = [threading.Thread(target=store.put_compile, args=stored(n)) for n in (1, 2)]
        for t in threads:
            t.start()
        time.sleep(0.3)
        lock.release()
        for t in threads:
            t.join()
        assert store.get_session("s").basis_bytes == once
        for n in (1, 2):
            record = store.get_compile(f"s:{n:04x}")
            assert recall(store, "s", record.basis_digest).sources == sources
    finally:
        kv.close()
