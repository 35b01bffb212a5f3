"""What an image sent costs in its route model's tokens, as the provider documents it for
that model (R-EST-3). Pure: dimensions and a model name in, a token count out.

OpenAI's vision guide ("Calculating costs", platform.openai.com/docs/guides/images-vision)
gives two rules, each model under one of them:
- tiles: the image is scaled to fit a 2048-pixel square, then down to a shortest side of
  768, and costs `base` plus `tile` tokens a 512-pixel square that covers it (the high
  detail a request's `detail: auto` may pick, the most it counts): GPT-4o, 4.1 and 4.5
  85 + 170 ("1024 x 1024 ... 765 tokens", "2048 x 4096 ... 1105 tokens"), GPT-4o mini
  2833 + 5667, GPT-5 and gpt-5-chat-latest 70 + 140, o1, o1-pro and o3 75 + 150,
  computer-use-preview 65 + 129;
- patches: the 32-pixel squares that cover the image, at most 1,536 (a larger image is
  scaled down to fit), times a multiplier: gpt-4.1-mini and gpt-5-mini 1.62,
  gpt-4.1-nano and gpt-5-nano 2.46, o4-mini 1.72 (1024 x 1024: 1,024 patches; 1800 x
  2400: 33 x 44 = 1,452 patches).
Measurements reported on OpenAI's forum bill gpt-5-mini at 1.2 and gpt-5-nano at 1.5 a
patch; the documented, higher figures are kept: an estimate under what the provider
reads is the harmful direction (the budget decides when to compact).

Gemini (ai.google.dev/gemini-api/docs/tokens, Gemini 2.0 and later): "image inputs with
both dimensions <=384 pixels are counted as 258 tokens. Images larger in one or both
dimensions are cropped and scaled as needed into tiles of 768x768 pixels, each counted
as 258 tokens"; how the tiles are cut is not stated, so an image counts the 768-pixel
tiles that cover it at its own size. Gemini 3 models count by `media_resolution`
instead: the default for an image is high, at most 1,120 tokens
(ai.google.dev/gemini-api/docs/media-resolution; Vertex AI's image understanding page:
"Default resolution tokens: 1120"), which ctxcc's bodies never change.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TileRule:
    """OpenAI's high-detail tiles: `base` plus `tile` tokens a 512-pixel tile."""

    base: int
    tile: int


@dataclass(frozen=True, slots=True)
class PatchRule:
    """OpenAI's 32-pixel patches (at most 1,536) times a multiplier, in hundredths so
    that the count is exact integer arithmetic (1.62: 162)."""

    hundredths: int


@dataclass(frozen=True, slots=True)
class GeminiTiles:
    """Gemini 2.x: 258 tokens up to 384 pixels a side, else 258 a 768-pixel tile."""


@dataclass(frozen=True, slots=True)
class FlatRule:
    """The same count for every image (Gemini 3's default media resolution)."""

    tokens: int


ImageRule = TileRule | PatchRule | GeminiTiles | FlatRule

# OpenAI's high-detail geometry, common to every tile model.
OPENAI_IMAGE_FIT = 2_048
OPENAI_IMAGE_SHORT_SIDE = 768
OPENAI_IMAGE_TILE = 512
# After fitting, an image is at most 768 x 2048: 2 x 4 tiles.
OPENAI_MOST_TILES = 8
# GPT-4o's figures: also those of a model the guide does not name.
OPENAI_DEFAULT = TileRule(85, 170)

OPENAI_PATCH = 32
OPENAI_MOST_PATCHES = 1_536

# What OpenAI's guide states per model. A route's model takes the longest key that
# starts one of its name's segments and ends there or before a "-", ":" or "@" (a dated
# snapshot, a fine-tune): "openai/gpt-4o-mini-2024-07-18" is gpt-4o-mini, "gpt-5.1" none
# of them (it keeps the default).
OPENAI_RULES: dict[str, ImageRule] = {
    "gpt-4o": OPENAI_DEFAULT,
    "gpt-4.1": OPENAI_DEFAULT,
    "gpt-4.5": OPENAI_DEFAULT,
    "gpt-4o-mini": TileRule(2_833, 5_667),
    "gpt-5": TileRule(70, 140),
    "gpt-5-chat-latest": TileRule(70, 140),
    "o1": TileRule(75, 150),
    "o1-pro": TileRule(75, 150),
    "o3": TileRule(75, 150),
    "computer-use-preview": TileRule(65, 129),
    "gpt-4.1-mini": PatchRule(162),
    "gpt-4.1-nano": PatchRule(246),
    "gpt-5-mini": PatchRule(162),
    "gpt-5-nano": PatchRule(246),
    "o4-mini": PatchRule(172),
}
_OPENAI_KEYS = sorted(OPENAI_RULES, key=len, reverse=True)

GEMINI_IMAGE_TOKENS = 258
GEMINI_TILE = 768
# Gemini states no largest image, and its tiles follow the image's size: a side is taken
# at most at this, the most a JPEG, GIF or WebP header can state (a PNG's may state 2^32 -
# 1, which no provider decodes). Unbounded, an image's stated 4,000,000,000 x
# 4,000,000,000 counted 7e15 tokens, past the 32-bit counts of a view, and the compile
# failed to encode at every step of the session; bounded, one image counts at most
# 86 x 86 tiles, 1,908,168 tokens.
GEMINI_MOST_SIDE = 65_535
GEMINI_3_DEFAULT = FlatRule(1_120)
# "gemini-2.5-flash", "models/gemini-2.0-flash-001", "google/gemini-3-pro-preview",
# "gemini-3.1-pro-preview": the major version after "gemini-".
_GEMINI_VERSION = re.compile(r"(?:^|[^a-z0-9])gemini-(\d+)(?![0-9])")

# A patch count that a float lands on within this of a whole number is that number: a
# 1914 x 2552 image (the 3:4 of OpenAI's 1800 x 2400 example) is 33 x 44 patches, where
# the floats give 33.0 x 44.00000000000001.
_EPSILON = 1e-6


def _segment_key(name: str, keys: list[str]) -> str | None:
    for key in keys:
        at = name.find(key)
        while at >= 0:
            end = at + len(key)
            starts = at == 0 or not name[at - 1].isalnum()
            ends = end == len(name) or name[end] in "-:@"
            if starts and ends:
                return key
            at = name.find(key, at + 1)
    return None


def openai_rule(model: str) -> ImageRule:
    """The rule OpenAI's guide states for `model`; GPT-4o's for one it does not name."""
    key = _segment_key(model.strip().lower(), _OPENAI_KEYS)
    return OPENAI_RULES[key] if key is not None else OPENAI_DEFAULT


def openai_named(model: str) -> bool:
    """Whether OpenAI's guide names `model` (a rule of its own, not the default)."""
    return _segment_key(model.strip().lower(), _OPENAI_KEYS) is not None


def gemini_rule(model: str) -> ImageRule | None:
    """The rule Gemini's docs state for `model`'s generation (2 or 3); None for another
    (or none named): the caller keeps its own rule."""
    found = _GEMINI_VERSION.search(model.strip().lower())
    version = int(found.group(1)) if found is not None else 0
    if version == 2:
        return GeminiTiles()
    if version == 3:
        return GEMINI_3_DEFAULT
    return None


def _tile_tokens(rule: TileRule, width: int, height: int) -> int:
    w, h = float(width), float(height)
    if max(w, h) > OPENAI_IMAGE_FIT:
        scale = OPENAI_IMAGE_FIT / max(w, h)
        w, h = w * scale, h * scale
    if min(w, h) > OPENAI_IMAGE_SHORT_SIDE:
        scale = OPENAI_IMAGE_SHORT_SIDE / min(w, h)
        w, h = w * scale, h * scale
    tiles = math.ceil(w / OPENAI_IMAGE_TILE) * math.ceil(h / OPENAI_IMAGE_TILE)
    return rule.base + rule.tile * tiles


def openai_patches(width: int, height: int) -> int:
    """The 32-pixel patches OpenAI counts for an image: those that cover it, or, past
    1,536, those of the image scaled down by sqrt(1536 * 32^2 / (w * h)) and further so
    that its tighter side is a whole number of patches (the guide's 1800 x 2400: shrink
    0.603 gives 33.94 x 45.25 patches, times 33 / 33.94 gives 33 x 44 = 1,452), at most
    1,536."""
    raw = math.ceil(width / OPENAI_PATCH) * math.ceil(height / OPENAI_PATCH)
    if raw <= OPENAI_MOST_PATCHES:
        return raw
    shrink = math.sqrt(OPENAI_MOST_PATCHES * OPENAI_PATCH**2 / (width * height))
    sides = (width * shrink / OPENAI_PATCH, height * shrink / OPENAI_PATCH)
    # A side under one patch (a strip thinner than the scaled image) stays one patch.
    fit = min((math.floor(s) / s for s in sides if s >= 1), default=1.0)
    w, h = (max(1, math.ceil(s * fit - _EPSILON)) for s in sides)
    return min(OPENAI_MOST_PATCHES, w * h)


def _patch_tokens(rule: PatchRule, width: int, height: int) -> int:
    return -(-openai_patches(width, height) * rule.hundredths // 100)


def _gemini_tiles(width: int, height: int) -> int:
    # An image of at most 384 pixels a side (258 tokens) is one tile.
    width, height = min(width, GEMINI_MOST_SIDE), min(height, GEMINI_MOST_SIDE)
    tiles = math.ceil(width / GEMINI_TILE) * math.ceil(height / GEMINI_TILE)
    return GEMINI_IMAGE_TOKENS * tiles


def rule_tokens(rule: ImageRule, width: int, height: int) -> int:
    """What an image of `width` x `height` pixels (both above 0) costs under `rule`."""
    if isinstance(rule, TileRule):
        return _tile_tokens(rule, width, height)
    if isinstance(rule, PatchRule):
        return _patch_tokens(rule, width, height)
    if isinstance(rule, GeminiTiles):
        return _gemini_tiles(width, height)
    return rule.tokens


def rule_most(rule: ImageRule) -> int | None:
    """The most `rule` counts for one image of any size; None: no bound is stated
    (Gemini 2.x tiles an image at its own size, up to GEMINI_MOST_SIDE a side)."""
    if isinstance(rule, TileRule):
        return rule.base + rule.tile * OPENAI_MOST_TILES
    if isinstance(rule, PatchRule):
        return -(-OPENAI_MOST_PATCHES * rule.hundredths // 100)
    if isinstance(rule, GeminiTiles):
        return None
    return rule.tokens
