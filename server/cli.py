"""`ctxcc` command line: `serve` runs the daemon; more subcommands join as they land."""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import json
import logging
import os
import signal
import sys
from collections.abc import Sequence

from server import __version__, health_cli, inspect_cli, log_format, replay
from server.adapters.gc_pauses import COLLECTIONS
from server.config import ConfigError, add_flags, resolve, unknown_env, unused_settings

log = logging.getLogger("ctxcc")

EXIT_CONFIG = 2
EXIT_LOCKED = 3
EXIT_STORE = 1  # RocksDB refused to open the store: not a setting, and not in use
EXIT_PIPE = 141  # what a shell reports for a filter ended by SIGPIPE (128 + 13)
# Each starts the drain (`--grace-period`); `ctxcc serve --help` names them.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ctxcc", description="ctxcc: context compiler sidecar")
    parser.add_argument("--version", action="version", version=f"ctxcc {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser(
        "serve",
        help="run the daemon",
        description=(
            "Run the ctxcc daemon. Settings come from flags, then CTXCC_* environment "
            "variables, then the TOML file given by --config, then defaults."
        ),
    )
    add_flags(serve)
    replay.add_parser(sub)
    inspect_cli.add_parsers(sub)
    health_cli.add_parser(sub)
    return parser


SWITCH_INTERVAL_S = 0.001


async def _serve(flags: dict[str, object]) -> int:
    from server.app import Daemon  # the composition root loads heavy modules; import late
    from storage import StoreLockedError, StoreOpenError

    cfg = resolve(flags)
    # Everything the daemon writes (RocksDB's files, its lock) is private to its user.
    os.umask(0o077)
    # A thread waiting for the GIL asks its holder to let go after this long (5 ms by
    # default). An RPC takes the GIL a dozen times on the event loop, so while a compile
    # runs, 5 ms per take made health checks and appends of other sessions wait 50-100 ms;
    # at 1 ms they wait 10-20 ms (hostile corpus, 34 MB history case).
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    COLLECTIONS.install()
    # A native crash (RocksDB, grpc core) prints every thread's Python stack to the
    # log instead of vanishing with a bare exit status.
    faulthandler.enable(all_threads=True)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(log_format.formatter(cfg.log_format))
    logging.basicConfig(level=cfg.log_level.upper(), handlers=[handler])
    log_format.filter_grpc_records()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    # SIGHUP too: the terminal of a `make run` closed, or a supervisor that hangs up; its
    # default action would end the daemon without draining and leave its socket file.
    # Taken before the start: a signal while the store opens (a long WAL replay, the
    # over-budget sessions read back) ended the process undrained (SIGTERM, SIGHUP) or
    # with a KeyboardInterrupt traceback (SIGINT); it now stops the daemon once started.
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop.set)
    for warning in [*unknown_env(os.environ), *unused_settings(cfg)]:
        log.warning("%s", warning)
    daemon = Daemon(cfg)
    try:
        endpoints = await daemon.start()
    except StoreLockedError as exc:
        log.error("%s", exc)
        return EXIT_LOCKED
    except StoreOpenError as exc:
        log.error("%s", exc)
        await daemon.stop()
        return EXIT_STORE
    except ConfigError as exc:
        log.error("%s", exc)
        await daemon.stop()
        return EXIT_CONFIG
    ready = {
        "tcp": endpoints.tcp,
        "unix": endpoints.unix,
        "metrics": endpoints.metrics,
        "health": endpoints.health,
        "ui": endpoints.ui,
    }
    # What starting made lives as long as the process: out of every full collection's
    # walk from now on (server/adapters/gc_pauses.py).
    COLLECTIONS.freeze_startup()
    # The endpoints as a field of their own too: a log pipeline reading JSON lines gets
    # them as an object, not as text inside the message.
    log.info("serving %s", json.dumps(ready), extra={"endpoints": ready})
    await stop.wait()
    log.info(
        "shutting down: draining in-flight calls for up to %ss (a second signal cuts it short)",
        cfg.grace_period,
    )
    hurried: list[int] = []

    def hurry(sig: signal.Signals) -> None:
        # An operator's second Ctrl-C (or a supervisor's second TERM) will not wait out
        # a long grace period: the calls still running are cut as at its end, and the
        # store still closes (what was acknowledged is on disk either way).
        if not hurried:
            log.warning("%s again: not waiting for the calls still in flight", sig.name)
        hurried.append(sig)
        daemon.hurry()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, hurry, sig)
    await daemon.stop()
    log.info("stopped (calls in flight cut short)" if hurried else "stopped cleanly")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _dispatch(build_parser().parse_args(argv))
    except BrokenPipeError:
        # The reader left (`ctxcc sessions | head`): stop quietly, like any Unix filter.
        # stdout is pointed at /dev/null so the interpreter's final flush cannot fail too.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_PIPE


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "health":
        return health_cli.main(args)
    if args.command in ("inspect", "sessions"):
        return inspect_cli.main(args)
    if args.command == "replay":
        logging.basicConfig(level="WARNING", stream=sys.stderr)
        return replay.main(args)
    if args.command == "serve":
        flags = {k: v for k, v in vars(args).items() if k != "command"}
        try:
            return asyncio.run(_serve(flags))
        except ConfigError as exc:
            _config_error(exc, flags)
            return EXIT_CONFIG
    return EXIT_CONFIG


def _config_error(exc: ConfigError, flags: dict[str, object]) -> None:
    """A setting refused before the log is set up: written as the log would write it
    (the settings that name the format may be the ones refused, so the flag or the
    environment is taken as asked), one line either way."""
    asked = flags.get("log_format") or os.environ.get("CTXCC_LOG_FORMAT", "")
    if asked == "json":
        record = logging.LogRecord(log.name, logging.ERROR, __file__, 0, "%s", (exc,), None)
        print(log_format.JsonFormatter().format(record), file=sys.stderr)
    else:
        print(f"ctxcc: {exc}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
