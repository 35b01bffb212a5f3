"""Rendered bodies validated against the official provider SDKs' own request types.

OpenAI and Anthropic publish their request params as TypedDicts; pydantic validates a
TypedDict but, by default, lets unknown keys through and checks `Iterable[...]` fields
lazily. Both would hide exactly the mistakes this suite is for, so every TypedDict of
the SDKs gets `extra="forbid"` and every lazily-validated iterable is consumed.
google-genai's types are pydantic models that already forbid unknown fields; the REST
body (camelCase) is checked field by field against them.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
import sys
from collections.abc import Iterator
from typing import Any

import pydantic
from pydantic import ConfigDict, TypeAdapter
from typing_extensions import is_typeddict

_FORBID = ConfigDict(extra="forbid", arbitrary_types_allowed=True)


def _forbid_unknown_keys(package: str) -> None:
    root = importlib.import_module(package)
    for info in pkgutil.walk_packages(root.__path__, f"{package}."):
        importlib.import_module(info.name)
    for name, module in list(sys.modules.items()):
        if not name.startswith(f"{package}.") or module is None:
            continue
        for value in list(vars(module).values()):
            if isinstance(value, type) and is_typeddict(value):
                value.__pydantic_config__ = _FORBID  # type: ignore[attr-defined]


def _consume(value: Any, where: str, out: list[str]) -> None:
    """Walk a validated value, draining pydantic's lazy iterable validators. Some params
    also accept the SDK's response models, which keep unknown keys as extras: those are
    reported here."""
    if isinstance(value, pydantic.BaseModel):
        if value.model_extra:
            out.append(f"{where}: unknown keys {sorted(value.model_extra)}")
        for name in type(value).model_fields:
            _consume(getattr(value, name), f"{where}.{name}", out)
    elif isinstance(value, dict):
        for k, v in value.items():
            _consume(v, f"{where}.{k}", out)
    elif isinstance(value, list | tuple | Iterator):
        for i, v in enumerate(value):
            _consume(v, f"{where}.{i}", out)


@functools.cache
def _adapter(kind: str) -> TypeAdapter[Any]:
    if kind == "openai_chat":
        _forbid_unknown_keys("openai.types")
        from openai.types.chat import completion_create_params

        return TypeAdapter(completion_create_params.CompletionCreateParamsNonStreaming)
    if kind == "openai_responses":
        _forbid_unknown_keys("openai.types")
        from openai.types.responses import response_create_params

        return TypeAdapter(response_create_params.ResponseCreateParamsNonStreaming)
    if kind == "anthropic_messages":
        _forbid_unknown_keys("anthropic.types")
        from anthropic.types import message_create_params

        return TypeAdapter(message_create_params.MessageCreateParamsNonStreaming)
    raise KeyError(kind)


def errors_for(kind: str, body: dict[str, Any]) -> list[str]:
    """Validation errors of a body, short enough to read; empty when valid."""
    if kind == "gemini":
        return _gemini_errors(body)
    out: list[str] = []
    try:
        _consume(_adapter(kind).validate_python(body), "body", out)
    except pydantic.ValidationError as exc:
        return _short(exc)
    return out


# The generateContent REST body's top-level fields and the google-genai type of each.
_GEMINI_FIELDS = {
    "contents": "list[Content]",
    "systemInstruction": "Content",
    "tools": "list[Tool]",
    "toolConfig": "ToolConfig",
    "generationConfig": "GenerationConfig",
    "safetySettings": "list[SafetySetting]",
    "cachedContent": "str",
}


@functools.cache
def _gemini_adapter(field: str) -> TypeAdapter[Any]:
    from google.genai import types

    spec = _GEMINI_FIELDS[field]
    if spec == "str":
        return TypeAdapter(str)
    if spec.startswith("list["):
        return TypeAdapter(list[getattr(types, spec[5:-1])])  # type: ignore[misc,arg-type]
    return TypeAdapter(getattr(types, spec))


def _gemini_errors(body: dict[str, Any]) -> list[str]:
    out = [f"{k}: not a generateContent field" for k in body if k not in _GEMINI_FIELDS]
    for field, value in body.items():
        if field in _GEMINI_FIELDS:
            try:
                _gemini_adapter(field).validate_python(value, by_alias=True, by_name=False)
            except pydantic.ValidationError as exc:
                out += [f"{field}.{e}" for e in _short(exc)]
    return out


def _short(exc: pydantic.ValidationError) -> list[str]:
    """A union's failure lists every member's errors. Per union, keep the member that
    came closest (fewest errors), so a failure reads in a few lines."""
    by_member: dict[tuple[str, ...], dict[str, int]] = {}
    errs = []
    for e in exc.errors():
        loc = tuple(str(p) for p in e["loc"])
        cut = next((i for i, p in enumerate(loc) if p.startswith(("union[", "list[union["))), None)
        if cut is not None and cut + 1 < len(loc):
            counts = by_member.setdefault(loc[:cut], {})
            counts[loc[cut + 1]] = counts.get(loc[cut + 1], 0) + 1
        errs.append((loc, cut, e["msg"]))
    out = []
    for loc, cut, msg in errs:
        shown = loc
        if cut is not None and cut + 1 < len(loc):
            counts = by_member[loc[:cut]]
            if loc[cut + 1] != min(counts, key=lambda m: counts[m]):
                continue
            shown = loc[:cut] + loc[cut + 1 :]
        out.append(f"{'.'.join(shown)}: {msg}")
    return out[:12]
