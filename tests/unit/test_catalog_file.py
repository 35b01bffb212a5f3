"""An operator's `--model-catalog` file: entries under `models` are added or replace the
shipped ones; anything the daemon would not use is refused with the entry and field named,
instead of a model that silently stays unknown, a window from a typo, or a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from server.adapters.catalog import load_catalog


def _file(tmp_path: Path, data: object) -> str:
    path = tmp_path / "models.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_entries_are_added_and_replace_shipped_ones(tmp_path: Path) -> None:
    shipped = load_catalog().lookup("claude-sonnet-4")
    assert shipped.context_window > 0
    catalog = load_catalog(
        _file(
            tmp_path,
            {
                "_comment": "ours",
                "models": {
                    "house-model": {
                        "context_window": 9000,
                        "max_output": 1000,
                        "images": False,
                        "tokenizer": "cl100k",
                        "token_factor": 1.5,
                        "_comment": "internal",
                    },
                    "claude-sonnet-4": {"context_window": 12345, "tokenizer": "claude"},
                },
            },
        )
    )
    house = catalog.lookup("acme/house-model-v2")
    assert (house.key, house.context_window, house.max_output_tokens) == ("house-model", 9000, 1000)
    assert (house.accepts_images, house.tokenizer, house.token_factor) == (False, "cl100k", 1.5)
    assert catalog.lookup("claude-sonnet-4-20250514").context_window == 12345
    assert catalog.lookup("gpt-4o").context_window == load_catalog().lookup("gpt-4o").context_window


@pytest.mark.parametrize(
    ("data", "said"),
    [
        ([1, 2], "must be a JSON object with the entries under 'models'"),
        ({"house-model": {"context_window": 9000}}, "unknown top-level key(s) house-model"),
        ({"models": [1]}, "'models' must be an object"),
        ({"models": {"m": 5}}, "entry 'm' must be an object"),
        ({"models": {"m": {"contxt_window": 9000}}}, "'m' has unknown field(s) contxt_window"),
        ({"models": {"m": {"context_window": "9000"}}}, "'m' context_window must be a whole"),
        ({"models": {"m": {"max_output": -1}}}, "'m' max_output must be a whole number"),
        ({"models": {"m": {"max_input": 1.5}}}, "'m' max_input must be a whole number"),
        ({"models": {"m": {"context_window": True}}}, "'m' context_window must be a whole"),
        ({"models": {"m": {"images": "no"}}}, "'m' images must be true or false, got 'no'"),
        ({"models": {"m": {"token_factor": 0}}}, "'m' token_factor must be a number above 0"),
        ({"models": {"m": {"token_factor": "1.1"}}}, "'m' token_factor must be a number above"),
        # Values the daemon would take and then fail every compile of the model with
        # INTERNAL: a window no budget field holds, counts that overflow.
        ({"models": {"m": {"context_window": 1 << 33}}}, "'m' context_window must be a whole"),
        ({"models": {"m": {"max_output": 1 << 32}}}, "to 268435456, got 4294967296"),
        # Rendered bodies carry it: Gemini's maxOutputTokens is an int32.
        ({"models": {"m": {"max_output": (1 << 32) - 1}}}, "to 268435456, got 4294967295"),
        ({"models": {"m": {"context_window": (1 << 28) + 1}}}, "to 268435456, got 268435457"),
        ({"models": {"m": {"token_factor": float("inf")}}}, "at most 10, got inf"),
        ({"models": {"m": {"token_factor": 1e300}}}, "'m' token_factor must be a number above"),
        ({"models": {"m": {"token_factor": float("nan")}}}, "'m' token_factor must be a"),
        ({"models": {"m": {"family": 3}}}, "'m' family must be a string, got 3"),
        ({"models": {"m": {"tokenizer": "llama"}}}, "'m' has unknown tokenizer 'llama'"),
    ],
)
def test_what_would_be_ignored_or_misread_is_refused(
    tmp_path: Path, data: object, said: str
) -> None:
    path = _file(tmp_path, data)
    with pytest.raises(ValueError) as err:
        load_catalog(path)
    assert str(err.value).startswith(f"cannot read model catalog {path}: catalog: ")
    assert said in str(err.value)


def test_limits_up_to_the_compile_bound_load(tmp_path: Path) -> None:
    """268,435,456 tokens, a compile's largest `limits`, is a limit a catalog takes too."""
    entry = {"context_window": 1 << 28, "max_output": 1 << 28, "max_input": 1 << 28}
    catalog = load_catalog(_file(tmp_path, {"models": {"house-model": entry}}))
    house = catalog.lookup("house-model")
    assert (house.context_window, house.max_output_tokens, house.max_input_tokens) == (
        1 << 28,
        1 << 28,
        1 << 28,
    )
