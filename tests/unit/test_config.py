"""Configuration precedence (flags > env > file > defaults) and clear errors."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from server.cli import STOP_SIGNALS, build_parser
from server.config import SETTINGS, ConfigError, resolve, unused_settings


def test_defaults_are_the_embedded_ones() -> None:
    cfg = resolve({}, env={})
    assert cfg.data_dir == Path("data")
    assert cfg.db_path == Path("data/db")
    assert cfg.socket_path == Path("data/ctxcc.sock")
    assert cfg.socket_mode == 0o660
    assert cfg.listen == "127.0.0.1:50551"
    assert cfg.metrics_listen == "127.0.0.1:9464"
    assert cfg.durability == "sync"
    # The environment section's time changes hourly: the whole history follows it.
    assert cfg.time_granularity == 3600


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
        ({"session_retention": "7 days"}, "session_retention must be a whole number of"),
        ({"session_retention": "-1d"}, "session_retention must be a whole number of"),
        ({"session_retention": "1.5h"}, "session_retention must be a whole number of"),
        ({"session_retention": "d"}, "session_retention must be a whole number of"),
        # str.isdigit() took these: int() then raised ValueError (a traceback, exit 1),
        # or read the Arabic-Indic digit as 3 seconds.
        ({"session_retention": "\u00b2"}, "session_retention must be a whole number of"),
        ({"session_retention": "\u0663d"}, "session_retention must be a whole number of"),
        ({"session_retention": "9" * 5000}, "session_retention must be a whole number of"),
        ({"session_retention": "36501d"}, "session_retention must be at most 36500d"),
        ({"session_retention": "9" * 20}, "session_retention must be at most 36500d"),
        ({"listen": "127.0.0.1:\u00b2"}, "listen must be host:port or 'none'"),
        ({"socket_group": "9" * 5000}, "socket_group 9+ is not a gid"),
        ({"log_format": "logfmt"}, "log_format must be 'text' or 'json'"),
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


def test_grace_period_help_names_every_signal_that_drains() -> None:
    """`--grace-period`'s help named SIGTERM/SIGINT, while SIGHUP (a `make run` terminal
    closed) drains the daemon as well."""
    parser = build_parser()
    sub: Any = next(a for a in parser._actions if a.dest == "command")
    grace = next(a for a in sub.choices["serve"]._actions if a.dest == "grace_period")
    assert grace.help is not None
    assert [s.name for s in STOP_SIGNALS if s.name not in grace.help] == []


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


@pytest.mark.parametrize(
    ("line", "expected", "given"),
    [
        # A quoted number was read as the number: `max_tools = "10"` served 10 tools.
        ('max_tools = "10"', "a TOML integer", 'the string "10"'),
        ('grace_period = "2.5"', "a TOML number", 'the string "2.5"'),
        ('first_reserve_fraction = "0.5"', "a TOML number", 'the string "0.5"'),
        ('debug_echo = "true"', "a TOML boolean", 'the string "true"'),
        ("debug_echo = 1", "a TOML boolean", "the integer 1"),
        ("workers = 3.0", "a TOML integer", "the float 3.0"),
        ("max_tools = true", "a TOML integer", "the boolean true"),
        ("grace_period = false", "a TOML number", "the boolean false"),
        ("socket_group = true", "a TOML string", "the boolean true"),
        ("listen = 50551", "a TOML string", "the integer 50551"),
        ("workspace_roots = 5", "a TOML string or an array of strings", "the integer 5"),
        ("data_dir = 2024-01-01", "a TOML string", "the date/time 2024-01-01"),
    ],
)
def test_file_values_of_the_wrong_type_name_file_key_type_and_value(
    tmp_path: Path, line: str, expected: str, given: str
) -> None:
    f = tmp_path / "c.toml"
    f.write_text(line + "\n")
    key = line.split(" =", maxsplit=1)[0]
    with pytest.raises(ConfigError) as err:
        resolve({"config": str(f)}, env={})
    assert str(err.value).startswith(f"config file {f}: {key} must be {expected}"), err.value
    assert str(err.value).endswith(f", got {given}"), err.value


def test_a_socket_group_may_be_a_gid_number_or_a_name(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text("socket_group = 1000\n")
    assert resolve({"config": str(f)}, env={}).socket_group == "1000"
    f.write_text('socket_group = "ctxcc"\n')
    assert resolve({"config": str(f)}, env={}).socket_group == "ctxcc"


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("0", 0), ("3600", 3600), ("90s", 90), ("30m", 1800), ("36h", 129600), ("7D", 604800)],
)
def test_session_retention_is_a_duration(tmp_path: Path, value: str, seconds: int) -> None:
    assert resolve({}, env={}).session_retention_s == 0  # off unless asked for
    assert resolve({"session_retention": value}, env={}).session_retention_s == seconds
    f = tmp_path / "c.toml"
    f.write_text(f'session_retention = "{value}"\n')
    assert resolve({"config": str(f)}, env={}).session_retention_s == seconds
    f.write_text("session_retention = 604800\n")  # a TOML integer is seconds
    assert resolve({"config": str(f)}, env={}).session_retention_s == 604800


def _reads_as_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


# Every setting whose default is a number or a boolean, found from the defaults so that a
# numeric setting added later is covered too; socket_mode is a quoted octal string, and
# session_retention a number of seconds or a quoted duration ("7d").
TEXT_OR_NUMBER = {"socket_mode", "session_retention"}
TYPED = [
    s
    for s in SETTINGS
    if s.name not in TEXT_OR_NUMBER
    and (_reads_as_number(s.default) or s.default in {"true", "false"})
]


@pytest.mark.parametrize("setting", TYPED, ids=[s.name for s in TYPED])
def test_numbers_and_booleans_in_the_file_must_not_be_quoted(tmp_path: Path, setting: Any) -> None:
    f = tmp_path / "c.toml"
    f.write_text(f"{setting.name} = {setting.default}\n")  # the default, as TOML's own type
    typed = resolve({"config": str(f)}, env={})
    assert typed == resolve({}, env={})
    f.write_text(f'{setting.name} = "{setting.default}"\n')
    with pytest.raises(ConfigError, match=f'{setting.name} must be a TOML .*, got the string "'):
        resolve({"config": str(f)}, env={})
    # Flags and environment variables are text by nature: the same text still reads.
    assert resolve({setting.name: setting.default}, env={}) == typed
    assert resolve({}, env={"CTXCC_" + setting.name.upper(): setting.default}) == typed


REPO = Path(__file__).resolve().parents[2]
EXAMPLE_CONFIGS = sorted(
    p
    for p in REPO.glob("**/*.toml")
    if p.name != "pyproject.toml" and not ({".venv", "node_modules", ".tools"} & set(p.parts))
)


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value) if isinstance(value, int | float) else json.dumps(value)


def test_the_shipped_example_configs_load_with_their_numbers_checked(tmp_path: Path) -> None:
    """Each TOML config in the repository (the Kubernetes ConfigMap's ctxcc.toml) loads
    under the typed check, reads as the same settings given as flags, and its numbers are
    ones the check sees: quoted, each is refused."""
    assert EXAMPLE_CONFIGS, "no example config found"
    for path in EXAMPLE_CONFIGS:
        data = tomllib.loads(path.read_text())
        as_flags = {
            k: ",".join(v) if isinstance(v, list) else v if isinstance(v, str) else _toml(v)
            for k, v in data.items()
        }
        assert resolve({"config": str(path)}, env={}) == resolve(as_flags, env={})
        typed = [k for k, v in data.items() if not isinstance(v, str | list)]
        assert typed, f"{path}: no number or boolean to check"
        for key in typed:
            quoted = tmp_path / "quoted.toml"
            quoted.write_text(
                "".join(
                    f"{k} = {json.dumps(_toml(v)) if k == key else _toml(v)}\n"
                    for k, v in data.items()
                )
            )
            with pytest.raises(ConfigError, match=f"config file {quoted}: {key} must be"):
                resolve({"config": str(quoted)}, env={})


def test_tls_files_with_no_tcp_listener_are_warned_unused() -> None:
    """TLS serves only `listen`: with it 'none' the files were never read, not even a
    missing one reported, and the operator believed some port was encrypted."""
    tls = {"tls_cert_file": "/nowhere/cert.pem", "tls_key_file": "/nowhere/key.pem"}
    (warning,) = unused_settings(resolve({"listen": "none", **tls}, env={}))
    assert warning.startswith("tls_cert_file, tls_key_file are set but listen is 'none'")
    assert "unused" in warning
    with_ca = {**tls, "tls_client_ca_file": "/nowhere/ca.pem"}
    (warning,) = unused_settings(resolve({"listen": "none", **with_ca}, env={}))
    assert warning.startswith("tls_cert_file, tls_key_file, tls_client_ca_file are set")
    # With a TCP listener they are used (and checked when it binds); without TLS, nothing.
    assert unused_settings(resolve({"listen": "127.0.0.1:0", **with_ca}, env={})) == []
    assert unused_settings(resolve({"listen": "none"}, env={})) == []


@pytest.mark.parametrize("gid", ["4294967295", "99999999999999999999"])
def test_a_socket_group_past_the_largest_gid_is_refused_before_anything_binds(
    gid: str,
) -> None:
    """A gid past 32 bits made the socket's chown raise OverflowError after the server
    had started (a traceback, a stale socket); 4294967295 is (gid_t)-1, which chown
    takes for "leave the group" (accepted, and nothing changed)."""
    with pytest.raises(ConfigError) as err:
        resolve({"socket_group": gid}, env={})
    assert str(err.value) == f"socket_group {gid} is not a gid (0 to 4294967294)"
    assert resolve({"socket_group": "4294967294"}, env={}).socket_group == "4294967294"


def test_a_config_file_that_is_not_utf8_is_a_config_error(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_bytes(b'data_dir = "d\xff"\n')
    with pytest.raises(ConfigError) as err:
        resolve({"config": str(f)}, env={})
    assert str(err.value) == f"config file {f} is not valid TOML: not UTF-8 at byte 13"
