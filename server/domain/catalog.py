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


# An entry's fields and what each must be. `_comment` is free text, at the top or in an entry.
_INT_FIELDS = ("context_window", "max_output", "max_input")
# The most a window, output or input limit can be: more than any model reads or writes.
# The one bound of every token count a caller or an operator states: the catalog's, a
# compile's `limits`, the budget settings, usage reports. Rendered bodies carry the
# limits: a max_output of 4,294,967,295 went into Gemini bodies as maxOutputTokens, an
# int32 the provider refuses in every request (and past uint32, a view's budget fields,
# every compile of the model failed with INTERNAL).
MAX_LIMIT_TOKENS = 1 << 28
# No tokenizer counts ten times what another does (a character-level one counts about
# four times cl100k_base): a factor of 1e300, or Infinity (which JSON readers take), made
# every count overflow and every compile on the model fail (INTERNAL).
MAX_TOKEN_FACTOR = 10.0
_FIELDS = frozenset({*_INT_FIELDS, "family", "images", "tokenizer", "token_factor", "_comment"})


def parse_catalog(data: object) -> dict[str, ModelInfo]:
    """Entries of a catalog file (the shipped one or an operator's `--model-catalog`).

    Anything it would not use is refused, naming the entry and field: an entry outside
    `models`, a misspelt field or a string where a number belongs would otherwise leave
    the model unknown or its window wrong without a word."""
    if not isinstance(data, Mapping):
        raise ValueError("catalog: must be a JSON object with the entries under 'models'")
    stray = sorted(str(k) for k in data if k not in ("models", "_comment"))
    if stray:
        raise ValueError(
            f"catalog: unknown top-level key(s) {', '.join(stray)}: entries go under 'models'"
        )
    models = data.get("models", {})
    if not isinstance(models, Mapping):
        raise ValueError("catalog: 'models' must be an object")
    out: dict[str, ModelInfo] = {}
    for key, raw in models.items():
        if not isinstance(raw, Mapping):
            raise ValueError(f"catalog: entry {key!r} must be an object")
        unknown = sorted(str(f) for f in raw if f not in _FIELDS)
        if unknown:
            raise ValueError(
                f"catalog: {key!r} has unknown field(s) {', '.join(unknown)}"
                f" (known: {', '.join(sorted(_FIELDS - {'_comment'}))})"
            )
        for name in _INT_FIELDS:
            value = raw.get(name, 0)
            if (
                isinstance(value, bool)
                or not isinstance(value, int)
                or not 0 <= value <= MAX_LIMIT_TOKENS
            ):
                raise ValueError(
                    f"catalog: {key!r} {name} must be a whole number of tokens,"
                    f" 0 (unknown) to {MAX_LIMIT_TOKENS}, got {value!r}"
                )
        images = raw.get("images", True)
        if not isinstance(images, bool):
            raise ValueError(f"catalog: {key!r} images must be true or false, got {images!r}")
        factor = raw.get("token_factor", 1.0)
        if (
            isinstance(factor, bool)
            or not isinstance(factor, int | float)
            or not 0 < factor <= MAX_TOKEN_FACTOR
        ):
            raise ValueError(
                f"catalog: {key!r} token_factor must be a number above 0, at most "
                f"{MAX_TOKEN_FACTOR:g}, got {factor!r}"
            )
        family = raw.get("family", "")
        if not isinstance(family, str):
            raise ValueError(f"catalog: {key!r} family must be a string, got {family!r}")
        tokenizer = raw.get("tokenizer", UNKNOWN_TOKENIZER)
        if tokenizer not in {*TOKENIZER_TABLES, UNKNOWN_TOKENIZER}:
            raise ValueError(f"catalog: {key!r} has unknown tokenizer {tokenizer!r}")
        out[str(key).lower()] = ModelInfo(
            key=str(key).lower(),
            family=family or family_of(str(key)),
            context_window=raw.get("context_window", 0),
            max_output_tokens=raw.get("max_output", 0),
            max_input_tokens=raw.get("max_input", 0),
            accepts_images=images,
            tokenizer=str(tokenizer),
            token_factor=float(factor),
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
