"""What an image costs on a route's model (R-EST-3), against the providers' own documented
figures and examples (server/compiler/image_cost.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from server.compiler.image_cost import (
    OPENAI_DEFAULT,
    OPENAI_RULES,
    FlatRule,
    GeminiTiles,
    ImageRule,
    PatchRule,
    TileRule,
    gemini_rule,
    openai_patches,
    openai_rule,
    rule_most,
    rule_tokens,
)
from server.compiler.projection import (
    MODEL_IMAGE_TOKENS,
    PROJECTION,
    ImagePolicy,
    as_projected,
    image_tokens,
)
from server.domain.model import ArtifactRef


def _ref(width: int, height: int) -> ArtifactRef:
    return ArtifactRef("a", "image/png", 100, "0" * 64, width, height)


def test_the_projection_that_counts_by_model_is_the_current_one() -> None:
    # 13 (a call block a checkpoint splits is shown whole) counts images as 12 did.
    assert MODEL_IMAGE_TOKENS == 12 and PROJECTION >= MODEL_IMAGE_TOKENS


@pytest.mark.parametrize(
    ("width", "height", "tokens"),
    [
        # OpenAI's vision guide, "Calculating costs", tile models: "A 1024 x 1024 square
        # image in detail: high mode costs 765 tokens" (1024 is below 2048, scaled down
        # to 768 x 768, four 512-pixel tiles: 170 * 4 + 85).
        (1_024, 1_024, 765),
        # "A 2048 x 4096 image in detail: high mode costs 1105 tokens" (scaled to 1024 x
        # 2048, then to 768 x 1536: six tiles, 170 * 6 + 85).
        (2_048, 4_096, 1_105),
    ],
)
def test_gpt_4o_counts_openais_own_tile_examples(width: int, height: int, tokens: int) -> None:
    assert rule_tokens(openai_rule("gpt-4o"), width, height) == tokens
    assert image_tokens(_ref(width, height), "openai-chat", model="gpt-4o") == tokens


@pytest.mark.parametrize(
    ("model", "base", "tile"),
    [
        # The guide's table of tile models: base tokens, tile tokens.
        ("gpt-4o", 85, 170),
        ("gpt-4.1", 85, 170),
        ("gpt-4.5-preview", 85, 170),
        ("gpt-4o-mini", 2_833, 5_667),
        ("gpt-5", 70, 140),
        ("gpt-5-chat-latest", 70, 140),
        ("o1", 75, 150),
        ("o1-pro", 75, 150),
        ("o3", 75, 150),
        ("computer-use-preview", 65, 129),
    ],
)
def test_each_tile_model_counts_its_documented_base_and_tile(
    model: str, base: int, tile: int
) -> None:
    """A 1024x1024 image is four tiles on every tile model: base + 4 tiles."""
    assert openai_rule(model) == TileRule(base, tile)
    assert image_tokens(_ref(1_024, 1_024), "openai-responses", model=model) == base + 4 * tile
    # One tile for a 16x16 icon (high detail: no 85-token low-detail shortcut).
    assert image_tokens(_ref(16, 16), "openai-chat", model=model) == base + tile


@pytest.mark.parametrize(
    ("width", "height", "patches"),
    [
        # The guide's patch examples: "1024 x 1024 ... (1024 + 32 - 1) // 32 = 32 patches
        # ... 32 * 32 = 1024, below the cap of 1536".
        (1_024, 1_024, 1_024),
        # "1800 x 2400 ... 57 * 75 = 4275 patches ... shrink factor is sqrt(1536 * 32^2 /
        # (1800 * 2400)) = 0.603 ... 33 / 33.94 = 0.97 to fit the width in a whole
        # number of patches ... 33 * 44 = 1452".
        (1_800, 2_400, 1_452),
        (2_400, 1_800, 1_452),  # the same turned: the tighter side is now the height
        # The same 3:4, where floats land a hair above 44 patches: still 33 x 44.
        (1_914, 2_552, 1_452),
        (2_726, 1_798, 1_457),  # 47 x 31, the floats 47.00000000000001 x 31.0
        (32, 32, 1),
        (33, 32, 2),
        (2_048, 768, 1_536),  # 64 x 24: exactly the cap
        (4_000, 4_000, 1_521),  # 39.19 patches a side: 39 x 39
        (100_000, 1, 1_536),  # a one-pixel line: capped, never zero
    ],
)
def test_openais_patch_count_follows_its_worked_examples(
    width: int, height: int, patches: int
) -> None:
    assert openai_patches(width, height) == patches


@pytest.mark.parametrize(
    ("model", "hundredths", "at_1024", "at_1800x2400"),
    [
        # The guide's multipliers; 1,024 and 1,452 patches times each, rounded up.
        ("gpt-4.1-mini", 162, 1_659, 2_353),  # 1024 * 1.62 = 1658.88; 1452 * 1.62 = 2352.24
        ("gpt-4.1-nano", 246, 2_520, 3_572),  # 2519.04; 3571.92
        ("o4-mini", 172, 1_762, 2_498),  # 1761.28; 2497.44
        ("gpt-5-mini", 162, 1_659, 2_353),
        ("gpt-5-nano", 246, 2_520, 3_572),
    ],
)
def test_each_patch_model_counts_its_documented_multiplier(
    model: str, hundredths: int, at_1024: int, at_1800x2400: int
) -> None:
    assert openai_rule(model) == PatchRule(hundredths)
    assert image_tokens(_ref(1_024, 1_024), "openai-chat", model=model) == at_1024
    assert image_tokens(_ref(1_800, 2_400), "openai-chat", model=model) == at_1800x2400


@pytest.mark.parametrize(
    ("model", "rule"),
    [
        # Provider prefixes, dated snapshots and fine-tunes name the model they extend.
        ("openai/gpt-4o-mini", TileRule(2_833, 5_667)),
        ("gpt-4o-mini-2024-07-18", TileRule(2_833, 5_667)),
        ("ft:gpt-4o-mini-2024-07-18:acme::9xYz", TileRule(2_833, 5_667)),
        ("GPT-4.1-Mini-2025-04-14", PatchRule(162)),
        ("o4-mini-2025-04-16", PatchRule(172)),
        ("gpt-5-2025-08-07", TileRule(70, 140)),
        ("gpt-4o-2024-08-06", OPENAI_DEFAULT),
        # Models the guide does not name keep GPT-4o's figures: neither gpt-5's for
        # gpt-5.1 nor o3's for a name that merely contains it.
        ("gpt-5.1", OPENAI_DEFAULT),
        ("chatgpt-4o-latest", OPENAI_DEFAULT),
        ("foo3", OPENAI_DEFAULT),
        ("house-model", OPENAI_DEFAULT),
        ("", OPENAI_DEFAULT),
    ],
)
def test_a_routes_model_name_finds_its_rule(model: str, rule: object) -> None:
    assert openai_rule(model) == rule


@pytest.mark.parametrize(
    ("width", "height", "tokens"),
    [
        # Gemini's token guide: "image inputs with both dimensions <=384 pixels are
        # counted as 258 tokens".
        (16, 16, 258),
        (384, 384, 258),
        # "Images larger in one or both dimensions are cropped and scaled as needed into
        # tiles of 768x768 pixels, each counted as 258 tokens": the tiles that cover it.
        (385, 384, 258),
        (768, 768, 258),
        (1_000, 1_000, 4 * 258),
        (1_536, 768, 2 * 258),
        (1_537, 768, 3 * 258),
        (64, 2_048, 3 * 258),
        (4_000, 3_000, 24 * 258),
    ],
)
def test_gemini_2_counts_258_or_its_768_pixel_tiles(width: int, height: int, tokens: int) -> None:
    for model in ("gemini-2.5-pro", "gemini-2.0-flash", "models/gemini-2.5-flash-lite"):
        assert gemini_rule(model) == GeminiTiles()
        assert image_tokens(_ref(width, height), "gemini", model=model) == tokens


@pytest.mark.parametrize("side", [65_535, 65_536, 2**31 - 1, 2**32 - 1])
def test_gemini_2_counts_a_side_at_most_at_the_largest_a_header_states(side: int) -> None:
    """A PNG header (or a client's ArtifactHeader) may state 2^32 - 1 pixels a side: its
    tiles at that size were 7e15 tokens, past a view's 32-bit counts."""
    assert rule_tokens(GeminiTiles(), side, side) == 86 * 86 * 258 == 1_908_168
    assert rule_tokens(GeminiTiles(), side, 1) == 86 * 258


def test_gemini_3_counts_its_default_media_resolution() -> None:
    """Gemini 3's media resolution guide: the default for images is high, at most 1,120
    tokens (Vertex AI: "Default resolution tokens: 1120"), whatever the image's size."""
    for model in ("gemini-3-pro-preview", "google/gemini-3-flash-preview", "gemini-3.1-pro"):
        assert gemini_rule(model) == FlatRule(1_120)
        for width, height in ((16, 16), (1_024, 1_024), (4_000, 3_000)):
            assert image_tokens(_ref(width, height), "gemini", model=model) == 1_120


def test_a_gemini_model_of_another_generation_keeps_the_protocols_rule() -> None:
    """Neither rule is stated for Gemini 1.5 or an unversioned name: at least 258, the area
    rule above (as projection 10 counted every Gemini route)."""
    for model in ("gemini-1.5-pro", "gemini-exp-1206", "house-gemini", "gemini-20-ultra"):
        assert gemini_rule(model) is None
        assert image_tokens(_ref(16, 16), "gemini", model=model) == 258
        assert image_tokens(_ref(1_000, 1_000), "gemini", model=model) == 1_334


def test_a_model_counts_by_its_own_providers_rule_whatever_the_protocol() -> None:
    """A gateway's OpenAI-compatible endpoint serving Claude or Gemini (and an
    Anthropic-compatible one serving GPT) reaches a model that reads the image as its own
    provider documents: GPT-4o's tiles counted a 1024x1024 image at 765 for Claude, which
    reads 1,399. A model no rule names keeps its protocol's rule."""
    ref = _ref(1_024, 1_024)
    assert image_tokens(ref, "openai-chat", model="claude-sonnet-4-5") == 1_399
    assert image_tokens(ref, "openai-chat", model="anthropic/claude-3.7-sonnet") == 1_399
    assert image_tokens(ref, "openai-chat", model="gemini-2.5-pro") == 1_032
    assert image_tokens(ref, "openai-responses", model="google/gemini-3-pro") == 1_120
    assert image_tokens(ref, "anthropic-messages", model="gpt-4o-mini") == 25_501
    assert image_tokens(ref, "anthropic-messages", model="gemini-3-pro") == 1_120
    assert image_tokens(ref, "gemini", model="gpt-4.1-mini") == 1_659
    # Not named: the protocol's rule.
    assert image_tokens(ref, "openai-chat", model="mistral-large") == 765
    assert image_tokens(ref, "anthropic-messages", model="my-model") == 1_399
    assert image_tokens(ref, "gemini", model="gemma-3") == 1_399
    # Recorded before projection 12: by protocol alone, as counted then.
    assert image_tokens(ref, "openai-chat", 11, "claude-sonnet-4-5") == 765


def test_compiles_recorded_before_projection_12_count_as_they_did() -> None:
    """A compile recorded at projection 10 or 11 counted GPT-4o's tiles on every OpenAI
    route and at least 258 on every Gemini route; before 10 the area rule everywhere.
    Rebuilt, it counts so again, its route's model notwithstanding."""
    ref = _ref(1_024, 1_024)
    for projection in (10, 11):
        assert image_tokens(ref, "openai-chat", projection, "gpt-4o-mini") == 765
        assert image_tokens(ref, "openai-chat", projection, "gpt-4.1-mini") == 765
        assert image_tokens(ref, "gemini", projection, "gemini-3-pro-preview") == 1_399
    assert image_tokens(ref, "openai-chat", 9, "gpt-4o-mini") == 1_399
    assert image_tokens(ref, "openai-chat", 12, "gpt-4o-mini") == 25_501
    # The policy a compile projects with carries the model from projection 12 only.
    policy = ImagePolicy()
    for projection, model in ((11, ""), (12, "gpt-4o-mini")):
        seen = as_projected(policy, (), None, projection, "openai-chat", "gpt-4o-mini")
        assert (seen.token_protocol, seen.token_model) == ("openai-chat", model)


def test_an_image_of_unknown_size_counts_the_most_its_model_may() -> None:
    """1,600 as before, or the most the model's rule counts for one image where that is
    more: GPT-4o mini's 8 tiles (768 x 2048 after fitting), 1,536 patches times 2.46."""
    unknown = _ref(0, 0)
    assert image_tokens(unknown, "openai-chat", model="gpt-4o") == 1_600
    assert image_tokens(unknown, "openai-chat", model="gpt-4o-mini") == 2_833 + 8 * 5_667
    assert image_tokens(unknown, "openai-chat", model="gpt-4.1-nano") == 3_779
    assert image_tokens(unknown, "gemini", model="gemini-3-pro-preview") == 1_600
    assert image_tokens(unknown, "gemini", model="gemini-2.5-pro") == 1_600


_RULES = sorted({*OPENAI_RULES.values(), FlatRule(1_120)}, key=repr)


@given(
    st.sampled_from(_RULES),
    st.integers(min_value=1, max_value=20_000),
    st.integers(min_value=1, max_value=20_000),
)
def test_no_image_counts_more_than_its_rules_most(rule: ImageRule, width: int, height: int) -> None:
    most = rule_most(rule)
    assert most is not None
    assert 0 < rule_tokens(rule, width, height) <= most
    assert 1 <= openai_patches(width, height) <= 1_536
