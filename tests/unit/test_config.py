"""Configuration precedence (flags > env > file > defaults) and clear errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from server.cli import build_parser
from server.config import SETTINGS, ConfigError, resolve


def test_defaults_are_the_embedded_ones() -> None:
    cfg = resolve({}, env={})
    assert cfg.data_dir == Path("data")
    assert cfg.db_path == Path("data/db")
    assert cfg.socket_path == Path("data/ctxcc.sock")
    assert cfg.socket_mode == 0o660
    assert cfg.listen == "127.0.0.1:50551"
    assert cfg.metrics_listen == "127.0.0.1:9464"
    assert cfg.durability == "sync"


def test_flags_beat_env_beat_file(tmp_path: Path) -> None:
    f = tmp_path / "ctxcc.toml"
    f.write_text('listen = "127.0.0.1:1"\nmetrics_listen = "127.0.0.1:2"\ndata_dir = "/f"\n')
    env = {"CTXCC_CONFIG": str(f), "CTXCC_METRICS_LISTEN": "127.0.0.1:3", "CTXCC_DATA_DIR": "/e"}
    cfg = resolve({"data_dir": "/flag"}, env=env)
    assert cfg.data_dir == Path("/flag")
    assert cfg.metrics_listen == "127.0.0.1:3"
    assert cfg.listen == "127.0.0.1:1"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"listen": "nonsense"}, "listen must be host:port"),
        ({"durability": "maybe"}, "durability must be"),
        ({"workers": "0"}, "workers must be at least 1"),
        ({"socket": "none", "listen": "none"}, "unreachable"),
        ({"socket": "/tmp/" + "x" * 120}, "107 bytes"),
        ({"preload_tokenizers": "o200k,gpt2"}, "preload_tokenizers takes o200k, cl100k, claude"),
        ({"preload_tokenizers": "all,claude"}, "preload_tokenizers takes"),
        ({"grace_period": "-1"}, "grace_period must be a number of seconds, 0 or more"),
        ({"grace_period": "nan"}, "grace_period must be a number of seconds, 0 or more"),
        ({"grace_period": "inf"}, "grace_period must be a number of seconds, 0 or more"),
        ({"grace_period": "soon"}, "grace_period must be a number of seconds, 0 or more"),
        ({"socket_mode": "999"}, "socket_mode must be an octal mode such as 0660"),
        # Beyond the permission bits: chmod masked 10660 to 0660, set setuid/sticky bits
        # on the socket for 7777, and a number past a C int crashed the start.
        ({"socket_mode": "10660"}, "socket_mode must be permission bits from 0000 to 0777"),
        ({"socket_mode": "7777"}, "socket_mode must be permission bits from 0000 to 0777"),
        ({"socket_mode": "7" * 21}, "socket_mode must be permission bits from 0000 to 0777"),
        # gRPC takes it as a C int: beyond, the start crashed with an OverflowError.
        ({"max_message_bytes": str(1 << 31)}, "max_message_bytes must be at most 2147483647"),
    ],
)
def test_bad_settings_are_named(flags: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve(flags, env={})


@pytest.mark.parametrize(
    ("value", "tables"),
    [
        ("none", ()),
        ("", ()),
        ("all", ("o200k", "cl100k", "claude")),
        (" claude , o200k,claude", ("claude", "o200k")),
    ],
)
def test_preload_tokenizers(value: str, tables: tuple[str, ...]) -> None:
    assert resolve({}, env={}).preload_tokenizers == ("claude",)
    assert resolve({}, env={"CTXCC_PRELOAD_TOKENIZERS": value}).preload_tokenizers == tables


def test_unknown_file_keys_are_refused(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text("lsten = 'x'\n")
    with pytest.raises(ConfigError, match="unknown setting"):
        resolve({"config": str(f)}, env={})


def test_help_names_every_flag_and_env_var() -> None:
    parser = build_parser()
    sub: Any = next(a for a in parser._actions if a.dest == "command")
    text = sub.choices["serve"].format_help()
    for s in SETTINGS:
        assert "--" + s.name.replace("_", "-") in text
        assert "CTXCC_" + s.name.upper() in text
    assert "--config" in text and "CTXCC_CONFIG" in text


def test_file_arrays_booleans_and_numbers_read_as_their_flags_would(tmp_path: Path) -> None:
    """An array in the TOML file was turned into its Python repr: the roots were
    `['/w/a'` and `'/w/b']`, so every project was refused, with no word at start-up."""
    f = tmp_path / "c.toml"
    f.write_text(
        'workspace_roots = ["/w/a", "/w/b"]\ninstruction_files = ["AGENTS.md"]\n'
        'preload_tokenizers = ["claude", "o200k"]\ndebug_echo = true\n'
        "grace_period = 2.5\nworkers = 3\n"
    )
    cfg = resolve({"config": str(f)}, env={})
    assert cfg.workspace_roots == (Path("/w/a"), Path("/w/b"))
    assert cfg.instruction_files == ("AGENTS.md",)
    assert cfg.preload_tokenizers == ("claude", "o200k")
    assert cfg.debug_echo is True
    assert (cfg.grace_period, cfg.workers) == (2.5, 3)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        # TOML's octal integer: read as the digits "432" it was the mode 0432, writable
        # by every user.
        ("socket_mode = 0o660", 'socket_mode must be a quoted octal mode such as "0660"'),
        ("socket_mode = 660", 'socket_mode must be a quoted octal mode such as "0660"'),
        ('listen = ["127.0.0.1:1"]', "listen must be a single value"),
        ('workspace_roots = ["/a,/b"]', "workspace_roots must be an array of strings without"),
        ("workspace_roots = [1]", "workspace_roots must be an array of strings without"),
        ("data_dir = { path = '/x' }", "data_dir must be a single value"),
    ],
)
def test_file_values_of_the_wrong_shape_are_named(tmp_path: Path, line: str, message: str) -> None:
    f = tmp_path / "c.toml"
    f.write_text(line + "\n")
    with pytest.raises(ConfigError, match=message):
        resolve({"config": str(f)}, env={})
