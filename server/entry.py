"""The `ctxcc` command's entry point: what must happen before gRPC is imported.

gRPC's C core writes its own lines to stderr (one per failed TLS handshake, which any
peer that reaches a TLS port can trigger at will; its view of a failed bind), in its own
text format, and reads how much to write (GRPC_VERBOSITY) once, when it is imported. So
the level is set here, before anything imports grpc: none at all when the daemon's log is
JSON (every line must parse: the daemon reports what matters in its own records), errors
only otherwise. An operator's own GRPC_VERBOSITY is kept."""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping, Sequence


def log_format_asked(argv: Sequence[str], env: MutableMapping[str, str]) -> str:
    """The log format the command line or the environment asks for ("" when neither):
    a flag wins over CTXCC_LOG_FORMAT, as in the settings. A --config file's is read
    later, with the rest of the settings."""
    for i, arg in enumerate(argv):
        if arg.startswith("--log-format="):
            return arg.split("=", 1)[1]
        if arg == "--log-format" and i + 1 < len(argv):
            return argv[i + 1]
    return env.get("CTXCC_LOG_FORMAT", "")


def quiet_grpc(argv: Sequence[str], env: MutableMapping[str, str]) -> None:
    if "GRPC_VERBOSITY" not in env:
        env["GRPC_VERBOSITY"] = "NONE" if log_format_asked(argv, env) == "json" else "ERROR"


def main() -> int:
    quiet_grpc(sys.argv[1:], os.environ)
    from server.cli import main as cli_main  # imports grpc: after the level is set

    return cli_main()
