"""The memory of repeatable views (service/repeats.py) on its own: a view is kept only
when its record was the only write since its reads, it is repeated only while the store's
generation and the clock's time text hold, and entries are bounded by count and bytes."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from server.compiler.compile import compile_view, section_digests
from server.domain.generation import Generation
from server.domain.model import ContentPart, Event, UserMessage
from server.domain.records import CompileRecord
from server.service.compile_types import CompileOptions, CompileResult
from server.service.repeats import BUSY, Repeatable, Repeats
from tests.unit.test_incremental import C, Step, inputs_for

LOG = [Event(i + 1, f"e{i + 1}", 0, UserMessage((ContentPart(text=f"hi {i}"),))) for i in range(3)]


class _Store:
    """Counts writes like the real store: each compile record bumps its session."""

    def __init__(self) -> None:
        self.everything = 0
        self.sessions: dict[str, int] = {}
        self.written: list[CompileRecord] = []
        self.locked = False

    def generation(self, session_id: str, route_id: str) -> Generation:
        return Generation(self.everything, self.sessions.get(session_id, 0), 0)

    def put_compile(
        self,
        record: CompileRecord,
        parts: tuple[Any, ...] = (),
        wait: bool = True,
        route_since: Generation | None = None,
    ) -> bool:
        if not wait and self.locked:
            return False
        self.written.append(record)
        self.sessions[record.session_id] = self.sessions.get(record.session_id, 0) + 1
        return True


class _Sources:
    def reads_files(self, session: Any) -> bool:
        return False


class _Ids:
    def __init__(self) -> None:
        self.n = 0

    def new_id(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}r{self.n}"


class _Clock:
    def now_ns(self) -> int:
        return 42


def _repeats(store: _Store, time_text: list[str], max_bytes: int = 1 << 30) -> Repeats:
    return Repeats(
        store,  # type: ignore[arg-type]
        _Sources(),  # type: ignore[arg-type]
        replace(inputs_for(LOG, Step([], 0, "", 0, False, False, False), 0).sources).caps,
        lambda: time_text[0],
        _Ids(),
        _Clock(),
        max_bytes,
    )


def _compiled(store: _Store, repeats: Repeats, session_id: str) -> CompileOptions:
    """A compile of `session_id` whose record was written, remembered as `repeats` would."""
    inputs = inputs_for(LOG, Step([], 0, "", 0, False, False, False), 0)
    view = replace(compile_view(inputs, C), session_id=session_id, compile_id=f"{session_id}:1")
    digests = section_digests(view.system_sections, view.tools)
    inputs = replace(inputs, previous_sections=digests)
    opts = CompileOptions(session_id=session_id, route=inputs.route)
    record = CompileRecord(view.compile_id, session_id, inputs.route, 3, 10, 1, 7)
    record = replace(record, section_digests=digests)
    before = store.generation(session_id, "")
    store.put_compile(record)
    repeats.remember(opts, before, inputs, CompileResult(view), record)
    return opts


def test_a_kept_view_repeats_under_new_ids_while_nothing_moves() -> None:
    now = inputs_for(LOG, Step([], 0, "", 0, False, False, False), 0).environment.time_text
    store, clock = _Store(), [now]
    repeats = _repeats(store, clock)
    opts = _compiled(store, repeats, "a")
    entry = repeats.candidate(opts)
    assert entry is not None
    store.locked = True  # an append holds the session's lock: nothing written
    assert repeats.repeat(entry, wait=False) is BUSY
    assert len(store.written) == 1 and repeats.candidate(opts) is not None
    store.locked = False
    first = repeats.repeat(entry, wait=False)
    assert isinstance(first, CompileResult)
    again = repeats.candidate(opts)
    assert again is not None, "its own record does not end the repeat"
    second = repeats.repeat(again)
    assert isinstance(second, CompileResult)
    ids = [first.view.compile_id, second.view.compile_id]
    assert ids == ["a:r2", "a:r3"]  # r1 went to the try that found the lock held
    assert replace(second.view, compile_id="a:1") == entry.result.view
    assert [r.compile_id for r in store.written[1:]] == ids
    assert all(r.create_time_ns == 42 for r in store.written[1:])
    # Another write, another request, or the clock's text moving on: no repeat.
    assert repeats.candidate(replace(opts, dry_run=True)) is None
    clock[0] = now + " later"
    last = repeats.candidate(opts)
    assert last is not None and repeats.repeat(last) is None
    store.everything += 1
    assert repeats.candidate(opts) is None


def test_a_view_is_not_kept_when_another_write_came_between() -> None:
    store = _Store()
    repeats = _repeats(store, ["t"])
    inputs = inputs_for(LOG, Step([], 0, "", 0, False, False, False), 0)
    view = compile_view(inputs, C)
    digests = section_digests(view.system_sections, view.tools)
    inputs = replace(inputs, previous_sections=digests)
    opts = CompileOptions(session_id="s", route=inputs.route)
    record = replace(CompileRecord("s:1", "s", inputs.route, 3, 10, 1, 7), section_digests=digests)
    before = store.generation("s", "")
    store.put_compile(record)
    store.put_compile(record)  # stands for an append that landed during the compile
    repeats.remember(opts, before, inputs, CompileResult(view), record)
    assert repeats.candidate(opts) is None
    # Nor when its previous sections were not its own (its changed sections would differ).
    store2 = _Store()
    other = _repeats(store2, ["t"])
    before = store2.generation("s", "")
    store2.put_compile(record)
    other.remember(opts, before, replace(inputs, previous_sections=()), CompileResult(view), record)
    assert other.candidate(opts) is None


def test_entries_are_bounded_by_bytes() -> None:
    store = _Store()
    probe = _repeats(store, ["t"])
    one = probe.candidate(_compiled(store, probe, "x"))
    assert isinstance(one, Repeatable)
    repeats = _repeats(store, ["t"], max_bytes=2 * one.size + 1)
    kept = [_compiled(store, repeats, sid) for sid in ("a", "b", "c")]
    assert [repeats.candidate(o) is not None for o in kept] == [False, True, True]
    assert repeats.size_bytes == 2 * one.size
