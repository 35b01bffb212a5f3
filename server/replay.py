"""`ctxcc replay TRACE.jsonl[.xz]`: replays recorded agent requests through a real
daemon and measures the estimates against the tokens the providers reported.

Each trace session becomes one daemon session. For every request the new messages are
appended as events, the tools registered, a view compiled with no kernel or other
sources (so the view holds the trace's content), its estimate compared with
`reported_input_tokens`, and the usage reported — exactly the loop an agent runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import lzma
import math
import os
import secrets
import statistics
import sys
import tempfile
from collections import defaultdict
from collections.abc import AsyncIterator, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

import grpc

from ctxcc.v1 import (
    checkpoint_pb2,
    common_pb2,
    compile_service_pb2,
    compile_service_pb2_grpc,
    session_pb2,
    session_service_pb2,
    session_service_pb2_grpc,
    tool_service_pb2,
    tool_service_pb2_grpc,
    view_pb2,
)
from server import cli_channel
from server.compiler.textscan import LONE_SURROGATE
from server.replay_events import events_of, tools_of
from server.service.inputs import MAX_USAGE_TOKENS

MIN_REPORTED = 100
KEYS = (
    "requests",
    "mape_pct",
    "median_ape_pct",
    "p95_ape_pct",
    "signed_pct",
    "with_baseline_requests",
    "with_baseline_mape_pct",
    "with_baseline_p95_ape_pct",
    "route_model_requests",
    "route_model_mape_pct",
    "full_requests",
    "full_mape_pct",
)
# Estimate methods, in the order of the table's columns.
METHODS = ("full", "route_model", "baseline_delta")


@dataclass(frozen=True, slots=True)
class Row:
    source: str
    session: str
    step: int
    model: str
    reported: int
    estimate: int
    method: str
    ape_pct: float
    signed_pct: float
    # Estimated tokens per layer of the compiled view (pinned, history, working_set, ...).
    layers: dict[str, int]
    # estimate - sum of the layers, and the learned route model the estimate used.
    provider_overhead: int = 0
    route_ratio: float = 1.0
    route_overhead: int = 0
    route_framing: float = 0.0
    # Messages in the view: with the layers, what a change between two rows consists of.
    messages: int = 0


def _count(value: object) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0)


def shape_error(request: object) -> str | None:
    """What keeps a trace line from being a request of the documented format (traces
    README: step, messages, tools, reported tokens), or None. A wrong shape is said
    where it is, not met later as a traceback or a request silently not counted."""
    if not isinstance(request, dict):
        return f"not a JSON object but {type(request).__name__}"
    step = request.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        return f'"step" must be a whole number >= 0, not {step!r}'
    messages = request.get("messages")
    if messages is not None and (
        not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages)
    ):
        return '"messages" must be a list of objects ({"role": ..., "content": ...})'
    tools = request.get("tools")
    if tools is not None and not isinstance(tools, list):
        return '"tools" must be a list of tool schemas or null'
    for key in ("reported_input_tokens", "reported_output_tokens"):
        if not _count(request.get(key)):
            return f'"{key}" must be a whole number >= 0 or null, not {request.get(key)!r}'
        if (request.get(key) or 0) > MAX_USAGE_TOKENS:
            # The daemon refuses such a report; a protobuf field cannot even hold most.
            return (
                f'"{key}" is {request[key]}, over {MAX_USAGE_TOKENS} (more than any model '
                "reads or writes)"
            )
    for key in ("session", "source", "provider", "model"):
        if not isinstance(request.get(key, ""), str):
            return f'"{key}" must be a string, not {request.get(key)!r}'
    return None


def whole_characters(value: Any) -> Any:
    """`value` with each lone surrogate in its strings (JSON may escape half of a pair:
    an emoji a logger cut in two) as U+FFFD, the daemon's count of one: no protobuf
    string can carry it."""
    if isinstance(value, str):
        return LONE_SURROGATE.sub("\ufffd", value) if LONE_SURROGATE.search(value) else value
    if isinstance(value, list):
        return [whole_characters(v) for v in value]
    if isinstance(value, dict):
        return {whole_characters(k): whole_characters(v) for k, v in value.items()}
    return value


def read_trace(path: Path) -> Iterator[dict[str, Any]]:
    opener: Any = lzma.open if path.suffix == ".xz" else open
    n = 0
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            for n, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    request = json.loads(line)
                except ValueError as exc:
                    raise SystemExit(f"ctxcc replay: {path}:{n}: not JSON ({exc})") from None
                if (wrong := shape_error(request)) is not None:
                    raise SystemExit(f"ctxcc replay: {path}:{n}: {wrong}")
                yield whole_characters(request)
    # A directory, a truncated or damaged .xz, a binary file: one line, not a traceback.
    except (OSError, EOFError, lzma.LZMAError, UnicodeDecodeError) as exc:
        where = f" after line {n}" if n else ""
        raise SystemExit(f"ctxcc replay: cannot read {path}{where}: {exc}") from None


class Stubs:
    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.sessions: Any = session_service_pb2_grpc.SessionServiceStub(channel)
        self.compiles: Any = compile_service_pb2_grpc.CompileServiceStub(channel)
        self.tools: Any = tool_service_pb2_grpc.ToolServiceStub(channel)


async def replay_session(stubs: Stubs, name: str, requests: list[dict[str, Any]]) -> list[Row]:
    sid = "replay-" + hashlib.sha256(name.encode()).hexdigest()[:12] + "-" + secrets.token_hex(3)
    await stubs.sessions.CreateSession(
        session_service_pb2.CreateSessionRequest(session=session_pb2.Session(session_id=sid))
    )
    prev: list[dict[str, Any]] = []
    head = 0
    tools_json = ""
    rows: list[Row] = []
    for req in sorted(requests, key=lambda r: r["step"]):
        messages = req.get("messages") or []
        if messages[: len(prev)] == prev:
            new = messages[len(prev) :]
        else:
            # The agent rewrote its history (a compaction): the log cannot be rewritten, so
            # a checkpoint stands for everything so far and the new messages follow it.
            if head:
                await stubs.compiles.CreateCheckpoint(
                    compile_service_pb2.CreateCheckpointRequest(
                        checkpoint=checkpoint_pb2.Checkpoint(
                            session_id=sid,
                            covers_through_seq=head,
                            summary="[earlier conversation compacted by the agent]",
                            portable=True,
                        )
                    )
                )
            new = messages
        events = [e for m in new for e in events_of(m)]
        for i in range(0, len(events), 500):
            result = await stubs.sessions.AppendEvents(
                session_service_pb2.AppendEventsRequest(session_id=sid, events=events[i : i + 500])
            )
            head = result.last_seq
        encoded = json.dumps(req.get("tools"), sort_keys=True)
        if req.get("tools") and encoded != tools_json:
            await stubs.tools.RegisterTools(
                tool_service_pb2.RegisterToolsRequest(
                    session_id=sid, tools=tools_of(req["tools"]), replace_all=True
                )
            )
            tools_json = encoded
        route = common_pb2.Route(
            connection="replay",
            protocol=str(req.get("provider", "")),
            endpoint=str(req.get("source", "")),
            model=str(req.get("model", "unknown")),
        )
        compiled = await stubs.compiles.Compile(
            compile_service_pb2.CompileRequest(
                session_id=sid,
                route=route,
                exclude_sections=list(view_pb2.SectionKind.values())[1:],
                image_mode=compile_service_pb2.IMAGE_MODE_REFERENCE,
            )
        )
        view = compiled.view
        reported = int(req.get("reported_input_tokens") or 0)
        estimate = view.budget.estimated_input_tokens
        if reported >= MIN_REPORTED:
            method = view_pb2.EstimateMethod.Name(view.budget.estimate_method)
            rows.append(
                Row(
                    source=str(req.get("source", "")),
                    session=name,
                    step=int(req["step"]),
                    model=route.model,
                    reported=reported,
                    estimate=estimate,
                    method=method.removeprefix("ESTIMATE_METHOD_").lower(),
                    ape_pct=abs(estimate - reported) / reported * 100,
                    signed_pct=(estimate - reported) / reported * 100,
                    layers={
                        view_pb2.Layer.Name(r.layer).removeprefix("LAYER_").lower(): r.tokens
                        for r in view.layers
                    },
                    provider_overhead=view.budget.provider_overhead_tokens,
                    route_ratio=view.budget.route_model.ratio,
                    route_overhead=view.budget.route_model.overhead_tokens,
                    route_framing=round(view.budget.route_model.framing_tokens, 3),
                    messages=len(view.messages),
                )
            )
        if reported:
            await stubs.compiles.ReportUsage(
                compile_service_pb2.ReportUsageRequest(
                    compile_id=view.compile_id,
                    route=route,
                    input_tokens=reported,
                    output_tokens=int(req.get("reported_output_tokens") or 0),
                )
            )
        prev = messages
    return rows


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)] if ordered else 0.0


def summary(rows: list[Row]) -> dict[str, float | int]:
    apes = [r.ape_pct for r in rows]
    base = [r.ape_pct for r in rows if r.method == "baseline_delta"]
    learned = [r.ape_pct for r in rows if r.method == "route_model"]
    full = [r.ape_pct for r in rows if r.method == "full"]
    return {
        "requests": len(rows),
        "mape_pct": round(statistics.fmean(apes), 3) if apes else 0.0,
        "median_ape_pct": round(statistics.median(apes), 3) if apes else 0.0,
        "p95_ape_pct": round(p95(apes), 3),
        "signed_pct": round(statistics.fmean(r.signed_pct for r in rows), 3) if rows else 0.0,
        "with_baseline_requests": len(base),
        "with_baseline_mape_pct": round(statistics.fmean(base), 3) if base else 0.0,
        "with_baseline_p95_ape_pct": round(p95(base), 3),
        "route_model_requests": len(learned),
        "route_model_mape_pct": round(statistics.fmean(learned), 3) if learned else 0.0,
        "full_requests": len(full),
        "full_mape_pct": round(statistics.fmean(full), 3) if full else 0.0,
    }


# The replay's own daemon binds its Unix socket inside its scratch directory: a socket
# path is at most 107 bytes, so a temp dir longer than this is passed over for /tmp.
MAX_SCRATCH_BASE_CHARS = 64


def scratch_base() -> str:
    """Where the replay's own daemon keeps its data: the temp dir (TMPDIR; a read-only
    root filesystem may have no /tmp), or /tmp when that path is too long for a socket."""
    base = tempfile.gettempdir()
    if len(os.fsencode(base)) <= MAX_SCRATCH_BASE_CHARS:
        return base
    return "/tmp"  # noqa: S108 (a private directory is made in it, mode 0700, by mkdtemp)


@contextlib.asynccontextmanager
async def _target(address: str | None, token_file: str = "") -> AsyncIterator[grpc.aio.Channel]:
    if address:
        async with cli_channel.channel(address, token_file) as channel:
            yield channel
        return
    from server.app import Daemon
    from server.config import resolve

    with tempfile.TemporaryDirectory(prefix="ctxcc-replay-", dir=scratch_base()) as tmp:
        cfg = resolve(
            {
                "data_dir": tmp,
                "listen": "none",
                "metrics_listen": "none",
                "ui_listen": "none",
                "durability": "buffered",
            },
            env={},
        )
        daemon = Daemon(cfg)
        await daemon.start()
        try:
            async with grpc.aio.insecure_channel(
                f"unix:{daemon.endpoints.unix}",
                options=[("grpc.max_receive_message_length", 256 << 20)],
            ) as channel:
                yield channel
        finally:
            await daemon.stop()


async def run(
    path: Path, target: str | None, rows_path: Path | None, out: IO[str], token_file: str = ""
) -> dict[str, Any]:
    sessions: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for req in read_trace(path):
        sessions[str(req.get("session", ""))].append(req)
    rows: list[Row] = []
    async with _target(target, token_file) as channel:
        stubs = Stubs(channel)
        for name, requests in sessions.items():
            rows += await replay_session(stubs, name, requests)
    by_source: dict[str, list[Row]] = defaultdict(list)
    for r in rows:
        by_source[r.source].append(r)
    print(
        f"{'source':<22}{'requests':>9}{'mape%':>8}{'median%':>9}{'p95%':>8}{'signed%':>9}"
        + "".join(f"{m + ' n':>{len(m) + 4}}{'mape%':>8}" for m in METHODS),
        file=out,
    )
    for source, group in [*sorted(by_source.items()), ("all", rows)]:
        s = summary(group)
        per_method = ""
        for m in METHODS:
            apes = [r.ape_pct for r in group if r.method == m]
            mape = f"{statistics.fmean(apes):.3f}" if apes else "-"
            per_method += f"{len(apes):>{len(m) + 4}}{mape:>8}"
        print(
            f"{source:<22}{s['requests']:>9}{s['mape_pct']:>8.2f}{s['median_ape_pct']:>9.2f}"
            f"{s['p95_ape_pct']:>8.2f}{s['signed_pct']:>9.2f}{per_method}",
            file=out,
        )
    if rows_path is not None:
        text = "".join(json.dumps(asdict(r)) + "\n" for r in rows)
        await asyncio.to_thread(rows_path.write_text, text, encoding="utf-8")
    result = summary(rows)
    print(json.dumps({k: result[k] for k in KEYS}), file=out)
    return result


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "replay",
        help="replay a trace through a daemon and measure estimation error",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("trace", type=Path, help="trace file (.jsonl or .jsonl.xz)")
    p.add_argument(
        "--target",
        default=None,
        help="gRPC target of a running daemon, e.g. unix:/path/ctxcc.sock or "
        "127.0.0.1:50551 (default: an in-process daemon on a temp dir; CTXCC_TARGET is not "
        "read: a replay writes sessions, so it goes to a daemon only when named here)",
    )
    p.add_argument("--rows", type=Path, default=None, help="write one JSON line per request here")
    cli_channel.add_token_flag(p)


def main(args: argparse.Namespace) -> int:
    if not args.trace.exists():
        print(f"ctxcc replay: {args.trace} does not exist", file=sys.stderr)
        return 2
    if args.rows is not None:
        # The rows are written after the whole replay: a path that cannot take them
        # fails now, before a --target daemon has learned from (and kept) the run.
        try:
            with args.rows.open("a", encoding="utf-8"):
                pass
        except OSError as exc:
            print(f"ctxcc replay: cannot write --rows {args.rows}: {exc}", file=sys.stderr)
            return 2
    try:
        # A token file that cannot be read fails before anything is replayed.
        if args.target:
            cli_channel.bearer_for(args.target, args.auth_token_file)
        asyncio.run(run(args.trace, args.target, args.rows, sys.stdout, args.auth_token_file))
    except cli_channel.TokenError as exc:
        print(f"ctxcc replay: {exc}", file=sys.stderr)
        return 2
    except grpc.aio.AioRpcError as err:
        print(
            f"ctxcc replay: the daemon answered {err.code().name}: {err.details()}", file=sys.stderr
        )
        return 1
    return 0
