"""`ctxcc health`: asks a daemon's grpc.health.v1 whether it is SERVING — for container
HEALTHCHECKs, scripts and people. With no `--target` it finds the daemon the way
`ctxcc serve` would listen with the same flags, environment and config file: it tries
the Unix socket, then the health port, then the API port, and the first that answers
decides.

Exit codes: 0 serving; 1 not serving, unknown service or unreachable; 2 bad arguments or
configuration. Docker reads 0 as healthy and 1 as unhealthy (it reserves 2).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from server.config import ConfigError, resolve

EXIT_SERVING = 0
EXIT_UNHEALTHY = 1
EXIT_USAGE = 2


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "health",
        help="check that a daemon is serving (exit 0) or not (exit 1)",
        description=(
            "Ask a ctxcc daemon's grpc.health.v1 service whether it is SERVING. Without "
            "--target, the daemon is found from the same CTXCC_* environment and --config file as "
            "`ctxcc serve`: it tries the Unix socket, then the health port, then the API port; "
            "the first that answers decides. "
            "Exit 0 serving, 1 not serving or unreachable, 2 bad arguments."
        ),
    )
    p.add_argument("--target", default="", help="gRPC target, e.g. unix:/run/ctxcc/ctxcc.sock")
    p.add_argument("--config", default=None, help="TOML config the daemon runs with")
    p.add_argument("--service", default="", help="service name (default: the whole server)")
    p.add_argument(
        "--timeout",
        type=_seconds,
        default=3.0,
        help="seconds to wait for an answer (> 0, at most a day)",
    )


# gRPC turns a deadline past ~7e9 s from now into one already passed (its clock
# overflows), so a huge --timeout failed every check as unreachable at once, as 0 did.
MAX_TIMEOUT_S = 86_400.0


def _seconds(text: str) -> float:
    """A deadline of 0 or less would fail every check as unreachable: a usage error."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text} is not a positive number of seconds")
    if value > MAX_TIMEOUT_S:
        raise argparse.ArgumentTypeError(f"{text} is more than {MAX_TIMEOUT_S:.0f} seconds")
    return value


def _loopback(hostport: str) -> str:
    host, _, port = hostport.rpartition(":")
    # A daemon bound to every interface answers on loopback.
    wildcard = {"0.0.0.0", "::", "[::]"}  # noqa: S104
    return f"127.0.0.1:{port}" if host in wildcard else hostport


def default_targets(config: str | None) -> list[str]:
    """Where `ctxcc serve` would listen with the same settings, in the order to try."""
    cfg = resolve({"config": config})
    targets = []
    if cfg.socket_path is not None:
        targets.append(f"unix:{cfg.socket_path}")
    if cfg.health_listen != "none":
        targets.append(_loopback(cfg.health_listen))
    if cfg.listen != "none":
        targets.append(_loopback(cfg.listen))
    return targets


def _ask(target: str, service: str, timeout: float) -> tuple[int, str, bool]:
    """(exit code, one line saying why, whether a daemon answered at all)."""
    with grpc.insecure_channel(target) as channel:
        stub: Any = health_pb2_grpc.HealthStub(channel)
        try:
            answer = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        except grpc.RpcError as err:
            code = err.code() if isinstance(err, grpc.Call) else grpc.StatusCode.UNKNOWN
            if code == grpc.StatusCode.NOT_FOUND:
                return EXIT_UNHEALTHY, f"unknown service {service!r} at {target}", True
            details = err.details() if isinstance(err, grpc.Call) else str(err)
            return EXIT_UNHEALTHY, f"unreachable: {code.name}: {details} ({target})", False
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)
    ok = answer.status == health_pb2.HealthCheckResponse.SERVING
    return (EXIT_SERVING if ok else EXIT_UNHEALTHY), f"{status} ({target})", True


def _find(targets: list[str], service: str, timeout: float) -> tuple[int, str]:
    """The first target where a daemon answers decides (NOT_SERVING included); one that
    cannot be reached — a relative socket path seen from another directory, a port that
    is off — passes to the next. All of them share the one `--timeout`."""
    deadline = time.monotonic() + timeout
    misses = []
    for target in targets:
        left = max(deadline - time.monotonic(), 0.05)
        code, line, answered = _ask(target, service, left)
        if answered:
            return code, line
        misses.append(line)
    return EXIT_UNHEALTHY, "; ".join(misses) or "no socket or port configured"


def main(args: argparse.Namespace) -> int:
    try:
        targets = [args.target] if args.target else default_targets(args.config)
    except ConfigError as exc:
        print(f"ctxcc health: {exc}", file=sys.stderr)
        return EXIT_USAGE
    code, line = _find(targets, args.service, args.timeout)
    if code == EXIT_SERVING:
        print(line)
    else:
        print(f"ctxcc health: {line}", file=sys.stderr)
    return code
