"""Scans of client text: path extraction, rule globs and result searches are linear and
bounded, whatever the text or pattern."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from server.compiler import textscan
from server.compiler.path_memo import path_union, paths_in_texts
from server.compiler.textscan import (
    MAX_GLOB_CHARS,
    MAX_GLOBS,
    MAX_PATHS,
    LineSearch,
    PathText,
    PatternError,
    compile_globs,
    compile_search,
    glob_matches,
    globs_problem,
    matches_any,
    paths_in,
)


def test_paths_are_slash_separated_names_or_names_with_an_extension() -> None:
    text = "see ./src/a.py, README.md and /usr/lib/x; also src/a.py again, archive.tar.gz, v2"
    assert paths_in(text).paths == ("src/a.py", "README.md", "usr/lib/x", "archive.tar.gz")


# Each of these took quadratic time in the old path regex (80 KB of `a`: about a minute);
# a linear scan does a MiB in milliseconds. The timeout is a generous bound, not a benchmark.
@pytest.mark.timeout(20)
@pytest.mark.parametrize("unit", ["a", "a.", "a-", "a/", "ab/c."])
def test_path_scan_is_linear_on_long_word_runs(unit: str) -> None:
    text = unit * ((1 << 20) // len(unit))
    found = paths_in(text)
    assert len(found.paths) <= 1


def test_path_scan_stops_at_its_caps_and_says_so() -> None:
    text = " ".join(f"src/m{i}/f.py" for i in range(MAX_PATHS + 10))
    found = paths_in(text)
    assert found.capped and len(found.paths) == MAX_PATHS
    assert not paths_in("src/a.py " * 10_000).capped  # repeats are one path


@pytest.mark.parametrize(
    ("glob", "path", "hit"),
    [
        ("src/**/*.py", "/repo/src/a/b.py", True),
        ("src/**/*.py", "src/x.py", True),
        ("*.md", "docs/readme.md", True),
        ("src/**/*.py", "lib/x.py", False),
        ("*.py", "x.pyc", False),
        ("a?c.txt", "abc.txt", True),
        ("a?c.txt", "a/c.txt", False),
        ("docs/*.md", "docs/sub/x.md", False),
        ("file(1)[x].py", "file(1)[x].py", True),  # regex syntax in a glob is literal
        ("a.py", "aXpy", False),
    ],
)
def test_glob_semantics(glob: str, path: str, hit: bool) -> None:
    assert matches_any([glob], [path]) is hit


@pytest.mark.timeout(20)
def test_backtracking_glob_is_linear() -> None:
    # Translated to a backtracking regex this froze a daemon for 12 s on one path.
    globs = compile_globs(["**a**a**a**a**a**a**b"])
    paths = PathText.of(["a" * 80, *(("a/" * 40) + str(i) for i in range(4_000))])
    assert not glob_matches(globs, paths)
    assert glob_matches(globs, PathText.of(["a" * 80 + "b"]))


def test_glob_caps_refuse_at_registration_and_cut_otherwise() -> None:
    assert globs_problem(["*.py"]) is None
    assert "at most" in (globs_problem(["*.py"] * (MAX_GLOBS + 1)) or "")
    assert "characters" in (globs_problem(["a" * (MAX_GLOB_CHARS + 1)]) or "")
    assert "line break" in (globs_problem(["a\nb"]) or "")
    cut = compile_globs(["*.md"] * 200_000)
    assert cut.dropped == 200_000 - MAX_GLOBS
    assert glob_matches(cut, PathText.of(["x.md"]))


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        ("a{4294967294}", "at most 1000"),
        ("a{2,99999}", "at most 1000"),
        (r"(a)\1", "RE2"),
        ("(?=a)", "RE2"),
        ("(", "RE2"),
        ("x" * 1001, "over 1000"),
        ("", "required"),
    ],
)
def test_search_patterns_are_refused_before_any_work(pattern: str, why: str) -> None:
    with pytest.raises(PatternError, match=r".*") as exc:
        compile_search(pattern, True)
    assert why in str(exc.value)


def _run(search: LineSearch) -> list[tuple[int, str]]:
    while not search.done:
        search.step(64)
    return [(m.line, m.text) for m in search.found]


def test_line_search_reports_lines_with_context() -> None:
    data = b"a\nfoo\nb\nc\nfoo bar\nd"
    assert _run(LineSearch(data, compile_search("^foo", True), 1, 20)) == [
        (1, "a\nfoo\nb"),
        (4, "c\nfoo bar\nd"),
    ]
    # A line is reported once however often it matches; `most` stops the scan.
    assert _run(LineSearch(b"oo oo\noo", compile_search("oo", False), 0, 1)) == [(0, "oo oo")]
    # Literal search: regex syntax means itself.
    assert _run(LineSearch(b"x\na.*b\n", compile_search("a.*b", False), 0, 5)) == [(1, "a.*b")]


def test_line_search_steps_are_bounded() -> None:
    data = b"".join(b"line %d\n" % i for i in range(100_000))
    search = LineSearch(data, compile_search("nomatch", False), 0, 20)
    search.step(4_096)
    assert 4_096 <= search.pos <= 4_096 + 16
    steps = 1
    while not search.done:
        search.step(4_096)
        steps += 1
    assert steps >= len(data) // (4_096 + 16) and search.line == 100_000


def test_path_scan_slices_never_cut_a_path() -> None:
    # Slices end at a non-path character at or after 64 Ki characters.
    text = "x" * ((64 << 10) - 3) + " src/abc/d.py " + "y " * 40_000 + "lib/e.go"
    assert paths_in(text).paths == ("src/abc/d.py", "lib/e.go")


def _union(texts: list[str], most: int) -> tuple[tuple[str, ...], bool]:
    """The definition: paths of each text in order, distinct, at most `most` of them."""
    out: list[str] = []
    for text in texts:
        for path in paths_in(text).paths:
            if path not in out:
                if len(out) >= most:
                    return tuple(out), True
                out.append(path)
    return tuple(out), False


_TEXTS = st.lists(
    st.lists(
        st.sampled_from(["a.py", "src/b.go", "c/d/e", "plain", "x.md", "a.py"]), max_size=3
    ).map(" ".join),
    min_size=1,
    max_size=6,
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(_TEXTS, st.booleans()), min_size=1, max_size=6), st.booleans())
def test_path_unions_of_growing_turns_equal_a_scan_of_every_text(
    steps: list[tuple[list[str], bool]], small_cap: bool
) -> None:
    """A turn's texts are scanned once as it grows; lists that share only their first
    text (another session, a rewritten turn) must not take each other's union."""
    most = 3 if small_cap else MAX_PATHS
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(textscan, "MAX_PATHS", most)
        turn = ["open a.py please"]
        for more, restart in steps:
            turn = (["open a.py please", *more]) if restart else [*turn, *more]
            found = paths_in_texts(turn)
            assert (found.paths, found.capped) == _union(turn, most)


@settings(max_examples=200, deadline=None)
@given(st.lists(_TEXTS, min_size=1, max_size=6), st.booleans())
def test_a_union_continued_from_the_last_one_scans_only_new_texts(
    steps: list[list[str]], small_cap: bool
) -> None:
    """What a compile continuing its memo does in a growing turn: the union it carried is
    continued over the texts after it (each scanned once, the ones before not at all),
    and the answer is the definition's; with nothing new found it is the same object,
    which the system prompt's memo compares by identity."""
    most = 3 if small_cap else MAX_PATHS
    scanned: list[str] = []
    real = textscan.paths_in

    def counting(text: str, *args: int) -> textscan.FoundPaths:
        scanned.append(text)
        return real(text, *args)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(textscan, "MAX_PATHS", most)
        mp.setattr(textscan, "paths_in", counting)
        turn = ["open a.py please"]
        union = path_union(turn, None)
        for more in steps:
            before = _union(turn, most)
            turn = [*turn, *more]
            del scanned[:]
            nxt = path_union(turn, union)
            assert (nxt.found.paths, nxt.found.capped) == _union(turn, most)
            assert len(scanned) <= len(more)
            if _union(turn, most) == before:
                assert nxt.found is union.found
            union = nxt


def test_compiled_globs_are_kept_by_their_globs_and_bounded() -> None:
    """A new turn makes its prompt again, compiling every matched rule's globs (128 rules
    of 64: ~150 ms): equal globs take the program already compiled, least recently used
    ones leave past the bound, and what a set matches does not depend on where it came
    from."""
    cache = textscan._GlobCache(6)
    first = cache.get(("src/**/*.py", "docs/*.md"))
    assert cache.get(("src/**/*.py", "docs/*.md")) is first
    other = cache.get(("tests/**",))
    assert other is not first and cache.held() == 3
    paths = textscan.PathText.of(["src/a/b.py", "tests/x/y.txt"])
    assert textscan.glob_matches(first, paths) and textscan.glob_matches(other, paths)
    assert not textscan.glob_matches(first, textscan.PathText.of(["docs/a/b.md"]))
    cache.get(("a", "b", "c", "d"))  # over the bound: the oldest set leaves
    assert cache.held() == 5
    assert cache.get(("src/**/*.py", "docs/*.md")) is not first
    assert cache.held() <= 6
    assert textscan.compile_globs(["lib/*.rs"]) is textscan.compile_globs(("lib/*.rs",))


_LINE_TEXT = st.lists(
    st.sampled_from(["a", "é", "🙂", "\n", "\r", "\r\n", "\x0b", "\x1c", "\x85", "\u2028"]),
    max_size=40,
).map("".join)


@given(
    _LINE_TEXT,
    st.binary(max_size=3),
    st.integers(0, 45),
    st.integers(0, 45),
    st.integers(1, 9),
)
@settings(max_examples=400)
def test_line_slice_is_splitlines_of_the_decoded_text(
    text: str, junk: bytes, offset: int, limit: int, piece: int
) -> None:
    """Pieces of any size ("\\r" and "\\n" of one end, or one character's bytes, on both
    sides of a cut) give what splitting the whole decoded text gives."""
    data = text.encode() + junk + text.encode()
    lines = data.decode("utf-8", "replace").splitlines(keepends=True)
    got = textscan.line_slice(data, offset, limit, piece)
    assert got == ("".join(lines[offset : offset + limit]), len(lines))


def test_a_huge_result_is_split_in_bounded_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    """4 MiB of one-character lines: no split over a piece, and only the lines asked for
    kept (splitting it whole made a list of 4 million lines in one call)."""
    split = textscan._split
    sizes: list[int] = []

    def spy(text: str) -> list[str]:
        sizes.append(len(text))
        return split(text)

    monkeypatch.setattr(textscan, "_split", spy)
    data = b"\n" * (4 << 20)
    text, total = textscan.line_slice(data, 1_000, 10)
    assert (text, total) == ("\n" * 10, 4 << 20)
    assert len(sizes) == (4 << 20) // textscan.LINE_PIECE_BYTES
    assert max(sizes) <= textscan.LINE_PIECE_BYTES + 1
