"""The workspace adapter on real directories: discovery order, confinement, decoding."""

from __future__ import annotations

import os
import shutil
import tracemalloc
from pathlib import Path

import pytest

from server.adapters.workspace import (
    MAX_DIR_FILES,
    MAX_NOTE_CHARS,
    MAX_NOTES,
    WorkspaceConfig,
    WorkspaceReader,
)
from server.domain.errors import CtxccError, Reason
from server.domain.frontmatter import parse_front_matter
from server.domain.sources import RuleActivation, Scope
from server.domain.validation import check_session_paths


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    g = tmp_path / "global"
    (g / "skills" / "pdf").mkdir(parents=True)
    (g / "rules").mkdir()
    (g / "AGENTS.md").write_text("global agents")
    (g / "skills" / "pdf" / "SKILL.md").write_text(
        '---\nname: pdf\ndescription: "Read PDFs"\n---\nbody'
    )
    (g / "rules" / "sql.md").write_text(
        "---\nname: sql\ndescription: SQL style\nactivation: on_demand\n---\nUse CTEs."
    )
    (g / "MEMORY.md").write_text("likes tea")
    p = tmp_path / "work" / "proj"
    (p / "src" / "pkg").mkdir(parents=True)
    (p / ".ctxcc" / "rules").mkdir(parents=True)
    (p / "AGENTS.md").write_text("root agents")
    (p / "src" / "CLAUDE.md").write_text("src claude")
    (p / "src" / "pkg" / "GEMINI.md").write_bytes(b"pkg \xff\xfe gemini")
    (p / ".ctxcc" / "rules" / "tests.md").write_text(
        "---\nactivation: matched\nglobs: [tests/**/*.py, '*.spec.ts']\n---\nUse pytest."
    )
    (tmp_path / "outside.md").write_text("secret")
    return tmp_path


def reader(tree: Path, roots: tuple[Path, ...] | None = None) -> WorkspaceReader:
    return WorkspaceReader(
        WorkspaceConfig(
            roots=roots if roots is not None else (tree / "work",), global_dir=tree / "global"
        )
    )


def test_discovers_in_order_from_global_to_working_directory(tree: Path) -> None:
    p = tree / "work" / "proj"
    got = reader(tree).read(str(p), str(p / "src" / "pkg"))
    assert [(Path(f.path).name, f.scope) for f in got.instruction_files] == [
        ("AGENTS.md", Scope.GLOBAL),
        ("AGENTS.md", Scope.PROJECT),
        ("CLAUDE.md", Scope.PROJECT),
        ("GEMINI.md", Scope.PROJECT),
    ]
    gemini = got.instruction_files[-1]
    assert gemini.decode_replaced and gemini.text == "pkg \ufffd\ufffd gemini"
    assert [(s.name, s.description, s.scope) for s in got.skills] == [
        ("pdf", "Read PDFs", Scope.GLOBAL)
    ]
    rules = {r.name: r for r in got.rules}
    assert rules["sql"].activation is RuleActivation.ON_DEMAND and rules["sql"].text == "Use CTEs."
    assert rules["tests"].path_globs == ("tests/**/*.py", "*.spec.ts")
    assert rules["tests"].activation is RuleActivation.MATCHED
    assert [m.text for m in got.memory] == ["likes tea"]


def test_symlinks_that_escape_are_refused(tree: Path) -> None:
    p = tree / "work" / "proj"
    (p / "AGENTS.md").unlink()
    os.symlink(tree / "outside.md", p / "AGENTS.md")
    os.symlink(p / "src" / "CLAUDE.md", p / "CLAUDE.md")  # inside the root: fine
    got = reader(tree).read(str(p), str(p))
    texts = [f.text for f in got.instruction_files]
    assert "secret" not in texts and "src claude" in texts
    assert any("refused" in n and "outside" in n for n in got.notes)


def test_project_outside_the_roots_is_not_read(tree: Path) -> None:
    p = tree / "work" / "proj"
    got = reader(tree, roots=(tree / "elsewhere",)).read(str(p), str(p))
    assert [f.scope for f in got.instruction_files] == [Scope.GLOBAL]
    assert any("not under a workspace root" in n for n in got.notes)
    # A symlinked project root that resolves outside the roots is refused too.
    os.symlink(tree / "global", tree / "work" / "sneaky")
    got = reader(tree).read(str(tree / "work" / "sneaky"), "")
    assert all(f.scope is Scope.GLOBAL for f in got.instruction_files)


def test_dotdot_and_relative_paths_are_refused() -> None:
    for root, wd in (("/a/../b", ""), ("rel", ""), ("/a", "/a/../../etc"), ("/a", "/b")):
        with pytest.raises(CtxccError) as exc:
            check_session_paths(root, wd)
        assert exc.value.reason is Reason.PATH_OUTSIDE_ROOT
    check_session_paths("/a", "/a/b")


def _deep(base: Path, depth: int) -> Path:
    """`base`/a/a/…/a, `depth` levels (made one level at a time: os.makedirs recurses)."""
    fd = os.open(base, os.O_RDONLY)
    try:
        for _ in range(depth):
            os.mkdir("a", dir_fd=fd)
            nfd = os.open("a", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = nfd
    finally:
        os.close(fd)
    return Path(str(base) + "/a" * depth)


def test_a_deep_working_directory_opens_each_level_once(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each file of the chain once walked from the project root: 300 levels took ~140,000
    opens (2,000 levels: 10-20 s a compile). Opening each level from the one above
    costs a few opens a level, with the same files, order, links and notes."""
    p = tree / "work" / "proj"
    depth = 300
    wd = _deep(p / "src", depth)
    (wd / "AGENTS.md").write_text("deepest")
    mid = Path(str(p / "src") + "/a" * 150)
    (mid / "CLAUDE.md").symlink_to(p / "AGENTS.md")  # inside the root: followed
    os.mkfifo(mid / "GEMINI.md")  # never blocks: a note
    opens = 0
    real_open = os.open

    def counting(*args: object, **kwargs: object) -> int:
        nonlocal opens
        opens += 1
        return real_open(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", counting)
    got = reader(tree).read(str(p), str(wd))
    monkeypatch.undo()
    texts = [f.text for f in got.instruction_files]
    assert texts == ["global agents", "root agents", "src claude", "root agents", "deepest"]
    assert got.instruction_files[3].display == "src" + "/a" * 150 + "/CLAUDE.md"
    assert got.notes == ("skipped src" + "/a" * 150 + "/GEMINI.md: not a regular file",)
    assert opens < 10 * depth, opens


def test_rule_and_skill_directories_linked_outside_list_nothing_there(tree: Path) -> None:
    """A glob of a rules or skills directory that is a link out listed the directory it
    leads to: the view's notes named every file there (each read refused). Listing
    walks confined too: one note for the link, no name from outside."""
    p = tree / "work" / "proj"
    private = tree / "private"
    (private / "alice-secret-project").mkdir(parents=True)
    (private / "alice-secret-project" / "SKILL.md").write_text(
        "---\nname: s\ndescription: d\n---\n"
    )
    (private / "payroll-2026.md").write_text("---\nactivation: always\n---\nsalaries")
    shutil.rmtree(p / ".ctxcc" / "rules")
    (p / ".ctxcc" / "rules").symlink_to(private)
    (p / ".claude").mkdir()
    (p / ".claude" / "skills").symlink_to(private)
    shared = p / "shared-skills" / "deploy"  # a link that stays inside still works
    shared.mkdir(parents=True)
    (shared / "SKILL.md").write_text("---\nname: deploy\ndescription: Ship it\n---\n")
    (p / ".ctxcc" / "skills").symlink_to(p / "shared-skills")
    got = reader(tree).read(str(p), str(p))
    assert got.notes == (
        "refused .claude/skills: it resolves outside its root",  # skills are read first
        "refused .ctxcc/rules: it resolves outside its root",
    )
    assert [s.name for s in got.skills if s.scope is Scope.PROJECT] == ["deploy"]
    assert [r.name for r in got.rules if r.scope is Scope.PROJECT] == []


def test_notes_of_a_read_are_bounded_and_the_rest_counted(tree: Path) -> None:
    """Thousands of bad rule files gave a note each, in every view (40,000 links out:
    ~2.4 MB of notes). The read keeps MAX_NOTES of them and one note counts the rest by
    kind."""
    p = tree / "work" / "proj"
    rules = p / ".ctxcc" / "rules"
    for i in range(300):
        (rules / f"out-{i:03}.md").symlink_to(tree / "outside.md")
    for i in range(20):
        (rules / f"bad-{i:02}.md").write_text("---\nactivation: sometimes\n---\nx")
    got = reader(tree).read(str(p), str(p))
    assert len(got.notes) == MAX_NOTES
    # In the order of the names read: the 20 bad ones, then the links out.
    kept = got.notes[:-1]
    assert kept[0] == (
        "skipped .ctxcc/rules/bad-00.md: activation must be always, on_demand or matched, "
        "not 'sometimes'"
    )
    assert [n.split(" ")[0] for n in kept] == ["skipped"] * 20 + ["refused"] * (MAX_NOTES - 21)
    assert kept[20] == "refused .ctxcc/rules/out-000.md: it resolves outside its root"
    rest = 300 - (MAX_NOTES - 21)
    assert got.notes[-1] == f"{rest} more workspace notes not shown ({rest} refused)"
    # The rules that are fine are still read.
    assert [r.name for r in got.rules if r.scope is Scope.PROJECT] == ["tests"]


def test_a_long_note_is_cut_and_marked() -> None:
    from server.adapters.workspace import _bounded

    assert _bounded(["x" * (MAX_NOTE_CHARS + 10)]) == ("x" * (MAX_NOTE_CHARS - 1) + "\u2026",)
    assert _bounded(["a"] * MAX_NOTES) == ("a",) * MAX_NOTES
    over = ["skipped a"] * MAX_NOTES + ["refused b", "skipped c"]
    assert _bounded(over)[-1] == "3 more workspace notes not shown (1 refused, 2 skipped)"


def test_a_huge_rules_directory_is_listed_in_bounded_memory(tree: Path) -> None:
    """Only the first MAX_DIR_FILES names are kept while a skills or rules directory is
    listed: anyone who writes the workspace (an agent's tools) can make a directory of
    1,000,000 entries, and listing it whole raised the daemon's peak by ~380 MB at every
    compile. Measured by tracemalloc: what a read allocates, not the machine's state."""
    p = tree / "work" / "proj"
    rules = p / ".ctxcc" / "rules"
    many = 40_000
    for i in range(many):
        os.close(os.open(rules / f"{i:06d}{'r' * 200}.md", os.O_CREAT | os.O_WRONLY, 0o644))
    tracemalloc.start()
    try:
        got = reader(tree).read(str(p), str(p))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # A whole listing peaked at ~15 MB; the first 1,024 entries, read, ~2.4 MB.
    assert peak < 6 << 20, peak
    # The first MAX_DIR_FILES by name, as before: "000000rrr..." first, "tests" not.
    assert len([r for r in got.rules if r.scope is Scope.PROJECT]) == MAX_DIR_FILES
    assert min(r.rule_id for r in got.rules).startswith("000000")
    assert f"skipped {many + 1 - MAX_DIR_FILES} more entries of .ctxcc/rules" in "\n".join(
        got.notes
    ), got.notes


def test_the_readmes_rule_file_is_read_as_written(tree: Path) -> None:
    """The README's example rule file, copied as it is shown: its `# always | on_demand
    | matched` comment was read as part of the activation, and the rule was skipped."""
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    section = readme.split("Rule files are Markdown with front matter", 1)[1]
    example = section.split("```markdown\n", 1)[1].split("```", 1)[0]
    assert "# always | on_demand | matched" in example  # the comment this test is about
    p = tree / "work" / "proj"
    (p / ".ctxcc" / "rules" / "tests.md").write_text(example)
    got = reader(tree).read(str(p), str(p))
    (rule,) = [r for r in got.rules if r.rule_id == "tests"]
    assert rule.activation is RuleActivation.MATCHED
    assert rule.path_globs == ("tests/**/*.py",) and rule.description == "How we test"
    assert rule.text == "Tests use pytest and never touch the network."
    assert not [n for n in got.notes if "tests.md" in n], got.notes


@pytest.mark.parametrize(
    ("line", "value"),
    [
        ("d: Don't #mock", "Don't"),
        ("u: a#b", "a#b"),
        ('q: "a # b"  # c', "a # b"),
        ("e: # nothing", ""),
        ("l: ['x # y', z]  # c", ("x # y", "z")),
    ],
)
def test_front_matter_comments_are_dropped_as_yaml_drops_them(
    line: str, value: str | tuple[str, ...]
) -> None:
    fields, body = parse_front_matter(f"---\n{line}\n---\nbody")
    assert list(fields.values()) == [value] and body == "body"
