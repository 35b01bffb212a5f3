"""Reads instruction files, skills, rule files and memory files from disk, confined to
configured roots (R-SYS 2, 3, 4, 7; R-SYS-11).

Confinement: a session's project root must lie under one of `workspace_roots`, its
working directory under the project root; every file is resolved (symlinks followed)
and refused when it lands outside the root it was found in. Paths with `..` are
refused outright. Nothing here raises on a bad file: it is skipped with a note, so a
broken repository never breaks a compile. Notes name files relative to the root they
were found in (`global:` for the global directory), never by the daemon's absolute paths
or the configured roots.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from server.adapters.confined import (
    Opens,
    Refused,
    list_confined,
    open_root,
    open_subdir,
    read_at,
    read_confined,
)
from server.domain.errors import CtxccError
from server.domain.frontmatter import parse_front_matter
from server.domain.sources import (
    InstructionFile,
    MemoryEntry,
    RuleActivation,
    RuleEntry,
    Scope,
    SkillEntry,
    WorkspaceSources,
)
from server.domain.validation import check_session_paths, within

# Read at most this much of any one file; caps cut far earlier, this bounds memory.
MAX_READ_BYTES = 1 << 20
# Read at most this much of all the files of one workspace read together. The caps show
# ~100K characters by default, but every file is read, sanitized and recorded before
# they cut: 200 rule files of 1 MiB (hard links of one file cost no disk) made each
# compile take ~7 s and the daemon 2.7 GB. Past it, files are skipped with a note.
MAX_READ_TOTAL = 16 << 20
# Skills or rule files read from one directory, the first by name. Each costs a walk
# from the root and a parse however small it is, and the caps show ~100 of them:
# 20,000 of each made every compile take ~5 s, and 200,000 would pass the compile's
# CPU budget. Past them, one note counts the rest.
MAX_DIR_FILES = 1_024
# Names the walks of one workspace read may open (see confined.Opens). A read of the
# most the bounds above let through opens ~50,000 under a root 10 deep; past this (~0.3
# s of opens), every later file is skipped with a note.
MAX_READ_OPENS = 250_000
# Notes of one workspace read a view carries: a repository with thousands of bad or
# outside-linking rule files would otherwise put megabytes of notes in every view.
# Past them, one note counts the rest (truncation is marked, never silent).
MAX_NOTES = 32
MAX_NOTE_CHARS = 512
_ACTIVATIONS = {
    "always": RuleActivation.ALWAYS,
    "on_demand": RuleActivation.ON_DEMAND,
    "on-demand": RuleActivation.ON_DEMAND,
    "matched": RuleActivation.MATCHED,
}


def _text(name: str) -> str:
    """A name from the file system as text a view can carry. Names are bytes: one that
    is not UTF-8 comes back from Python with surrogate escapes, which no protobuf string
    (nor any provider's JSON) takes, so its undecodable bytes are shown as U+FFFD."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _bounded(notes: list[str]) -> tuple[str, ...]:
    """The first MAX_NOTES notes, each cut at MAX_NOTE_CHARS, then one that counts the
    rest by their first word (refused, skipped, ...)."""
    shown = [n if len(n) <= MAX_NOTE_CHARS else n[: MAX_NOTE_CHARS - 1] + "\u2026" for n in notes]
    if len(shown) <= MAX_NOTES:
        return tuple(shown)
    rest = notes[MAX_NOTES - 1 :]
    kinds: dict[str, int] = {}
    for note in rest:
        kind = note.split(" ", 1)[0]
        kinds[kind] = kinds.get(kind, 0) + 1
    counted = ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items()))
    return (*shown[: MAX_NOTES - 1], f"{len(rest)} more workspace notes not shown ({counted})")


def _decoded(data: bytes) -> tuple[str, bool]:
    """A file's text, and whether invalid UTF-8 in it was replaced."""
    try:
        return data.decode("utf-8"), False
    except UnicodeDecodeError:
        return data.decode("utf-8", errors="replace"), True


def _skill_dir(name: str, subdir: bool) -> bool:
    return subdir and not name.startswith(".")


def _rule_file(name: str, subdir: bool) -> bool:
    return name.endswith(".md") and not name.startswith(".")


@dataclass(slots=True)
class _Reading:
    """One workspace read in progress: its notes, and the bytes it may still read."""

    notes: list[str] = field(default_factory=list)
    left: int = MAX_READ_TOTAL
    opens: Opens = field(default_factory=lambda: Opens(MAX_READ_OPENS))

    def limit(self) -> int:
        """How much of the next file to read: one byte more than the room left tells a
        file that does not fit without reading more of it."""
        return min(MAX_READ_BYTES, self.left + 1)


@dataclass(frozen=True, slots=True)
class WorkspaceConfig:
    roots: tuple[Path, ...] = ()
    global_dir: Path | None = None
    instruction_names: tuple[str, ...] = ("AGENTS.md", "CLAUDE.md", "GEMINI.md")
    project_skill_dirs: tuple[str, ...] = (".ctxcc/skills", ".claude/skills")
    project_rule_dir: str = ".ctxcc/rules"
    project_memory_file: str = ".ctxcc/MEMORY.md"


class WorkspaceReader:
    def __init__(self, cfg: WorkspaceConfig) -> None:
        self.cfg = cfg
        self._roots = tuple(Path(os.path.realpath(r)) for r in cfg.roots)

    def _shown(self, path: Path, root: Path) -> str:
        """How a note names a file: relative to its root, the global one marked."""
        rel = _text(os.path.relpath(path, root))
        g = self.cfg.global_dir
        is_global = g is not None and Path(os.path.realpath(g)) == root
        return f"global:{rel}" if is_global else rel

    def _read(self, path: Path, root: Path, run: _Reading) -> tuple[str, bool] | None:
        """Text of a regular file under `root`, or None (with a note). The walk holds a
        directory descriptor at every step, so no swap on disk can lead it outside."""
        try:
            parts = list(path.relative_to(root).parts)
        except ValueError:
            run.notes.append(f"refused {self._shown(path, root)}: it resolves outside its root")
            return None
        data = read_confined(str(root), parts, run.limit(), run.opens)
        if isinstance(data, Refused):
            verb = "refused" if data.outside else "skipped"
            if not data.missing:
                run.notes.append(f"{verb} {self._shown(path, root)}: {data.why}")
            return None
        return self._taken(data, path, root, run)

    def _taken(self, data: bytes, path: Path, root: Path, run: _Reading) -> tuple[str, bool] | None:
        """The text of `data`, read from `path`, when it fits in what the read may still
        take; else None with a note (a smaller file after it may still fit)."""
        if len(data) > run.left:
            run.notes.append(
                f"skipped {self._shown(path, root)}: with the workspace files read before "
                f"it, over {MAX_READ_TOTAL >> 20} MiB, the most one read takes"
            )
            return None
        run.left -= len(data)
        return _decoded(data)

    def _first(
        self, d: Path, root: Path, run: _Reading, wanted: Callable[[str, bool], bool]
    ) -> list[str]:
        """The first MAX_DIR_FILES names, by name, of the entries of the directory `d`
        under `root` that `wanted` takes (given whether each is a directory or a link),
        listed by a confined walk (a glob would follow a link out and name what is
        there); a note counts the rest. None when it is not a directory, with a note
        when it leads outside."""
        try:
            parts = list(d.relative_to(root).parts)
        except ValueError:
            return []
        found = list_confined(str(root), parts, wanted, MAX_DIR_FILES, run.opens)
        if isinstance(found, Refused):
            if found.outside:
                run.notes.append(f"refused {self._shown(d, root)}: {found.why}")
            return []
        names, taken = found
        if taken > MAX_DIR_FILES:
            run.notes.append(
                f"skipped {taken - MAX_DIR_FILES} more entries of {self._shown(d, root)}: "
                f"a skills or rules directory gives its first {MAX_DIR_FILES} by name"
            )
        return names

    def _read_in(
        self, fd: int | None, path: Path, root: Path, run: _Reading
    ) -> tuple[str, bool] | None:
        """As `_read`, through `fd`, the directory of `path` already opened confined
        (None: not held), falling back to `_read` for anything but a plain file."""
        if fd is not None:
            data = read_at(fd, path.name, run.limit(), run.opens)
            if isinstance(data, Refused):
                return None  # read_at refuses only a missing name: no note, as _read
            if data is not None:
                return self._taken(data, path, root, run)
        return self._read(path, root, run)

    def _project_root(self, raw: str, run: _Reading) -> Path | None:
        if not raw:
            return None
        real = Path(os.path.realpath(raw))
        if not any(within(str(real), str(r)) for r in self._roots):
            configured = "" if self._roots else " (none is configured)"
            run.notes.append(
                f"project files not read: {raw} is not under a workspace root{configured}; "
                "see --workspace-roots"
            )
            return None
        if not real.is_dir():
            run.notes.append(f"project files not read: {raw} is not a directory")
            return None
        return real

    def reads_files(self, project_root: str) -> bool:
        return bool(project_root) or self.cfg.global_dir is not None

    def read(self, project_root: str, working_directory: str) -> WorkspaceSources:
        try:
            check_session_paths(project_root, working_directory)
        except CtxccError as exc:
            return WorkspaceSources(notes=(f"project files not read: {exc.message}",))
        try:
            return self._read_all(project_root, working_directory)
        except (OSError, ValueError) as exc:
            # A directory vanishing or turning into a link mid-listing: a note, not an
            # error, so a changing repository never fails a compile.
            why = getattr(exc, "strerror", None) or type(exc).__name__
            return WorkspaceSources(notes=(f"workspace files not read: {why}",))

    def _read_all(self, project_root: str, working_directory: str) -> WorkspaceSources:
        run = _Reading()
        files: list[InstructionFile] = []
        skills: list[SkillEntry] = []
        rules: list[RuleEntry] = []
        memory: list[MemoryEntry] = []
        g = self.cfg.global_dir
        if g is not None and g.is_dir():
            groot = Path(os.path.realpath(g))
            files += self._instructions([groot], groot, Scope.GLOBAL, run)
            skills += self._skills([groot / "skills"], groot, Scope.GLOBAL, run)
            rules += self._rules(groot / "rules", groot, Scope.GLOBAL, run)
            memory += self._memory(groot / "MEMORY.md", groot, Scope.GLOBAL, run)
        root = self._project_root(project_root, run)
        if root is not None:
            files += self._instructions(
                self._chain(root, project_root, working_directory), root, Scope.PROJECT, run
            )
            skills += self._skills(
                [root / d for d in self.cfg.project_skill_dirs], root, Scope.PROJECT, run
            )
            rules += self._rules(root / self.cfg.project_rule_dir, root, Scope.PROJECT, run)
            memory += self._memory(root / self.cfg.project_memory_file, root, Scope.PROJECT, run)
        return WorkspaceSources(
            tuple(files), tuple(skills), tuple(rules), tuple(memory), _bounded(run.notes)
        )

    def _chain(self, root: Path, project_root: str, working_directory: str) -> list[Path]:
        """The project root, then each directory down to the working directory. Worked
        out from the names alone (resolving them would race with changes on disk); the
        confined reads resolve links inside the root themselves."""
        dirs = [root]
        wd, raw = posixpath.normpath(working_directory), posixpath.normpath(project_root)
        for base in (raw, str(root)):
            if working_directory and within(wd, base) and wd != base:
                for part in PurePosixPath(wd).relative_to(base).parts:
                    dirs.append(dirs[-1] / part)
                break
        return dirs

    def _instructions(
        self, dirs: list[Path], root: Path, scope: Scope, run: _Reading
    ) -> list[InstructionFile]:
        out = []
        # Each directory of the chain is opened from its parent's descriptor, once: a
        # walk from the root for every file costs the square of the depth. A step that
        # is no plain subdirectory (a link, missing) leaves the rest to `_read`.
        fd = open_root(str(root), run.opens) if dirs and dirs[0] == root else None
        try:
            for i, d in enumerate(dirs):
                if i > 0 and fd is not None:
                    nfd = open_subdir(fd, d.name, run.opens) if d.parent == dirs[i - 1] else None
                    os.close(fd)
                    fd = nfd
                for name in self.cfg.instruction_names:
                    got = self._read_in(fd, d / name, root, run)
                    if got is not None:
                        shown = self._shown(d / name, root)
                        path = _text(str(d / name))
                        out.append(InstructionFile(path, scope, got[0], got[1], shown))
        finally:
            if fd is not None:
                os.close(fd)
        return out

    def _skills(
        self, dirs: list[Path], root: Path, scope: Scope, run: _Reading
    ) -> list[SkillEntry]:
        out = []
        for d in dirs:
            for entry in self._first(d, root, run, _skill_dir):
                skill_md = d / entry / "SKILL.md"
                got = self._read(skill_md, root, run)
                if got is None:
                    continue
                fields, _ = parse_front_matter(got[0])
                name, desc = fields.get("name"), fields.get("description")
                if not isinstance(name, str) or not isinstance(desc, str) or not name:
                    shown = self._shown(skill_md, root)
                    run.notes.append(f"skipped {shown}: front matter needs name and description")
                    continue
                out.append(
                    SkillEntry(
                        _text(skill_md.parent.name),
                        scope,
                        "",
                        name,
                        desc,
                        load_hint=_text(str(skill_md)),
                        origin=_text(str(skill_md)),
                    )
                )
        return out

    def _rules(self, d: Path, root: Path, scope: Scope, run: _Reading) -> list[RuleEntry]:
        out: list[RuleEntry] = []
        for name in self._first(d, root, run, _rule_file):
            path = d / name
            got = self._read(path, root, run)
            if got is None:
                continue
            fields, body = parse_front_matter(got[0])
            given = fields.get("activation", "always")
            activation = _ACTIVATIONS.get(str(given).lower())
            globs = fields.get("globs", ())
            if activation is None:
                shown = self._shown(path, root)
                run.notes.append(
                    f"skipped {shown}: activation must be always, on_demand or matched, "
                    f"not {str(given)[:64]!r}"
                )
                continue
            out.append(
                RuleEntry(
                    rule_id=_text(path.stem),
                    scope=scope,
                    scope_id="",
                    name=str(fields.get("name") or _text(path.stem)),
                    description=str(fields.get("description", "")),
                    text=body,
                    activation=activation,
                    path_globs=(globs,) if isinstance(globs, str) else tuple(globs),
                    origin=_text(str(path)),
                )
            )
        return out

    def _memory(self, path: Path, root: Path, scope: Scope, run: _Reading) -> list[MemoryEntry]:
        got = self._read(path, root, run)
        if got is None:
            return []
        return [MemoryEntry(path.name, scope, "", got[0], origin=_text(str(path)))]
