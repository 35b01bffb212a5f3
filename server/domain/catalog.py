"""The model catalog: what is known of a model's window, output, images and tokenizer.

Lookup is by the longest catalog key starting a segment of the lower-cased model name, so
`claude-sonnet-4-20250514` and `anthropic/claude-sonnet-4` both find `claude-sonnet-4`
while `claude-sonnet-4-5` would find a longer key first if the catalog had one.
Unknown models get no window (R-BUD-4) and the conservative estimator.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from server.domain.families import family_of


@dataclass(frozen=True, slots=True)
class ModelInfo:
    key: str
    family: str
    context_window: int = 0
    max_output_tokens: int = 0
    max_input_tokens: int = 0
    accepts_images: bool = True
    tokenizer: str = "charclass"
    token_factor: float = 1.0


UNKNOWN_TOKENIZER = "charclass"
# The tokenizers that count with a table of their own (the daemon builds each on first use).
TOKENIZER_TABLES = ("o200k", "cl100k", "claude")
# Model names whose lookup is remembered.
_REMEMBERED = 1_024


def parse_catalog(data: Mapping[str, object]) -> dict[str, ModelInfo]:
    models = data.get("models", {})
    if not isinstance(models, Mapping):
        raise ValueError("catalog: 'models' must be an object")
    out: dict[str, ModelInfo] = {}
    for key, raw in models.items():
        if not isinstance(raw, Mapping):
            raise ValueError(f"catalog: entry {key!r} must be an object")
        tokenizer = str(raw.get("tokenizer", UNKNOWN_TOKENIZER))
        if tokenizer not in {*TOKENIZER_TABLES, UNKNOWN_TOKENIZER}:
            raise ValueError(f"catalog: {key!r} has unknown tokenizer {tokenizer!r}")
        out[str(key).lower()] = ModelInfo(
            key=str(key).lower(),
            family=str(raw.get("family") or family_of(str(key))),
            context_window=int(raw.get("context_window", 0)),
            max_output_tokens=int(raw.get("max_output", 0)),
            max_input_tokens=int(raw.get("max_input", 0)),
            accepts_images=bool(raw.get("images", True)),
            tokenizer=tokenizer,
            token_factor=float(raw.get("token_factor", 1.0)),
        )
    return out


class Catalog:
    def __init__(self, entries: Mapping[str, ModelInfo]) -> None:
        self._entries = dict(entries)
        self._keys = sorted(self._entries, key=len, reverse=True)
        # Answers by model name: a step looks its model up four times (compile, usage
        # report), each a scan of every key. The catalog never changes once built.
        self._found: dict[str, ModelInfo] = {}

    def lookup(self, model: str) -> ModelInfo:
        found = self._found.get(model)
        if found is None:
            found = self._scan(model)
            if len(self._found) >= _REMEMBERED:  # names come from clients: bounded
                self._found.clear()
            self._found[model] = found
        return found

    def _scan(self, model: str) -> ModelInfo:
        name = model.lower()
        for key in self._keys:
            # The key must start a name segment: "o3" matches "o3-mini", not "foo3".
            at = name.find(key)
            while at >= 0:
                if at == 0 or not name[at - 1].isalnum():
                    return self._entries[key]
                at = name.find(key, at + 1)
        return ModelInfo(key="", family=family_of(model))

    def merged(self, overrides: Mapping[str, ModelInfo]) -> Catalog:
        return Catalog({**self._entries, **overrides})
