"""The channel the operator commands (`ctxcc inspect`, `sessions`, `replay --target`)
open to a running daemon.

A daemon with `auth_token_file` refuses TCP peers that do not send its bearer token, so
these commands send it when given one. They take it from the same `CTXCC_AUTH_TOKEN_FILE`
the daemon reads: inside the daemon's container (`kubectl exec`) they just work. Unix-
socket peers are trusted (the daemon never checks a token there): over a `unix:` target
the token is neither read nor sent. The channel is plaintext: against a TLS listener,
use the Unix socket; and the token goes only to a loopback address, never in clear over
a network (a target beyond loopback with a token is a usage error).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from typing import Any

import grpc

from server.config_values import is_loopback

TOKEN_ENV = "CTXCC_AUTH_TOKEN_FILE"  # noqa: S105 - the name of a variable, not a token


class TokenError(Exception):
    """The token file named cannot be read (a usage error: exit 2)."""


def add_token_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--auth-token-file",
        default=os.environ.get(TOKEN_ENV, ""),
        help=(
            "file holding the daemon's bearer token, sent over TCP to loopback only (env "
            f"{TOKEN_ENV}, as the daemon's; neither read nor sent over the Unix socket)"
        ),
    )


def bearer(token_file: str) -> tuple[tuple[str, str], ...]:
    """The metadata that authenticates these commands' calls (none without a file)."""
    if not token_file:
        return ()
    try:
        token = open(token_file, encoding="utf-8").read().strip()  # noqa: SIM115 - read at once
    except (OSError, UnicodeDecodeError) as exc:
        raise TokenError(f"cannot read --auth-token-file {token_file}: {exc}") from None
    if not token:
        raise TokenError(f"--auth-token-file {token_file} is empty")
    # A header value is printable ASCII: gRPC refuses anything else only once a call is
    # made, with a traceback (a line break inside, a non-ASCII letter).
    if not all(" " <= c <= "~" for c in token):
        raise TokenError(
            f"--auth-token-file {token_file} holds characters other than printable ASCII, "
            "which no bearer token header can carry"
        )
    return (("authorization", f"Bearer {token}"),)


def bearer_for(target: str, token_file: str) -> tuple[tuple[str, str], ...]:
    """The metadata for calls to `target`: the token only where the daemon checks it
    (TCP), and only where a plaintext channel keeps it off the network (loopback)."""
    if not token_file or target.startswith(("unix:", "unix-abstract:")):
        return ()
    if not all(is_loopback(host.lower()) for host in _hosts(target)):
        raise TokenError(
            f"will not send the token of --auth-token-file {token_file} in clear to "
            f"{target}, which is not a loopback address: use the daemon's Unix socket "
            "(--target unix:PATH), or reach its port on loopback (kubectl port-forward)"
        )
    return bearer(token_file)


def _hosts(target: str) -> list[str]:
    """The hosts a gRPC target names: host:port, [v6]:port, dns:[//authority/]host:port,
    ipv4:/ipv6: address lists."""
    scheme, colon, rest = target.partition(":")
    if colon and scheme in ("ipv4", "ipv6"):
        addresses = rest.split(",")
    elif colon and scheme == "dns":
        addresses = [rest.split("/", 3)[-1] if rest.startswith("//") else rest]
    else:
        addresses = [target]
    hosts = []
    for address in addresses:
        if address.startswith("["):
            hosts.append(address[1:].partition("]")[0])
        elif address.count(":") > 1:
            hosts.append(address)  # an IPv6 address without a port
        else:
            hosts.append(address.partition(":")[0])
    return hosts


def channel(
    target: str, token_file: str, options: Sequence[tuple[str, Any]] = ()
) -> grpc.aio.Channel:
    metadata = bearer_for(target, token_file)
    interceptors = [_Sending(metadata)] if metadata else None
    # A recorded view is as large as the daemon's max_message_bytes lets it be (64 MiB
    # by default, which these commands cannot know): gRPC's 4 MiB default refused a
    # session's view of 6 MB. The daemon bounds what it sends.
    everything = [("grpc.max_receive_message_length", -1), *options]
    return grpc.aio.insecure_channel(target, options=everything, interceptors=interceptors)


class _Sending(
    grpc.aio.UnaryUnaryClientInterceptor,
    grpc.aio.UnaryStreamClientInterceptor,
    grpc.aio.StreamUnaryClientInterceptor,
    grpc.aio.StreamStreamClientInterceptor,
):
    """Adds `metadata` to every call of the channel."""

    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self._metadata = metadata

    def _details(self, details: Any) -> Any:
        sent = grpc.aio.Metadata(*(details.metadata or ()), *self._metadata)
        return details._replace(metadata=sent)

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)

    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)

    async def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(self._details(details), requests)

    async def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(self._details(details), requests)
