"""Daemon configuration: flags over CTXCC_* environment variables over a TOML file over
defaults. Every setting has one name used in all three places (flag `--data-dir`,
env `CTXCC_DATA_DIR`, TOML key `data_dir`)."""

from __future__ import annotations

import argparse
import ipaddress
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from server.compiler.budget import BudgetConfig
from server.compiler.textscan import MAX_JSON_DEPTH
from server.domain.catalog import TOKENIZER_TABLES


class ConfigError(ValueError):
    """A setting is missing, malformed or contradictory; the message says which."""


@dataclass(frozen=True, slots=True)
class Setting:
    name: str
    default: str
    help: str


SETTINGS: tuple[Setting, ...] = (
    Setting("data_dir", "./data", "directory for RocksDB (<data-dir>/db) and the socket"),
    Setting("socket", "", "Unix socket path; empty means <data-dir>/ctxcc.sock; 'none' disables"),
    Setting("socket_mode", "0660", "permissions of the Unix socket (octal)"),
    Setting(
        "socket_group", "", "group (name or gid) given the Unix socket; empty keeps the process's"
    ),
    Setting("tls_cert_file", "", "PEM certificate for TLS on the TCP port (with tls_key_file)"),
    Setting("tls_key_file", "", "PEM private key for TLS on the TCP port"),
    Setting(
        "tls_client_ca_file",
        "",
        "PEM CA bundle: with it, TCP clients must present a certificate it signed (mTLS)",
    ),
    Setting(
        "auth_token_file",
        "",
        "file holding a bearer token TCP clients must send; required to listen beyond loopback",
    ),
    Setting("listen", "127.0.0.1:50551", "TCP host:port for gRPC, or 'none'"),
    Setting("metrics_listen", "127.0.0.1:9464", "host:port for Prometheus /metrics, or 'none'"),
    Setting(
        "health_listen",
        "none",
        "host:port serving only grpc.health.v1 (for kubelet probes), or 'none'",
    ),
    Setting(
        "ui_listen",
        "127.0.0.1:9465",
        "host:port of the read-only web inspector, or 'none'; beyond loopback it needs "
        "auth_token_file",
    ),
    Setting(
        "durability", "sync", "'sync' fsyncs every append batch; 'buffered' leaves it to the OS"
    ),
    Setting("grace_period", "10", "seconds in-flight calls get to finish on SIGTERM/SIGINT"),
    Setting("workers", "8", "threads for blocking storage work"),
    Setting(
        "compile_workers",
        "2",
        "threads for compiles and result searches, apart from storage work",
    ),
    Setting("log_level", "info", "debug, info, warning or error"),
    Setting("max_sessions", "100000", "sessions the daemon holds at most"),
    Setting("max_session_bytes", str(1 << 30), "bytes one session may store"),
    Setting("max_events_per_append", "1000", "events one AppendEvents may carry"),
    Setting("max_event_bytes", str(1 << 20), "encoded bytes of one event (after blob offload)"),
    Setting("blob_threshold_bytes", str(16 << 10), "tool results above this become blobs"),
    Setting("max_artifact_bytes", str(20 << 20), "bytes of one uploaded artifact"),
    Setting("max_message_bytes", str(64 << 20), "largest gRPC message accepted"),
    Setting(
        "disk_reserve_bytes",
        str(64 << 20),
        "space held back beside RocksDB so it can always recover from a full disk; writes "
        "resume when this much is free again (0 disables)",
    ),
    Setting(
        "stream_chunk_bytes",
        str(1 << 20),
        "CompileStream sends views larger than this as ordered chunks",
    ),
    Setting(
        "compile_memo_bytes",
        str(32 << 20),
        "memory for compile memos (each session's projected history, so a step compiles only "
        "its new events); 0 compiles every view from scratch",
    ),
    Setting(
        "compile_cpu_budget_ms",
        "30000",
        "CPU milliseconds one compile (its loading, projection and renderings) may use "
        "before it is stopped with RESOURCE_EXHAUSTED/QUOTA_EXCEEDED; 0 = no limit",
    ),
    Setting("kernel_file", "", "file with the kernel prefix text; empty uses the built-in one"),
    Setting(
        "workspace_roots",
        "",
        "comma-separated directories a session's project_root may lie under; "
        "project files are read only there (empty: none)",
    ),
    Setting(
        "global_dir",
        "",
        "user-global directory: AGENTS.md/CLAUDE.md/GEMINI.md, skills/, rules/, MEMORY.md",
    ),
    Setting("instruction_files", "AGENTS.md,CLAUDE.md,GEMINI.md", "instruction file names"),
    Setting("time_granularity", "60", "seconds the environment section's time is rounded to"),
    Setting("instruction_file_cap", "16000", "characters of one instruction file"),
    Setting("instructions_cap", "48000", "characters of all instruction files"),
    Setting("skills_cap", "8000", "characters of the skills catalog"),
    Setting("rules_cap", "16000", "characters of the rules in direct effect"),
    Setting("rule_index_cap", "4000", "characters of the on-demand rule index"),
    Setting("memory_cap", "8000", "characters of memory"),
    Setting(
        "model_catalog", "", "JSON file of model entries added to or replacing the shipped catalog"
    ),
    # The Claude table's build holds the GIL ~0.15 s (more on a busy node): long enough to
    # push other sessions' calls past the 250 ms latency bound, so it is built before
    # SERVING; the OpenAI tables build in under ~0.1 s and wait for their first compile.
    Setting(
        "preload_tokenizers",
        "claude",
        "tokenizer tables built before the daemon reports SERVING: comma-separated o200k, "
        "cl100k, claude, or 'all' or 'none'; the others are built on their first compile",
    ),
    # Budget parameters (R-BUD-1..5): local scheduling choices, not provider claims.
    Setting(
        "first_reserve_fraction",
        "0.25",
        "share of a known window reserved for output before any usage is known (0..1]",
    ),
    Setting("first_reserve_max", "16384", "cap in tokens on that first output reserve"),
    Setting(
        "reserve_last_output_factor",
        "2",
        "once usage is known, the output reserve is this many times the last output",
    ),
    Setting("reserve_min", "1024", "lower clamp in tokens of the usage-based output reserve"),
    Setting("reserve_max", "8192", "upper clamp in tokens of the usage-based output reserve"),
    Setting(
        "unknown_window_watermark",
        "32768",
        "history high watermark in tokens when the model's window is unknown",
    ),
    Setting(
        "unknown_window_reserve", "16384", "output reserve in tokens when the window is unknown"
    ),
    # Tool registry limits guard against abuse; the defaults take real agents' tool sets
    # (descriptions of 9-12K characters, deeply nested schemas) with room to spare.
    Setting("max_tools", "512", "tools one session may register"),
    Setting("max_tool_description_chars", "65536", "characters of one tool's description"),
    Setting("max_tool_schema_bytes", str(256 << 10), "bytes of one tool's input schema JSON"),
    Setting("max_tool_schema_depth", "64", "nesting depth of one tool's input schema (4..100)"),
    Setting(
        "debug_echo",
        "false",
        "serve ctxcc.debug.Echo/Echo (benchmarks only: a transport baseline); true or false",
    ),
)
_BY_NAME = {s.name: s for s in SETTINGS}


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
    max_sessions: int
    max_session_bytes: int
    max_events_per_append: int
    max_event_bytes: int
    blob_threshold_bytes: int
    max_artifact_bytes: int
    max_message_bytes: int
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


def env_name(name: str) -> str:
    return "CTXCC_" + name.upper()


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


def _read_toml(path: str) -> dict[str, Any]:
    import tomllib  # only with --config: not on every start-up

    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
    unknown = sorted(set(data) - set(_BY_NAME))
    if unknown:
        raise ConfigError(f"config file {path}: unknown setting(s) {', '.join(unknown)}")
    return data


def _parse_hostport(name: str, value: str) -> str:
    if value == "none":
        return value
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"{name} must be host:port or 'none', got {value!r}")
    return value


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


def _int(raw: Mapping[str, str], name: str, base: int = 10, minimum: int = 0) -> int:
    try:
        value = int(raw[name], base)
    except ValueError:
        kind = "an octal mode such as 0660" if base == 8 else "a whole number"
        raise ConfigError(f"{name} must be {kind}, got {raw[name]!r}") from None
    if value < minimum:
        raise ConfigError(f"{name} must be at least {minimum}, got {value}")
    return value


def _schema_depth(raw: Mapping[str, str]) -> int:
    depth = _int(raw, "max_tool_schema_depth", minimum=4)
    # Bodies render JSON nested deeper than textscan.MAX_JSON_DEPTH as malformed.
    if depth > MAX_JSON_DEPTH:
        raise ConfigError(f"max_tool_schema_depth must be at most {MAX_JSON_DEPTH}, got {depth}")
    return depth


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _bool(raw: Mapping[str, str], name: str) -> bool:
    value = raw[name].lower()
    if value not in {"true", "false"}:
        raise ConfigError(f"{name} must be true or false, got {raw[name]!r}")
    return value == "true"


def _csv(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def _names(value: str) -> tuple[str, ...]:
    names = tuple(_csv(value))
    if any("/" in n or n in {".", ".."} for n in names):
        raise ConfigError(f"instruction_files takes plain file names, got {value!r}")
    return names


def _tokenizers(value: str) -> tuple[str, ...]:
    names = _csv(value)
    if names in (["none"], []):
        return ()
    if names == ["all"]:
        return TOKENIZER_TABLES
    unknown = [n for n in names if n not in TOKENIZER_TABLES]
    if unknown:
        raise ConfigError(
            f"preload_tokenizers takes {', '.join(TOKENIZER_TABLES)}, 'all' or 'none', "
            f"got {value!r}"
        )
    return tuple(dict.fromkeys(names))


def _fraction(raw: Mapping[str, str], name: str) -> float:
    try:
        value = float(raw[name])
    except ValueError:
        raise ConfigError(f"{name} must be a number, got {raw[name]!r}") from None
    if not 0 < value <= 1:
        raise ConfigError(f"{name} must be above 0 and at most 1, got {raw[name]}")
    return value


def _budget(raw: Mapping[str, str]) -> BudgetConfig:
    cfg = BudgetConfig(
        first_reserve_fraction=_fraction(raw, "first_reserve_fraction"),
        first_reserve_max=_int(raw, "first_reserve_max", minimum=1),
        dynamic_reserve_factor=_int(raw, "reserve_last_output_factor", minimum=1),
        dynamic_reserve_min=_int(raw, "reserve_min", minimum=1),
        dynamic_reserve_max=_int(raw, "reserve_max", minimum=1),
        unknown_history_watermark=_int(raw, "unknown_window_watermark", minimum=1),
        unknown_output_reserve=_int(raw, "unknown_window_reserve", minimum=1),
    )
    if cfg.dynamic_reserve_min > cfg.dynamic_reserve_max:
        raise ConfigError(
            f"reserve_min ({cfg.dynamic_reserve_min}) is above reserve_max "
            f"({cfg.dynamic_reserve_max})"
        )
    return cfg


def _build(raw: Mapping[str, str]) -> Config:
    if raw["durability"] not in {"sync", "buffered"}:
        raise ConfigError(f"durability must be 'sync' or 'buffered', got {raw['durability']!r}")
    if raw["log_level"].lower() not in {"debug", "info", "warning", "error"}:
        raise ConfigError(
            f"log_level must be debug, info, warning or error, got {raw['log_level']!r}"
        )
    try:
        grace = float(raw["grace_period"])
    except ValueError:
        grace = math.nan
    if not 0 <= grace < math.inf:  # NaN fails both comparisons
        raise ConfigError(
            f"grace_period must be a number of seconds, 0 or more, got {raw['grace_period']!r}"
        )
    cfg = Config(
        data_dir=Path(raw["data_dir"]),
        socket=raw["socket"],
        socket_mode=_int(raw, "socket_mode", 8),
        socket_group=raw["socket_group"],
        auth_token_file=raw["auth_token_file"],
        tls_cert_file=raw["tls_cert_file"],
        tls_key_file=raw["tls_key_file"],
        tls_client_ca_file=raw["tls_client_ca_file"],
        listen=_parse_hostport("listen", raw["listen"]),
        metrics_listen=_parse_hostport("metrics_listen", raw["metrics_listen"]),
        health_listen=_parse_hostport("health_listen", raw["health_listen"]),
        ui_listen=_parse_hostport("ui_listen", raw["ui_listen"]),
        durability=raw["durability"],
        grace_period=grace,
        workers=_int(raw, "workers", minimum=1),
        compile_workers=_int(raw, "compile_workers", minimum=1),
        log_level=raw["log_level"].lower(),
        max_sessions=_int(raw, "max_sessions", minimum=1),
        max_session_bytes=_int(raw, "max_session_bytes", minimum=1),
        max_events_per_append=_int(raw, "max_events_per_append", minimum=1),
        max_event_bytes=_int(raw, "max_event_bytes", minimum=1024),
        blob_threshold_bytes=_int(raw, "blob_threshold_bytes", minimum=256),
        max_artifact_bytes=_int(raw, "max_artifact_bytes", minimum=1),
        max_message_bytes=_int(raw, "max_message_bytes", minimum=1 << 20),
        disk_reserve_bytes=_int(raw, "disk_reserve_bytes"),
        stream_chunk_bytes=_int(raw, "stream_chunk_bytes", minimum=1024),
        compile_memo_bytes=_int(raw, "compile_memo_bytes", minimum=0),
        compile_cpu_budget_ms=_int(raw, "compile_cpu_budget_ms", minimum=0),
        kernel_file=raw["kernel_file"],
        workspace_roots=tuple(Path(p) for p in _csv(raw["workspace_roots"])),
        global_dir=Path(raw["global_dir"]) if raw["global_dir"] else None,
        instruction_files=_names(raw["instruction_files"]),
        time_granularity=_int(raw, "time_granularity", minimum=1),
        instruction_file_cap=_int(raw, "instruction_file_cap", minimum=100),
        instructions_cap=_int(raw, "instructions_cap", minimum=100),
        skills_cap=_int(raw, "skills_cap", minimum=100),
        rules_cap=_int(raw, "rules_cap", minimum=100),
        rule_index_cap=_int(raw, "rule_index_cap", minimum=100),
        memory_cap=_int(raw, "memory_cap", minimum=100),
        model_catalog=raw["model_catalog"],
        debug_echo=_bool(raw, "debug_echo"),
        budget=_budget(raw),
        max_tools=_int(raw, "max_tools", minimum=1),
        max_tool_description_chars=_int(raw, "max_tool_description_chars", minimum=1024),
        max_tool_schema_bytes=_int(raw, "max_tool_schema_bytes", minimum=1024),
        max_tool_schema_depth=_schema_depth(raw),
        preload_tokenizers=_tokenizers(raw["preload_tokenizers"]),
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
    if cfg.listen != "none" and not _loopback(host) and not authenticated:
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
    if not _loopback(host.strip("[]")) and not cfg.auth_token_file:
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
