"""Token counters behind the compiler's TokenCounter port, chosen per tokenizer family.

`o200k_base` (GPT-4o, o-series, GPT-4.1, GPT-5) and `cl100k_base` (GPT-4, GPT-3.5, and
times a catalog factor the families without a tokenizer of their own) are counted with
the `bpe-openai` package, from ranks inside it, never from the network. Its bundled rank
files are byte-identical to the files tiktoken pins by sha256 and its token ids equal
tiktoken's (tests/unit/test_o200k.py). It is used rather than tiktoken because its BPE is
linear in the text: tiktoken needs 0.6-3 s of CPU for one 1 MiB word (its merge loop is
quadratic in a pre-token's length), bpe-openai ~15 ms. `ClaudeCounter` counts Anthropic
models with the Claude vocabulary Anthropic published (65,000 tokens, shipped in
`anthropic` SDK releases up to 0.38 as `tokenizer.json`), embedded in the
`anthropic-tokenizer` package: its vocabulary and ids equal the published file's
(tests/unit/test_claude_tokenizer.py). Claude 3 and later tokenize differently, but that
vocabulary follows their counts across content kinds far better than cl100k_base does;
the route model learns the rest. Other families use cl100k_base times a catalog factor,
refined online per route by the route model. `CharClassCounter` is the conservative
estimator of R-EST-2 for families without a known tokenizer.
"""

from __future__ import annotations

import bisect
import functools
import importlib.machinery
import importlib.util
import logging
import math
import re
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from server.adapters.charclass_table import CJK_SINGLES
from server.compiler.textscan import LONE_SURROGATE
from server.compiler.tokens import (
    CHARCLASS_BY_SCRIPT,
    CHARCLASS_RARE,
    CHARCLASS_SPLIT_WORDS,
    COUNTING,
    TokenCounter,
)
from server.domain.catalog import ModelInfo

_CACHE_MIN_CHARS = 24
_CACHE_SIZE = 8192


# Weights of non-ASCII characters by script, against cl100k_base (R-EST-2): (first code
# point, class, weight), each range running to the next one's start. A script cl100k_base
# splits into bytes gets up to its UTF-8 length (2 or 3, 4 above U+FFFF): Armenian,
# combining marks (decomposed accents: macOS file names, NFD text), Tibetan, Ethiopic,
# Yi, private use. The letters of the big alphabets (Latin-1, Greek, Cyrillic, Hebrew,
# Arabic) weigh what their prose costs; the rarer ranges around them what a run of
# their characters costs, since cl100k_base has no merges for them (COUNTING 3: before,
# Latin Extended-A and -B and the Cyrillic Supplement weighed like Latin-1 letters, 0.8,
# where cl100k_base spends 1.8-2 tokens a character: Czech prose was undercounted by 24%,
# a run of such letters by 60%).
_SCRIPTS_3: tuple[tuple[int, str, float], ...] = (
    (0x0080, "o", 2.0),  # C1 controls, Latin-1 symbols
    (0x00C0, "o", 0.8),  # Latin-1 letters
    (0x0100, "o", 1.8),  # Latin Extended-A (Czech, Polish, Turkish, Baltic letters)
    (0x0180, "o", 2.0),  # Latin Extended-B, IPA, spacing modifiers, combining marks
    (0x0370, "o", 1.3),  # Greek and Coptic
    (0x0400, "o", 0.8),  # Cyrillic
    (0x0460, "o", 2.0),  # historic Cyrillic, Cyrillic Supplement
    (0x0530, "o", 2.1),  # Armenian
    (0x0590, "o", 2.0),  # Hebrew points and cantillation marks
    (0x05D0, "o", 1.3),  # Hebrew letters
    (0x0600, "o", 1.0),  # Arabic (Urdu's letters take more than Arabic's)
    (0x064B, "o", 2.0),  # Arabic vowel marks (harakat)
    (0x0660, "o", 1.0),  # Arabic-Indic digits, Persian and Urdu letters
    (0x06D4, "o", 2.0),  # Arabic Quranic marks, extended digits
    (0x0700, "o", 2.0),  # Syriac, Thaana, NKo
    (0x0800, "o", 3.0),  # Samaritan, Mandaic, Arabic Extended
    (0x0900, "o", 2.0),  # Indic scripts
    (0x0D80, "o", 2.2),  # Sinhala
    (0x0E00, "o", 2.0),  # Thai
    (0x0E80, "o", 2.4),  # Lao
    (0x0F00, "o", 3.0),  # Tibetan
    (0x1000, "o", 2.2),  # Myanmar, Georgian
    (0x1100, "o", 3.0),  # Hangul Jamo, Ethiopic, Cherokee, syllabics, Ogham, Runic, ...
    (0x1780, "o", 2.2),  # Khmer
    (0x1800, "o", 3.0),  # Mongolian, ..., combining marks extended and supplement
    (0x1E00, "o", 2.4),  # Latin Extended Additional (Vietnamese)
    (0x1F00, "o", 3.0),  # Greek Extended (polytonic Greek)
    (0x2000, "o", 2.0),  # general punctuation, super- and subscripts, currency
    (0x20D0, "o", 3.0),  # combining marks for symbols
    (0x2100, "o", 2.0),  # letterlike symbols, number forms
    (0x2190, "o", 2.6),  # arrows, mathematical operators
    (0x2300, "o", 3.0),  # technical symbols, control pictures, OCR, enclosed
    (0x2500, "o", 2.0),  # box drawing, block elements, geometric shapes
    (0x2600, "o", 2.5),  # miscellaneous symbols
    (0x2700, "o", 2.0),  # dingbats, mathematical symbols A
    (0x2800, "o", 3.0),  # Braille, supplemental arrows and operators, ...
    (0x2C00, "o", 3.0),  # Glagolitic, Coptic, Tifinagh, ...
    (0x2E80, "c", 3.0),  # CJK radicals
    (0x3000, "c", 1.35),  # CJK symbols and punctuation
    (0x3040, "c", 2.0),  # kana (the one-token ones: _CJK_SINGLES)
    (0x3100, "c", 3.0),  # Bopomofo, compatibility Jamo, enclosed, CJK Extension A, ...
    (0x4E00, "c", 3.0),  # CJK unified ideographs (the one-token ones: _CJK_SINGLES)
    (0xA000, "o", 3.0),  # Yi, Vai, ...
    (0xAC00, "c", 2.7),  # Hangul syllables (the one-token ones: _CJK_SINGLES)
    (0xD7B0, "o", 3.0),  # Jamo Extended-B
    (0xD800, "o", 2.0),  # surrogates (counted as U+FFFD)
    (0xE000, "o", 3.0),  # private use
    (0xF900, "c", 3.0),  # CJK compatibility ideographs
    (0xFB00, "o", 3.0),  # alphabetic and Arabic presentation forms
    (0xFE00, "o", 2.0),  # variation selectors
    (0xFE10, "o", 3.0),  # vertical, combining half, CJK compatibility, small forms, ...
    (0xFF00, "o", 2.0),  # half- and full-width forms, specials
    (0x10000, "o", 4.0),  # historic scripts
    (0x1D000, "o", 3.2),  # musical and mathematical symbols
    (0x1D800, "o", 4.0),
    (0x1F000, "o", 3.2),  # emoji and other symbols
    (0x20000, "o", 4.0),  # CJK Extension B on, tags, private use
)
_SCRIPT_STARTS_3 = tuple(start for start, _, _ in _SCRIPTS_3)
_SCRIPT_WEIGHTS_3 = tuple((cls, w) for _, cls, w in _SCRIPTS_3)
# COUNTING 4: the Cyrillic letters outside the Russian alphabet's range (Ѐ-Џ, ѐ-џ:
# Serbian, Macedonian, Ukrainian and Belarusian letters) weigh what cl100k_base spends
# on them, not a Russian letter's 0.8 (Serbian prose was 0.94 of cl100k_base).
_SCRIPTS = tuple(
    sorted(
        (
            {start: (cls, w) for start, cls, w in _SCRIPTS_3}
            | {0x0400: ("o", 1.3), 0x0410: ("o", 0.8), 0x0450: ("o", 1.3)}
        ).items()
    )
)
_SCRIPT_STARTS = tuple(start for start, _ in _SCRIPTS)
_SCRIPT_WEIGHTS = tuple(found for _, found in _SCRIPTS)
# An ASCII letter after a letter of these ranges (Latin-1, Latin Extended-A and -B, IPA,
# Latin Extended Additional) begins a new piece of the word, as cl100k_base has few
# merges across them: weighs this more (COUNTING 4; Hungarian, Lithuanian, Esperanto
# and pinyin were 0.89-0.91 of cl100k_base, IPA 0.91).
_SPLIT_WORD = 0.6


# The weights of compiles recorded at tokens.COUNTING 2, kept to rebuild them (first code
# point, class, weight), each range running to the next one's start. A script cl100k_base
# splits into bytes gets up to its UTF-8 length (2 or 3, 4 above U+FFFF): Armenian,
# combining marks (decomposed accents: macOS file names, NFD text), Tibetan, Ethiopic,
# Yi, private use.
_SCRIPTS_2: tuple[tuple[int, str, float], ...] = (
    (0x0080, "o", 2.0),  # C1 controls, Latin-1 symbols
    (0x00C0, "o", 0.8),  # Latin-1 letters, Latin Extended-A and -B
    (0x0250, "o", 2.0),  # IPA, spacing modifiers, combining diacritical marks
    (0x0370, "o", 1.3),  # Greek and Coptic
    (0x0400, "o", 0.8),  # Cyrillic
    (0x0530, "o", 2.1),  # Armenian
    (0x0590, "o", 1.3),  # Hebrew
    (0x0600, "o", 1.0),  # Arabic (Urdu's letters take more than Arabic's)
    (0x0700, "o", 2.0),  # Syriac, Thaana, NKo
    (0x0800, "o", 3.0),  # Samaritan, Mandaic, Arabic Extended
    (0x0900, "o", 2.0),  # Indic scripts
    (0x0D80, "o", 2.2),  # Sinhala
    (0x0E00, "o", 2.0),  # Thai, Lao
    (0x0F00, "o", 3.0),  # Tibetan
    (0x1000, "o", 2.2),  # Myanmar, Georgian
    (0x1100, "o", 3.0),  # Hangul Jamo, Ethiopic, Cherokee, syllabics, Ogham, Runic, ...
    (0x1780, "o", 2.2),  # Khmer
    (0x1800, "o", 3.0),  # Mongolian, ..., combining marks extended and supplement
    (0x1E00, "o", 2.0),  # Latin Extended Additional (Vietnamese), Greek Extended
    (0x2000, "o", 2.0),  # punctuation, symbols, arrows, box drawing, maths
    (0x2C00, "o", 3.0),  # Glagolitic, Coptic, Tifinagh, ...
    (0x2E80, "c", 3.0),  # CJK radicals
    (0x3000, "c", 1.35),  # CJK symbols and punctuation
    (0x3040, "c", 2.0),  # kana (the one-token ones: _CJK_SINGLES)
    (0x3100, "c", 3.0),  # Bopomofo, compatibility Jamo, enclosed, CJK Extension A, ...
    (0x4E00, "c", 3.0),  # CJK unified ideographs (the one-token ones: _CJK_SINGLES)
    (0xA000, "o", 3.0),  # Yi, Vai, ...
    (0xAC00, "c", 2.7),  # Hangul syllables (the one-token ones: _CJK_SINGLES)
    (0xD7B0, "o", 3.0),  # Jamo Extended-B
    (0xD800, "o", 2.0),  # surrogates (counted as U+FFFD)
    (0xE000, "o", 3.0),  # private use
    (0xF900, "c", 3.0),  # CJK compatibility ideographs
    (0xFB00, "o", 2.0),  # presentation forms, half- and full-width forms, specials
    (0x10000, "o", 4.0),  # historic scripts
    (0x1D000, "o", 3.2),  # musical and mathematical symbols
    (0x1D800, "o", 4.0),
    (0x1F000, "o", 3.2),  # emoji and other symbols
    (0x20000, "o", 4.0),  # CJK Extension B on, tags, private use
)
_SCRIPT_STARTS_2 = tuple(start for start, _, _ in _SCRIPTS_2)
_SCRIPT_WEIGHTS_2 = tuple((cls, w) for _, cls, w in _SCRIPTS_2)
# Kana, ideographs and Hangul syllables cl100k_base encodes as one token each.
_CJK_SINGLES = frozenset(CJK_SINGLES)
_CJK_SINGLE = ("c", 1.0)
# ASCII whitespace that cl100k_base merges only with itself (and "\r" with "\n").
_ODD_SPACE = frozenset("\t\r\x0b\x0c")


def _script_lookup(
    starts: tuple[int, ...], weights: tuple[tuple[str, float], ...]
) -> tuple[dict[str, tuple[str, float]], Callable[[str], tuple[str, float]]]:
    """For one counting version's table: the class and weight of each BMP character met
    so far (at most 65,536 entries: text repeats its script, and a dict lookup costs less
    than the search), and the search that fills it for a non-ASCII character."""
    seen: dict[str, tuple[str, float]] = {}

    def script(ch: str) -> tuple[str, float]:
        if ch in _CJK_SINGLES:
            found = _CJK_SINGLE
        else:
            found = weights[bisect.bisect_right(starts, ord(ch)) - 1]
        if ord(ch) < 0x10000:
            seen[ch] = found
        return found

    return seen, script


_SEEN, _script = _script_lookup(_SCRIPT_STARTS, _SCRIPT_WEIGHTS)
_SEEN_3, _script_3 = _script_lookup(_SCRIPT_STARTS_3, _SCRIPT_WEIGHTS_3)
_SEEN_2, _script_2 = _script_lookup(_SCRIPT_STARTS_2, _SCRIPT_WEIGHTS_2)


def charclass_count(text: str) -> int:
    """Per-character-class weights that lean high (R-EST-2), for a text that is not empty.

    Measured against cl100k_base on English, code, JSON, digits, whitespace-heavy text,
    hex ids, URLs, Simplified and Traditional Chinese, Japanese, Korean, Cyrillic, Greek,
    Armenian, Hebrew, Arabic, Urdu, Czech, Polish, Hungarian, Lithuanian, Serbian, pinyin,
    IPA, Indic scripts, Amharic, decomposed accents and emoji, they never undercount by
    more than 5% (tests/unit/test_estimation.py) and run high on prose and code. A tab,
    carriage return, vertical tab or form feed weighs a token where it does not repeat
    the character before it, and so does a space or line feed after one (cl100k_base
    merges runs of one whitespace character and `\\r\\n`, not mixed runs), a line feed
    after a carriage return nothing. An ASCII letter after a Latin letter outside ASCII
    weighs more: it begins a new piece of the word. Compiles recorded before
    tokens.COUNTING 4 are rebuilt with the weights they had (charclass_count_3,
    charclass_count_2, charclass_count_1).
    """
    total = 0.0
    prev = ""  # class of the previous character
    before = ""  # the previous character
    lower = False  # was the previous character a lower-case letter
    latin = False  # was the previous character a Latin letter outside ASCII
    for ch in text:
        o = ord(ch)
        if o < 128:
            if ch.isalpha():
                cls, w = "a", 1 / 3.3
                if lower and ch.isupper():
                    w += 1.2  # a case switch inside a word: camelCase, base64
                if latin:
                    w += _SPLIT_WORD
            elif ch.isdigit():
                cls, w = "d", 0.55
            elif ch == "\n":
                cls = "s"
                w = 0.0 if before == "\r" else 1.0 if before in _ODD_SPACE else 0.6
            elif ch == " ":
                cls, w = "s", 1.0 if before in _ODD_SPACE else 0.2
            elif ch in _ODD_SPACE:
                cls, w = "s", 0.2 if before == ch else 1.0
            elif o < 32 or o == 127:
                cls, w = "p", 1.2  # control characters: one token each, or more
            else:
                cls, w = "p", 0.9
            latin = False
        else:
            cls, w = _SEEN.get(ch) or _script(ch)
            latin = (0x00C0 <= o < 0x02B0 or 0x1E00 <= o < 0x1F00) and ch.isalpha()
        if cls != prev:
            if cls == "s":
                w += 0.3  # a whitespace run often stands alone before digits or symbols
            elif {cls, prev} == {"a", "d"}:
                w += 0.7  # letter/digit switches split ids, hashes and base64
        total += w
        prev = cls
        before = ch
        lower = ch.islower() and o < 128
    return max(1, math.ceil(total))


def charclass_count_3(text: str) -> int:
    """The weights of compiles recorded at tokens.COUNTING 3, kept to rebuild them: an
    ASCII letter after a Latin letter outside ASCII weighed as any other (Hungarian,
    Lithuanian, Esperanto, pinyin and IPA 0.89-0.91 of cl100k_base), and the Cyrillic
    letters outside the Russian alphabet's range as Russian ones (Serbian 0.94)."""
    total = 0.0
    prev = ""  # class of the previous character
    before = ""  # the previous character
    lower = False  # was the previous character a lower-case letter
    for ch in text:
        o = ord(ch)
        if o < 128:
            if ch.isalpha():
                cls, w = "a", 1 / 3.3
                if lower and ch.isupper():
                    w += 1.2  # a case switch inside a word: camelCase, base64
            elif ch.isdigit():
                cls, w = "d", 0.55
            elif ch == "\n":
                cls = "s"
                w = 0.0 if before == "\r" else 1.0 if before in _ODD_SPACE else 0.6
            elif ch == " ":
                cls, w = "s", 1.0 if before in _ODD_SPACE else 0.2
            elif ch in _ODD_SPACE:
                cls, w = "s", 0.2 if before == ch else 1.0
            elif o < 32 or o == 127:
                cls, w = "p", 1.2  # control characters: one token each, or more
            else:
                cls, w = "p", 0.9
        else:
            cls, w = _SEEN_3.get(ch) or _script_3(ch)
        if cls != prev:
            if cls == "s":
                w += 0.3  # a whitespace run often stands alone before digits or symbols
            elif {cls, prev} == {"a", "d"}:
                w += 0.7  # letter/digit switches split ids, hashes and base64
        total += w
        prev = cls
        before = ch
        lower = ch.islower() and o < 128
    return max(1, math.ceil(total))


def charclass_count_2(text: str) -> int:
    """The weights of compiles recorded at tokens.COUNTING 2, kept to rebuild them: a
    tab, a carriage return, a vertical tab or a form feed weighed like a space (0.2),
    where cl100k_base spends a token on each beside another kind of whitespace (a
    `\\r ` run 5 times, a tab-separated table of short words 1.4 times the estimate), and
    Latin Extended-A and -B, the Cyrillic Supplement, Hebrew points, Arabic vowel marks,
    arrows, operators and presentation forms had their alphabets' or their blocks'
    lower weights (Czech prose 0.76 of cl100k_base, runs of such characters 0.4)."""
    total = 0.0
    prev = ""  # class of the previous character
    lower = False  # was the previous character a lower-case letter
    for ch in text:
        o = ord(ch)
        if o < 128:
            if ch.isalpha():
                cls, w = "a", 1 / 3.3
                if lower and ch.isupper():
                    w += 1.2  # a case switch inside a word: camelCase, base64
            elif ch.isdigit():
                cls, w = "d", 0.55
            elif ch == "\n":
                cls, w = "s", 0.6
            elif ch.isspace():
                cls, w = "s", 0.2
            elif o < 32 or o == 127:
                cls, w = "p", 1.2  # control characters: one token each, or more
            else:
                cls, w = "p", 0.9
        else:
            cls, w = _SEEN_2.get(ch) or _script_2(ch)
        if cls != prev:
            if cls == "s":
                w += 0.3  # a whitespace run often stands alone before digits or symbols
            elif {cls, prev} == {"a", "d"}:
                w += 0.7  # letter/digit switches split ids, hashes and base64
        total += w
        prev = cls
        lower = ch.islower() and o < 128
    return max(1, math.ceil(total))


def charclass_count_1(text: str) -> int:
    """The weights of compiles recorded before tokens.COUNTING 2, kept to rebuild them:
    three for all non-ASCII text, which undercount cl100k_base by up to 60% on Armenian,
    decomposed accents and rare CJK characters, and by 30-40% on Traditional Chinese and
    kanji-heavy Japanese."""
    total = 0.0
    prev = ""  # class of the previous character
    lower = False  # was the previous character a lower-case letter
    for ch in text:
        o = ord(ch)
        if o < 128:
            if ch.isalpha():
                cls, w = "a", 1 / 3.3
                if lower and ch.isupper():
                    w += 1.2  # a case switch inside a word: camelCase, base64
            elif ch.isdigit():
                cls, w = "d", 0.55
            elif ch == "\n":
                cls, w = "s", 0.6
            elif ch.isspace():
                cls, w = "s", 0.2
            else:
                cls, w = "p", 0.9
        elif 0x2E80 <= o <= 0x9FFF or 0xAC00 <= o <= 0xD7AF or 0xF900 <= o <= 0xFAFF:
            cls, w = "c", 1.35
        elif o < 0x800:
            cls, w = "o", 0.8  # two-byte scripts: Latin accents, Greek, Cyrillic, Arabic
        elif o < 0x10000:
            cls, w = "o", 2.0  # other three-byte characters: symbols, Indic scripts
        else:
            cls, w = "o", 3.2  # emoji and other astral characters
        if cls != prev:
            if cls == "s":
                w += 0.3  # a whitespace run often stands alone before digits or symbols
            elif {cls, prev} == {"a", "d"}:
                w += 0.7  # letter/digit switches split ids, hashes and base64
        total += w
        prev = cls
        lower = ch.islower() and o < 128
    return max(1, math.ceil(total))


O200K = "o200k_base"
CL100K = "cl100k_base"

log = logging.getLogger("ctxcc.tokenizer")


class TokenizerTable:
    """One tokenizer's table, built on its first use and then kept for the process.

    Tables are large (o200k ~69 MB, Claude ~42 MB, cl100k ~33 MB) and a daemon usually
    serves one or two tokenizer families, so a table is built when a compile first needs
    it, unless start-up preloads it (`--preload-tokenizers`, Claude's by default). A
    build is CPU work in native code that holds the GIL for its whole call (cl100k
    ~0.03 s, o200k ~0.05-0.1 s, Claude ~0.1-0.16 s): it runs in the compile worker that
    needs it, never on the event loop. Each table has its own lock, so a Claude compile
    never waits for o200k's build, and first uses that meet build it once: the later
    ones wait for the first's result."""

    def __init__(self, name: str, build: Callable[[], Any]) -> None:
        self.name = name
        self._build = build
        self._lock = threading.Lock()
        self._value: Any = None
        self.builds = 0

    def get(self) -> Any:
        value = self._value  # once built, a count takes no lock
        if value is None:
            with self._lock:
                if self._value is None:
                    started = time.perf_counter()
                    self._value = self._build()
                    self.builds += 1
                    took = time.perf_counter() - started
                    log.info("tokenizer %s built in %.2f s", self.name, took)
                value = self._value
        return value

    @property
    def loaded(self) -> bool:
        return self._value is not None

    def forget(self) -> None:
        with self._lock:
            self._value = None


_BINDINGS = "bpe_openai._bindings"
_IMPORT_LOCK = threading.Lock()


def _bpe_bindings() -> Any:
    """bpe-openai's Rust extension, loaded without running the package's `__init__`,
    which builds Python dicts of every rank file the package ships (cl100k, o200k,
    voyage3: ~68 MB and ~0.6 s of CPU, kept for good) for a tiktoken-style API ctxcc
    does not use: the extension embeds its own ranks."""
    with _IMPORT_LOCK:
        module = sys.modules.get(_BINDINGS)
        if module is not None:  # the package was imported after all (tests, benchmarks)
            return module
        package = importlib.util.find_spec("bpe_openai")  # a top-level spec: found, not run
        if package is None or not package.submodule_search_locations:
            raise ImportError("bpe-openai is not installed")
        finder = importlib.machinery.FileFinder(
            next(iter(package.submodule_search_locations)),
            (importlib.machinery.ExtensionFileLoader, importlib.machinery.EXTENSION_SUFFIXES),
        )
        spec = finder.find_spec(_BINDINGS)
        if spec is None or spec.loader is None:
            raise ImportError("bpe-openai has no compiled _bindings module")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        # Registered, so that importing the package later reuses this module.
        sys.modules[_BINDINGS] = module
        return module


def _build_bpe(encoding: str) -> Any:
    """The Rust bindings are used directly: their `count` skips building the id list,
    and the tiktoken-style wrapper refuses texts of a million characters or more."""
    return _bpe_bindings().tokenizer_for_encoding(encoding)


def _build_claude() -> Any:
    import anthropic_tokenizer

    anthropic_tokenizer.count_tokens("")  # builds the embedded vocabulary
    return anthropic_tokenizer.count_tokens


# Keyed by the catalog's tokenizer names (TOKENIZER_TABLES).
TABLES: dict[str, TokenizerTable] = {
    "o200k": TokenizerTable("o200k", functools.partial(_build_bpe, O200K)),
    "cl100k": TokenizerTable("cl100k", functools.partial(_build_bpe, CL100K)),
    "claude": TokenizerTable("claude", _build_claude),
}
_BY_ENCODING = {O200K: TABLES["o200k"], CL100K: TABLES["cl100k"]}


def load_bpe(encoding: str) -> Any:
    """bpe-openai's tokenizer for `encoding`, from ranks inside the package (no network)."""
    return _BY_ENCODING[encoding].get()


def load_o200k() -> Any:
    return load_bpe(O200K)


def load_cl100k() -> Any:
    return load_bpe(CL100K)


def load_claude() -> Any:
    """`count_tokens` of the Claude vocabulary inside `anthropic-tokenizer` (no network:
    only its `ApiTokenizer` class talks to a server, and ctxcc never uses it)."""
    return TABLES["claude"].get()


def loaded_tokenizers() -> frozenset[str]:
    """The tokenizers whose table is built (the `ctxcc_tokenizer_loaded` gauge)."""
    return frozenset(name for name, table in TABLES.items() if table.loaded)


def preload_tokenizers(names: Iterable[str]) -> None:
    """Build these tables now (blocking), for operators who pay at start rather than on
    the first compile of each family."""
    for name in names:
        TABLES[name].get()


def forget_tokenizers() -> None:
    """Drop the built tables, so the next use loads afresh (tests prove it is offline)."""
    for table in TABLES.values():
        table.forget()


# A count holds the GIL for its whole call (~18 ms a MiB): long texts are counted in
# pieces of about this many characters, so other threads get the GIL between them.
PIECE_CHARS = 32 << 10
# A space after a non-space: a pre-token boundary of cl100k_base and o200k_base. No
# pre-token of either pattern holds a non-space followed by a space (letter, digit and
# punctuation pieces end before it; only whitespace pieces hold spaces), and the patterns
# have no lookbehind, so the pieces from here on are those of the text starting here: the
# counts of the parts add up to the count of the whole (tests/unit/test_o200k.py).
_CUT = re.compile(r"(?<=\S) ")


def pieces(text: str, size: int = PIECE_CHARS) -> Iterator[str]:
    """`text` cut at pre-token boundaries into parts of at least `size` characters (a
    part runs on to the next boundary: a 1 MiB word stays whole). Linear: each search
    starts past the last cut."""
    start = 0
    while len(text) - start > size:
        found = _CUT.search(text, start + size)
        if found is None:
            break
        yield text[start : found.start()]
        start = found.start()
    yield text[start:]


class _CachedCounter:
    """Counts of a tokenizer times a family factor, with a small LRU for long texts that
    reappear compile after compile (history messages, tool schemas)."""

    def __init__(self, name: str, factor: float = 1.0) -> None:
        self.factor = factor
        self.name = f"{name}*{factor:g}"
        self._lock = threading.Lock()
        # Keyed by the text's hash and length, not the text: a cache of 8,192 counts must
        # not keep 8,192 texts of up to 1 MiB alive. (str hashes are salted per process,
        # so no client can aim at a collision.)
        self._cache: OrderedDict[tuple[int, int], int] = OrderedDict()

    def _count(self, text: str) -> int:
        raise NotImplementedError

    def _count_any(self, text: str) -> int:
        try:
            return self._count(text)
        except UnicodeEncodeError:
            # A lone surrogate has no UTF-8 form for the tokenizer to read: a client's
            # JSON may escape one ("\ud800"), and a call's arguments are counted
            # unescaped. Counted as the replacement character, one for one.
            return self._count(LONE_SURROGATE.sub("\ufffd", text))

    def raw(self, text: str) -> int:
        if len(text) < _CACHE_MIN_CHARS:
            return self._count_any(text)
        key = (hash(text), len(text))
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        n = self._count_any(text)
        with self._lock:
            self._cache[key] = n
            if len(self._cache) > _CACHE_SIZE:
                self._cache.popitem(last=False)
        return n

    def count(self, text: str) -> int:
        if not text:
            return 0
        raw = self.raw(text)
        return raw if self.factor == 1.0 else math.ceil(raw * self.factor)


class CharClassCounter(_CachedCounter):
    """The conservative counter of models with no tokenizer table (`charclass_count`),
    cached like the others: it walks a text in Python, character by character (~5 MB/s
    here), and a compile counts every tool schema it offers at every step (a session
    with a megabyte of tools on such a route spent ~0.2 s a step on them)."""

    def __init__(self, counting: int = COUNTING) -> None:
        super().__init__("charclass")
        if counting >= CHARCLASS_SPLIT_WORDS:
            self.name, self._weigh = "charclass", charclass_count
        elif counting >= CHARCLASS_RARE:
            self.name, self._weigh = "charclass-3", charclass_count_3
        elif counting >= CHARCLASS_BY_SCRIPT:
            self.name, self._weigh = "charclass-2", charclass_count_2
        else:
            self.name, self._weigh = "charclass-1", charclass_count_1

    def _count(self, text: str) -> int:
        return self._weigh(text)


class BpeCounter(_CachedCounter):
    """Exact counts of one OpenAI encoding (times a family factor)."""

    def __init__(self, encoding: str, factor: float = 1.0) -> None:
        super().__init__(f"bpe-openai:{encoding}", factor)
        self.encoding = encoding

    def _count(self, text: str) -> int:
        bpe = load_bpe(self.encoding)
        return sum(int(bpe.count(piece)) for piece in pieces(text))


# The Claude tokenizer holds the GIL for a whole call and counts ~0.8 M characters/s
# (one 1 MiB word: ~3 s): long texts are counted in pieces, so that other requests are
# served between them.
_CLAUDE_PIECE = 8_192
_PIECE_CUT = re.compile(r"\s(?=\S)")


def claude_pieces(text: str) -> list[str]:
    """Pieces of at most about _CLAUDE_PIECE characters, cut just before the last
    whitespace character ahead of a non-whitespace one: its byte-level pre-tokenizer
    never joins across such a point, so the pieces' counts add up to the whole text's.
    A run with no such point is cut hard (a few tokens off, once per 8K characters)."""
    if len(text) <= _CLAUDE_PIECE:
        return [text]
    out: list[str] = []
    start = 0
    while len(text) - start > _CLAUDE_PIECE:
        end = start + _CLAUDE_PIECE
        cut = None
        for m in _PIECE_CUT.finditer(text, start + _CLAUDE_PIECE // 2, end):
            cut = m.start()
        out.append(text[start : cut if cut is not None else end])
        start = cut if cut is not None else end
    out.append(text[start:])
    return out


class ClaudeCounter(_CachedCounter):
    """Claude-vocabulary counts times a family factor."""

    # Anthropic's API takes tool-call arguments as an object (compiler/tokens.py).
    arguments_as_parameters = True

    def __init__(self, factor: float = 1.0) -> None:
        super().__init__("anthropic-tokenizer:claude", factor)

    def _count(self, text: str) -> int:
        count = load_claude()
        return sum(int(count(p)) for p in claude_pieces(text))


class CounterRegistry:
    """One counter per (tokenizer, factor), shared across compiles and threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: dict[tuple[str, float, int], TokenCounter] = {}

    def ready(self, info: ModelInfo) -> bool:
        """Whether counting for `info` needs no table built first (a build takes up to
        seconds: see TokenizerTable)."""
        table = TABLES.get(info.tokenizer)
        return table is None or table.loaded

    def for_model(self, info: ModelInfo, counting: int = COUNTING) -> TokenCounter:
        """`counting`: tokens.COUNTING of the compile (a rebuild's is its record's): the
        conservative estimator's weights changed at 2, 3 and 4."""
        weights = COUNTING
        if info.tokenizer not in TABLES:
            weights = min(max(counting, CHARCLASS_BY_SCRIPT - 1), COUNTING)
        key = (info.tokenizer, info.token_factor, weights)
        with self._lock:
            counter = self._counters.get(key)
            if counter is None:
                if info.tokenizer == "o200k":
                    counter = BpeCounter(O200K)  # exact: no factor
                elif info.tokenizer == "cl100k":
                    counter = BpeCounter(CL100K, info.token_factor)
                elif info.tokenizer == "claude":
                    counter = ClaudeCounter(info.token_factor)
                else:
                    counter = CharClassCounter(weights)
                self._counters[key] = counter
            return counter
