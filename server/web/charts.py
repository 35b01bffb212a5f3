"""Geometry of the inline SVG charts. Pure arithmetic: the templates draw what this
computes, and every label still passes through the template's escaping."""

from __future__ import annotations

from dataclasses import dataclass

from server.domain.records import CompileRecord
from server.web.present import LAYER_ORDER, busts, decision_name, layer_tokens

WIDTH = 1000
HEIGHT = 300
LEFT = 64
RIGHT = 12
TOP = 16
BOTTOM = 40
PLOT_W = WIDTH - LEFT - RIGHT
PLOT_H = HEIGHT - TOP - BOTTOM


@dataclass(frozen=True, slots=True)
class Segment:
    layer: str
    y: float
    height: float
    tokens: int


@dataclass(frozen=True, slots=True)
class Bar:
    index: int
    x: float
    width: float
    compile_id: str
    seq: int
    segments: tuple[Segment, ...]
    estimate: int
    estimate_y: float
    reported: int | None
    reported_y: float | None
    decision: str
    cache_bust: tuple[str, ...]
    checkpoint: str  # the checkpoint id when it differs from the previous compile's
    recorded: bool  # False for records written before layer figures were kept
    title: str


@dataclass(frozen=True, slots=True)
class Line:
    label: str
    value: int
    y: float | None  # None: above the chart's scale


@dataclass(frozen=True, slots=True)
class Tick:
    y: float
    label: str


@dataclass(frozen=True, slots=True)
class TimelineChart:
    bars: tuple[Bar, ...]
    budget_points: str  # SVG polyline points of the input budget per compile
    window_points: str
    lines: tuple[Line, ...]
    ticks: tuple[Tick, ...]
    scale_max: int
    width: int = WIDTH
    height: int = HEIGHT
    left: int = LEFT
    top: int = TOP
    plot_w: int = PLOT_W
    plot_h: int = PLOT_H


def _nice(value: float) -> int:
    """A round number at or above `value` for the top of the axis."""
    if value <= 0:
        return 1000
    step = 10 ** (len(str(int(value))) - 1)
    for m in (1, 2, 2.5, 5, 10):
        if m * step >= value:
            return int(m * step)
    return int(10 * step)


def timeline(records: tuple[CompileRecord, ...], full_window: bool = False) -> TimelineChart:
    tops = [max(r.estimated_input_tokens, r.usage.input_tokens if r.usage else 0) for r in records]
    tops += [sum(t for _, t in r.layer_tokens) for r in records]
    if full_window:
        tops += [max(r.context_window, r.input_budget) for r in records]
    scale = _nice(max(tops, default=0) * 1.1)

    def y(v: float) -> float:
        return round(TOP + PLOT_H - PLOT_H * v / scale, 2)

    n = max(1, len(records))
    slot = PLOT_W / n
    width = max(1.0, min(48.0, slot * 0.8))
    bars = []
    previous_checkpoint = ""
    for i, r in enumerate(records):
        x = round(LEFT + slot * i + (slot - width) / 2, 2)
        layers = layer_tokens(r.layer_tokens, r.estimated_input_tokens) if r.layer_tokens else {}
        segments = []
        base = 0
        for layer in LAYER_ORDER:
            tokens = layers.get(layer, 0)
            if tokens <= 0:
                continue  # a negative overhead (estimate below the ledger) draws nothing
            segments.append(Segment(layer, y(base + tokens), y(base) - y(base + tokens), tokens))
            base += tokens
        changed = tuple(busts(r.changed_sections))
        checkpoint = r.checkpoint_id if r.checkpoint_id != previous_checkpoint else ""
        previous_checkpoint = r.checkpoint_id
        reported = r.usage.input_tokens if r.usage else None
        decision = decision_name(r.decision)
        title = (
            f"seq {r.event_boundary}: estimate {r.estimated_input_tokens:,}"
            + (f", reported {reported:,}" if reported is not None else "")
            + f", {decision}"
            + (f", prefix changed: {', '.join(changed)}" if changed else "")
        )
        bars.append(
            Bar(
                index=i,
                x=x,
                width=round(width, 2),
                compile_id=r.compile_id,
                seq=r.event_boundary,
                segments=tuple(segments),
                estimate=r.estimated_input_tokens,
                estimate_y=y(r.estimated_input_tokens),
                reported=reported,
                reported_y=y(reported) if reported is not None else None,
                decision=decision.replace(" ", "_"),
                cache_bust=changed,
                checkpoint=checkpoint,
                recorded=bool(r.layer_tokens),
                title=title,
            )
        )

    def points(values: list[int]) -> str:
        return " ".join(
            f"{round(LEFT + slot * i + slot / 2, 2)},{y(v)}"
            for i, v in enumerate(values)
            if 0 < v <= scale
        )

    last = records[-1] if records else None
    lines = []
    if last is not None:
        for label, value in (("input budget", last.input_budget), ("window", last.context_window)):
            if value:
                lines.append(Line(label, value, y(value) if value <= scale else None))
    ticks = tuple(Tick(y(scale * k / 4), f"{scale * k // 4:,}") for k in range(5))
    return TimelineChart(
        bars=tuple(bars),
        budget_points=points([r.input_budget for r in records]),
        window_points=points([r.context_window for r in records]),
        lines=tuple(lines),
        ticks=ticks,
        scale_max=scale,
    )


@dataclass(frozen=True, slots=True)
class Stack:
    """One horizontal bar: the layers of one view against its window."""

    segments: tuple[Segment, ...]  # y holds the x offset (percent) for horizontal use
    reserve_pct: float
    budget_pct: float


def window_stack(layers: dict[str, int], window: int, reserve: int, budget: int) -> Stack:
    total = max(window, sum(v for v in layers.values() if v > 0) + reserve, 1)
    segments = []
    offset = 0.0
    for layer in LAYER_ORDER:
        tokens = layers.get(layer, 0)
        if tokens <= 0:
            continue
        w = 100 * tokens / total
        segments.append(Segment(layer, round(offset, 3), round(w, 3), tokens))
        offset += w
    return Stack(tuple(segments), round(100 * reserve / total, 3), round(100 * budget / total, 3))
