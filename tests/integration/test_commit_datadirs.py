"""Upgrades keep data, held to what earlier daemons answered.

Each tests/fixtures/data-commit-<sha>/ was written by the daemon of commit <sha> of main
(its code from the repository's history) with

    .venv/bin/python scripts/make_commit_datadir.py <sha> tests/fixtures/data-commit-<sha> [--kill]

which drives it through the API (sessions, sources, tools, an image, unary compiles,
stream steps with usage reports, checkpoints of both kinds, a tool search, time travel)
and saves what it answered: events, sessions and checkpoints as bytes, every view it
compiled, its usage estimates. Today's daemon opens a copy and must answer the same:
the same events, sessions and checkpoints, byte-equal views for every recorded compile
rebuilt by id and for every `as_of_seq` compile (but for the new unrecorded compile id),
the same estimates for the same usage reports (replays), a baseline that carries over,
the inspector's pages and /metrics over the old records, and new writes on top.
A fixture made with --kill ends with a SIGKILL while its second session was appending:
everything acknowledged before the kill is there.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import json
import shutil
import tempfile
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from ctxcc.v1 import artifact_service_pb2 as apb
from ctxcc.v1 import common_pb2, event_pb2, session_pb2, view_pb2
from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_service_pb2 as spb
from server.app import Daemon
from storage.basis_bytes import Split, split_basis_bytes
from storage.rocks import open_rocks
from storage.store import KVEventStore
from tests.conftest import Stubs, make_config, stubs_for
from tests.helpers import error_info, user

FIXTURES = sorted((Path(__file__).parents[1] / "fixtures").glob("data-commit-*"))
SID, OTHER = "upg-session", "upg-other"


@dataclass
class Upgraded:
    api: Stubs
    m: dict[str, Any]
    fixture: Path
    daemon: Daemon
    data: Path

    def saved(self, name: str) -> bytes:
        return gzip.decompress((self.fixture / "views" / f"{name}.pb.gz").read_bytes())

    @property
    def route(self) -> common_pb2.Route:
        return common_pb2.Route(**self.m["route"])

    def recorded(self) -> list[dict[str, Any]]:
        """The compiles the old daemon recorded, in the order it made them (daemons before
        8124a36 recorded as_of_seq compiles too)."""
        return [
            c
            for c in self.m["compiles"]
            if c["how"] in ("unary", "stream")
            or (c["how"] == "as_of" and ":unrecorded-" not in c["compile_id"])
        ]


def test_there_are_fixtures_of_earlier_commits() -> None:
    assert len(FIXTURES) >= 3
    for fixture in FIXTURES:
        m = json.loads((fixture / "manifest.json").read_text())
        assert fixture.name == f"data-commit-{m['commit'][:7]}"


@pytest.mark.parametrize(
    ("name", "before"), [("data-commit-7ea72d1", True), ("data-commit-3a9715c", False)]
)
def test_the_store_tells_records_made_before_call_ids_were_counted(
    short_tmp: Path, name: str, before: bool
) -> None:
    """7ea72d1 counted neither a call's id nor its result's (its records have no
    message_change); 3a9715c did. A record written now never says it was before."""
    copy = short_tmp / "db"
    shutil.copytree(Path(__file__).parents[1] / "fixtures" / name / "db", copy)
    kv = open_rocks(copy)
    try:
        store = KVEventStore(kv)
        records = store.list_compiles(SID)
        assert len(records) >= 10
        assert {r.before_call_ids for r in records} == {before}
        assert all(store.get_compile(r.compile_id).before_call_ids == before for r in records)
    finally:
        kv.close()


@pytest.fixture(params=FIXTURES, ids=lambda p: p.name)
async def u(request: pytest.FixtureRequest, short_tmp: Path) -> AsyncIterator[Upgraded]:
    fixture: Path = request.param
    data = short_tmp / "data"
    shutil.copytree(fixture / "db", data / "db")  # never open the committed copy
    m = json.loads((fixture / "manifest.json").read_text())
    daemon = Daemon(make_config(data))
    await daemon.start()
    api = stubs_for(f"unix:{daemon.endpoints.unix}")
    u = Upgraded(api, m, fixture, daemon, data)
    try:
        yield u
    finally:
        await u.api.channel.close()
        await u.daemon.stop()  # the one running now (a test may restart it)


def _split_of(fixture: Path, sid: str) -> Split:
    """What a session's basis parts hold in a fixture's data dir, as an earlier daemon
    wrote it (read from a copy)."""
    with tempfile.TemporaryDirectory(prefix="ctxcc-", dir="/tmp") as d:
        shutil.copytree(fixture / "db", Path(d) / "db")
        kv = open_rocks(Path(d) / "db")
        try:
            return split_basis_bytes(kv, sid)
        finally:
            kv.close()


def _b(msg: Any) -> bytes:
    data: bytes = msg.SerializeToString(deterministic=True)
    return data


def _without_id(data: bytes) -> bytes:
    """A view's bytes without its compile id (an as_of_seq compile gets a new one; daemons
    before as_of_seq compiles were unrecorded gave them a recorded one)."""
    view = view_pb2.CompiledView.FromString(data)
    view.compile_id = ""
    return _b(view)


async def test_sessions_events_and_checkpoints_read_back_as_written(u: Upgraded) -> None:
    listed = (await u.api.sessions.ListSessions(spb.ListSessionsRequest())).sessions
    assert {s.session_id for s in listed} == set(u.m["sessions"])  # upg-gone was deleted
    for sid, saved in u.m["sessions"].items():
        got = (await u.api.sessions.GetSession(spb.GetSessionRequest(session_id=sid))).session
        events = (
            await u.api.sessions.ListEvents(spb.ListEventsRequest(session_id=sid, page_size=1000))
        ).events
        checkpoints = (
            await u.api.compiles.ListCheckpoints(cpb.ListCheckpointsRequest(session_id=sid))
        ).checkpoints
        assert [_b(c).hex() for c in checkpoints] == saved["checkpoints"]
        written = [e.hex() for e in map(_b, events)]
        assert written[: len(saved["events"])] == saved["events"]
        if sid == OTHER and "killed_after_acked_seq" in u.m:
            # Appends acknowledged before the SIGKILL are all there, and nothing else
            # than the burst's user messages follows.
            assert got.head_seq >= u.m["killed_after_acked_seq"] > saved["head_seq"]
            assert [e.seq for e in events] == list(range(1, got.head_seq + 1))
            burst = events[saved["head_seq"] :]
            assert all(e.user_message.parts[0].text.startswith("burst ") for e in burst)
        else:
            # The active time (field 12) came after the earlier daemons: the later of the
            # last append and the last recorded compile, never before the update time.
            assert got.active_time.ToNanoseconds() >= got.update_time.ToNanoseconds() > 0
            was = session_pb2.Session.FromString(bytes.fromhex(saved["session"]))
            if not was.HasField("active_time"):
                got.ClearField("active_time")
            # Basis bytes (field 13) came after the earlier daemons: what the session's
            # basis parts hold, taken out of the stored bytes of daemons that counted
            # them there (from d7961be; test_basis_quota.py).
            split = _split_of(u.fixture, sid)
            assert got.basis_bytes == split.held
            assert got.stored_bytes == was.stored_bytes - split.counted
            got.ClearField("basis_bytes")
            got.stored_bytes = was.stored_bytes
            assert _b(got).hex() == saved["session"]
    download = u.api.artifacts.DownloadArtifact(
        apb.DownloadArtifactRequest(session_id=SID, artifact_id=u.m["artifact_id"])
    )
    chunks = [c async for c in download]
    assert (
        hashlib.sha256(b"".join(c.data for c in chunks[1:])).hexdigest() == (u.m["artifact_sha256"])
    )


async def test_recorded_compiles_are_rebuilt_as_the_old_daemon_sent_them(u: Upgraded) -> None:
    assert len(u.recorded()) >= 10
    for entry in u.recorded():
        asked = cpb.CompileRequest.FromString(bytes.fromhex(entry["request"]))
        req = cpb.CompileRequest(
            rebuild_compile_id=entry["compile_id"],
            image_mode=cpb.IMAGE_MODE_REFERENCE,
            render_formats=asked.render_formats,
        )
        if not u.m["features"]["rebuild"]:
            # Recorded before compiles kept their basis: not rebuilt, and said so.
            with pytest.raises(grpc.aio.AioRpcError) as exc:
                await u.api.compiles.Compile(req)
            assert error_info(exc.value).reason == "COMPILE_NOT_FOUND"
            assert "without its basis" in (exc.value.details() or "")
            continue
        rebuilt = (await u.api.compiles.Compile(req)).view
        assert _b(rebuilt) == u.saved(entry["name"]), entry["name"]
        assert hashlib.sha256(_b(rebuilt)).hexdigest() == entry["view_sha256"]


async def test_as_of_seq_compiles_are_the_old_daemons(u: Upgraded) -> None:
    """The same `as_of_seq` request gets the view the old daemon gave for it: exactly
    where it recorded versions (the rebuild feature), else (sources, clock and counting
    are today's) with the same messages."""
    at = [c for c in u.m["compiles"] if c["how"] == "as_of"]
    assert len(at) >= 12
    for entry in at:
        req = cpb.CompileRequest.FromString(bytes.fromhex(entry["request"]))
        assert req.as_of_seq == entry["event_boundary"] > 0
        view = (await u.api.compiles.Compile(req)).view
        assert view.compile_id.startswith(view.session_id + ":unrecorded-")
        old = view_pb2.CompiledView.FromString(u.saved(entry["name"]))
        if not u.m["features"]["rebuild"]:
            assert _untokened(view.messages) == _untokened(old.messages), entry["name"]
            assert view.checkpoint_id == old.checkpoint_id
        elif ":unrecorded-" in entry["compile_id"]:
            assert _without_id(_b(view)) == _without_id(u.saved(entry["name"])), entry["name"]
    if not u.m["features"]["rebuild"]:
        return
    # At each boundary, the request of the latest compile recorded there gets its view.
    # (The only check for a daemon that recorded its as_of_seq compiles: each of those
    # took the versions of the one before it at its boundary, which the next replaced.)
    latest = {(c["compile_id"].split(":")[0], c["event_boundary"]): c for c in u.recorded()}
    assert len(latest) >= 10
    for entry in latest.values():
        req = cpb.CompileRequest.FromString(bytes.fromhex(entry["request"]))
        req.as_of_seq = entry["event_boundary"]
        view = (await u.api.compiles.Compile(req)).view
        assert _without_id(_b(view)) == _without_id(u.saved(entry["name"])), entry["name"]


def _untokened(messages: Any) -> list[bytes]:
    out = []
    for m in messages:
        copy = view_pb2.ViewMessage()
        copy.CopyFrom(m)
        copy.tokens = 0
        out.append(_b(copy))
    return out


async def test_usage_reports_replay_and_the_baseline_carries_over(u: Upgraded) -> None:
    assert len(u.m["usage"]) >= (8 if u.m["features"]["stream_usage"] else 3)
    for report in u.m["usage"]:
        again = await u.api.compiles.ReportUsage(
            cpb.ReportUsageRequest(
                compile_id=report["compile_id"],
                route=common_pb2.Route.FromString(bytes.fromhex(report["route"])),
                input_tokens=report["input_tokens"],
                output_tokens=report["output_tokens"],
                cached_input_tokens=report["cached_input_tokens"],
            )
        )
        assert again.replayed, report
        assert again.estimated_input_tokens == report["estimated_input_tokens"], report
    # The session's last compile came after its last report; the same request now (a dry
    # run, nothing recorded) estimates from the same baseline, with the same figures.
    # (The other session of a fixture killed mid-append has events after its last compile.)
    for name in (
        ("stream-small-2",) if "killed_after_acked_seq" in u.m else ("stream-small-2", "other-2")
    ):
        entry = next(c for c in u.m["compiles"] if c["name"] == name)
        before = view_pb2.CompiledView.FromString(u.saved(name))
        req = cpb.CompileRequest.FromString(bytes.fromhex(entry["request"]))
        req.dry_run = True
        now = (await u.api.compiles.Compile(req)).view
        assert before.budget.baseline_tokens > 0
        assert (now.budget.estimate_method, now.budget.baseline_tokens) == (
            before.budget.estimate_method,
            before.budget.baseline_tokens,
        ), name
        if [_b(x) for x in now.layers] == [_b(x) for x in before.layers]:
            # Counted as the old daemon counted (past a change of counting, the change
            # of the fixed parts' counts since the baseline is part of the estimate).
            assert now.budget.estimated_input_tokens == before.budget.estimated_input_tokens
        assert now.checkpoint_id == before.checkpoint_id
        assert _untokened(now.messages) == _untokened(before.messages)


async def test_checkpoints_of_both_kinds_are_used(u: Upgraded) -> None:
    last = {c["name"]: c for c in u.m["compiles"]}
    assert last["unary-after-checkpoint"]["checkpoint_id"] == u.m["model_checkpoint_id"]
    other = view_pb2.CompiledView.FromString(u.saved("other-2")).checkpoint_id
    assert other
    for sid, checkpoint in ((SID, u.m["model_checkpoint_id"]), (OTHER, other)):
        req = cpb.CompileRequest(session_id=sid, route=u.route, dry_run=True)
        view = (await u.api.compiles.Compile(req)).view
        assert view.checkpoint_id == checkpoint and not view.fallback_reasons, sid


def _gemini_calls(view: view_pb2.CompiledView) -> list[tuple[str, str | None]]:
    (body,) = (
        json.loads(r.body_json)
        for r in view.renderings
        if r.format == view_pb2.RENDER_FORMAT_GEMINI
    )
    parts = [p for c in body["contents"] for p in c["parts"] if "functionCall" in p]
    # Bodies from rendering 7 carry no call ids (Vertex AI refuses them): the view's calls
    # are the body's, in order.
    ids = [c.call_id for m in view.messages for c in m.tool_calls]
    assert len(ids) == len(parts)
    return [(i, p.get("thoughtSignature")) for i, p in zip(ids, parts, strict=True)]


# The first fixture whose driver compiled a Gemini 3 loop (6d5d7bd: rendering 3).
GEMINI_3_FIXTURES = [f for f in FIXTURES if (f / "views" / "wide-gemini-3.pb.gz").exists()]


@pytest.mark.parametrize("u", GEMINI_3_FIXTURES, indirect=True, ids=lambda p: p.name)
async def test_a_gemini_3_step_gets_its_stand_in_signature_only_when_compiled_now(
    u: Upgraded,
) -> None:
    """Rendering 4 gives an unsigned step of Gemini 3's current turn Google's stand-in
    signature; the compile a daemon before it recorded is rebuilt without it (above), and
    the same request compiled now carries it on that step only (a daemon with rendering 4
    sent it already)."""
    (entry,) = [c for c in u.recorded() if c["name"] == "wide-gemini-3"]
    old = view_pb2.CompiledView.FromString(u.saved("wide-gemini-3"))
    now = (
        await u.api.compiles.Compile(cpb.CompileRequest.FromString(bytes.fromhex(entry["request"])))
    ).view
    calls = _gemini_calls(now)
    assert calls[-1] == ("w2", "skip_thought_signature_validator")
    assert all(sig is None for _, sig in calls[:-1])  # earlier, finished turns
    if u.m.get("versions", {}).get("rendering", 0) >= 4:  # manifests of older ones lack it
        assert _gemini_calls(old) == calls
    else:
        assert ("w2", None) in _gemini_calls(old)


# The first fixture whose driver logged a screenshot while its call ran (888a760:
# projection 7, before such an attachment waited for the call's result).
PAIRING_FIXTURES = [f for f in FIXTURES if (f / "views" / "pairing.pb.gz").exists()]


def _pairs(view: view_pb2.CompiledView) -> list[tuple[str, str, bool]]:
    """Each message as its role, its calls' ids or its result's call id, and synthetic."""
    return [
        (
            event_pb2.MessageRole.Name(m.role).removeprefix("MESSAGE_ROLE_").lower(),
            ",".join(c.call_id for c in m.tool_calls) or m.tool_call_id,
            m.synthetic,
        )
        for m in view.messages
    ]


@pytest.mark.parametrize("u", PAIRING_FIXTURES, indirect=True, ids=lambda p: p.name)
async def test_a_screenshot_before_its_result_pairs_the_new_way_only_when_compiled_now(
    u: Upgraded,
) -> None:
    """The compile the daemon before projection 8 recorded is rebuilt as it paired (above:
    the attachment closed the call, the second imported tool message was left out); the
    same request compiled now keeps the call whole and both imported messages."""
    (entry,) = [c for c in u.recorded() if c["name"] == "pairing"]
    old = view_pb2.CompiledView.FromString(u.saved("pairing"))
    now = (
        await u.api.compiles.Compile(cpb.CompileRequest.FromString(bytes.fromhex(entry["request"])))
    ).view
    imported = ["cart: 2 items", "total: 41.90 EUR"]
    assert _pairs(now) == [
        ("user", "", False),
        ("assistant", "w3", False),
        ("tool", "w3", False),
        ("user", "", False),  # the screenshot, after its call's result
        ("assistant", "", True),
        ("tool", "", False),
        ("assistant", "~2", True),
        ("tool", "~2", False),
    ]
    assert [m.parts[0].text for m in now.messages if m.origin_session_id] == imported
    if u.m["versions"]["projection"] < 8:
        assert ("tool", "w3", True) in _pairs(old)  # a made-up result, then w3~2
        assert [m.parts[0].text for m in old.messages if m.origin_session_id] == imported[:1]


async def test_new_writes_go_on_top(u: Upgraded) -> None:
    head = (await u.api.sessions.GetSession(spb.GetSessionRequest(session_id=SID))).session
    last = next(c for c in reversed(u.m["compiles"]) if c["name"] == "stream-small-2")
    req = cpb.CompileRequest.FromString(bytes.fromhex(last["request"]))
    # A resume of a view sent before the upgrade compiles afresh at the head.
    resume = cpb.ResumeRequest(compile_id=last["compile_id"], compile=req)
    resumed = [
        r
        async for r in u.api.compiles.CompileStream(iter([cpb.CompileStreamRequest(resume=resume)]))
    ]
    assert [r.WhichOneof("response") for r in resumed] == ["view"]
    assert resumed[0].view.event_boundary == head.head_seq
    assert resumed[0].view.compile_id != last["compile_id"]
    # A delta against a view of the old daemon (kept by none now) is a whole view.
    step = cpb.StepRequest(
        step_id="after",
        events=[user("after the upgrade")],
        compile=req,
        delta_base_compile_id=last["compile_id"],
        delta_digest=cpb.DELTA_DIGEST_MESSAGE_CHAIN_COMPACTION_APART,
    )
    step.usage.CopyFrom(
        cpb.ReportUsageRequest(compile_id=last["compile_id"], route=u.route, input_tokens=3300)
    )
    responses = [
        r async for r in u.api.compiles.CompileStream(iter([cpb.CompileStreamRequest(step=step)]))
    ]
    assert [r.WhichOneof("response") for r in responses] == ["view"]
    (resp,) = responses
    assert resp.append.first_seq == head.head_seq + 1
    assert resp.HasField("usage") and not resp.usage.replayed
    view = resp.view
    assert view.messages[-1].parts[0].text == "after the upgrade"
    assert view.budget.baseline_tokens == 3300
    rebuilt = await u.api.compiles.Compile(cpb.CompileRequest(rebuild_compile_id=view.compile_id))
    assert _b(rebuilt.view) == _b(view)


async def test_an_old_compile_reported_now_is_the_baseline_across_a_restart(u: Upgraded) -> None:
    """A usage report of a compile the old daemon recorded (and nobody reported) reads
    its record, makes it the baseline, and what that wrote reads back after a restart."""
    entry = next(c for c in u.m["compiles"] if c["name"] == "other-2")
    assert entry["compile_id"] not in {r["compile_id"] for r in u.m["usage"]}
    old = view_pb2.CompiledView.FromString(u.saved("other-2"))
    reported = old.budget.estimated_input_tokens + 11
    resp = await u.api.compiles.ReportUsage(
        cpb.ReportUsageRequest(
            compile_id=entry["compile_id"], route=u.route, input_tokens=reported, output_tokens=9
        )
    )
    assert not resp.replayed
    assert resp.estimated_input_tokens == old.budget.estimated_input_tokens
    recorded = cpb.CompileRequest.FromString(bytes.fromhex(entry["request"]))
    view = (await u.api.compiles.Compile(recorded)).view
    assert view.budget.estimate_method == view_pb2.ESTIMATE_METHOD_BASELINE_DELTA
    assert view.budget.baseline_tokens == reported
    req = cpb.CompileRequest.FromString(bytes.fromhex(entry["request"]))
    req.dry_run = True
    first = (await u.api.compiles.Compile(req)).view
    await u.api.channel.close()
    await u.daemon.stop()
    u.daemon = Daemon(make_config(u.data))
    await u.daemon.start()
    u.api = stubs_for(f"unix:{u.daemon.endpoints.unix}")
    again = (await u.api.compiles.Compile(req)).view
    # (Not its bytes: the environment section's clock may have ticked meanwhile.)
    assert [_b(m) for m in again.messages] == [_b(m) for m in first.messages]
    assert (again.budget.estimate_method, again.budget.baseline_tokens) == (
        first.budget.estimate_method,
        reported,
    )
    assert again.checkpoint_id == first.checkpoint_id == view.checkpoint_id
    rebuilt = await u.api.compiles.Compile(cpb.CompileRequest(rebuild_compile_id=view.compile_id))
    assert _b(rebuilt.view) == _b(view)
    replay = await u.api.compiles.ReportUsage(
        cpb.ReportUsageRequest(
            compile_id=entry["compile_id"], route=u.route, input_tokens=reported, output_tokens=9
        )
    )
    assert replay.replayed and replay.estimated_input_tokens == resp.estimated_input_tokens


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=60) as resp:
        assert resp.status == 200, url
        body: bytes = resp.read()
        return body.decode()


async def test_the_inspector_and_metrics_show_old_records(u: Upgraded) -> None:
    ui = f"http://{u.daemon.endpoints.ui}"
    pages = ["/", f"/s/{SID}", f"/s/{OTHER}", f"/s/{SID}/events", f"/s/{SID}/diff?a=5&b=12"]
    for page in pages:
        await asyncio.to_thread(_get, ui + page)
    for c in u.recorded():
        sid = c["compile_id"].split(":")[0]
        body = await asyncio.to_thread(_get, f"{ui}/s/{sid}/step?compile={c['compile_id']}")
        if u.m["features"]["rebuild"]:
            assert "rebuilt byte for byte" in body, c["name"]
        else:
            assert f"compiled now as of seq {c['event_boundary']}" in body, c["name"]
    metrics = await asyncio.to_thread(_get, f"http://{u.daemon.endpoints.metrics}/metrics")
    assert "ctxcc_compile_duration_seconds" in metrics


async def test_basis_bytes_stay_the_parts_held_after_new_compiles(u: Upgraded) -> None:
    """Each session of the old data dir compiled again by this daemon (a new message, so a
    new basis): once stopped, every session's basis_bytes is what the basis parts it holds
    take (split_basis_bytes), and its stored_bytes grew by the events alone."""
    last: dict[str, cpb.CompileRequest] = {}
    for entry in u.m["compiles"]:
        req = cpb.CompileRequest.FromString(bytes.fromhex(entry["request"]))
        if (
            req.session_id
            and not req.as_of_seq
            and ":unrecorded" not in entry.get("compile_id", "")
        ):
            last[req.session_id] = req
    assert last
    before = {}
    for sid, req in last.items():
        before[sid] = (
            await u.api.sessions.GetSession(spb.GetSessionRequest(session_id=sid))
        ).session
        await u.api.sessions.AppendEvents(
            spb.AppendEventsRequest(session_id=sid, events=[user(f"new in {sid}")])
        )
        view = (await u.api.compiles.Compile(req)).view
        # Rebuildable (its basis stored): as requested, without the request's options.
        rebuilt = await u.api.compiles.Compile(
            cpb.CompileRequest(rebuild_compile_id=view.compile_id)
        )
        assert rebuilt.view.event_boundary == view.event_boundary
    after = {
        sid: (await u.api.sessions.GetSession(spb.GetSessionRequest(session_id=sid))).session
        for sid in last
    }
    await u.api.channel.close()
    await u.daemon.stop()
    kv = open_rocks(u.data / "db")
    try:
        for sid in last:
            assert after[sid].basis_bytes == split_basis_bytes(kv, sid).held, sid
            assert after[sid].basis_bytes >= before[sid].basis_bytes
            grew = after[sid].stored_bytes - before[sid].stored_bytes
            assert 0 < grew < 1_000, (sid, grew)
    finally:
        kv.close()
    u.api = stubs_for(f"unix:{u.daemon.endpoints.unix}")  # closed again by the fixture
