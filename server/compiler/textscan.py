"""Every scan of client text: path extraction, rule globs and result search.

Rules this module keeps:
- linear time in the text, by construction: path tokens come from one character-class
  scan (no alternation, so nothing to backtrack into); globs and search patterns run
  on RE2, whose automata never backtrack, and `[^/]*` translations cannot explode;
- bounded work per call: globs are capped in count and length, the paths a compile
  matches against are capped, and searches advance in slices so the caller can stop
  a request whose whole budget is spent (the caller owns the clock: this is pure);
- no I/O, no clock: same text in, same answer out.

The memo that keeps a text's path scan for the next compile (`paths_in_texts`) is in
path_memo.py: it remembers these answers and scans nothing itself.
"""

from __future__ import annotations

import codecs
import json
import math
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import re2

# Globs: per rule and per character. Registration refuses more; files and old
# records over the caps are cut with a note (never a compile failure).
MAX_GLOBS = 64
MAX_GLOB_CHARS = 256
# Path tokens longer than this are not paths anyone names; runs of `aaaa…` end here.
MAX_PATH_CHARS = 1_024
# Distinct paths a compile matches rule globs against, and their joined size.
MAX_PATHS = 4_096
MAX_PATH_BYTES = 256 << 10
# Search patterns (ReadToolResult) and the automaton memory RE2 may use for one (the
# re2 module keeps the last 128 programs: at most 1 GiB however hostile they are).
MAX_PATTERN_CHARS = 1_000
MAX_PATTERN_MEMORY = 8 << 20
# Bytes of text one search step scans: each RE2 call holds the GIL, so steps stay short.
SEARCH_STEP_BYTES = 256 << 10

# A run of path characters holding a '.' or '/', matched only from the start of the
# run (the lookbehind) and with possessive repeats: nothing is ever rescanned, so the
# scan is linear, and word runs without either character cost one pass in C.
_CANDIDATE = re.compile(r"(?<![\w.\-/])[\w\-]*+[./][\w.\-/]*+")
_BOUNDARY = re.compile(r"[^\w.\-/]")
SCAN_SLICE_CHARS = 64 << 10
# Distinct candidates examined in Python (bounds the per-token work on hostile text).
MAX_CANDIDATES = 16_384
# Counted repetitions: RE2 caps them at 1000, but an overflowing count must not slip by.
_REPEAT = re.compile(r"\{(\d+)(?:,(\d*))?\}")
_EXT = re.compile(r"[A-Za-z0-9]{1,8}")


class PatternError(ValueError):
    """A search pattern or glob that is refused; the message says why."""


def _options() -> re2.Options:
    opts = re2.Options()
    opts.log_errors = False
    opts.max_mem = MAX_PATTERN_MEMORY
    return opts


# -- paths named in active content --------------------------------------------------


def _as_path(token: str) -> str | None:
    """A token of [\\w.-/] as a path: two segments or more, or a name with an extension."""
    parts = [p for p in token.split("/") if p]
    if len(parts) >= 2:
        joined = "/".join(parts)
        return joined.strip("./") or joined
    if len(parts) == 1:
        name = parts[0].strip(".")
        stem, dot, ext = name.rpartition(".")
        if dot and stem and _EXT.fullmatch(ext):
            return name
    return None


@dataclass(frozen=True, slots=True)
class FoundPaths:
    paths: tuple[str, ...]
    # True when more distinct paths were named than a compile matches against.
    capped: bool = False


def _slices(text: str, step: int = SCAN_SLICE_CHARS) -> Iterable[tuple[int, int]]:
    """Cut points at non-path characters about `step` apart: `re` holds the GIL for a
    whole call, so a MiB is scanned in slices other threads can run between."""
    lo = 0
    while lo < len(text):
        cut = _BOUNDARY.search(text, min(lo + step, len(text)))
        hi = cut.start() if cut else len(text)
        yield lo, max(hi, lo + 1)
        lo = max(hi, lo + 1)


def paths_in(text: str, most: int = MAX_PATHS, most_bytes: int = MAX_PATH_BYTES) -> FoundPaths:
    """Distinct path-like tokens, in order of first appearance: anything with a slash
    between two names, or a name with an extension."""
    seen: dict[str, None] = {}
    size = 0
    candidates: dict[str, None] = {}
    for lo, hi in _slices(text):
        candidates.update(dict.fromkeys(_CANDIDATE.findall(text, lo, hi)))  # dedup in C
    for n, token in enumerate(candidates):
        if n >= MAX_CANDIDATES:
            return FoundPaths(tuple(seen), capped=True)
        if len(token) > MAX_PATH_CHARS:
            continue
        path = _as_path(token)
        if path is None or path in seen:
            continue
        size += len(path) + 1
        if len(seen) >= most or size > most_bytes:
            return FoundPaths(tuple(seen), capped=True)
        seen[path] = None
    return FoundPaths(tuple(seen))


# -- rule globs -----------------------------------------------------------------------


def glob_problem(glob: str) -> str | None:
    """Why a glob is refused, or None."""
    if len(glob) > MAX_GLOB_CHARS:
        return f"a glob is over {MAX_GLOB_CHARS} characters"
    if "\n" in glob or "\r" in glob or "\x00" in glob:
        return "a glob holds a line break or NUL"
    return None


def globs_problem(globs: Sequence[str]) -> str | None:
    if len(globs) > MAX_GLOBS:
        return f"at most {MAX_GLOBS} globs per rule"
    return next((p for p in map(glob_problem, globs) if p), None)


def _glob_re2(glob: str) -> str:
    """`**/` any directories, `**` anything, `*` and `?` within one path segment; the
    rest literal. Paths arrive one per line, so no class may cross a line."""
    out: list[str] = []
    i = 0
    while i < len(glob):
        if glob.startswith("**/", i):
            out.append("(?:[^\\n]*/)?")
            i += 3
        elif glob.startswith("**", i):
            out.append("[^\\n]*")
            i += 2
        elif glob[i] == "*":
            out.append("[^/\\n]*")
            i += 1
        elif glob[i] == "?":
            out.append("[^/\\n]")
            i += 1
        else:
            c = glob[i]
            out.append(c if c.isalnum() or ord(c) > 127 else "\\" + c)
            i += 1
    return "".join(out)


@dataclass(frozen=True, slots=True)
class GlobSet:
    """The usable globs of one rule, as one RE2 program, plus what was cut."""

    program: re2._Regexp | None
    dropped: int = 0


# Globs whose compiled programs are kept (~1.7 KB of RE2 memory each: ~110 KB for a rule
# of 64). A new turn makes its system prompt again and compiles every matched rule's
# globs (128 rules of 64: ~150 ms), and rules rarely change between turns.
_KEPT_GLOBS = 8_192


class _GlobCache:
    """Compiled glob sets by their globs, least recently used out first. A memo of a
    pure function (a GlobSet is immutable, RE2 programs are safe across threads)."""

    def __init__(self, most: int) -> None:
        self._most = most
        self._lock = threading.Lock()
        self._sets: OrderedDict[tuple[str, ...], GlobSet] = OrderedDict()
        self._held = 0

    def get(self, globs: tuple[str, ...]) -> GlobSet:
        with self._lock:
            found = self._sets.get(globs)
            if found is not None:
                self._sets.move_to_end(globs)
                return found
        made = _compile_globs(globs)
        with self._lock:
            if globs not in self._sets and len(globs) <= self._most:
                self._sets[globs] = made
                self._held += len(globs)
                while self._held > self._most:
                    old, _ = self._sets.popitem(last=False)
                    self._held -= len(old)
        return made

    def held(self) -> int:
        """Globs kept (for tests: bounded)."""
        with self._lock:
            return self._held


_GLOB_SETS = _GlobCache(_KEPT_GLOBS)


def compile_globs(globs: Iterable[str]) -> GlobSet:
    """The glob set of a rule's globs (kept: see _KEPT_GLOBS)."""
    return _GLOB_SETS.get(tuple(globs))


def _compile_globs(globs: Iterable[str]) -> GlobSet:
    usable: list[str] = []
    dropped = 0
    for raw in globs:
        g = raw.strip().lstrip("./")
        if not g:
            continue
        if glob_problem(g) is not None or len(usable) >= MAX_GLOBS:
            dropped += 1
            continue
        usable.append(g)
    if not usable:
        return GlobSet(None, dropped)
    # A glob matches a path or any trailing sub-path (`src/**/*.py` matches
    # `/repo/src/a/b.py` and `src/x.py`): the optional prefix ends at a slash.
    body = "|".join(_glob_re2(g) for g in usable)
    pattern = f"(?m)^(?:[^\\n]*/)?(?:{body})$"
    try:
        return GlobSet(re2.compile(pattern, _options()), dropped)
    except re2.error:
        return GlobSet(None, dropped + len(usable))


@dataclass(frozen=True, slots=True)
class PathText:
    """Paths joined one per line, encoded once, for matching many rules."""

    data: bytes

    @staticmethod
    def of(paths: Sequence[str]) -> PathText:
        return PathText("\n".join(p.strip("/") for p in paths).encode())


def glob_matches(globs: GlobSet, paths: PathText) -> bool:
    return bool(globs.program is not None and paths.data and globs.program.search(paths.data))


def matches_any(globs: Sequence[str], paths: Sequence[str]) -> bool:
    return glob_matches(compile_globs(globs), PathText.of(paths))


# -- JSON the model or the client wrote ------------------------------------------------

# Deeper JSON is treated as malformed: encoding it again would recurse past Python's
# stack limit, and no tool takes arguments nested this deep.
MAX_JSON_DEPTH = 100


def _depth_over(value: object, limit: int) -> bool:
    stack = [(value, 1)]
    while stack:
        item, d = stack.pop()
        if d > limit:
            return True
        if isinstance(item, dict):
            stack.extend((v, d + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, d + 1) for v in item)
    return False


# A UTF-16 surrogate on its own: JSON may escape one ("\\ud800"), no UTF-8 text holds it.
LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _not_json(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):  # 1e400: read as infinity, written back as Infinity
        raise ValueError(f"{text} overflows a double")
    return value


# One decoder: json.loads with options makes a new one at every call.
_STRICT = json.JSONDecoder(parse_constant=_not_json, parse_float=_finite)


def loads_strict(text: str) -> object:
    """`json.loads` of JSON as RFC 8259 has it: Python also reads NaN, Infinity and
    -Infinity (and a number too large for a double as infinity) and writes them back as
    such, which no provider's parser takes: a body carrying one is refused whole."""
    return _STRICT.decode(text)


def parse_json(text: str, max_depth: int = MAX_JSON_DEPTH) -> tuple[bool, object]:
    """(True, value) for JSON nested at most `max_depth` deep, else (False, None)."""
    try:
        value = loads_strict(text)
    except (ValueError, RecursionError):
        return False, None
    if _depth_over(value, max_depth):
        return False, None
    return True, value


# -- searches of stored results -------------------------------------------------------


def compile_search(pattern: str, is_regex: bool) -> re2._Regexp:
    """Validate, bound and compile a search pattern (RE2 syntax: no backreferences or
    lookaround, which is what keeps every search linear)."""
    if not pattern:
        raise PatternError("pattern is required")
    if len(pattern) > MAX_PATTERN_CHARS:
        raise PatternError(f"pattern is over {MAX_PATTERN_CHARS} characters")
    if "\x00" in pattern:
        raise PatternError("pattern holds NUL")
    if is_regex:
        for m in _REPEAT.finditer(pattern):
            counts = [int(c) for c in m.groups() if c]
            if any(c > 1_000 for c in counts):
                raise PatternError("repetition counts are at most 1000")
    # (?m): `^` and `$` mean the start and end of a line, as in grep.
    source = "(?m)" + (pattern if is_regex else re2.escape(pattern))
    try:
        return re2.compile(source, _options())
    except re2.error as exc:
        why = exc.args[0] if exc.args else "invalid"
        why = why.decode(errors="replace") if isinstance(why, bytes) else str(why)
        raise PatternError(f"pattern does not compile (RE2 syntax): {why}") from None


@dataclass(frozen=True, slots=True)
class LineMatch:
    line: int
    text: str


@dataclass
class LineSearch:
    """A line search over `data` that advances one bounded step at a time, so the
    caller can enforce a whole-request budget between steps. A line is reported once,
    by where a match starts."""

    data: bytes
    program: re2._Regexp
    context: int
    most: int
    pos: int = 0
    line: int = 0
    found: list[LineMatch] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return self.pos >= len(self.data) or len(self.found) >= self.most

    def step(self, step_bytes: int = SEARCH_STEP_BYTES) -> None:
        if self.done:
            return
        end = self.data.find(b"\n", min(len(self.data), self.pos + step_bytes))
        end = len(self.data) if end < 0 else end + 1
        while self.pos < end and len(self.found) < self.most:
            hit = self.program.search(self.data, self.pos, end)
            if hit is None:
                self.line += self.data.count(b"\n", self.pos, end)
                self.pos = end
                return
            start = hit.start()
            self.line += self.data.count(b"\n", self.pos, start)
            self.found.append(LineMatch(self.line, self._around(start)))
            nl = self.data.find(b"\n", start)
            self.pos = len(self.data) if nl < 0 else nl + 1
            self.line += 1

    def _around(self, at: int) -> str:
        """The line holding byte `at`, with `context` lines either side."""
        lo = self.data.rfind(b"\n", 0, at) + 1
        for _ in range(self.context):
            if lo == 0:
                break
            lo = self.data.rfind(b"\n", 0, lo - 1) + 1
        hi = at
        for _ in range(self.context + 1):
            nl = self.data.find(b"\n", hi)
            if nl < 0:
                hi = len(self.data)
                break
            hi = nl + 1
        chunk = self.data[lo:hi]
        chunk = chunk[:-1] if chunk.endswith(b"\n") else chunk
        return chunk.decode("utf-8", errors="replace")


# -- line reads of stored results ------------------------------------------------------

# Bytes of a stored result decoded and split at a time by `line_slice`: a 32 MiB result
# split whole was one call of seconds holding the GIL, and a list of 16 million lines.
LINE_PIECE_BYTES = 256 << 10
# Where str.splitlines ends a line ("\r\n" is one end).
_LINE_ENDS = frozenset("\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")


def _split(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def line_slice(
    data: bytes, offset: int, limit: int, piece_bytes: int = LINE_PIECE_BYTES
) -> tuple[str, int]:
    """Lines `offset` to `offset + limit` of `data` (UTF-8, undecodable bytes replaced),
    joined with their ends, and how many lines it holds in all: what
    `data.decode("utf-8", "replace").splitlines(keepends=True)` gives, but decoded and
    split `piece_bytes` at a time, keeping only the lines asked for."""
    decode = codecs.getincrementaldecoder("utf-8")("replace").decode
    end = offset + limit
    out: list[str] = []
    finished = 0  # lines ended so far: also the index of a line still open
    open_line = False
    held = ""  # a piece's last "\r", which a "\n" starting the next piece would join
    size = len(data)
    for start in range(0, size, piece_bytes):
        last = start + piece_bytes >= size
        text = held + decode(data[start : start + piece_bytes], last)
        held = ""
        if not last and text.endswith("\r"):
            text, held = text[:-1], "\r"
        if not text:
            continue
        lines = _split(text)
        # lines[0] continues the open line, if any: its index is `finished` either way.
        lo, hi = max(offset - finished, 0), min(end - finished, len(lines))
        if lo < hi:
            out.extend(lines[lo:hi])
        ended = len(lines) if lines[-1][-1] in _LINE_ENDS else len(lines) - 1
        finished += ended
        open_line = ended < len(lines)
    return "".join(out), finished + open_line
