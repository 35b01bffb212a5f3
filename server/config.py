"""Daemon configuration: flags over CTXCC_* environment variables over a TOML file over
defaults. Every setting has one name used in all three places (flag `--data-dir`,
env `CTXCC_DATA_DIR`, TOML key `data_dir`)."""

from __future__ import annotations

import argparse
import difflib
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from server.compiler.budget import BudgetConfig
from server.config_settings import BY_NAME, SETTINGS, ConfigError, Setting, env_name
from server.config_values import (
    bool_setting,
    budget_config,
    csv_list,
    duration_s,
    file_names,
    hostport,
    int_setting,
    is_loopback,
    message_bytes,
    schema_depth,
    socket_mode,
    tokenizer_names,
)

# The settings table and its error are named here too: callers import the config's API
# from this one module.
__all__ = [
    "SETTINGS",
    "Config",
    "ConfigError",
    "Setting",
    "add_flags",
    "describe",
    "env_name",
    "resolve",
    "unknown_env",
    "unused_settings",
]

# CTXCC_* variables that are no daemon setting but are read by the clients: one
# environment (a shared ConfigMap, a shell) often serves both.
CLIENT_ENV = frozenset({"CTXCC_TARGET"})


def unknown_env(env: Mapping[str, str]) -> list[str]:
    """A warning for each CTXCC_* variable that names no setting: a mistyped one
    (CTXCC_DATADIR) was ignored in silence, the daemon running on the default instead."""
    settings = sorted({env_name(s.name) for s in SETTINGS} | {"CTXCC_CONFIG"})
    out = []
    for name in sorted(env):
        if not name.startswith("CTXCC_") or name in settings or name in CLIENT_ENV:
            continue
        close = difflib.get_close_matches(name, settings, n=1, cutoff=0.8)
        hint = f" (did you mean {close[0]}?)" if close else ""
        out.append(f"environment variable {name} is no ctxcc setting and is ignored{hint}")
    return out


TLS_SETTINGS = ("tls_cert_file", "tls_key_file", "tls_client_ca_file")


def unused_settings(cfg: Config) -> list[str]:
    """A warning for each group of settings given that nothing uses. TLS serves only the
    gRPC TCP listener (the Unix socket, health, /metrics and the inspector are plain), so
    with `listen = none` its files were never read: not even a missing one was reported,
    and an operator who set them believed something was encrypted."""
    out = []
    tls = [name for name in TLS_SETTINGS if getattr(cfg, name)]
    if tls and cfg.listen == "none":
        out.append(
            f"{', '.join(tls)} {'is' if len(tls) == 1 else 'are'} set but listen is 'none': "
            "TLS applies only to the gRPC TCP listener (not the Unix socket, health_listen, "
            "metrics_listen or ui_listen), so the file(s) are unused and not read"
        )
    return out


@dataclass(frozen=True, slots=True)
class Config:
    data_dir: Path
    socket: str
    socket_mode: int
    socket_group: str
    auth_token_file: str
    tls_cert_file: str
    tls_key_file: str
    tls_client_ca_file: str
    listen: str
    metrics_listen: str
    health_listen: str
    ui_listen: str
    durability: str
    grace_period: float
    workers: int
    compile_workers: int
    log_level: str
    log_format: str
    max_sessions: int
    session_retention_s: int
    max_session_bytes: int
    max_session_basis_bytes: int
    max_events_per_append: int
    max_event_bytes: int
    blob_threshold_bytes: int
    max_artifact_bytes: int
    max_message_bytes: int
    max_request_bytes_in_memory: int
    max_watch_bytes_in_memory: int
    max_calls_in_progress: int
    disk_reserve_bytes: int
    stream_chunk_bytes: int
    compile_memo_bytes: int
    compile_cpu_budget_ms: int
    kernel_file: str
    workspace_roots: tuple[Path, ...]
    global_dir: Path | None
    instruction_files: tuple[str, ...]
    time_granularity: int
    instruction_file_cap: int
    instructions_cap: int
    skills_cap: int
    rules_cap: int
    rule_index_cap: int
    memory_cap: int
    model_catalog: str
    debug_echo: bool
    budget: BudgetConfig
    max_tools: int = 512
    max_tool_description_chars: int = 65_536
    max_tool_schema_bytes: int = 256 << 10
    max_tool_schema_depth: int = 64
    preload_tokenizers: tuple[str, ...] = ("claude",)

    @property
    def db_path(self) -> Path:
        return self.data_dir / "db"

    @property
    def socket_path(self) -> Path | None:
        if self.socket == "none":
            return None
        return Path(self.socket) if self.socket else self.data_dir / "ctxcc.sock"


def add_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        default=None,
        help="TOML file with any of the settings below (env CTXCC_CONFIG)",
    )
    for s in SETTINGS:
        parser.add_argument(
            "--" + s.name.replace("_", "-"),
            dest=s.name,
            default=None,
            metavar=s.name.upper().split("_")[-1],
            help=f"{s.help} (env {env_name(s.name)}; default {s.default or 'empty'})",
        )


# Settings that take several values: comma-separated in a flag or the environment, and
# also a TOML array of strings in the file.
LIST_SETTINGS = frozenset({"workspace_roots", "instruction_files", "preload_tokenizers"})


# TOML's names for the types a value of the file can have, as an operator reads them.
TOML_TYPES: dict[type, str] = {
    bool: "boolean",  # before int: a bool is an int to isinstance
    int: "integer",
    float: "float",
    str: "string",
    list: "array",
    dict: "table",
}
EXPECTED = {
    "int": "a TOML integer (unquoted, e.g. 10)",
    "float": "a TOML number (unquoted, e.g. 2.5 or 10)",
    "bool": "a TOML boolean (true or false, unquoted)",
    "str": "a TOML string (quoted)",
}


def _given(value: object) -> str:
    """What the file gave, in TOML's words: `the string "10"`, `the integer 1000`."""
    kind = next((n for t, n in TOML_TYPES.items() if isinstance(value, t)), "date/time")
    if isinstance(value, str):
        shown = json.dumps(value)  # a TOML basic string, quotes and escapes as written
    elif isinstance(value, bool):
        shown = "true" if value else "false"
    else:
        shown = str(value)
    return f"the {kind} {shown}"


def _file_text(path: str, name: str, value: object) -> str:
    """A TOML value as the text a flag would carry, once it has the setting's TOML type.
    `str()` alone turned an array into its Python repr (`workspace_roots = ["/a", "/b"]`
    became the roots `['/a'` and `'/b']`, silently), `true` into `True`, and `socket_mode
    = 0o660` into "432", read as the octal mode 0432 (a socket others could write to); and
    took `max_tools = "10"` as 10, a quoted number that is a type mistake in TOML."""
    where = f"config file {path}: {name}"
    kind = BY_NAME[name].kind
    if name == "socket_mode" and isinstance(value, int) and not isinstance(value, bool):
        # TOML keeps no trace of whether 0o660 or 660 was meant
        raise ConfigError(f'{where} must be a quoted octal mode such as "0660", got {value}')
    if isinstance(value, list):
        if name not in LIST_SETTINGS:
            raise ConfigError(f"{where} must be a single value, got {value!r}")
        if all(isinstance(v, str) and "," not in v for v in value):
            return ",".join(value)
        raise ConfigError(f"{where} must be an array of strings without commas, got {value!r}")
    if isinstance(value, dict):
        raise ConfigError(f"{where} must be a single value, got {value!r}")
    if kind == "bool" and isinstance(value, bool):
        return "true" if value else "false"
    if kind == "int" and isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if kind == "float" and isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)  # an integer is a number of seconds too: grace_period = 20
    if kind == "str" and isinstance(value, str):
        return value
    if name == "socket_group" and isinstance(value, int) and not isinstance(value, bool):
        return str(value)  # a group name or a gid: `socket_group = 1000` is the gid
    if name == "session_retention" and isinstance(value, int) and not isinstance(value, bool):
        return str(value)  # "7d" or a number of seconds: `session_retention = 604800`
    expected = EXPECTED[kind]
    if name in LIST_SETTINGS:
        expected = "a TOML string or an array of strings"
    raise ConfigError(f"{where} must be {expected}, got {_given(value)}")


def _read_toml(path: str) -> dict[str, str]:
    import tomllib  # only with --config: not on every start-up

    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
    except UnicodeDecodeError as exc:  # TOML is UTF-8
        raise ConfigError(
            f"config file {path} is not valid TOML: not UTF-8 at byte {exc.start}"
        ) from exc
    unknown = sorted(set(data) - set(BY_NAME))
    if unknown:
        raise ConfigError(f"config file {path}: unknown setting(s) {', '.join(unknown)}")
    return {name: _file_text(path, name, value) for name, value in data.items()}


def resolve(flags: Mapping[str, Any], env: Mapping[str, str] | None = None) -> Config:
    """Merge flags, environment and file; validate; return a frozen Config."""
    env = os.environ if env is None else env
    config_path = flags.get("config") or env.get("CTXCC_CONFIG")
    file_values = _read_toml(config_path) if config_path else {}
    raw: dict[str, str] = {}
    for s in SETTINGS:
        value: Any = flags.get(s.name)
        if value is None:
            value = env.get(env_name(s.name))
        if value is None:
            value = file_values.get(s.name)
        raw[s.name] = s.default if value is None else str(value)
    return _build(raw)


# The largest gid: gid_t is 32 bits, and its all-ones value means "no group" to chown.
MAX_GID = 2**32 - 2


def _build(raw: Mapping[str, str]) -> Config:
    if raw["durability"] not in {"sync", "buffered"}:
        raise ConfigError(f"durability must be 'sync' or 'buffered', got {raw['durability']!r}")
    if raw["log_level"].lower() not in {"debug", "info", "warning", "error"}:
        raise ConfigError(
            f"log_level must be debug, info, warning or error, got {raw['log_level']!r}"
        )
    if raw["log_format"].lower() not in {"text", "json"}:
        raise ConfigError(f"log_format must be 'text' or 'json', got {raw['log_format']!r}")
    try:
        grace = float(raw["grace_period"])
    except ValueError:
        grace = math.nan
    if not 0 <= grace < math.inf:  # NaN fails both comparisons
        raise ConfigError(
            f"grace_period must be a number of seconds, 0 or more, got {raw['grace_period']!r}"
        )
    group = raw["socket_group"]
    # The length first: int() of over 4,300 digits raised its own ValueError (exit 1).
    if (
        group.isascii()
        and group.isdigit()
        and (len(group.lstrip("0")) > 10 or int(group) > MAX_GID)
    ):
        # Checked before anything binds: the socket's chown raised OverflowError after
        # the server had started (a traceback, a stale socket), and 4294967295 is
        # (gid_t)-1, which chown takes for "leave the group".
        raise ConfigError(f"socket_group {group} is not a gid (0 to {MAX_GID})")
    cfg = Config(
        data_dir=Path(raw["data_dir"]),
        socket=raw["socket"],
        socket_mode=socket_mode(raw),
        socket_group=raw["socket_group"],
        auth_token_file=raw["auth_token_file"],
        tls_cert_file=raw["tls_cert_file"],
        tls_key_file=raw["tls_key_file"],
        tls_client_ca_file=raw["tls_client_ca_file"],
        listen=hostport("listen", raw["listen"]),
        metrics_listen=hostport("metrics_listen", raw["metrics_listen"]),
        health_listen=hostport("health_listen", raw["health_listen"]),
        ui_listen=hostport("ui_listen", raw["ui_listen"]),
        durability=raw["durability"],
        grace_period=grace,
        workers=int_setting(raw, "workers", minimum=1),
        compile_workers=int_setting(raw, "compile_workers", minimum=1),
        log_level=raw["log_level"].lower(),
        log_format=raw["log_format"].lower(),
        max_sessions=int_setting(raw, "max_sessions", minimum=1),
        session_retention_s=duration_s(raw, "session_retention"),
        max_session_bytes=int_setting(raw, "max_session_bytes", minimum=1),
        max_session_basis_bytes=int_setting(raw, "max_session_basis_bytes", minimum=0),
        max_events_per_append=int_setting(raw, "max_events_per_append", minimum=1),
        max_event_bytes=int_setting(raw, "max_event_bytes", minimum=1024),
        blob_threshold_bytes=int_setting(raw, "blob_threshold_bytes", minimum=256),
        max_artifact_bytes=int_setting(raw, "max_artifact_bytes", minimum=1),
        max_message_bytes=message_bytes(raw),
        max_request_bytes_in_memory=int_setting(raw, "max_request_bytes_in_memory", minimum=0),
        max_watch_bytes_in_memory=int_setting(raw, "max_watch_bytes_in_memory", minimum=0),
        max_calls_in_progress=int_setting(raw, "max_calls_in_progress", minimum=0),
        disk_reserve_bytes=int_setting(raw, "disk_reserve_bytes"),
        stream_chunk_bytes=int_setting(raw, "stream_chunk_bytes", minimum=1024),
        compile_memo_bytes=int_setting(raw, "compile_memo_bytes", minimum=0),
        compile_cpu_budget_ms=int_setting(raw, "compile_cpu_budget_ms", minimum=0),
        kernel_file=raw["kernel_file"],
        workspace_roots=tuple(Path(p) for p in csv_list(raw["workspace_roots"])),
        global_dir=Path(raw["global_dir"]) if raw["global_dir"] else None,
        instruction_files=file_names(raw["instruction_files"]),
        time_granularity=int_setting(raw, "time_granularity", minimum=1),
        instruction_file_cap=int_setting(raw, "instruction_file_cap", minimum=100),
        instructions_cap=int_setting(raw, "instructions_cap", minimum=100),
        skills_cap=int_setting(raw, "skills_cap", minimum=100),
        rules_cap=int_setting(raw, "rules_cap", minimum=100),
        rule_index_cap=int_setting(raw, "rule_index_cap", minimum=100),
        memory_cap=int_setting(raw, "memory_cap", minimum=100),
        model_catalog=raw["model_catalog"],
        debug_echo=bool_setting(raw, "debug_echo"),
        budget=budget_config(raw),
        max_tools=int_setting(raw, "max_tools", minimum=1),
        max_tool_description_chars=int_setting(raw, "max_tool_description_chars", minimum=1024),
        max_tool_schema_bytes=int_setting(raw, "max_tool_schema_bytes", minimum=1024),
        max_tool_schema_depth=schema_depth(raw),
        preload_tokenizers=tokenizer_names(raw["preload_tokenizers"]),
    )
    sock = cfg.socket_path
    # sun_path holds 108 bytes including the terminating NUL.
    if sock is not None and len(str(sock).encode()) > 107:
        raise ConfigError(f"socket path {sock} is longer than the 107 bytes a Unix socket allows")
    host = cfg.listen.rpartition(":")[0].strip("[]")
    if bool(cfg.tls_cert_file) != bool(cfg.tls_key_file):
        raise ConfigError("tls_cert_file and tls_key_file go together")
    if cfg.tls_client_ca_file and not cfg.tls_cert_file:
        raise ConfigError("tls_client_ca_file needs tls_cert_file and tls_key_file")
    authenticated = cfg.auth_token_file or cfg.tls_client_ca_file
    if cfg.listen != "none" and not is_loopback(host) and not authenticated:
        raise ConfigError(
            f"refusing to serve the API on {cfg.listen} without authentication: set "
            "auth_token_file (or mTLS with tls_client_ca_file), or listen on loopback and use "
            "the Unix socket"
        )
    _check_ui(cfg)
    if sock is None and cfg.listen == "none":
        raise ConfigError("both socket and listen are 'none': the daemon would be unreachable")
    return cfg


def _check_ui(cfg: Config) -> None:
    """The inspector shows every session's content: beyond loopback only with the API's
    token, and never on the metrics or health port, which a pod exposes to its cluster."""
    if cfg.ui_listen == "none":
        return
    host, _, port = cfg.ui_listen.rpartition(":")
    if not is_loopback(host.strip("[]")) and not cfg.auth_token_file:
        raise ConfigError(
            f"refusing to serve the inspector on {cfg.ui_listen} without authentication: "
            "set auth_token_file, or keep ui_listen on loopback"
        )
    for other in ("metrics_listen", "health_listen", "listen"):
        value = getattr(cfg, other)
        if value != "none" and port != "0" and value.rpartition(":")[2] == port:
            raise ConfigError(f"ui_listen must not share a port with {other} ({value})")


def describe(cfg: Config) -> dict[str, str]:
    return {f.name: str(getattr(cfg, f.name)) for f in fields(cfg)}
