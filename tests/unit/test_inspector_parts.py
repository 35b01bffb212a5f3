"""The inspector's pieces that need no browser: its settings, compile records written
before the timeline's figures existed, and the chart arithmetic."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from server.compiler.render import surrogates_escaped
from server.compiler.view import Decision, Layer, SectionKind
from server.config import ConfigError, resolve
from server.domain.model import Route
from server.domain.records import CompileRecord, Usage
from server.service.watch import Closed, WatchHub
from server.web import charts, present
from storage.codec import decode_value, encode_value


def test_ui_listens_on_loopback_by_default_and_can_be_turned_off() -> None:
    assert resolve({}, env={}).ui_listen == "127.0.0.1:9465"
    assert resolve({"ui_listen": "none"}, env={}).ui_listen == "none"


def test_ui_beyond_loopback_needs_the_api_token(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"inspector on 0\.0\.0\.0:9465 without authentication"):
        resolve({"ui_listen": "0.0.0.0:9465"}, env={})
    token = tmp_path / "t"
    token.write_text("x" * 20)
    cfg = resolve({"ui_listen": "0.0.0.0:9465", "auth_token_file": str(token)}, env={})
    assert cfg.ui_listen == "0.0.0.0:9465"


@pytest.mark.parametrize("other", ["metrics_listen", "health_listen"])
def test_ui_never_shares_the_metrics_or_health_port(other: str) -> None:
    with pytest.raises(ConfigError, match=f"must not share a port with {other}"):
        resolve({"ui_listen": "127.0.0.1:9500", other: "0.0.0.0:9500"}, env={})


@dataclass(frozen=True, slots=True)
class OldCompileRecord:
    """A compile record as the previous release wrote it (no timeline figures)."""

    compile_id: str
    session_id: str
    route: Route
    event_boundary: int
    estimated_input_tokens: int
    estimate_method: int
    create_time_ns: int
    usage: Usage | None = None
    section_digests: tuple[tuple[int, str], ...] = ()
    message_count: int = 0
    messages_digest: str = ""
    fixed_tokens: int = 0
    raw_delta: int | None = None
    baseline_tokens: int = 0


def test_compile_records_written_before_the_timeline_figures_still_read() -> None:
    OldCompileRecord.__name__ = "CompileRecord"  # the envelope names the record type
    old = OldCompileRecord("s:1", "s", Route(model="m"), 4, 900, 2, 7, Usage(950, 10))
    record = decode_value(encode_value(old), CompileRecord)
    assert (record.estimated_input_tokens, record.usage) == (900, Usage(950, 10))
    assert record.layer_tokens == () and record.input_budget == 0 and record.decision == 0
    chart = charts.timeline((record,))
    assert not chart.bars[0].recorded and chart.bars[0].decision == "not_recorded"


def _rec(i: int, **kw: object) -> CompileRecord:
    base: dict[str, object] = {
        "layer_tokens": ((int(Layer.PINNED), 100), (int(Layer.HISTORY), 500)),
        "input_budget": 10_000,
        "context_window": 12_000,
        "decision": int(Decision.OK),
        "estimated_input_tokens": 1000,
    }
    fields = {**base, **kw}
    return CompileRecord(
        compile_id=f"s:{i}",
        session_id="s",
        route=Route(model="m"),
        event_boundary=i,
        estimate_method=1,
        create_time_ns=i,
        **fields,  # type: ignore[arg-type]
    )


def test_timeline_bars_stack_layers_and_mark_busts_and_checkpoints() -> None:
    records = (
        _rec(1, usage=Usage(1100, 1)),
        _rec(2, checkpoint_id="c1", changed_sections=(int(SectionKind.MEMORY),)),
        _rec(3, checkpoint_id="c1", estimated_input_tokens=550),  # below the ledger
    )
    chart = charts.timeline(records)
    first, second, third = chart.bars
    assert [s.layer for s in first.segments] == ["pinned", "history", "provider_overhead"]
    assert [s.tokens for s in first.segments] == [100, 500, 400]
    top = min(s.y for s in first.segments)
    assert top == pytest.approx(first.estimate_y)  # the stack adds up to the estimate
    assert first.reported == 1100 and second.reported is None
    assert second.cache_bust == ("memory",) and first.cache_bust == ()
    assert (first.checkpoint, second.checkpoint, third.checkpoint) == ("", "c1", "")
    assert [s.layer for s in third.segments] == ["pinned", "history"]  # negative: not drawn
    # the budget line is on the chart only when the scale reaches it
    assert chart.scale_max < 10_000 and chart.lines[0].y is None
    assert charts.timeline(records, full_window=True).lines[0].y is not None


async def test_a_watcher_subscribing_during_shutdown_ends_at_once() -> None:
    """A live page (or WatchSession) that subscribes just after the daemon closed its
    watchers must not wait for updates that never come: it held shutdown up by seconds."""
    hub = WatchHub(4)
    async with hub.subscribe("s") as early:
        hub.close_all()
        assert isinstance(early.queue.get_nowait(), Closed)
    async with hub.subscribe("s") as late:
        assert isinstance(late.queue.get_nowait(), Closed)


def test_a_body_with_an_escaped_lone_surrogate_is_shown_and_stays_encodable() -> None:
    """The step page shows a rendered body indented: read back and written with non-ASCII
    kept, the escape of a lone surrogate a client sent (the body keeps it escaped) became
    a character no UTF-8 page can carry, and the page failed 500."""
    body = '{"input":{"cmd":"\\ud800 and é"}}'
    shown = present.pretty_body(body)
    shown.encode()  # raises UnicodeEncodeError when a surrogate is left in
    assert "\\ud800" in shown and "é" in shown
    assert json.loads(shown) == json.loads(body)


def _old_pretty(body: str) -> str:
    """The step page's body as it was made: parsed whole, cut, indented whole."""
    text = surrogates_escaped(
        json.dumps(present._cut(json.loads(body)), indent=2, ensure_ascii=False)
    )
    if len(text) > present.MAX_BODY_CHARS:
        cut = len(text) - present.MAX_BODY_CHARS
        text = text[: present.MAX_BODY_CHARS] + f"\n… [{cut:,} more characters]"
    return text


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
    | st.just("x" * (present.MAX_JSON_STRING + 5)),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=30,
)


@given(_JSON, st.booleans())
@settings(max_examples=300)
def test_the_body_is_indented_as_json_dumps_indents_it(value: object, spaced: bool) -> None:
    body = json.dumps(value, ensure_ascii=False, separators=(", ", ": ") if spaced else None)
    body = surrogates_escaped(body)
    assert present.pretty_body(body) == _old_pretty(body)


def test_a_huge_body_is_read_only_up_to_the_pages_cut(monkeypatch: pytest.MonkeyPatch) -> None:
    """A body of 250,000 messages (750,000 strings): only the strings before the page's
    cut are decoded (it was parsed and indented whole, seconds of CPU), and the page's
    text is the same up to the cut."""
    messages = [{"role": "user", "content": f"m{i}"} for i in range(250_000)]
    body = json.dumps({"model": "m", "messages": messages}, separators=(",", ":"))
    scan = present._scanstring
    decoded: list[int] = []

    def counted(text: str, start: int) -> tuple[str, int]:
        decoded.append(start)
        return scan(text, start)

    monkeypatch.setattr(present, "_scanstring", counted)
    shown = present.pretty_body(body)
    assert len(decoded) < 40_000
    assert shown[: present.MAX_BODY_CHARS] == _old_pretty(body)[: present.MAX_BODY_CHARS]
    assert shown.endswith(f"[cut here: the body is {len(body):,} characters of JSON]")
