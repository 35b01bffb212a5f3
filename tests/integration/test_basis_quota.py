"""A session's basis bytes are counted apart from its events and artifacts.

The parts a compile stores for its basis count in `Session.basis_bytes`, bounded by
`--max-session-basis-bytes`; appends and artifacts are checked against `stored_bytes`
alone. Measured before: with a 1 MB `--max-session-bytes` and a 100 KB rule written anew
before every step, 9 compiles kept their basis, later ones were recorded without it, and
the agent's appends were refused QUOTA_EXCEEDED with ~86 KB of events (its compiles'
bookkeeping had taken the quota). Against daemons on RocksDB in temp dirs, through the
gRPC API; and the data dirs of earlier daemons, opened."""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import grpc
import pytest

from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_pb2
from ctxcc.v1 import session_service_pb2 as spb
from server.app import Daemon
from server.compiler.budget import BudgetConfig
from server.compiler.compile import CompileInputs
from server.compiler.sources import SourceInputs
from server.domain.catalog import ModelInfo
from server.domain.model import Route, Session
from server.domain.records import CompileRecord
from server.domain.table_chunks import Splitter
from server.service.basis import SettingsPart, basis_of
from storage.basis_bytes import MARKER, split_basis_bytes
from storage.codec import decode_value
from storage.rocks import open_rocks
from storage.store import KVEventStore, StoreLimits
from tests.conftest import Stubs, make_config, stubs_for
from tests.helpers import compile_request, error_info, user

SID = "basis"
KB, MB = 1_000, 1_000_000
FIXTURES = Path(__file__).parents[1] / "fixtures"


def _rule(path: Path, text: str) -> None:
    name = path.stem
    path.write_text(f"---\nname: {name}\ndescription: {name}\nactivation: on_demand\n---\n{text}")


@contextlib.asynccontextmanager
async def said_hi(short_tmp: Path, **flags: str) -> AsyncIterator[tuple[Daemon, Stubs]]:
    """A daemon of `flags` on RocksDB in `short_tmp` whose session SID holds one user
    message, and its stubs."""
    d = Daemon(make_config(short_tmp, **flags))
    await d.start()
    api = stubs_for(f"unix:{d.endpoints.unix}")
    try:
        session = session_pb2.Session(session_id=SID)
        await api.sessions.CreateSession(spb.CreateSessionRequest(session=session))
        await api.sessions.AppendEvents(
            spb.AppendEventsRequest(session_id=SID, events=[user("hi")])
        )
        yield d, api
    finally:
        await api.channel.close()
        await d.stop()


async def _held(api: Stubs, sid: str = SID) -> session_pb2.Session:
    return (await api.sessions.GetSession(spb.GetSessionRequest(session_id=sid))).session


def _dropped(d: Daemon, reason: str = "quota") -> float:
    got = d.telemetry.registry.get_sample_value(
        "ctxcc_compiles_without_basis_total", {"reason": reason}
    )
    assert got is not None
    return got


async def _rebuilds(api: Stubs, compile_id: str) -> bool:
    try:
        await api.compiles.Compile(cpb.CompileRequest(rebuild_compile_id=compile_id))
    except grpc.aio.AioRpcError as exc:
        assert error_info(exc).reason == "COMPILE_NOT_FOUND", exc
        assert "without its basis" in (exc.details() or "")
        return False
    return True


async def test_bases_regenerated_at_every_step_never_refuse_an_append(short_tmp: Path) -> None:
    """The measured scenario: a 100 KB rule written anew before every step of 4 KB. The
    first compiles keep their basis until the basis quota, the rest are recorded without
    it (counted), and the agent appends until its events fill --max-session-bytes. A
    restart reads both figures back as they were (and the basis bytes are what the basis
    parts hold); DeleteSession frees both."""
    work = short_tmp / "work"
    proj = work / "proj"
    rules = proj / ".ctxcc" / "rules"
    rules.mkdir(parents=True)
    data = short_tmp / "data"
    flags = {
        "workspace_roots": str(work),
        "max_session_bytes": str(MB),
        "max_session_basis_bytes": str(MB),
    }
    d = Daemon(make_config(data, **flags))
    await d.start()
    api = stubs_for(f"unix:{d.endpoints.unix}")
    try:
        session = session_pb2.Session(
            session_id=SID, project_id="p", project_root=str(proj), working_directory=str(proj)
        )
        await api.sessions.CreateSession(spb.CreateSessionRequest(session=session))
        compiled: list[str] = []
        step = 0
        while True:
            step += 1
            _rule(rules / "generated.md", f"step {step}: " + "Mind the style. " * (100 * KB // 16))
            try:
                await api.sessions.AppendEvents(
                    spb.AppendEventsRequest(
                        session_id=SID, events=[user(f"step {step} " + "x" * 4 * KB)]
                    )
                )
            except grpc.aio.AioRpcError as exc:
                assert error_info(exc).reason == "QUOTA_EXCEEDED"
                assert error_info(exc).metadata["quota"] == "max_session_bytes"
                break
            compiled.append((await api.compiles.Compile(compile_request(SID))).view.compile_id)
        held = await _held(api)
        dropped = _dropped(d)
        kept = len(compiled) - int(dropped)
        print(
            f"steps {step}: appends refused at {held.stored_bytes} stored bytes, "
            f"{held.basis_bytes} basis bytes; {kept} compiles kept their basis, "
            f"{int(dropped)} recorded without"
        )
        # The events filled the event quota: the refused append was the one past it.
        assert MB - 5 * KB < held.stored_bytes <= MB
        assert step > 200
        # The bases filled theirs: about nine of ~100 KB, then none.
        assert 8 <= kept <= 10
        assert 0.8 * MB < held.basis_bytes <= MB
        assert dropped == len(compiled) - kept and _dropped(d, "missing") == 0
        assert await _rebuilds(api, compiled[0])
        assert not await _rebuilds(api, compiled[-1])
        await api.channel.close()
        await d.stop()

        kv = open_rocks(data / "db")
        try:
            split = split_basis_bytes(kv, SID)
            assert kv.get("meta", MARKER) == b"1"
        finally:
            kv.close()
        assert held.basis_bytes == split.held

        d = Daemon(make_config(data, **flags))
        await d.start()
        api = stubs_for(f"unix:{d.endpoints.unix}")
        again = await _held(api)
        assert (again.stored_bytes, again.basis_bytes) == (held.stored_bytes, held.basis_bytes)
        assert _dropped(d) == 0  # counted since the daemon started
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await api.sessions.AppendEvents(
                spb.AppendEventsRequest(session_id=SID, events=[user("x" * 5 * KB)])
            )
        assert error_info(refused.value).reason == "QUOTA_EXCEEDED"
        _rule(rules / "generated.md", "step after the restart: " + "Mind it. " * (100 * KB // 9))
        await api.compiles.Compile(compile_request(SID))
        assert _dropped(d) == 1
        assert (await _held(api)).basis_bytes == held.basis_bytes

        await api.sessions.DeleteSession(spb.DeleteSessionRequest(session_id=SID))
        await api.sessions.CreateSession(spb.CreateSessionRequest(session=session))
        fresh = await _held(api)
        assert (fresh.stored_bytes, fresh.basis_bytes) == (0, 0)
        await api.sessions.AppendEvents(
            spb.AppendEventsRequest(session_id=SID, events=[user("x" * 900 * KB)])
        )
        view = (await api.compiles.Compile(compile_request(SID))).view
        assert await _rebuilds(api, view.compile_id)
        now = await _held(api)
        assert now.stored_bytes > 900 * KB and 100 * KB < now.basis_bytes < 200 * KB
    finally:
        await api.channel.close()
        await d.stop()


async def test_a_basis_quota_of_0_stores_no_basis(short_tmp: Path) -> None:
    async with said_hi(short_tmp, max_session_basis_bytes="0") as (d, api):
        view = (await api.compiles.Compile(compile_request(SID))).view
        assert not await _rebuilds(api, view.compile_id)
        assert (await _held(api)).basis_bytes == 0
        assert _dropped(d) == 1


@pytest.mark.parametrize("commit", ["f2d8783", "4413fe6"])
async def test_an_earlier_data_dir_gets_its_basis_bytes_apart(short_tmp: Path, commit: str) -> None:
    """4413fe6 counted basis parts in stored_bytes, f2d8783 (before d7961be) did not: at
    the first open each session's basis bytes are what its parts hold, and its stored
    bytes those of its events, artifacts, checkpoints and tools alone (the same as the
    f2d8783 daemon's for the same requests). Its appends then go up to the event quota."""
    data = short_tmp / "data"
    shutil.copytree(FIXTURES / f"data-commit-{commit}" / "db", data / "db")
    kv = open_rocks(data / "db")
    try:
        assert kv.get("meta", MARKER) is None
        before = {
            s.session_id: s
            for s in (decode_value(raw, Session) for _, raw in kv.scan("sessions", b"", b"\xff"))
        }
        splits = {sid: split_basis_bytes(kv, sid) for sid in before}
        store = KVEventStore(kv)
        assert store.basis_bytes_moved == len(before)
        after = {sid: store.get_session(sid) for sid in before}
    finally:
        kv.close()
    # What f2d8783's daemon answered for the same requests (it counted no parts).
    manifest = json.loads((FIXTURES / "data-commit-f2d8783" / "manifest.json").read_text())
    f2d8783 = {
        sid: session_pb2.Session.FromString(bytes.fromhex(saved["session"])).stored_bytes
        for sid, saved in manifest["sessions"].items()
    }
    for sid, was in before.items():
        split = splits[sid]
        assert split.held > 0
        assert after[sid].basis_bytes == split.held
        if commit == "f2d8783":
            assert split.counted == 0
            assert after[sid].stored_bytes == was.stored_bytes
        else:
            assert split.counted == split.held
            assert after[sid].stored_bytes == was.stored_bytes - split.held
        assert after[sid].stored_bytes == f2d8783[sid]
    session = "upg-session"
    was, counted = before[session], splits[session].counted
    # An event quota a little over what the daemon that wrote it counted: every byte the
    # session's bases took there is room to append now.
    quota = was.stored_bytes + 2 * KB
    d = Daemon(make_config(data, max_session_bytes=str(quota)))
    await d.start()
    api = stubs_for(f"unix:{d.endpoints.unix}")
    try:
        appended = 0
        while True:
            try:
                await api.sessions.AppendEvents(
                    spb.AppendEventsRequest(session_id=session, events=[user("y" * 400)])
                )
            except grpc.aio.AioRpcError as exc:
                assert error_info(exc).reason == "QUOTA_EXCEEDED"
                break
            appended += 1
        held = await _held(api, session)
        assert quota - KB < held.stored_bytes <= quota
        assert held.basis_bytes == splits[session].held
        print(f"{commit}: {appended} appends of 400 bytes, {counted} bytes of bases moved")
        assert held.stored_bytes - after[session].stored_bytes > counted + KB
    finally:
        await api.channel.close()
        await d.stop()
    # Opened again, nothing is moved twice.
    kv = open_rocks(data / "db")
    try:
        store = KVEventStore(kv)
        assert store.basis_bytes_moved == 0
        assert store.get_session(session).stored_bytes == held.stored_bytes
    finally:
        kv.close()


def test_a_session_past_its_basis_quota_is_logged_once(
    short_tmp: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The first compile recorded without its basis for the quota is a warning; the
    session's later ones are counted, not warned of (one warning per compile before)."""
    session = Session("s", 1, 1)
    kv = open_rocks(short_tmp / "db")
    try:
        store = KVEventStore(kv, StoreLimits(max_session_basis_bytes=10))
        store.create_session(session)
        settings = SettingsPart("kernel", BudgetConfig(), 1, 1)
        for n in range(3):
            sources = SourceInputs(notes=(f"note {n} " * 20,))
            inputs = CompileInputs(f"s:{n}", session, (), 0, Route(model="m"), sources=sources)
            digest, parts = basis_of(inputs, ModelInfo("m", "m"), settings, Splitter())
            record = CompileRecord(f"s:{n:04x}", "s", Route(model="m"), 0, 1, 1, 1)
            with caplog.at_level(logging.DEBUG, "ctxcc.storage"):
                store.put_compile(replace(record, basis_digest=digest), parts)
            assert store.get_compile(f"s:{n:04x}").basis_digest == ""
        warned = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warned) == 1 and "later ones of the session are counted" in warned[0].message
        assert store.bases_dropped == {"quota": 3, "missing": 0}
        assert store.get_session("s").basis_bytes == 0
    finally:
        kv.close()
