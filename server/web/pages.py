"""Page handlers: read the query, ask the inspection use cases, hand plain values to a
template. No HTML is built here; the templates escape everything they print."""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Awaitable, Callable
from typing import Any

import jinja2
from aiohttp import web

from server.compiler.view import CompiledView
from server.domain.errors import CtxccError, invalid
from server.domain.model import Event
from server.domain.records import Checkpoint, CompileRecord
from server.service.inspection import InspectUseCases, SessionRow, relative_error
from server.service.step_diff import StepDiff, diff_views
from server.service.watch import CompileNotice, Resync
from server.web import charts, present
from server.web.keys import BUILDING, HEADERS, INSPECT, TEMPLATES
from server.web.step_page import event_view, event_views, step_context

SORTS: dict[str, Callable[[SessionRow], Any]] = {
    "session": lambda r: r.session.session_id,
    "model": lambda r: r.model,
    "events": lambda r: r.session.head_seq,
    "last_compile": lambda r: r.last_compile.create_time_ns if r.last_compile else 0,
    "utilization": lambda r: r.utilization if r.utilization is not None else -1.0,
    "error": lambda r: abs(r.last_error) if r.last_error is not None else -1.0,
    "fallbacks": lambda r: r.fallbacks,
}
PageHandler = Callable[[web.Request], Awaitable[web.Response]]
HEARTBEAT_S = 15.0
MAX_TIMELINE = 400
# Checkpoints the timeline lists, the newest: a session has no cap on them, and a row
# each made the page grow without a bound (20,000 checkpoints: 3.6 MB).
MAX_CHECKPOINTS = 400


# Pages made at once; the others wait their turn (on their connections, at most
# server.MAX_CONNECTIONS). A page is made on threads (the render, a step's values, a
# diff) that hold the GIL, so 32 page loads of a 10,000-message session at once each
# took a thread and ran every agent's calls on the daemon about 20 times slower (another
# session's append and compile: median 5 ms quiet, 130 ms), for no more page bytes served.
PAGES_AT_ONCE = 2


def _in_turn(handler: PageHandler) -> PageHandler:
    """`handler` made one of PAGES_AT_ONCE at a time (its writing is not: a slow reader
    holds only its own connection, for server.WRITE_TIMEOUT_S at most)."""

    @functools.wraps(handler)
    async def made(request: web.Request) -> web.Response:
        async with request.app[BUILDING]:
            if request.transport is None or request.transport.is_closing():
                # Its reader went away while it waited: 60 loads sent and closed at once
                # kept the pages of everyone else waiting 19 s, made for nobody.
                raise web.HTTPServiceUnavailable(text="The page's reader went away.")
            return await handler(request)

    return made


def install_filters(env: jinja2.Environment) -> None:
    env.filters.update(
        num=present.num,
        pct=present.pct,
        signed_pct=present.signed_pct,
        when=present.when,
        id_path=present.id_path,
        shown=present.shown,
    )
    env.globals.update(full_text=present.FULL_TEXT, max_page_chars=present.MAX_PAGE_CHARS)


async def _page(request: web.Request, template: str, **context: Any) -> web.Response:
    # A long session's page is a few MB of escaped text (its text is cut to a budget,
    # present.PageBudget): render and encode it off the event loop, which also serves
    # gRPC (Jinja2 templates render safely from any thread), and hand aiohttp bytes.
    template_ = request.app[TEMPLATES].get_template(template)

    def render() -> bytes:
        return template_.render(**context).encode()

    body = await asyncio.to_thread(render)
    return web.Response(body=body, content_type="text/html", charset="utf-8")


def _uses(request: web.Request) -> InspectUseCases:
    return request.app[INSPECT]


def _sid(request: web.Request) -> str:
    return present.path_id(request.match_info["sid"])


def _int(request: web.Request, key: str, default: int = 0) -> int:
    raw = request.query.get(key, "")
    if not raw:
        return default
    # isascii: str.isdigit also holds for '²' and '①', which int() refuses.
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 18:
        raise invalid(key, f"{key} must be a whole number")
    return int(raw)


async def sessions_page(request: web.Request) -> web.Response:
    query = request.query.get("q", "")[:200]
    listed = await _uses(request).sessions(query)
    sort = request.query.get("sort", "last_compile")
    order = request.query.get("order", "desc")
    if sort not in SORTS:
        sort = "last_compile"
    rows = sorted(listed.rows, key=SORTS[sort], reverse=order != "asc")
    return await _page(
        request,
        "sessions.html",
        rows=rows,
        listed=listed,
        q=query,
        sort=sort,
        order=order,
        columns=list(SORTS),
        decision_name=present.decision_name,
    )


async def timeline_page(request: web.Request) -> web.Response:
    sid = _sid(request)
    full = request.query.get("scale") == "window"
    t = await _uses(request).timeline(sid)
    # A page of MAX_TIMELINE compiles, newest first (?page=1 the ones before them...): a
    # page of every compile was ~2 KB a compile, unbounded, and its chart's bars of
    # thousands of compiles narrower than a pixel.
    total = len(t.compiles)
    pages = max(1, -(-total // MAX_TIMELINE))
    page = min(_int(request, "page"), pages - 1)
    end = total - page * MAX_TIMELINE
    start = max(0, end - MAX_TIMELINE)
    # The chart and the rows of thousands of compiles took the event loop, which also
    # serves gRPC, for up to ~0.8 s: made on a thread, like the page's render.
    chart, rows = await asyncio.to_thread(_timeline_parts, t.compiles[:end], start, full)
    return await _page(
        request,
        "timeline.html",
        timeline=t,
        chart=chart,
        rows=rows,
        full=full,
        page=page,
        first=start + 1,
        last=end,
        older=page + 1 if start > 0 else None,
        newer=page - 1 if page > 0 else None,
        layer_order=present.LAYER_ORDER,
        checkpoint_kind=_checkpoint_kind,
        kinds={c.checkpoint_id: _checkpoint_kind(c) for c in t.checkpoints},
        checkpoints=t.checkpoints[-MAX_CHECKPOINTS:],
        older_checkpoints=max(0, len(t.checkpoints) - MAX_CHECKPOINTS),
    )


def _timeline_parts(
    records: tuple[CompileRecord, ...], start: int, full: bool
) -> tuple[charts.TimelineChart, list[dict[str, Any]]]:
    """The chart and table rows of `records[start:]` (blocking: on a thread)."""
    shown = records[start:]
    chart = charts.timeline(shown, full_window=full)
    rows = []
    # A row's diff is against the previous compile of its own route (an agent's route
    # names its connection and endpoint too): two routes of one model interleave. Those
    # before the page count too: its first rows have their diff.
    previous_on = {r.route.route_id: r for r in records[:start]}
    for index, r in enumerate(shown, start + 1):
        previous = previous_on.get(r.route.route_id)
        layers = present.layer_tokens(r.layer_tokens, r.estimated_input_tokens)
        rows.append(
            {
                "record": r,
                "index": index,
                "layers": layers if r.layer_tokens else None,
                "decision": present.decision_name(r.decision),
                "error": relative_error(r),
                "busts": present.busts(r.changed_sections),
                "previous": previous,
                "fallbacks": [present.name(k, present.FallbackReason) for k in r.fallback_reasons],
            }
        )
        previous_on[r.route.route_id] = r
    return chart, rows


def _checkpoint_kind(c: Checkpoint) -> str:
    return present.name(c.kind)


async def step_page(request: web.Request) -> web.Response:
    sid = _sid(request)
    fmt_name = request.query.get("format", "")
    fmt = present.FORMATS.get(fmt_name)
    if fmt_name and fmt is None:
        # A 400 like a malformed seq's: the page without the body asked for read as if
        # the format had been shown.
        raise invalid("format", f"format must be one of {', '.join(sorted(present.FORMATS))}")
    step = await _uses(request).step(
        sid,
        seq=_int(request, "seq"),
        compile_id=request.query.get("compile", "")[:300],
        model=request.query.get("model", "")[:200],
        render_format=fmt,
    )
    # A long view's values (its messages cut to the page's budget, the body indented up to
    # its cut) are made on a thread, like the page's render: not on the event loop.
    context = await asyncio.to_thread(step_context, step, fmt_name if fmt else "")
    return await _page(request, "step.html", **context)


async def diff_page(request: web.Request) -> web.Response:
    sid = _sid(request)
    model = request.query.get("model", "")[:200]
    uses = _uses(request)
    # Each side is a recorded compile (`from`, `to`: exact, as the timeline and the step
    # page link them) or a seq of the model (the form): two compiles at one seq for one
    # model on different connections are told apart only by their ids.
    a = await uses.step(
        sid, seq=_int(request, "a"), compile_id=request.query.get("from", "")[:300], model=model
    )
    b = await uses.step(
        sid, seq=_int(request, "b"), compile_id=request.query.get("to", "")[:300], model=model
    )
    # Two views of 100,000 messages take the diff ~0.5 s: on a thread, as the render.
    d, entered, left, changed = await asyncio.to_thread(_diff_parts, a.view, b.view)
    return await _page(
        request,
        "diff.html",
        session=a.session,
        a=a,
        b=b,
        diff=d,
        # The form and links by seq keep to the compared model.
        model=model or b.view.route.model,
        entered=entered,
        left=left,
        changed=changed,
        name=present.name,
    )


def _diff_parts(a: CompiledView, b: CompiledView) -> tuple[StepDiff, Any, Any, Any]:
    """The diff of two views and its messages for the page (blocking: on a thread)."""
    d = diff_views(a, b)
    budget = present.PageBudget()
    entered, _ = event_views(d.entered, budget)
    left, _ = event_views(d.left, budget)
    changed = []
    for c in d.changed:
        if budget.spent:
            break
        changed.append((event_view(c.before, budget), event_view(c.after, budget), c.what))
    return d, entered, left, changed


async def events_page(request: web.Request) -> web.Response:
    sid = _sid(request)
    after = _int(request, "after")
    through = _int(request, "through")
    page = await _uses(request).events(sid, after, through)
    # Paged by bytes read as well as by count (a few 1 MB messages fill a page), and each
    # event's text cut to the page's budget: a page that spends it ends early, "more".
    budget = present.PageBudget()
    rows = []
    more = page.more
    for e in page.events:
        if budget.spent:
            more = True
            break
        rows.append((e, budget.cut(present.event_text(e))))
    return await _page(
        request,
        "events.html",
        sid=sid,
        after=after,
        through=through,
        events=rows,
        more=more,
        next_after=rows[-1][0].seq if rows else after,
        kind=lambda e: present.name(e.kind),
    )


def _sse(update: object) -> str | None:
    if isinstance(update, Event):
        data = {"kind": "event", "seq": update.seq}
    elif isinstance(update, CompileNotice):
        data = {"kind": "compile", "seq": update.event_boundary}
    elif isinstance(update, Checkpoint):
        data = {"kind": "checkpoint", "seq": update.covers_through_seq}
    elif isinstance(update, Resync):
        data = {"kind": "resync", "seq": update.head_seq}
    else:
        return None
    return f"event: update\ndata: {json.dumps(data)}\n\n"


async def live(request: web.Request) -> web.StreamResponse:
    """Server-sent events fed by the watch hub: the page refreshes its figures on each.

    The stream opens (the page shows "live") only once the watch is subscribed, and its
    first update is a resync: what was written between the page's render and the
    subscription is re-read then rather than lost.

    It ends, and frees its watcher, however the page goes away: a connection lost
    while a write waits on a stalled reader is a ConnectionError (aiohttp's
    "Connection lost", not only a reset); the pump never waits on the queue, which
    nobody reads once the stream ended; and the handler's own cancellation (the daemon
    stopping) is never taken for the pump's."""
    sid = _sid(request)
    await _uses(request).session(sid)  # an unknown session is a 404 page, not a dead stream
    updates = _uses(request).watch(sid)
    queue: asyncio.Queue[str | None] = asyncio.Queue(maxsize=64)
    try:
        first = _sse(await anext(updates))
    except BaseException:
        await updates.aclose()
        raise
    if first is not None:
        queue.put_nowait(first)

    async def pump() -> None:
        try:
            async for update in updates:
                text = _sse(update)
                if text is not None and not queue.full():
                    queue.put_nowait(text)  # the page re-reads everything: a drop is harmless
        except CtxccError:
            pass  # the session was deleted (a reload shows the 404) or the daemon stops
        finally:
            # The end of the stream, queued without waiting: a full queue gives up its
            # oldest update for it (the writer may never read again).
            if queue.full():
                queue.get_nowait()
            queue.put_nowait(None)
            await updates.aclose()

    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    response.headers.update(request.app[HEADERS])
    task = asyncio.create_task(pump())
    try:
        await response.prepare(request)
        await response.write(b": live\n\n")
        while True:
            try:
                item = await asyncio.wait_for(queue.get(), HEARTBEAT_S)
            except TimeoutError:
                item = ": ping\n\n"  # finds a closed connection, so the watcher is freed
            if item is None:
                break
            await response.write(item.encode())
    except ConnectionError:
        pass  # the page went away (reset, or lost while a write waited)
    finally:
        task.cancel()
        # Waits for the pump's end without taking its CancelledError for this handler's:
        # a cancelled handler (the daemon stopping) still raises CancelledError here.
        await asyncio.wait([task])
        # A pump cancelled before it ran never closed the watch: closed here.
        await updates.aclose()
    return response


def add_routes(app: web.Application) -> None:
    app[BUILDING] = asyncio.Semaphore(PAGES_AT_ONCE)
    app.router.add_get("/", _in_turn(sessions_page))
    app.router.add_get("/s/{sid}", _in_turn(timeline_page))
    app.router.add_get("/s/{sid}/step", _in_turn(step_page))
    app.router.add_get("/s/{sid}/diff", _in_turn(diff_page))
    app.router.add_get("/s/{sid}/events", _in_turn(events_page))
    app.router.add_get("/s/{sid}/live", live)
