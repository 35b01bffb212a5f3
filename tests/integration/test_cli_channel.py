"""Where the operator commands' channel (`ctxcc sessions`, `inspect`, `replay --target`)
sends the daemon's bearer token: only to TCP on loopback, the one place the daemon
checks it that a plaintext channel may reach."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ctxcc.v1 import session_service_pb2 as spb
from ctxcc.v1 import session_service_pb2_grpc as spb_grpc
from server import cli_channel
from server.app import Daemon
from server.transport.interceptor import BoundaryInterceptor
from tests.conftest import make_config

TOKEN = "s3cret-token-of-twenty-chars"


@pytest.fixture
async def guarded(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[Daemon, list[str]]]:
    """A daemon with an auth token whose interceptor notes each call's authorization."""
    token = short_tmp / "token"
    token.write_text(TOKEN + "\n")
    sent: list[str] = []
    denied = BoundaryInterceptor._denied

    def noting(self: BoundaryInterceptor, context: Any, service: str) -> Any:
        sent.append(dict(context.invocation_metadata() or ()).get("authorization", ""))
        return denied(self, context, service)

    monkeypatch.setattr(BoundaryInterceptor, "_denied", noting)
    d = Daemon(make_config(short_tmp, auth_token_file=str(token)))
    await d.start()
    try:
        yield d, sent
    finally:
        await d.stop()


async def _authorization_sent(sent: list[str], target: str, token_file: str) -> str:
    sent.clear()
    async with cli_channel.channel(target, token_file) as ch:
        await spb_grpc.SessionServiceStub(ch).ListSessions(spb.ListSessionsRequest())
    assert len(sent) == 1
    return sent[0]


async def test_the_token_goes_to_loopback_tcp_and_not_over_the_unix_socket(
    guarded: tuple[Daemon, list[str]], short_tmp: Path
) -> None:
    """The daemon never checks a token on its Unix socket (its mode and group guard it):
    the commands sent it there all the same, to whatever answers on that path."""
    d, sent = guarded
    token_file = str(short_tmp / "token")
    tcp = str(d.endpoints.tcp)
    assert tcp.startswith("127.0.0.1:")
    assert await _authorization_sent(sent, tcp, token_file) == f"Bearer {TOKEN}"
    unix = f"unix:{d.endpoints.unix}"
    assert await _authorization_sent(sent, unix, token_file) == ""
    # Not even read there: a token file the operator cannot read fails nothing.
    assert await _authorization_sent(sent, unix, str(short_tmp / "absent")) == ""


@pytest.mark.parametrize(
    "target",
    ["10.1.2.3:50551", "ctxcc.example.com:50551", "dns:///ctxcc.example.com:50551", "[fd00::1]:1"],
)
def test_the_token_is_never_sent_in_clear_beyond_loopback(short_tmp: Path, target: str) -> None:
    """The channel is plaintext: a token sent to a TCP address beyond loopback crosses the
    network in clear. It is a usage error (exit 2) before anything is sent."""
    token = short_tmp / "token"
    token.write_text(TOKEN)
    with pytest.raises(cli_channel.TokenError) as refused:
        cli_channel.bearer_for(target, str(token))
    assert "in clear" in str(refused.value) and TOKEN not in str(refused.value)
    assert cli_channel.bearer_for(target, "") == ()  # no token, nothing to keep in


@pytest.mark.parametrize(
    "target",
    ["127.0.0.1:1", "localhost:1", "[::1]:1", "ipv4:127.0.0.2:1", "dns:///localhost:1"],
)
def test_loopback_targets_get_the_token(short_tmp: Path, target: str) -> None:
    token = short_tmp / "token"
    token.write_text(TOKEN)
    assert cli_channel.bearer_for(target, str(token)) == (("authorization", f"Bearer {TOKEN}"),)


@pytest.mark.parametrize("target", ["unix:/tmp/ctxcc.sock", "unix:///tmp/x.sock"])
def test_unix_targets_need_none(short_tmp: Path, target: str) -> None:
    assert cli_channel.bearer_for(target, str(short_tmp / "absent")) == ()
