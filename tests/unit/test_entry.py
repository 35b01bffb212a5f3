"""The entry point's gRPC log level, set before gRPC is imported (server/entry.py)."""

from __future__ import annotations

import pytest

from server.entry import quiet_grpc


@pytest.mark.parametrize(
    ("argv", "env", "level"),
    [
        (["serve"], {}, "ERROR"),
        (["serve", "--log-format", "json"], {}, "NONE"),
        (["serve", "--log-format=json"], {}, "NONE"),
        (["serve"], {"CTXCC_LOG_FORMAT": "json"}, "NONE"),
        # A flag wins over the environment, as in the settings.
        (["serve", "--log-format", "text"], {"CTXCC_LOG_FORMAT": "json"}, "ERROR"),
        # The operator's own level is kept.
        (["serve", "--log-format", "json"], {"GRPC_VERBOSITY": "DEBUG"}, "DEBUG"),
        (["serve", "--log-format"], {}, "ERROR"),  # argparse refuses it later
    ],
)
def test_the_level_follows_the_log_format_asked(
    argv: list[str], env: dict[str, str], level: str
) -> None:
    quiet_grpc(argv, env)
    assert env["GRPC_VERBOSITY"] == level
