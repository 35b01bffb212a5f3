"""The inspector's connections are bounded: at most MAX_CONNECTIONS open at once (one
more is answered 503 before any of it is read) and none idle without a request in
progress past IDLE_S, so half-sent requests cannot hold the daemon's descriptors (5,000
held 5,000 for an hour); a live page, whose response is in progress, stays open."""

from __future__ import annotations

import asyncio
import logging
import socket
import urllib.request

import pytest

from ctxcc.v1 import session_pb2
from ctxcc.v1 import session_service_pb2 as spb
from server.app import Daemon
from server.web import server as web_server
from tests.conftest import Stubs
from tests.helpers import user

CAP = 8
IDLE = 1.0


@pytest.fixture
def web_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    """The daemon made next (pytest makes a test's fixtures in the order it names them:
    this one before `daemon`) takes CAP connections, idle for IDLE seconds at most."""
    monkeypatch.setattr(web_server, "MAX_CONNECTIONS", CAP)
    monkeypatch.setattr(web_server, "IDLE_S", IDLE)


async def _connect(daemon: Daemon, send: bytes) -> socket.socket:
    host, port = str(daemon.endpoints.ui).rsplit(":", 1)
    s = socket.socket()
    s.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(s, (host, int(port)))
    if send:
        await loop.sock_sendall(s, send)
    return s


async def _read_until_closed(s: socket.socket) -> bytes:
    """Everything the daemon sends until it closes the connection (60 s a read: a bound
    on a hang)."""
    loop = asyncio.get_running_loop()
    out = b""
    while chunk := await asyncio.wait_for(loop.sock_recv(s, 65536), 60):
        out += chunk
    return out


def _open_connections(daemon: Daemon) -> int:
    assert daemon._web is not None
    return len(daemon._web._runner.server.connections)  # type: ignore[union-attr]


async def test_connections_past_the_cap_are_turned_away_and_idle_ones_closed(
    web_limits: None, daemon: Daemon
) -> None:
    half = [await _connect(daemon, b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n") for _ in range(CAP)]
    try:
        for _ in range(600):
            if _open_connections(daemon) == CAP:
                break
            await asyncio.sleep(0.05)
        assert _open_connections(daemon) == CAP
        extra = await _connect(daemon, b"")
        answer = await _read_until_closed(extra)
        extra.close()
        assert answer.startswith(b"HTTP/1.1 503 "), answer
        # Each half-sent request is closed once it has been idle that long, unanswered.
        leftovers = await asyncio.gather(*(_read_until_closed(s) for s in half))
        assert leftovers == [b""] * CAP
    finally:
        for s in half:
            s.close()
    url = f"http://{daemon.endpoints.ui}/"
    with await asyncio.to_thread(urllib.request.urlopen, url, timeout=60) as page:
        assert page.status == 200


async def test_a_live_page_stays_open_past_the_idle_time(
    web_limits: None, daemon: Daemon, unix_api: Stubs
) -> None:
    await unix_api.sessions.CreateSession(
        spb.CreateSessionRequest(session=session_pb2.Session(session_id="live"))
    )
    host = str(daemon.endpoints.ui)
    s = await _connect(daemon, f"GET /s/live/live HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    loop = asyncio.get_running_loop()
    try:
        head = await asyncio.wait_for(loop.sock_recv(s, 65536), 60)
        assert head.startswith(b"HTTP/1.1 200 "), head
        await asyncio.sleep(3 * IDLE)
        events = [user("still watching")]
        await unix_api.sessions.AppendEvents(
            spb.AppendEventsRequest(session_id="live", events=events)
        )
        seen = b""
        while b'"kind": "event", "seq": 1}' not in seen:  # the append's update
            chunk = await asyncio.wait_for(loop.sock_recv(s, 65536), 60)
            assert chunk, f"the live page was closed; it had read {seen!r}"
            seen += chunk
    finally:
        s.close()


async def test_a_sign_in_body_sent_slowly_is_given_up(
    monkeypatch: pytest.MonkeyPatch, web_limits: None, daemon: Daemon
) -> None:
    """A sign-in form whose body trickles in (a byte at a time, each well within the idle
    time) is answered 408 and its connection closed once FORM_READ_S has passed: the
    login page needs no token, and such a body held its connection for as long as it
    trickled, so CAP of them locked everyone out of the inspector."""
    monkeypatch.setattr(web_server, "FORM_READ_S", IDLE)
    head = (
        "POST /login HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 1000\r\n\r\ntoken="
    )
    s = await _connect(daemon, head.encode())
    loop = asyncio.get_running_loop()
    answer = b""
    try:
        # 30 times the bound, a byte every IDLE / 5 s: it should end long before this.
        for _ in range(150):
            try:
                chunk = await asyncio.wait_for(loop.sock_recv(s, 65536), IDLE / 5)
            except TimeoutError:
                try:
                    await loop.sock_sendall(s, b"a")
                except OSError:
                    break  # closed while this test still sent
                continue
            if not chunk:
                break
            answer += chunk
        else:
            raise AssertionError(f"the slow sign-in body still held its connection: {answer!r}")
    finally:
        s.close()
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    # The inspector still answers.
    url = f"http://{daemon.endpoints.ui}/login"
    with await asyncio.to_thread(urllib.request.urlopen, url, timeout=60) as page:
        assert page.status == 200


async def test_a_sign_in_body_cut_off_by_its_sender_is_no_incident(
    caplog: pytest.LogCaptureFixture, daemon: Daemon
) -> None:
    """A sender that goes away in the middle of its sign-in body is a request that ended,
    not an inspector failure logged with a traceback."""
    head = (
        "POST /login HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 1000\r\n\r\ntoken="
    )
    s = await _connect(daemon, head.encode())
    await asyncio.sleep(0.5)  # the handler waits on the body
    s.close()
    url = f"http://{daemon.endpoints.ui}/login"
    for _ in range(20):  # the daemon sees the close in its own time
        with await asyncio.to_thread(urllib.request.urlopen, url, timeout=60) as page:
            assert page.status == 200
        await asyncio.sleep(0.1)
    failed = [r for r in caplog.records if r.name == "ctxcc.web" and r.levelno >= logging.ERROR]
    assert not failed, [r.getMessage() for r in failed]
