"""Parsing and checking of single setting values; a bad one raises ConfigError naming it."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping

from server.compiler.budget import BudgetConfig
from server.compiler.textscan import MAX_JSON_DEPTH
from server.config_settings import ConfigError
from server.domain.catalog import MAX_LIMIT_TOKENS, TOKENIZER_TABLES


def hostport(name: str, value: str) -> str:
    if value == "none":
        return value
    host, sep, port = value.rpartition(":")
    if not sep or not host or not _digits(port, 5) or int(port) > 65535:
        raise ConfigError(f"{name} must be host:port or 'none', got {value!r}")
    return value


def int_setting(
    raw: Mapping[str, str],
    name: str,
    base: int = 10,
    minimum: int = 0,
    maximum: int | None = None,
) -> int:
    try:
        value = int(raw[name], base)
    except ValueError:
        kind = "an octal mode such as 0660" if base == 8 else "a whole number"
        raise ConfigError(f"{name} must be {kind}, got {raw[name]!r}") from None
    if value < minimum:
        raise ConfigError(f"{name} must be at least {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ConfigError(f"{name} must be at most {maximum}, got {value}")
    return value


# The most tokens a budget setting states: more than any model reads or writes, as a
# compile's `limits` (domain/catalog.MAX_LIMIT_TOKENS). An unknown window's watermark and
# reserve add up to its input budget (a sum past uint32, a view's budget fields, made
# every compile of an unknown model fail with INTERNAL), and its reserve is the output
# cap of an unknown model's bodies: 4,000,000,000 went into Gemini bodies as
# maxOutputTokens, an int32 the provider refuses in every request.
MAX_BUDGET_TOKENS = MAX_LIMIT_TOKENS


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# The longest duration taken, 100 years: a longer one means "never", which is off (0).
MAX_DURATION_S = 36500 * 86400


def _digits(text: str, most: int) -> bool:
    """ASCII digits only, at most `most` of them: str.isdigit() also takes "²" (int() then
    raised ValueError, a traceback at start) and "٣" (read as 3), and int() refuses
    over 4,300 digits with a ValueError of its own."""
    return 0 < len(text) <= most and text.isascii() and text.isdigit()


def duration_s(raw: Mapping[str, str], name: str) -> int:
    """Whole seconds from "0", "3600", "90s", "30m", "36h" or "7d"."""
    text = raw[name].strip().lower()
    unit = _UNITS.get(text[-1:], 0)
    number = text[:-1] if unit else text
    if not _digits(number, 20):
        raise ConfigError(
            f"{name} must be a whole number of seconds or one with a unit s, m, h or d "
            f"(e.g. 7d), got {raw[name]!r}"
        )
    seconds = int(number) * (unit or 1)
    if seconds > MAX_DURATION_S:
        raise ConfigError(f"{name} must be at most 36500d (100 years), got {raw[name]!r}")
    return seconds


# gRPC takes its message limits as a C int.
MAX_MESSAGE_BYTES = (1 << 31) - 1


def message_bytes(raw: Mapping[str, str]) -> int:
    """A limit past a C int crashed the start with grpc's OverflowError traceback."""
    value = int_setting(raw, "max_message_bytes", minimum=1 << 20)
    if value > MAX_MESSAGE_BYTES:
        raise ConfigError(
            f"max_message_bytes must be at most {MAX_MESSAGE_BYTES} (gRPC's limit), got {value}"
        )
    return value


def socket_mode(raw: Mapping[str, str]) -> int:
    """Permission bits only: a larger number was masked by chmod (10660 served as 0660) or,
    past a C int, crashed the start after the store had opened."""
    mode = int_setting(raw, "socket_mode", 8)
    if mode > 0o777:
        raise ConfigError(
            f"socket_mode must be permission bits from 0000 to 0777, got {raw['socket_mode']!r}"
        )
    return mode


def schema_depth(raw: Mapping[str, str]) -> int:
    depth = int_setting(raw, "max_tool_schema_depth", minimum=4)
    # Bodies render JSON nested deeper than textscan.MAX_JSON_DEPTH as malformed.
    if depth > MAX_JSON_DEPTH:
        raise ConfigError(f"max_tool_schema_depth must be at most {MAX_JSON_DEPTH}, got {depth}")
    return depth


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bool_setting(raw: Mapping[str, str], name: str) -> bool:
    value = raw[name].lower()
    if value not in {"true", "false"}:
        raise ConfigError(f"{name} must be true or false, got {raw[name]!r}")
    return value == "true"


def csv_list(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def file_names(value: str) -> tuple[str, ...]:
    names = tuple(csv_list(value))
    if any("/" in n or n in {".", ".."} for n in names):
        raise ConfigError(f"instruction_files takes plain file names, got {value!r}")
    return names


def tokenizer_names(value: str) -> tuple[str, ...]:
    names = csv_list(value)
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


def fraction_setting(raw: Mapping[str, str], name: str) -> float:
    try:
        value = float(raw[name])
    except ValueError:
        raise ConfigError(f"{name} must be a number, got {raw[name]!r}") from None
    if not 0 < value <= 1:
        raise ConfigError(f"{name} must be above 0 and at most 1, got {raw[name]}")
    return value


def budget_config(raw: Mapping[str, str]) -> BudgetConfig:
    cfg = BudgetConfig(
        first_reserve_fraction=fraction_setting(raw, "first_reserve_fraction"),
        first_reserve_max=int_setting(raw, "first_reserve_max", 10, 1, MAX_BUDGET_TOKENS),
        dynamic_reserve_factor=int_setting(
            raw, "reserve_last_output_factor", 10, 1, MAX_BUDGET_TOKENS
        ),
        dynamic_reserve_min=int_setting(raw, "reserve_min", 10, 1, MAX_BUDGET_TOKENS),
        dynamic_reserve_max=int_setting(raw, "reserve_max", 10, 1, MAX_BUDGET_TOKENS),
        unknown_history_watermark=int_setting(
            raw, "unknown_window_watermark", 10, 1, MAX_BUDGET_TOKENS
        ),
        unknown_output_reserve=int_setting(raw, "unknown_window_reserve", 10, 1, MAX_BUDGET_TOKENS),
    )
    if cfg.unknown_history_watermark + cfg.unknown_output_reserve > MAX_BUDGET_TOKENS:
        raise ConfigError(
            f"unknown_window_watermark + unknown_window_reserve (an unknown window's input "
            f"budget) must be at most {MAX_BUDGET_TOKENS}, got "
            f"{cfg.unknown_history_watermark + cfg.unknown_output_reserve}"
        )
    if cfg.dynamic_reserve_min > cfg.dynamic_reserve_max:
        raise ConfigError(
            f"reserve_min ({cfg.dynamic_reserve_min}) is above reserve_max "
            f"({cfg.dynamic_reserve_max})"
        )
    return cfg
