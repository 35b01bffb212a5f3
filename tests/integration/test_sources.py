"""A real project directory through a real daemon: every section with its source and
token count, API memory/rules/skills, LoadRule, change reporting and errors."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from ctxcc.v1 import common_pb2, session_pb2, source_pb2, view_pb2
from ctxcc.v1 import session_service_pb2 as spb
from ctxcc.v1 import source_service_pb2 as rpb
from server.adapters.workspace import (
    MAX_DIR_FILES,
    MAX_READ_BYTES,
    MAX_READ_TOTAL,
    WorkspaceReader,
)
from server.app import Daemon
from tests.conftest import Stubs, make_config, stubs_for
from tests.helpers import compile_request, error_info, user

PROJECT = common_pb2.SCOPE_PROJECT


@pytest.fixture
async def project_api(short_tmp: Path) -> AsyncIterator[tuple[Stubs, Path]]:
    work = short_tmp / "work"
    proj = work / "proj"
    (proj / "src").mkdir(parents=True)
    (proj / "AGENTS.md").write_text("Run make test before committing.\n")
    (proj / "src" / "CLAUDE.md").write_text("Source code lives here.\n")
    (proj / ".ctxcc" / "skills" / "deploy").mkdir(parents=True)
    (proj / ".ctxcc" / "skills" / "deploy" / "SKILL.md").write_text(
        "---\nname: deploy\ndescription: Ship a release.\n---\nsteps"
    )
    cfg = make_config(short_tmp / "data", workspace_roots=str(work))
    d = Daemon(cfg)
    await d.start()
    s = stubs_for(str(d.endpoints.tcp))
    try:
        yield s, proj
    finally:
        await s.channel.close()
        await d.stop()


async def _compiled(api: Stubs, sid: str, root: Path) -> view_pb2.CompiledView:
    """The first view of a new session `sid` on the project at `root`, after one user
    message: what a compile makes of the project's files."""
    session = session_pb2.Session(session_id=sid, project_root=str(root))
    await api.sessions.CreateSession(spb.CreateSessionRequest(session=session))
    await api.sessions.AppendEvents(spb.AppendEventsRequest(session_id=sid, events=[user("hi")]))
    return (await api.compiles.Compile(compile_request(sid))).view


async def test_project_sections_with_sources_tokens_and_changes(
    project_api: tuple[Stubs, Path],
) -> None:
    api, proj = project_api
    await api.sessions.CreateSession(
        spb.CreateSessionRequest(
            session=session_pb2.Session(
                session_id="p1",
                project_id="acme",
                project_root=str(proj),
                working_directory=str(proj / "src"),
            )
        )
    )
    await api.sessions.AppendEvents(spb.AppendEventsRequest(session_id="p1", events=[user("hi")]))
    await api.sources.PutMemory(
        rpb.PutMemoryRequest(
            memory=source_pb2.MemoryEntry(
                memory_id="tabs", scope=PROJECT, scope_id="acme", text="Team uses tabs."
            )
        )
    )
    await api.sources.PutRule(
        rpb.PutRuleRequest(
            rule=source_pb2.Rule(
                rule_id="sql",
                scope=PROJECT,
                scope_id="acme",
                name="sql",
                description="How to write SQL",
                text="Always use CTEs.",
                activation=source_pb2.RULE_ACTIVATION_ON_DEMAND,
            )
        )
    )
    first = (await api.compiles.Compile(compile_request("p1"))).view
    by = {s.kind: s for s in first.system_sections}
    assert list(by) == [
        view_pb2.SECTION_KIND_KERNEL,
        view_pb2.SECTION_KIND_INSTRUCTIONS,
        view_pb2.SECTION_KIND_SKILLS,
        view_pb2.SECTION_KIND_RULE_INDEX,
        view_pb2.SECTION_KIND_APPROVAL,
        view_pb2.SECTION_KIND_MEMORY,
        view_pb2.SECTION_KIND_ENVIRONMENT,
    ]
    assert list(by[view_pb2.SECTION_KIND_INSTRUCTIONS].sources) == [
        str(proj / "AGENTS.md"),
        str(proj / "src" / "CLAUDE.md"),
    ]
    assert list(by[view_pb2.SECTION_KIND_SKILLS].sources) == [
        str(proj / ".ctxcc" / "skills" / "deploy" / "SKILL.md")
    ]
    assert list(by[view_pb2.SECTION_KIND_MEMORY].sources) == ["api:memory/project/tabs"]
    assert all(s.tokens > 0 for s in first.system_sections)
    assert by[view_pb2.SECTION_KIND_MEMORY].authority == common_pb2.AUTHORITY_USER_CONTROLLABLE
    assert "load_rule" in [t.definition.name for t in first.tools]
    assert f"working_directory: {proj / 'src'}" in by[view_pb2.SECTION_KIND_ENVIRONMENT].text

    same = (await api.compiles.Compile(compile_request("p1"))).view
    assert same.prefix_digest == first.prefix_digest
    assert view_pb2.SECTION_KIND_MEMORY not in same.changed_sections

    await api.sources.PutMemory(
        rpb.PutMemoryRequest(
            memory=source_pb2.MemoryEntry(
                memory_id="tabs", scope=PROJECT, scope_id="acme", text="Team uses spaces."
            )
        )
    )
    changed = (await api.compiles.Compile(compile_request("p1"))).view
    assert changed.prefix_digest != first.prefix_digest
    assert view_pb2.SECTION_KIND_MEMORY in changed.changed_sections
    assert view_pb2.SECTION_KIND_INSTRUCTIONS not in changed.changed_sections

    rule = (await api.sources.LoadRule(rpb.LoadRuleRequest(session_id="p1", name="sql"))).rule
    assert rule.text == "Always use CTEs."
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await api.sources.LoadRule(rpb.LoadRuleRequest(session_id="p1", name="nope"))
    assert error_info(exc.value).reason == "SOURCE_NOT_FOUND"

    listed = await api.sources.ListMemory(rpb.ListMemoryRequest(scope=PROJECT, scope_id="acme"))
    assert [m.text for m in listed.memories] == ["Team uses spaces."]
    await api.sources.DeleteMemory(
        rpb.DeleteMemoryRequest(scope=PROJECT, scope_id="acme", memory_id="tabs")
    )
    gone = (await api.compiles.Compile(compile_request("p1"))).view
    assert view_pb2.SECTION_KIND_MEMORY not in {s.kind for s in gone.system_sections}
    assert view_pb2.SECTION_KIND_MEMORY in gone.changed_sections


async def test_source_errors(project_api: tuple[Stubs, Path]) -> None:
    api, proj = project_api

    async def reason(call: object) -> tuple[grpc.StatusCode, str]:
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await call  # type: ignore[misc]
        return exc.value.code(), error_info(exc.value).reason

    bad_scope = api.sources.PutMemory(
        rpb.PutMemoryRequest(memory=source_pb2.MemoryEntry(memory_id="m", text="x"))
    )
    assert await reason(bad_scope) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD")
    global_with_id = api.sources.PutMemory(
        rpb.PutMemoryRequest(
            memory=source_pb2.MemoryEntry(
                memory_id="m", scope=common_pb2.SCOPE_GLOBAL, scope_id="x", text="x"
            )
        )
    )
    assert (await reason(global_with_id))[1] == "INVALID_FIELD"
    unknown_session = api.sources.PutMemory(
        rpb.PutMemoryRequest(
            memory=source_pb2.MemoryEntry(
                memory_id="m", scope=common_pb2.SCOPE_SESSION, scope_id="ghost", text="x"
            )
        )
    )
    assert await reason(unknown_session) == (grpc.StatusCode.NOT_FOUND, "SESSION_NOT_FOUND")
    matched_without_globs = api.sources.PutRule(
        rpb.PutRuleRequest(
            rule=source_pb2.Rule(
                rule_id="r",
                scope=common_pb2.SCOPE_GLOBAL,
                name="r",
                text="t",
                activation=source_pb2.RULE_ACTIVATION_MATCHED,
            )
        )
    )
    assert (await reason(matched_without_globs))[1] == "INVALID_FIELD"
    missing = api.sources.DeleteRule(
        rpb.DeleteRuleRequest(scope=common_pb2.SCOPE_GLOBAL, rule_id="nope")
    )
    assert await reason(missing) == (grpc.StatusCode.NOT_FOUND, "SOURCE_NOT_FOUND")
    escape = api.sessions.CreateSession(
        spb.CreateSessionRequest(
            session=session_pb2.Session(session_id="x", project_root=f"{proj}/../../etc")
        )
    )
    assert await reason(escape) == (grpc.StatusCode.INVALID_ARGUMENT, "PATH_OUTSIDE_ROOT")


async def test_memory_and_the_rule_index_have_caps_of_their_own(short_tmp: Path) -> None:
    """R-MISC-4: memory and the on-demand rule index are each cut at their own cap
    (--memory-cap, --rule-index-cap), whole entries kept in order and the rest counted in
    the text and the notes; under the caps, nothing is cut."""
    session = "caps"
    entries = [f"fact {i}: " + "the build needs the cache warmed first. " * 2 for i in range(8)]
    entries = [e.strip() for e in entries]  # as the section holds them
    rules = [
        (f"r{i}", f"when touching module {i} " + "of the storage layer " * 3) for i in range(8)
    ]
    for memory_cap, index_cap, cut in (("300", "250", True), ("8000", "4000", False)):
        d = Daemon(
            make_config(
                short_tmp / f"data-{memory_cap}", memory_cap=memory_cap, rule_index_cap=index_cap
            )
        )
        await d.start()
        api = stubs_for(str(d.endpoints.tcp))
        try:
            await api.sessions.CreateSession(
                spb.CreateSessionRequest(session=session_pb2.Session(session_id=session))
            )
            await api.sessions.AppendEvents(
                spb.AppendEventsRequest(session_id=session, events=[user("hi")])
            )
            for i, text in enumerate(entries):
                await api.sources.PutMemory(
                    rpb.PutMemoryRequest(
                        memory=source_pb2.MemoryEntry(
                            memory_id=f"m{i}",
                            scope=common_pb2.SCOPE_SESSION,
                            scope_id=session,
                            text=text,
                        )
                    )
                )
            for name, description in rules:
                await api.sources.PutRule(
                    rpb.PutRuleRequest(
                        rule=source_pb2.Rule(
                            rule_id=name,
                            scope=common_pb2.SCOPE_SESSION,
                            scope_id=session,
                            name=name,
                            description=description,
                            text="Check the cache first.",
                            activation=source_pb2.RULE_ACTIVATION_ON_DEMAND,
                        )
                    )
                )
            view = (await api.compiles.Compile(compile_request(session))).view
        finally:
            await api.channel.close()
            await d.stop()
        by = {s.kind: s for s in view.system_sections}
        memory, index = by[view_pb2.SECTION_KIND_MEMORY], by[view_pb2.SECTION_KIND_RULE_INDEX]
        kept_facts = [t for t in entries if t in memory.text]
        kept_rules = [n for n, desc in rules if f"- {n}: {desc}" in index.text]
        if not cut:
            assert (kept_facts, kept_rules) == (entries, [n for n, _ in rules])
            assert not memory.truncated and not index.truncated
            assert not [n for n in view.notes if "omitted" in n]
            continue
        # Each entry line is `<entry ...>text</entry>` (~150 characters): two fit in 300.
        assert kept_facts == entries[: len(kept_facts)] and 1 <= len(kept_facts) < len(entries)
        assert kept_rules == [n for n, _ in rules][: len(kept_rules)]
        assert 1 <= len(kept_rules) < len(rules)
        assert memory.truncated and index.truncated
        lines = [ln for ln in memory.text.splitlines() if ln.startswith("<entry")]
        assert sum(len(ln) + 1 for ln in lines) <= 300 + 1
        omitted_facts, omitted_rules = len(entries) - len(kept_facts), len(rules) - len(kept_rules)
        assert f"[... {omitted_facts} more memory entries omitted: cap of 300 characters]" in (
            memory.text
        )
        assert f"[... {omitted_rules} more rule(s) omitted: cap of 250 characters]" in index.text
        assert f"{omitted_facts} memory entries omitted from the memory section (cap 300)" in (
            view.notes
        )
        assert f"{omitted_rules} rule(s) omitted from the rule_index section (cap 250)" in (
            view.notes
        )


async def test_skill_and_rule_files_saved_with_a_byte_order_mark_keep_their_front_matter(
    project_api: tuple[Stubs, Path],
) -> None:
    """Editors on Windows save UTF-8 with a byte-order mark, and CRLF line ends. The
    front matter after it is still front matter: the skill is listed, and the on-demand
    rule goes to the index (its text only through LoadRule), not into every prompt as an
    always rule with its front matter for text."""
    api, proj = project_api
    bom = b"\xef\xbb\xbf"
    skill = proj / ".ctxcc" / "skills" / "release" / "SKILL.md"
    skill.parent.mkdir(parents=True)
    skill.write_bytes(bom + b"---\r\nname: release\r\ndescription: Tag and publish.\r\n---\r\nx")
    (proj / ".ctxcc" / "rules").mkdir()
    (proj / ".ctxcc" / "rules" / "sql.md").write_bytes(
        bom + b"---\nname: sql\ndescription: How to write SQL\nactivation: on_demand\n---\n"
        b"Always use CTEs.\n"
    )
    view = await _compiled(api, "bom", proj)
    by = {s.kind: s.text for s in view.system_sections}
    assert "- release: Tag and publish." in by[view_pb2.SECTION_KIND_SKILLS], list(view.notes)
    assert "- sql: How to write SQL" in by[view_pb2.SECTION_KIND_RULE_INDEX]
    assert view_pb2.SECTION_KIND_RULES not in by, by.get(view_pb2.SECTION_KIND_RULES)
    assert not [n for n in view.notes if "front matter" in n], list(view.notes)
    rule = (await api.sources.LoadRule(rpb.LoadRuleRequest(session_id="bom", name="sql"))).rule
    assert rule.text == "Always use CTEs." and rule.description == "How to write SQL"


async def test_load_rule_reads_the_workspace_on_the_compute_pool(
    project_api: tuple[Stubs, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """LoadRule reads the whole workspace (up to 16 MiB of files) to find one rule, as a
    compile does: that is the compute pool's work. On the storage threads, eight agents
    loading rules in a loop took the threads other sessions' appends make their fsync
    on. The reader is the daemon's own; only the thread each read runs on is noted."""
    api, proj = project_api
    (proj / ".ctxcc" / "rules").mkdir()
    (proj / ".ctxcc" / "rules" / "sql.md").write_text(
        "---\nname: sql\ndescription: SQL\nactivation: on_demand\n---\nUse CTEs.\n"
    )
    threads: list[str] = []
    read = WorkspaceReader.read

    def noted(reader: WorkspaceReader, project_root: str, working_directory: str) -> Any:
        threads.append(threading.current_thread().name)
        return read(reader, project_root, working_directory)

    monkeypatch.setattr(WorkspaceReader, "read", noted)
    session = session_pb2.Session(session_id="lr", project_root=str(proj))
    await api.sessions.CreateSession(spb.CreateSessionRequest(session=session))
    loaded = await asyncio.gather(
        *(api.sources.LoadRule(rpb.LoadRuleRequest(session_id="lr", name="sql")) for _ in range(8))
    )
    assert [r.rule.text for r in loaded] == ["Use CTEs."] * 8
    assert len(threads) == 8 and all(t.startswith("ctxcc-compute") for t in threads), threads


async def test_a_workspace_read_stops_at_its_byte_budget(
    project_api: tuple[Stubs, Path],
) -> None:
    """Every file found is read, decoded and sanitized before the caps cut (rules past
    the rules cap are counted, not skipped unread): a repository of many big rule files
    (hard links of one file cost no disk) made each compile read all of them (200 of 1 MiB:
    ~7 s and 2.7 GB). One read takes MAX_READ_TOTAL bytes at most; each file that does
    not fit in what is left is skipped with a note, the files read stay in the view."""
    api, proj = project_api
    big = proj.parent / "big"
    rules = big / ".ctxcc" / "rules"
    rules.mkdir(parents=True)
    (big / "AGENTS.md").write_text("Keep the build green.\n")
    one = big / "one"
    one.write_bytes(b"---\nactivation: always\n---\n" + b"Use tabs. " * (MAX_READ_BYTES // 10))
    fit = MAX_READ_TOTAL // MAX_READ_BYTES - 1  # AGENTS.md took some of the room
    for i in range(fit + 4):
        os.link(one, rules / f"r{i:02d}.md")
    (big / ".ctxcc" / "MEMORY.md").write_text("Small files still fit.\n")  # read after rules
    view = await _compiled(api, "big", big)
    by = {s.kind: s.text for s in view.system_sections}
    assert "Keep the build green." in by[view_pb2.SECTION_KIND_INSTRUCTIONS]
    skipped = sorted(n.split(":")[0] for n in view.notes if "MiB, the most one read" in n)
    assert skipped == [f"skipped .ctxcc/rules/r{i:02d}.md" for i in range(fit, fit + 4)], list(
        view.notes
    )
    # The big rules read are each over the rules cap: all counted as omitted, none more;
    # a small file after the budget was reached still fits in what is left.
    assert f"{fit} rule(s) omitted from the rules section (cap 16000)" in view.notes
    assert "Small files still fit." in by[view_pb2.SECTION_KIND_MEMORY]


async def test_a_skills_or_rules_directory_gives_a_bounded_number_of_files(
    project_api: tuple[Stubs, Path],
) -> None:
    """Each skill or rule file costs a walk from the root and a parse however small it
    is, while the caps show ~100: a repository with 20,000 of each made every compile
    take ~5 s. A directory gives its first MAX_DIR_FILES by name; a note counts the rest."""
    api, proj = project_api
    wide = proj.parent / "wide"
    rules, skills = wide / ".ctxcc" / "rules", wide / ".claude" / "skills"
    rules.mkdir(parents=True)
    extra = 3
    for i in range(MAX_DIR_FILES + extra):
        (rules / f"r{i:05d}.md").write_text(
            f"---\nactivation: on_demand\ndescription: d\n---\nr{i}"
        )
        (skills / f"s{i:05d}").mkdir(parents=True)
        (skills / f"s{i:05d}" / "SKILL.md").write_text(
            f"---\nname: s{i:05d}\ndescription: d\n---\n"
        )
    view = await _compiled(api, "wide", wide)
    notes = list(view.notes)
    assert f"skipped {extra} more entries of .ctxcc/rules: " in "\n".join(notes), notes
    assert f"skipped {extra} more entries of .claude/skills: " in "\n".join(notes), notes
    by = {s.kind: s.text for s in view.system_sections}
    # Kept and omitted together: what was read, the first by name.
    kept = by[view_pb2.SECTION_KIND_SKILLS].count("\n- s")
    omitted = [n for n in notes if "skill(s) omitted from the skills section" in n]
    assert kept + int(omitted[0].split()[0]) == MAX_DIR_FILES, notes
    assert "- s00000: d" in by[view_pb2.SECTION_KIND_SKILLS]
    index = by[view_pb2.SECTION_KIND_RULE_INDEX].count("\n- r")
    omitted = [n for n in notes if "rule(s) omitted from the rule_index section" in n]
    assert index + int(omitted[0].split()[0]) == MAX_DIR_FILES, notes
    last = await api.sources.LoadRule(
        rpb.LoadRuleRequest(session_id="wide", name=f"r{MAX_DIR_FILES - 1:05d}")
    )
    assert last.rule.text == f"r{MAX_DIR_FILES - 1}"


async def test_a_workspace_read_opens_a_bounded_number_of_directories(
    project_api: tuple[Stubs, Path],
) -> None:
    """The confined walk goes back to the root for each `..` of a link's target, so a
    chain of links of `d/` 800 times then `../` 800 times cost millions of opens: 5.8 s a
    rule file, hours of a compute thread for a rules directory of them, while every other
    session's first compile waited. One read opens MAX_READ_OPENS names at most; the files
    read before that stay in the view, the rest are skipped with a note."""
    api, proj = project_api
    maze = proj.parent / "maze"
    rules = maze / ".ctxcc" / "rules"
    rules.mkdir(parents=True)
    (maze / "AGENTS.md").write_text("Keep the build green.\n")
    (rules / "a.md").write_text("Write tests first.\n")
    (maze / "real.md").write_text("The end of the maze.\n")
    depth, links = 800, 4
    deep = maze
    for _ in range(depth):  # one level at a time: mkdir(parents=True) recurses per level
        deep /= "d"
        deep.mkdir()
    for i in range(links):
        there = f"link{i + 1}" if i + 1 < links else "real.md"
        (maze / f"link{i}").symlink_to("/".join(["d"] * depth + [".."] * depth + [there]))
    for name in ("r0.md", "r1.md"):
        (rules / name).symlink_to("../../link0")
    view = await _compiled(api, "maze", maze)
    by = {s.kind: s.text for s in view.system_sections}
    assert "Keep the build green." in by[view_pb2.SECTION_KIND_INSTRUCTIONS]
    assert "Write tests first." in by[view_pb2.SECTION_KIND_RULES]
    assert "The end of the maze." not in by[view_pb2.SECTION_KIND_RULES]
    for name in ("r0.md", "r1.md"):
        note = f"skipped .ctxcc/rules/{name}: past the directories one workspace read may open"
        assert note in view.notes, list(view.notes)
