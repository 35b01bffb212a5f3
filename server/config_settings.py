"""The daemon's settings: one row a setting (name, default, help), the one name it has as
a flag, an environment variable and a TOML key."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


class ConfigError(ValueError):
    """A setting is missing, malformed or contradictory; the message says which."""


# The TOML type a setting's value must have in the config file. A flag or an environment
# variable is text, parsed by the setting's own check; in the file, `max_tools = "10"` is
# a mistake TOML can tell, and one an operator should hear about.
Kind = Literal["str", "int", "float", "bool"]


@dataclass(frozen=True, slots=True)
class Setting:
    name: str
    default: str
    help: str
    kind: Kind = "str"


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
    Setting(
        "grace_period",
        "10",
        "seconds in-flight calls get to finish on SIGTERM, SIGINT or SIGHUP",
        kind="float",
    ),
    Setting("workers", "8", "threads for blocking storage work", kind="int"),
    Setting(
        "compile_workers",
        "2",
        "threads for compiles and result searches, apart from storage work",
        kind="int",
    ),
    Setting("log_level", "info", "debug, info, warning or error"),
    Setting(
        "log_format",
        "text",
        "'text' lines, or 'json': one JSON object per line (time, level, logger, message)",
    ),
    Setting("max_sessions", "100000", "sessions the daemon holds at most", kind="int"),
    Setting(
        "session_retention",
        "0",
        "delete sessions nothing was appended to or compiled of for this long (e.g. 7d, "
        "36h, 90m, 3600s); 0 keeps every session until DeleteSession",
    ),
    Setting(
        "max_session_bytes",
        str(1 << 30),
        "bytes one session may store: its events, blobs, artifacts, checkpoints and tool "
        "definitions (not its compiles' bases)",
        kind="int",
    ),
    Setting(
        "max_session_basis_bytes",
        str(1 << 30),
        "bytes of the parts one session's compiles store for their bases (source texts, "
        "tools, settings), apart from max_session_bytes: past it compiles are answered "
        "and recorded without their basis (they cannot be rebuilt), appends are never "
        "refused for them; 0 stores no basis",
        kind="int",
    ),
    Setting("max_events_per_append", "1000", "events one AppendEvents may carry", kind="int"),
    Setting(
        "max_event_bytes",
        str(1 << 20),
        "encoded bytes of one event (after blob offload)",
        kind="int",
    ),
    Setting(
        "blob_threshold_bytes", str(16 << 10), "tool results above this become blobs", kind="int"
    ),
    Setting("max_artifact_bytes", str(20 << 20), "bytes of one uploaded artifact", kind="int"),
    Setting("max_message_bytes", str(64 << 20), "largest gRPC message accepted", kind="int"),
    Setting(
        "max_calls_in_progress",
        "8192",
        "calls in their handlers at once (open streams and watches included); past it a "
        "new call answers RESOURCE_EXHAUSTED/QUOTA_EXCEEDED (retry later); health checks "
        "always answer; 0 = no limit",
        kind="int",
    ),
    Setting(
        "max_request_bytes_in_memory",
        str(64 << 20),
        "bytes of requests of 64 KiB or more that calls in progress may hold together; past "
        "it such a request answers RESOURCE_EXHAUSTED/QUOTA_EXCEEDED (retry later), one "
        "alone always passes; 0 = no limit",
        kind="int",
    ),
    Setting(
        "max_watch_bytes_in_memory",
        str(64 << 20),
        "bytes that WatchSession calls may hold in flight together (backlog pages read and "
        "messages gRPC has not yet sent to a client that stopped reading); past it a watch "
        "waits before reading its next page; one alone always reads; 0 = no limit",
        kind="int",
    ),
    Setting(
        "disk_reserve_bytes",
        str(64 << 20),
        "space held back beside RocksDB so it can always recover from a full disk; writes "
        "resume when this much is free again (0 disables)",
        kind="int",
    ),
    Setting(
        "stream_chunk_bytes",
        str(1 << 20),
        "CompileStream sends views larger than this as ordered chunks",
        kind="int",
    ),
    Setting(
        "compile_memo_bytes",
        str(32 << 20),
        "memory for compile memos (each session's projected history, so a step compiles only "
        "its new events); 0 compiles every view from scratch",
        kind="int",
    ),
    Setting(
        "compile_cpu_budget_ms",
        "30000",
        "CPU milliseconds one compile (its loading, projection and renderings) may use "
        "before it is stopped with RESOURCE_EXHAUSTED/QUOTA_EXCEEDED; 0 = no limit",
        kind="int",
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
    # An hour: the environment section ends the system prompt, so every change of its time
    # changes the prefix the whole history follows, which providers cache (OpenAI, Gemini
    # by prefix; an agent's own Anthropic breakpoint on its last message): at a minute,
    # each step crossing one re-billed the history in full.
    Setting(
        "time_granularity",
        "3600",
        "seconds the environment section's time is rounded to",
        kind="int",
    ),
    Setting("instruction_file_cap", "16000", "characters of one instruction file", kind="int"),
    Setting("instructions_cap", "48000", "characters of all instruction files", kind="int"),
    Setting("skills_cap", "8000", "characters of the skills catalog", kind="int"),
    Setting("rules_cap", "16000", "characters of the rules in direct effect", kind="int"),
    Setting("rule_index_cap", "4000", "characters of the on-demand rule index", kind="int"),
    Setting("memory_cap", "8000", "characters of memory", kind="int"),
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
        kind="float",
    ),
    Setting("first_reserve_max", "16384", "cap in tokens on that first output reserve", kind="int"),
    Setting(
        "reserve_last_output_factor",
        "2",
        "once usage is known, the output reserve is this many times the last output",
        kind="int",
    ),
    Setting(
        "reserve_min", "1024", "lower clamp in tokens of the usage-based output reserve", kind="int"
    ),
    Setting(
        "reserve_max", "8192", "upper clamp in tokens of the usage-based output reserve", kind="int"
    ),
    Setting(
        "unknown_window_watermark",
        "32768",
        "history high watermark in tokens when the model's window is unknown",
        kind="int",
    ),
    Setting(
        "unknown_window_reserve",
        "16384",
        "output reserve in tokens when the window is unknown",
        kind="int",
    ),
    # Tool registry limits guard against abuse; the defaults take real agents' tool sets
    # (descriptions of 9-12K characters, deeply nested schemas) with room to spare.
    Setting("max_tools", "512", "tools one session may register", kind="int"),
    Setting(
        "max_tool_description_chars", "65536", "characters of one tool's description", kind="int"
    ),
    Setting(
        "max_tool_schema_bytes", str(256 << 10), "bytes of one tool's input schema JSON", kind="int"
    ),
    Setting(
        "max_tool_schema_depth",
        "64",
        "nesting depth of one tool's input schema (4..100)",
        kind="int",
    ),
    Setting(
        "debug_echo",
        "false",
        "serve ctxcc.debug.Echo/Echo (benchmarks only: a transport baseline); true or false",
        kind="bool",
    ),
)


BY_NAME = {s.name: s for s in SETTINGS}


def env_name(name: str) -> str:
    return "CTXCC_" + name.upper()
