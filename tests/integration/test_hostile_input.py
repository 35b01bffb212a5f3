"""Hostile input found by probing a real daemon: each case once answered INTERNAL (or
worse) where the README promises a documented reason."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from ctxcc.v1 import checkpoint_pb2, session_pb2
from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_service_pb2 as spb
from ctxcc.v1 import source_service_pb2 as rpb
from server.app import Daemon
from tests.conftest import Stubs, make_config, stubs_for
from tests.helpers import compile_request, error_info, user


def _token(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode()


# A page token is base64 of JSON the client hands back; nothing stops a client from
# handing back JSON nested past Python's recursion limit.
HOSTILE_TOKENS = [
    _token(b"[" * 200_000),
    _token(b'{"l":' * 100_000),
    _token(b'{"l": 1, "q": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"),
]


async def test_deeply_nested_page_tokens_answer_invalid_page_token(api: Stubs) -> None:
    await api.sessions.CreateSession(
        spb.CreateSessionRequest(session=session_pb2.Session(session_id="pages"))
    )
    await api.sessions.AppendEvents(
        spb.AppendEventsRequest(session_id="pages", events=[user("a"), user("b")])
    )
    listings: list[Callable[[str], Awaitable[Any]]] = [
        lambda t: api.sessions.ListEvents(
            spb.ListEventsRequest(session_id="pages", page_size=1, page_token=t)
        ),
        lambda t: api.sessions.ListSessions(spb.ListSessionsRequest(page_size=1, page_token=t)),
        lambda t: api.compiles.ListCheckpoints(
            cpb.ListCheckpointsRequest(session_id="pages", page_size=1, page_token=t)
        ),
    ]
    for listing in listings:
        for token in HOSTILE_TOKENS:
            with pytest.raises(grpc.aio.AioRpcError) as exc:
                await listing(token)
            assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT, exc.value.details()
            assert error_info(exc.value).reason == "INVALID_PAGE_TOKEN"
    # A real token still pages on.
    first = await api.sessions.ListEvents(spb.ListEventsRequest(session_id="pages", page_size=1))
    rest = await api.sessions.ListEvents(
        spb.ListEventsRequest(session_id="pages", page_size=1, page_token=first.next_page_token)
    )
    assert [e.seq for e in [*first.events, *rest.events]] == [1, 2]


@pytest.fixture
async def project(short_tmp: Path) -> AsyncIterator[tuple[Stubs, Path, Path]]:
    work, global_dir = short_tmp / "work", short_tmp / "global"
    (work / "proj").mkdir(parents=True)
    global_dir.mkdir()
    cfg = make_config(short_tmp / "data", workspace_roots=str(work), global_dir=str(global_dir))
    d = Daemon(cfg)
    await d.start()
    s = stubs_for(str(d.endpoints.tcp))
    try:
        yield s, work / "proj", global_dir
    finally:
        await s.channel.close()
        await d.stop()


def _latin_tree(proj: Path, global_dir: Path) -> None:
    """Rules, skills and a FIFO whose names are not UTF-8."""
    p, g = os.fsencode(proj), os.fsencode(global_dir)
    os.makedirs(p + b"/.ctxcc/rules")
    os.makedirs(p + b"/.ctxcc/skills/sk\xff")
    os.makedirs(p + b"/.ctxcc/skills/fifo\xfe")
    os.makedirs(g + b"/rules")
    with open(p + b"/.ctxcc/rules/r\xe9gle.md", "wb") as f:
        f.write(b"---\nname: regle\nactivation: on_demand\n---\nproject rule body")
    with open(p + b"/.ctxcc/skills/sk\xff/SKILL.md", "wb") as f:
        f.write(b"---\nname: latin\ndescription: a skill in a Latin-1 directory\n---\n")
    os.mkfifo(p + b"/.ctxcc/skills/fifo\xfe/SKILL.md")  # skipped, with a note naming it
    with open(g + b"/rules/\xff.md", "wb") as f:
        f.write(b"---\nactivation: always\n---\nglobal rule body")


async def test_file_names_that_are_not_utf8_never_fail_a_compile(
    project: tuple[Stubs, Path, Path],
) -> None:
    """A repository may hold any bytes as names (a Latin-1 checkout): rules, skills and
    notes named by them are shown with U+FFFD, never an INTERNAL for every compile."""
    api, proj, global_dir = project
    _latin_tree(proj, global_dir)
    await api.sessions.CreateSession(
        spb.CreateSessionRequest(
            session=session_pb2.Session(
                session_id="latin", project_root=str(proj), working_directory=str(proj)
            )
        )
    )
    await api.sessions.AppendEvents(
        spb.AppendEventsRequest(session_id="latin", events=[user("hi")])
    )
    view = (await api.compiles.Compile(compile_request("latin"))).view
    prompt = view.system_prompt
    assert "global rule body" in prompt
    assert "a skill in a Latin-1 directory" in prompt
    assert "regle" in prompt  # in the rule index
    assert any(
        n == "skipped .ctxcc/skills/fifo\ufffd/SKILL.md: not a regular file" for n in view.notes
    ), view.notes
    sources = [src for s in view.system_sections for src in s.sources]
    assert str(global_dir / "rules") + "/\ufffd.md" in sources, sources
    loaded = await api.sources.LoadRule(rpb.LoadRuleRequest(session_id="latin", name="regle"))
    assert loaded.rule.text == "project rule body"
    assert loaded.rule.rule_id == "r\ufffdgle"


def _status(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


async def test_inspector_numbers_in_other_scripts_are_a_bad_request(
    daemon: Daemon, api: Stubs
) -> None:
    """`str.isdigit` holds for '²' and '①', which `int` refuses: a page asked for one
    answered 500 with a traceback in the log; it is a 400 naming the parameter."""
    await api.sessions.CreateSession(
        spb.CreateSessionRequest(session=session_pb2.Session(session_id="insp"))
    )
    await api.sessions.AppendEvents(spb.AppendEventsRequest(session_id="insp", events=[user("hi")]))
    base = f"http://{daemon.endpoints.ui}/s/insp"
    for path, key in [
        ("/step?seq=%C2%B2", "seq"),
        ("/events?after=%C2%B2", "after"),
        ("/events?through=%E2%91%A0", "through"),
        ("/diff?a=%E2%91%A0&b=1", "a"),
    ]:
        code, body = await asyncio.to_thread(_status, base + path)
        assert code == 400, (path, code, body[-300:])
        assert f"{key} must be a whole number" in body, body[-300:]
    code, _ = await asyncio.to_thread(_status, base + "/events?after=0")
    assert code == 200
    # A rendering the inspector does not know is refused the same way (it was ignored:
    # the page came without the body asked for).
    code, body = await asyncio.to_thread(_status, base + "/step?seq=1&format=bogus")
    assert code == 400, (code, body[-300:])
    assert "format must be one of anthropic_messages, gemini, openai_chat" in body, body[-300:]
    code, body = await asyncio.to_thread(_status, base + "/step?seq=1&format=gemini&model=gpt-4o")
    assert code == 200, (code, body[-600:])


def _forged(real: str, last: object) -> str:
    """`real` with its position replaced: the fingerprint beside it only hashes the
    query, so any client can do this."""
    data = json.loads(base64.urlsafe_b64decode(real))
    data["l"] = last
    return _token(json.dumps(data).encode())


async def test_forged_page_positions_answer_invalid_page_token(api: Stubs) -> None:
    await api.sessions.CreateSession(
        spb.CreateSessionRequest(session=session_pb2.Session(session_id="forge"))
    )
    await api.sessions.AppendEvents(
        spb.AppendEventsRequest(session_id="forge", events=[user("a"), user("b"), user("c")])
    )
    for through in (1, 2):
        await api.compiles.CreateCheckpoint(
            cpb.CreateCheckpointRequest(
                checkpoint=checkpoint_pb2.Checkpoint(
                    session_id="forge", covers_through_seq=through, summary=f"s{through}"
                ),
                covered_digest_mode=cpb.COVERED_DIGEST_MODE_COMPUTE,
            )
        )
    events = await api.sessions.ListEvents(spb.ListEventsRequest(session_id="forge", page_size=1))
    checkpoints = await api.compiles.ListCheckpoints(
        cpb.ListCheckpointsRequest(session_id="forge", page_size=1)
    )
    assert events.next_page_token and checkpoints.next_page_token

    def list_events(t: str) -> Any:
        return api.sessions.ListEvents(
            spb.ListEventsRequest(session_id="forge", page_size=1, page_token=t)
        )

    def list_checkpoints(t: str) -> Any:
        return api.compiles.ListCheckpoints(
            cpb.ListCheckpointsRequest(session_id="forge", page_size=1, page_token=t)
        )

    for listing, real in (
        (list_events, events.next_page_token),
        (list_checkpoints, checkpoints.next_page_token),
    ):
        for last in ("abc", "\u00b2", "1", -5, 1 << 64, True, 1.5):
            with pytest.raises(grpc.aio.AioRpcError) as exc:
                await listing(_forged(real, last))
            assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (last, exc.value.details())
            assert error_info(exc.value).reason == "INVALID_PAGE_TOKEN", last
    # The real tokens still page on.
    assert [e.seq for e in (await list_events(events.next_page_token)).events] == [2]
    rest = await list_checkpoints(checkpoints.next_page_token)
    pages = [*checkpoints.checkpoints, *rest.checkpoints]
    assert sorted(c.covers_through_seq for c in pages) == [1, 2]
