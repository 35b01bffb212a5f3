"""`ctxcc inspect SESSION` and `ctxcc sessions`: what fills a session's window, from a
running daemon. Both show the view the agent got: the recorded compile (the latest, or
the latest at `--at-seq`) rebuilt byte for byte with `rebuild_compile_id`, as the web
inspector does; only where no compile was recorded (or for another `--model`) a
`dry_run` compile stands in. Either way looking changes nothing."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import grpc

from ctxcc.v1 import (
    common_pb2,
    compile_service_pb2,
    compile_service_pb2_grpc,
    event_pb2,
    session_service_pb2,
    session_service_pb2_grpc,
    view_pb2,
)
from server.cli_channel import TokenError, add_token_flag, channel

DEFAULT_TARGET = "127.0.0.1:50551"
BAR = 60
GLYPHS = {
    "pinned": "█",
    "history": "▓",
    "working_set": "▒",
    "tool_schema": "░",
    "native_state": "▪",
    "provider_overhead": "p",
    "reserve": "r",
    "free": "·",
}


def _name(enum: Any, value: int, prefix: str) -> str:
    return str(enum.Name(value)).removeprefix(prefix).lower()


def _items(view: view_pb2.CompiledView, top: int) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    pinned = [
        {
            "item": _name(view_pb2.SectionKind, s.kind, "SECTION_KIND_"),
            "tokens": s.tokens,
            "source": ", ".join(s.sources),
        }
        for s in view.system_sections
    ]
    out["pinned"] = pinned
    for m in view.messages:
        layer = _name(view_pb2.Layer, m.layer, "LAYER_")
        text = " ".join(p.text for p in m.parts if p.text) or " ".join(c.name for c in m.tool_calls)
        role = _name(event_pb2.MessageRole, m.role, "MESSAGE_ROLE_")
        label = f"{role} seq {m.first_seq}" + (" (synthetic)" if m.synthetic else "")
        out.setdefault(layer, []).append(
            {"item": label, "tokens": m.tokens, "source": text[:60].replace("\n", " ")}
        )
    out["tool_schema"] = [
        {
            "item": t.definition.name,
            "tokens": t.tokens,
            "source": _name(view_pb2.ToolOrigin, t.origin, "TOOL_ORIGIN_"),
        }
        for t in view.tools
    ]
    return {k: sorted(v, key=lambda i: -i["tokens"])[:top] for k, v in out.items() if v}


def summarize(view: view_pb2.CompiledView, top: int = 3, shown: str = "") -> dict[str, Any]:
    b = view.budget
    window = b.context_window or (b.input_budget + b.output_reserve)
    layers = {_name(view_pb2.Layer, r.layer, "LAYER_"): r.tokens for r in view.layers}
    return {
        "session_id": view.session_id,
        # "recorded compile <id>" or "dry run (...)": which view the numbers are from.
        "shown": shown,
        "event_boundary": view.event_boundary,
        "model": view.route.model,
        "context_window": b.context_window,
        "window_unknown": b.window_unknown,
        "input_budget": b.input_budget,
        "output_reserve": b.output_reserve,
        "estimated_input_tokens": b.estimated_input_tokens,
        "estimate_method": _name(view_pb2.EstimateMethod, b.estimate_method, "ESTIMATE_METHOD_"),
        "last_reported_input_tokens": b.baseline_tokens or None,
        "utilization": round(b.utilization, 4),
        "decision": _name(view_pb2.Decision, view.decision, "DECISION_"),
        "pressure_layer": _name(view_pb2.Layer, view.pressure_layer, "LAYER_"),
        "layers": layers,
        # Layers + provider_overhead == estimated_input_tokens, always.
        "provider_overhead": b.provider_overhead_tokens,
        "route_model": {
            "ratio": round(b.route_model.ratio, 4),
            "overhead_tokens": b.route_model.overhead_tokens,
            "delta_samples": b.route_model.delta_samples,
            "full_samples": b.route_model.full_samples,
            "counter_kind": b.route_model.counter_kind,
            "framing_tokens": round(b.route_model.framing_tokens, 1),
        },
        "free_tokens": max(0, window - b.estimated_input_tokens - b.output_reserve),
        "checkpoint_id": view.checkpoint_id or None,
        "fallback_reasons": [
            _name(view_pb2.FallbackReason, r, "FALLBACK_REASON_") for r in view.fallback_reasons
        ],
        "compaction_recommended": view.HasField("compaction"),
        "biggest_items": _items(view, top),
        "notes": list(view.notes),
    }


def bar(s: dict[str, Any], width: int = BAR) -> str:
    window = s["context_window"] or (s["input_budget"] + s["output_reserve"])
    parts = [
        *s["layers"].items(),
        ("provider_overhead", max(0, s["provider_overhead"])),
        ("reserve", s["output_reserve"]),
        ("free", s["free_tokens"]),
    ]
    cells = ""
    for name, tokens in parts:
        n = round(width * tokens / window) if window else 0
        if tokens and not n:
            n = 1  # a layer that exists is always visible
        cells += GLYPHS[name] * n
    return "[" + cells[:width].ljust(width, GLYPHS["free"]) + "]"


def render(s: dict[str, Any]) -> str:
    window = s["context_window"] or "unknown"
    lines = [
        f"session {s['session_id']}  seq {s['event_boundary']}  model {s['model']}  "
        f"window {window}",
        f"showing {s['shown']}",
        bar(s),
        "  "
        + "  ".join(f"{GLYPHS[k]} {k} {v}" for k, v in s["layers"].items() if v)
        + (
            f"  {GLYPHS['provider_overhead']} provider_overhead {s['provider_overhead']}"
            if s["provider_overhead"]
            else ""
        )
        + f"  {GLYPHS['reserve']} reserve {s['output_reserve']}"
        + f"  {GLYPHS['free']} free {s['free_tokens']}",
        f"estimate {s['estimated_input_tokens']} ({s['estimate_method']})"
        # The report the estimate stood on: one made after this compile (for the view
        # shown, say) is the next compile's baseline, and the web inspector's timeline
        # shows it against this estimate.
        + (
            f"  baseline {s['last_reported_input_tokens']} reported before it"
            if s["last_reported_input_tokens"]
            else "  no usage reported on this route before it"
        )
        + f"  budget {s['input_budget']}  utilization {s['utilization']:.1%}",
        "route model: ratio {ratio}  framing {framing_tokens}/message  overhead {overhead_tokens}"
        "  learned from {delta_samples} "
        "changes and {full_samples} first requests  ({counter_kind} counter)".format(
            **s["route_model"]
        ),
        f"decision {s['decision']}  pressure from {s['pressure_layer']}"
        + ("  compaction recommended" if s["compaction_recommended"] else ""),
        f"checkpoint {s['checkpoint_id'] or 'none'}"
        + (f"  fallbacks: {', '.join(s['fallback_reasons'])}" if s["fallback_reasons"] else ""),
        "biggest items:",
    ]
    for layer, items in s["biggest_items"].items():
        for it in items:
            lines.append(f"  {layer:<12} {it['tokens']:>7}  {it['item']:<28} {it['source']}")
    lines += [f"note: {n}" for n in s["notes"]]
    return "\n".join(lines)


async def _session(stub: Any, sid: str, at_seq: int = 0) -> Any:
    """The session and the id of its compile recorded at `at_seq` (0: the latest)."""
    return await stub.GetSession(
        session_service_pb2.GetSessionRequest(session_id=sid, compile_at_seq=at_seq)
    )


async def _view(
    cstub: Any, found: Any, model: str, at_seq: int
) -> tuple[view_pb2.CompiledView, str]:
    """The view the agent got, rebuilt from its record, or a dry run where none was
    recorded (or another model was asked for); and which of the two it is."""
    session = found.session
    why = "--model given" if found.compile_id else "no compile recorded"
    if found.compile_id and not model:
        rebuilt = compile_service_pb2.CompileRequest(
            rebuild_compile_id=found.compile_id,
            image_mode=compile_service_pb2.IMAGE_MODE_REFERENCE,
        )
        try:
            view: view_pb2.CompiledView = (await cstub.Compile(rebuilt)).view
            return view, f"recorded compile {found.compile_id}"
        except grpc.aio.AioRpcError as err:
            if err.code() != grpc.StatusCode.NOT_FOUND:
                raise
            # Recorded by a daemon that kept no versions of its sources: not rebuildable.
            why = f"compile {found.compile_id} cannot be rebuilt"
    route = common_pb2.Route(model=model) if model else session.current_route
    if not route.model:
        # The session's route is that of its latest recorded compile (or its report).
        raise SystemExit(
            f"ctxcc inspect: session {session.session_id} has no compile recorded and no "
            "usage reported, so its route is unknown; pass --model"
        )
    req = compile_service_pb2.CompileRequest(
        session_id=session.session_id,
        route=route,
        as_of_seq=at_seq,
        dry_run=True,
        image_mode=compile_service_pb2.IMAGE_MODE_REFERENCE,
    )
    view = (await cstub.Compile(req)).view
    where = f"seq {at_seq}" if at_seq else "the head"
    return view, f"dry run at {where} ({why})"


async def inspect(args: argparse.Namespace) -> int:
    async with channel(args.target, args.auth_token_file) as ch:
        sstub: Any = session_service_pb2_grpc.SessionServiceStub(ch)
        cstub: Any = compile_service_pb2_grpc.CompileServiceStub(ch)
        found = await _session(sstub, args.session, args.at_seq)
        view, shown = await _view(cstub, found, args.model, args.at_seq)
    s = summarize(view, args.top, shown)
    print(json.dumps(s, indent=2) if args.json else render(s))
    return 0


async def _summary(sstub: Any, cstub: Any, sid: str, model: str) -> dict[str, Any]:
    """A session's row figures from its view (see `_view`)."""
    found = await _session(sstub, sid)
    # --model here only stands in for an unknown route: a recorded compile wins.
    view, shown = await _view(cstub, found, "" if found.compile_id else model, 0)
    s = summarize(view, shown=shown)
    keys = ("estimated_input_tokens", "utilization", "decision", "pressure_layer", "shown")
    return {k: s[k] for k in keys}


async def sessions(args: argparse.Namespace) -> int:
    rows = []
    async with channel(args.target, args.auth_token_file) as ch:
        sstub: Any = session_service_pb2_grpc.SessionServiceStub(ch)
        cstub: Any = compile_service_pb2_grpc.CompileServiceStub(ch)
        listed = await sstub.ListSessions(
            session_service_pb2.ListSessionsRequest(page_size=args.limit)
        )
        for session in listed.sessions:
            row: dict[str, Any] = {
                "session_id": session.session_id,
                "head_seq": session.head_seq,
                "model": session.current_route.model or args.model,
            }
            if session.HasField("active_time"):
                # Since the latest append or recorded compile: what --session-retention
                # measures (a daemon before the field leaves it out).
                active = session.active_time.ToNanoseconds()
                row["idle_seconds"] = max(0, (time.time_ns() - active) // 1_000_000_000)
            if row["model"] and session.head_seq:
                try:
                    row |= await _summary(sstub, cstub, session.session_id, args.model)
                except grpc.aio.AioRpcError as err:
                    # One session's view (over the daemon's message size, say) must not
                    # hide the others: its row says why it has no figures.
                    row["error"] = err.code().name
            rows.append(row)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    # The decision column fits the longest decision (over_budget_send_anyway) and a space.
    print(
        f"{'session':<36}{'seq':>7}{'idle':>6}  {'model':<26}{'estimate':>9}{'util':>8}  "
        f"{'decision':<25}pressure"
    )
    for r in rows:
        util = f"{r['utilization']:.1%}" if "utilization" in r else "-"
        decision = f"({r['error']})" if "error" in r else r.get("decision", "-")
        idle = duration(r["idle_seconds"]) if "idle_seconds" in r else "-"
        print(
            f"{r['session_id']:<36}{r['head_seq']:>7}{idle:>6}  {r['model'] or '-':<26}"
            f"{r.get('estimated_input_tokens', '-'):>9}{util:>8}  {decision:<24} "
            f"{r.get('pressure_layer', '-')}"
        )
    return 0


def duration(seconds: int) -> str:
    """A short span, in its largest whole unit: 45s, 12m, 5h, 9d."""
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def whole(lo: int, hi: int) -> Callable[[str], int]:
    """An argparse type for a count the request carries in an unsigned proto field:
    out of its range, protobuf raised ValueError, a traceback, after connecting."""

    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not lo <= n <= hi:
            raise argparse.ArgumentTypeError(f"{n} is not between {lo} and {hi}")
        return n

    return parse


UINT32_MAX, UINT64_MAX = (1 << 32) - 1, (1 << 64) - 1


def add_parsers(sub: Any) -> None:
    target = os.environ.get("CTXCC_TARGET", DEFAULT_TARGET)
    p = sub.add_parser("inspect", help="show what fills a session's window")
    p.add_argument("session", help="session id")
    p.add_argument(
        "--at-seq",
        type=whole(0, UINT64_MAX),
        default=0,
        help="the compile recorded at this seq (default, or 0: the latest)",
    )
    p.add_argument(
        "--model",
        default="",
        help="dry-run compile for this route model instead of the recorded view",
    )
    p.add_argument(
        "--top",
        type=whole(0, UINT32_MAX),
        default=3,
        help="biggest items shown per layer (default 3)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument(
        "--target",
        default=target,
        help=f"daemon gRPC target (env CTXCC_TARGET; default {DEFAULT_TARGET})",
    )
    s = sub.add_parser("sessions", help="list sessions with their pressure")
    s.add_argument(
        "--limit",
        type=whole(1, UINT32_MAX),
        default=50,
        help="sessions to list (at most; default 50)",
    )
    s.add_argument("--model", default="", help="model for sessions without a current route")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.add_argument(
        "--target",
        default=target,
        help=f"daemon gRPC target (env CTXCC_TARGET; default {DEFAULT_TARGET})",
    )
    for parser in (p, s):
        add_token_flag(parser)


def main(args: argparse.Namespace) -> int:
    fn = inspect if args.command == "inspect" else sessions
    try:
        return asyncio.run(fn(args))
    except TokenError as exc:
        print(f"ctxcc {args.command}: {exc}", file=sys.stderr)
        return 2
    except grpc.aio.AioRpcError as err:
        print(f"ctxcc {args.command}: {err.code().name}: {err.details()}", file=sys.stderr)
        return 1
