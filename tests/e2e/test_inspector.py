"""The web inspector in a real browser (Debian's chromium driven by Playwright): a daemon
replays the development traces and a scripted agent, and the pages are checked against
what the gRPC API answered, clicked through (time travel, diff, provider bodies), fed
hostile content, and photographed."""

from __future__ import annotations

import hashlib
import html
import http.client
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from bench.paths import dev_traces
from ctxcc.v1 import (
    checkpoint_pb2,
    common_pb2,
    compile_service_pb2,
    session_pb2,
    session_service_pb2,
    session_service_pb2_grpc,
    view_pb2,
)
from tests.e2e.inspector_agent import (
    XSS_MEMORY,
    XSS_MODEL,
    XSS_RESULT,
    XSS_SUMMARY,
    XSS_USER,
    Agent,
    drive_demo,
)
from tests.e2e.proc import REPO, DaemonProcess
from tests.helpers import assistant, user

CHROMIUM = shutil.which("chromium") or str(REPO / ".tools" / "chromium")
# Playwright's `expect` retries for 5 s by default: a bound, not a wait, and a loaded
# machine's browser may take longer to render a page or open its live stream.
expect.set_options(timeout=30_000)
# Screenshots go to a temp dir; `CTXCC_INSPECTOR_SCREENSHOTS=docs/inspector` refreshes the
# README's pictures.
_SHOTS_ENV = os.environ.get("CTXCC_INSPECTOR_SCREENSHOTS", "")
SHOTS = Path(_SHOTS_ENV) if _SHOTS_ENV else None
LAYERS = ("pinned", "history", "working_set", "tool_schema", "native_state")


@dataclass
class World:
    daemon: DaemonProcess
    ui: str
    channel: grpc.Channel
    demo: Agent
    xss: Agent
    replay_rows: list[dict[str, Any]]


def n(text: str) -> int:
    return int(text.strip().replace(",", ""))


def lname(enum: Any, value: int, prefix: str) -> str:
    return str(enum.Name(value)).removeprefix(prefix).lower()


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    short = Path(tmp_path_factory.mktemp("insp", numbered=True))
    data = Path("/tmp") / f"ctxcc-insp-{os.getpid()}"
    daemon = DaemonProcess(data, "--durability", "buffered", log_path=short / "daemon.log")
    daemon.start()
    channel = None
    try:
        endpoints = daemon.wait_ready()
        rows = short / "rows.jsonl"
        traces = dev_traces()
        assert traces.exists(), f"the development traces are missing: {traces}"
        done = subprocess.run(
            [
                *(sys.executable, "-m", "server", "replay", str(traces)),
                *("--target", daemon.target, "--rows", str(rows)),
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        channel = grpc.insecure_channel(daemon.target)
        demo = drive_demo(channel, "demo")
        xss = drive_demo(channel, "hostile", model=XSS_MODEL)
        yield World(
            daemon,
            f"http://{endpoints['ui']}",
            channel,
            demo,
            xss,
            [json.loads(line) for line in rows.read_text().splitlines()],
        )
    finally:
        if channel is not None:
            channel.close()
        daemon.ensure_stopped()
        shutil.rmtree(data, ignore_errors=True)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    assert os.path.exists(CHROMIUM), "Debian chromium is missing: make test installs it"
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    pg.on("dialog", lambda d: errors.append("dialog: " + d.message))
    yield pg
    context.close()
    assert not errors, errors


def shoot(page: Page, name: str) -> None:
    out = SHOTS or Path("/tmp") / f"ctxcc-inspector-shots-{os.getpid()}"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.png"
    page.screenshot(path=str(path), full_page=False)
    assert path.stat().st_size > 5_000


def test_sessions_list_matches_the_api_and_filters_and_sorts(world: World, page: Page) -> None:
    page.goto(world.ui + "/")
    demo = world.demo
    last = demo.views[-1]
    row = page.locator('#sessions tr[data-session="demo"]')
    expect(row).to_have_count(1)
    head = demo.sessions.GetSession(
        session_service_pb2.GetSessionRequest(session_id=demo.session_id)
    ).session
    assert n(row.locator('[data-field="events"]').inner_text()) == head.head_seq
    assert n(row.locator('[data-field="estimate"]').inner_text()) == (
        last.budget.estimated_input_tokens
    )
    assert row.locator('[data-field="utilization"]').inner_text() == (
        f"{last.budget.utilization * 100:.1f}%"
    )
    reported = [v for v in demo.views if v.compile_id in demo.reported][-1]
    actual = demo.reported[reported.compile_id]
    error = (actual - reported.budget.estimated_input_tokens) / actual
    assert row.locator('[data-field="error"]').inner_text() == f"{error * 100:+.2f}%"
    listed = page.locator("#sessions tbody tr").evaluate_all(
        "rows => rows.map(r => r.dataset.session)"
    )
    for name in {r["session"] for r in world.replay_rows}:
        prefix = "replay-" + hashlib.sha256(name.encode()).hexdigest()[:12]
        assert any(s.startswith(prefix) for s in listed), name
    shoot(page, "sessions")

    page.fill('input[name="q"]', "demo")
    page.click("form.filter button")
    expect(page.locator("#sessions tbody tr")).to_have_count(1)
    page.goto(world.ui + "/")
    page.click('a[data-sort="events"]')  # descending first
    counts = [n(t) for t in page.locator('[data-field="events"]').all_inner_texts()]
    assert counts == sorted(counts, reverse=True) and len(counts) > 3
    page.click('a[data-sort="events"]')
    counts = [n(t) for t in page.locator('[data-field="events"]').all_inner_texts()]
    assert counts == sorted(counts)


def test_timeline_matches_every_compile_the_api_answered(world: World, page: Page) -> None:
    page.goto(world.ui + "/s/demo")
    rows = page.locator("#compiles tbody tr")
    expect(rows).to_have_count(len(world.demo.views))
    for i, view in enumerate(world.demo.views):
        row = rows.nth(i)
        assert row.get_attribute("data-compile") == view.compile_id
        b = view.budget
        assert n(row.locator('[data-field="estimate"]').inner_text()) == b.estimated_input_tokens
        assert n(row.locator('[data-field="budget"]').inner_text()) == b.input_budget
        layers = {lname(view_pb2.Layer, r.layer, "LAYER_"): r.tokens for r in view.layers}
        for layer in LAYERS:
            cell = row.locator(f'[data-layer="{layer}"]').inner_text()
            assert n(cell) == layers.get(layer, 0), (i, layer)
        overhead = n(row.locator('[data-layer="provider_overhead"]').inner_text())
        assert overhead + sum(layers.values()) == b.estimated_input_tokens
        reported = row.locator('[data-field="reported"]').inner_text()
        assert reported == (
            f"{world.demo.reported[view.compile_id]:,}"
            if view.compile_id in world.demo.reported
            else "-"
        )
    # the chart: one bar per compile, reported points, the checkpoint marked once
    assert page.locator("#timeline-chart a.bar").count() == len(world.demo.views)
    assert page.locator("#timeline-chart circle.reported").count() == len(world.demo.reported)
    assert page.locator("#timeline-chart line.checkpoint").count() == 1
    expect(page.locator("#checkpoints tbody tr")).to_have_count(1)


def test_timeline_of_a_replayed_trace_matches_the_replay(world: World, page: Page) -> None:
    by_session: dict[str, list[tuple[int, int]]] = {}
    for r in world.replay_rows:
        by_session.setdefault(r["session"], []).append((r["estimate"], r["reported"]))
    name, expected = max(by_session.items(), key=lambda kv: len(kv[1]))
    page.goto(world.ui + "/?q=replay-&sort=events")
    prefix = "replay-" + hashlib.sha256(name.encode()).hexdigest()[:12]
    page.click(f'#sessions a[href^="/s/{prefix}"]')
    expect(page.locator("h1")).to_contain_text(prefix)
    got = []
    for row in page.locator("#compiles tbody tr").all():
        reported = row.locator('[data-field="reported"]').inner_text()
        if reported != "-" and n(reported) >= 100:
            got.append((n(row.locator('[data-field="estimate"]').inner_text()), n(reported)))
    assert got == expected
    shoot(page, "timeline")
    # a bar is a link to its step: time travel from the chart
    page.locator("#timeline-chart a.bar").nth(3).click()
    expect(page.locator("h1")).to_contain_text("What the model saw")


def _page_figures(page: Page) -> dict[str, str]:
    fields = page.locator("#budget dd[data-field]")
    return {str(f.get_attribute("data-field")): f.inner_text() for f in fields.all()}


def _check_step(page: Page, agent: Agent, seq: int, model: str = "") -> view_pb2.CompiledView:
    """The step page equals the API's answer to a dry-run compile as of `seq`."""
    view = agent.dry_run(seq, model).view
    _check_view(page, view, seq)
    return view


def _check_view(page: Page, view: view_pb2.CompiledView, seq: int) -> None:
    b = view.budget
    assert n(page.locator("#step-seq").inner_text()) == seq
    figures = _page_figures(page)
    assert n(figures["estimated_input_tokens"]) == b.estimated_input_tokens
    assert n(figures["input_budget"]) == b.input_budget
    assert n(figures["output_reserve"]) == b.output_reserve
    assert figures["decision"] == lname(view_pb2.Decision, view.decision, "DECISION_")
    assert figures["estimate_method"] == lname(
        view_pb2.EstimateMethod, b.estimate_method, "ESTIMATE_METHOD_"
    )
    layers = {lname(view_pb2.Layer, r.layer, "LAYER_"): r.tokens for r in view.layers}
    for layer in LAYERS:
        cell = page.locator(f'#layers tr[data-layer="{layer}"] td.n').first.inner_text()
        assert n(cell) == layers.get(layer, 0), layer
    overhead = page.locator('#layers tr[data-layer="provider_overhead"] td.n').first
    assert n(overhead.inner_text()) == b.provider_overhead_tokens
    assert page.locator("#messages article.msg").count() == len(view.messages)
    tokens = [
        int(str(t))
        for t in page.locator("#messages article.msg").evaluate_all(
            "els => els.map(e => e.dataset.tokens)"
        )
    ]
    assert tokens == [m.tokens for m in view.messages]
    kinds = page.locator("#system details.section").evaluate_all(
        "els => els.map(e => e.dataset.kind)"
    )
    assert kinds == [
        lname(view_pb2.SectionKind, s.kind, "SECTION_KIND_") for s in view.system_sections
    ]


def test_step_view_matches_the_api_and_travels_in_time(world: World, page: Page) -> None:
    demo = world.demo
    head = demo.views[-1].event_boundary
    page.goto(world.ui + "/s/demo/step")
    _check_step(page, demo, head)
    shoot(page, "step")
    # back one recorded step, then forward again, then to an arbitrary seq
    previous = demo.views[-2].event_boundary
    page.click("#prev-step")
    _check_step(page, demo, previous)
    page.click("#next-step")
    _check_step(page, demo, head)
    page.fill("#seq-input", "2")
    page.click("#go-seq")
    view = _check_step(page, demo, 2)
    assert view.event_boundary == 2
    expect(page.locator("#provenance")).to_contain_text("compiled now as of seq 2")
    # every recorded step shows exactly what the agent got back then
    for original in demo.views:
        page.goto(world.ui + f"/s/demo/step?compile={original.compile_id}")
        _check_view(page, original, original.event_boundary)
        expect(page.locator("#provenance")).to_contain_text("rebuilt byte for byte")


def test_step_view_shows_why(world: World, page: Page) -> None:
    head = world.demo.views[-1].event_boundary
    page.goto(world.ui + f"/s/demo/step?seq={head}")
    memory = page.locator('#system details.section[data-kind="memory"]')
    expect(memory).to_have_class(re.compile("fenced"))
    expect(memory.locator(".fence")).to_have_text("fenced user content")
    kernel = page.locator('#system details.section[data-kind="kernel"]')
    expect(kernel).not_to_have_class(re.compile("fenced"))
    # tools by visibility: the deferred tool was activated by the search in this turn
    groups = {
        str(g.get_attribute("data-group")): g.locator("code").all_inner_texts()
        for g in page.locator("#tools ul.tools").all()
    }
    assert groups["direct"] == ["read_file"]
    assert groups["deferred, activated"] == ["deploy"]
    assert groups["hidden"] == ["rm_rf"]
    assert "tool_search" in groups["built-in"]
    # the checkpoint and the canonical events it replaced
    expect(page.locator("#checkpoint")).to_contain_text("model_summary")
    expect(page.locator(".image-ref")).to_have_count(1)
    page.click("#checkpoint-events")
    expect(page.locator("#events tbody tr")).to_have_count(3)
    expect(page.locator("#events")).to_contain_text("Look at src/app.py")
    # the same step for a model that takes no images: a placeholder with the reason
    page.goto(world.ui + f"/s/demo/step?seq={head}&model=gpt-4")
    _check_step(page, world.demo, head, "gpt-4")
    expect(page.locator("#images")).to_contain_text("does not accept images")
    expect(page.locator("p.placeholder")).to_have_count(1)


def test_rendered_provider_body_is_the_api_rendering(world: World, page: Page) -> None:
    head = world.demo.views[-1].event_boundary
    page.goto(world.ui + f"/s/demo/step?seq={head}")
    page.select_option("#format-select", "anthropic_messages")
    page.click("#render-button")
    body = json.loads(page.locator("#rendered-body").inner_text())
    api = world.demo.dry_run(head, fmt=view_pb2.RENDER_FORMAT_ANTHROPIC_MESSAGES)
    assert len(api.view.renderings) == 1, "a dry run renders the asked formats"
    expected = json.loads(api.view.renderings[0].body_json)
    assert body["model"] == expected["model"]
    assert body["system"] == expected["system"]
    assert [m["role"] for m in body["messages"]] == [m["role"] for m in expected["messages"]]
    assert [t["name"] for t in body["tools"]] == [t["name"] for t in expected["tools"]]
    page.locator("#render").scroll_into_view_if_needed()
    shoot(page, "render")  # not in the README: kept with the test run's pictures


def _key(m: view_pb2.ViewMessage) -> tuple[int, int, int, str, bool]:
    return (m.role, m.first_seq, m.last_seq, m.tool_call_id, m.synthetic)


def test_diff_between_two_steps(world: World, page: Page) -> None:
    demo = world.demo
    a, b = demo.views[2].event_boundary, demo.views[3].event_boundary
    page.goto(world.ui + f"/s/demo/step?seq={b}")
    page.click("#diff-prev")
    expect(page.locator("h1")).to_contain_text(f"seq {a}")
    va, vb = demo.dry_run(a).view, demo.dry_run(b).view
    ka, kb = {_key(m) for m in va.messages}, {_key(m) for m in vb.messages}
    assert page.locator("#entered article.msg").count() == len(kb - ka) > 0
    assert page.locator("#left article.msg").count() == len(ka - kb)
    # the checkpoint made between the two steps replaced the first turn by its summary
    assert len(ka - kb) > 0
    expect(page.locator("#entered article.msg.synthetic")).not_to_have_count(0)

    def body(m: view_pb2.ViewMessage) -> tuple[object, ...]:
        return (m.layer, m.tokens, [p.text for p in m.parts], [c.name for c in m.tool_calls])

    old = {_key(m): body(m) for m in va.messages}
    changed = sum(1 for m in vb.messages if _key(m) in old and old[_key(m)] != body(m))
    assert page.locator("#changed .change").count() == changed
    tools_a = {t.definition.name for t in va.tools}
    tools_b = {t.definition.name for t in vb.tools}
    if tools_a != tools_b:
        expect(page.locator("#tool-changes")).to_contain_text("+deploy")
    over = page.locator('#diff-layers tr[data-layer="provider_overhead"] td.n')
    assert n(over.nth(0).inner_text()) == va.budget.provider_overhead_tokens
    assert n(over.nth(1).inner_text()) == vb.budget.provider_overhead_tokens
    est = page.locator('#diff-layers tr[data-layer="estimate"] td.n')
    assert n(est.nth(0).inner_text()) == va.budget.estimated_input_tokens
    assert n(est.nth(1).inner_text()) == vb.budget.estimated_input_tokens
    same = va.prefix_digest == vb.prefix_digest
    expect(page.locator("#prefix-same" if same else "#prefix-changed")).to_have_count(1)
    shoot(page, "diff")


def test_timeline_updates_live_while_the_agent_runs(short_tmp: Path, page: Page) -> None:
    # The page shows "live" once its stream is open, and the daemon opens it only after
    # subscribing it to the session: a step taken right then reaches the page.
    d = DaemonProcess(short_tmp / "data").start()
    try:
        ui = "http://" + str(d.wait_ready()["ui"])
        with grpc.insecure_channel(d.target) as channel:
            agent = drive_demo(channel, "live")
            page.goto(ui + "/s/live")
            expect(page.locator("#live-status")).to_have_text("● live")
            page.evaluate("window.__sameDocument = true")
            before = len(agent.views)
            expect(page.locator("#compile-count")).to_have_text(f"{before} compiles")
            agent.append(user("one more thing"))
            agent.step(report=10)
            expect(page.locator("#compile-count")).to_have_text(f"{before + 1} compiles")
            assert page.evaluate("window.__sameDocument") is True  # updated in place
            assert page.locator("#compiles tbody tr").count() == before + 1
    finally:
        d.ensure_stopped()


HOSTILE = (XSS_USER, XSS_RESULT, XSS_MEMORY, XSS_SUMMARY, XSS_MODEL)


def test_untrusted_content_is_shown_as_text_and_never_runs(world: World, page: Page) -> None:
    head = world.xss.views[-1].event_boundary
    urls = [
        "/",
        "/s/hostile",
        f"/s/hostile/step?seq={head}&format=openai_chat",
        f"/s/hostile/step?seq={head - 2}",
        f"/s/hostile/diff?a=2&b={head}",
        "/s/hostile/events",
        "/?q=" + XSS_USER,
    ]
    seen = ""
    for url in urls:
        response = page.goto(world.ui + url)
        assert response is not None and response.ok, url
        csp = response.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "unsafe-inline" not in csp
        page.wait_for_load_state("networkidle")
        assert page.evaluate("typeof window.__pwned") == "undefined", url
        # nothing the page holds came alive: no handlers, frames or extra scripts
        assert page.locator("[onerror], [onload], iframe, main script").count() == 0, url
        assert page.locator("script").count() == 1  # the inspector's own file
        seen += page.locator("main").inner_text()
        for d in page.locator("details").all():
            d.evaluate("e => e.open = true")
        seen += page.locator("main").inner_text()
    for text in HOSTILE:
        # shown literally (modulo whitespace) somewhere, i.e. escaped, not interpreted
        probe = text.split(">")[0]
        assert probe in seen, probe
    page.goto(world.ui + f"/s/hostile/step?seq={head}")
    page.locator("#messages").scroll_into_view_if_needed()
    shoot(page, "hostile")


def test_content_security_policy_blocks_inline_script(world: World, page: Page) -> None:
    """Even if escaping ever failed, the browser would refuse inline script."""
    page.goto(world.ui + "/s/hostile")
    violations = page.evaluate(
        """() => new Promise(resolve => {
            const seen = [];
            document.addEventListener(
                'securitypolicyviolation', e => seen.push(e.violatedDirective));
            const s = document.createElement('script');
            s.textContent = 'window.__pwned = "inline"';
            document.body.appendChild(s);
            const img = document.createElement('img');
            img.setAttribute('onerror', 'window.__pwned = "handler"');
            img.src = 'data:,x';
            document.body.appendChild(img);
            setTimeout(() => resolve(seen), 500);
        })"""
    )
    assert page.evaluate("typeof window.__pwned") == "undefined"
    assert any(v.startswith("script-src") for v in violations), violations


def _status(url: str, **headers: str) -> tuple[int, str]:
    req = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_loopback_page_refuses_foreign_host_names(world: World) -> None:
    """DNS rebinding: a page bound to loopback answers only loopback Host names."""
    status, _ = _status(world.ui + "/", Host="attacker.example")
    assert status == 421
    status, _ = _status(world.ui + "/", Host="localhost")
    assert status == 200


@pytest.fixture
def other_site() -> Iterator[int]:
    """A port on loopback serving another web page: the one an attacker's local page
    (another app's, another port's) would be. It links to the inspector's page `?to=`."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            to = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query).get("to")
            if not to:  # the browser's own asks (/favicon.ico)
                self.send_error(404)
                return
            body = f'<a id="go" href="{html.escape(to[0])}">the inspector</a>'.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def _requested(page: Page, url: str, script: str) -> int:
    """The status of the inspector's answer to what `script` (run in `page`) asks of
    `url`: as the browser saw it, also where the page cannot read it (no-cors)."""
    with page.expect_response(lambda r: r.url == url) as got:
        page.evaluate(script, url)
    return got.value.status


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1"], ids=["cross-site", "same-site"])
def test_another_sites_page_only_follows_links_to_the_inspector(
    world: World, page: Page, other_site: int, host: str
) -> None:
    """A page of another site (`localhost`, against the inspector's 127.0.0.1) or of the
    same site at another port can neither make the inspector compile a step nor open a
    live watcher with a request it cannot read (a no-cors fetch, as an image or an
    EventSource would make); a link from it opens the inspector's page as usual."""
    step, live = world.ui + "/s/demo/step", world.ui + "/s/demo/live"
    page.goto(f"http://{host}:{other_site}/?to={urllib.parse.quote(world.ui + '/s/demo')}")
    no_cors = "u => { fetch(u, {mode: 'no-cors'}).catch(() => {}) }"
    assert _requested(page, step, no_cors) == 403
    assert _requested(page, live, no_cors) == 403
    with page.expect_navigation() as followed:
        page.click("#go")
    assert followed.value is not None and followed.value.status == 200
    expect(page.locator("h1")).to_contain_text("demo")


def test_token_is_required_when_configured(
    short_tmp: Path, browser: Browser, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("correct-horse-battery-staple\n")
    d = DaemonProcess(short_tmp / "data", "--auth-token-file", str(token)).start()
    try:
        ui = "http://" + str(d.wait_ready()["ui"])
        status, text = _status(ui + "/s/anything")
        assert status == 200 and "Sign in" in text  # redirected to the login form
        assert "anything" not in text
        assert _status(ui + "/", Authorization="Bearer correct-horse-battery-staple")[0] == 200
        page = browser.new_page()
        page.goto(ui + "/")
        expect(page.locator("h1")).to_have_text("Sign in")
        page.fill('input[name="token"]', "wrong-token-wrong-token")
        page.click('button[type="submit"]')
        expect(page.locator("#login-failed")).to_have_count(1)
        page.fill('input[name="token"]', "correct-horse-battery-staple")
        page.click('button[type="submit"]')
        expect(page.locator("h1")).to_have_text("Sessions")
        page.close()
        assert "correct-horse" not in d.log()
    finally:
        assert d.terminate() == 0


def test_fallbacks_and_an_over_budget_step_are_shown(world: World, page: Page) -> None:
    """A checkpoint from another route is passed over (a fallback, counted in the list);
    a step larger than gpt-4's 8K window is compiled anyway and marked over budget."""
    agent = Agent(world.channel, "tight", "gpt-4")
    agent.create()
    agent.append(user("summarise this"), assistant("ok"))
    agent.compiles.CreateCheckpoint(
        compile_service_pb2.CreateCheckpointRequest(
            checkpoint=checkpoint_pb2.Checkpoint(
                session_id="tight",
                covers_through_seq=2,
                summary="written for another model",
                source_route=common_pb2.Route(model="claude-sonnet-4"),
                kind=checkpoint_pb2.CHECKPOINT_KIND_MODEL_SUMMARY,
            )
        )
    )
    agent.append(user("word " * 9000))
    view = agent.step()
    assert list(view.fallback_reasons) == [view_pb2.FALLBACK_REASON_ROUTE_MISMATCH]
    assert view.decision == view_pb2.DECISION_OVER_BUDGET_SEND_ANYWAY
    page.goto(world.ui + "/?q=tight")
    assert page.locator('[data-field="fallbacks"]').inner_text() == "1"
    page.goto(world.ui + "/s/tight")
    row = page.locator("#compiles tbody tr").last
    expect(row).to_contain_text("over_budget_send_anyway")
    expect(row).to_contain_text("fallback: route_mismatch")
    assert page.locator("#timeline-chart rect.decision-over_budget_send_anyway").count() == 1
    page.goto(world.ui + "/s/tight/step")
    expect(page.locator("#fallbacks")).to_contain_text("route_mismatch")
    assert _page_figures(page)["decision"] == "over_budget_send_anyway"


def test_an_open_live_page_does_not_hold_up_shutdown(short_tmp: Path) -> None:
    d = DaemonProcess(short_tmp / "data", "--grace-period", "30").start()
    try:
        ui = str(d.wait_ready()["ui"])
        with grpc.insecure_channel(d.target) as ch:
            agent = Agent(ch, "s1", "gpt-4o")
            agent.create()
            agent.append(user("hello"), user("again"))
        conn = http.client.HTTPConnection(ui, timeout=10)
        conn.request("GET", "/s/s1/live")
        response = conn.getresponse()
        assert response.status == 200
        assert response.getheader("Content-Type", "").startswith("text/event-stream")
        assert "script-src 'self'" in response.getheader("Content-Security-Policy", "")
        assert response.readline() == b": live\n"
        assert response.readline() == b"\n"
        # Subscribed before the stream opened, the first update is a resync of the head (at
        # once, not at the 15 s heartbeat): the page re-reads what was written between its
        # render and the subscription.
        assert response.readline() == b"event: update\n"
        assert json.loads(response.readline().removeprefix(b"data: ")) == {
            "kind": "resync",
            "seq": 2,
        }
        assert d.metric("ctxcc_watchers") == 1
        started = time.monotonic()
        assert d.terminate(timeout=60) == 0
        # Not the 30 s grace period, nor stuck (about 1 s; a loaded machine may take a few).
        assert time.monotonic() - started < 15
        conn.close()
    finally:
        d.ensure_stopped()


def test_a_live_page_of_a_deleted_session_ends_its_stream(short_tmp: Path) -> None:
    """A session deleted while its page is open ends the page's live stream at once (it
    used to wait on the deleted log for good, pinging), without an incident."""
    d = DaemonProcess(short_tmp / "data").start()
    try:
        ui = str(d.wait_ready()["ui"])
        with grpc.insecure_channel(d.target) as ch:
            agent = Agent(ch, "gone", "gpt-4o")
            agent.create()
            agent.append(user("hello"))
            conn = http.client.HTTPConnection(ui, timeout=10)
            conn.request("GET", "/s/gone/live")
            response = conn.getresponse()
            assert response.status == 200
            assert [response.readline() for _ in range(3)] == [
                b": live\n",
                b"\n",
                b"event: update\n",
            ]
            assert b'"resync"' in response.readline()
            sessions: Any = session_service_pb2_grpc.SessionServiceStub(ch)
            sessions.DeleteSession(session_service_pb2.DeleteSessionRequest(session_id="gone"))
            assert response.read().strip() == b""  # the end of the stream, not a timeout
            conn.close()
        assert d.metric("ctxcc_watchers") == 0
        assert "inspector page failed" not in d.log()
        assert d.terminate() == 0
    finally:
        d.ensure_stopped()


def test_live_pages_have_a_watcher_cap_of_their_own(short_tmp: Path) -> None:
    """A page's live stream is a watcher of its session, in the inspector's own pool:
    sharing the API's 64 per session, open tabs made the agent's WatchSession
    RESOURCE_EXHAUSTED. With the agent's 64 watches open a page still goes live, and past
    the inspector's 16 a page is refused as the API refuses a watch (QUOTA_EXCEEDED: 429
    Too Many Requests, to retry later), not as a bad request (400); the agent's 65th
    watch is still refused by its own cap."""
    d = DaemonProcess(short_tmp / "data").start()
    watches: list[Any] = []
    pages: list[http.client.HTTPConnection] = []
    try:
        ui = str(d.wait_ready()["ui"])
        with grpc.insecure_channel(d.target) as ch:
            agent = Agent(ch, "busy", "gpt-4o")
            agent.create()
            agent.append(user("hello"))
            sessions: Any = session_service_pb2_grpc.SessionServiceStub(ch)

            def watch() -> Any:
                return sessions.WatchSession(
                    session_service_pb2.WatchSessionRequest(session_id="busy")
                )

            for _ in range(64):  # each subscribed once its backlog's first event is read
                w = watch()
                assert next(w).event.seq == 1
                watches.append(w)

            def live() -> tuple[int, bytes]:
                conn = http.client.HTTPConnection(ui, timeout=10)
                pages.append(conn)
                conn.request("GET", "/s/busy/live")
                response = conn.getresponse()
                if response.status != 200:
                    return response.status, response.read()
                return 200, response.readline()  # the stream's first line: subscribed

            for _ in range(16):
                status, first = live()
                assert (status, first) == (200, b": live\n")
            status, body = live()
            assert status == 429 and b"QUOTA_EXCEEDED" in body, (status, body)
            with pytest.raises(grpc.RpcError) as err:
                next(watch())
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            for w in watches:
                w.cancel()
        for conn in pages:
            conn.close()
        assert "inspector page failed" not in d.log()
        assert d.terminate() == 0
    finally:
        for w in watches:
            w.cancel()
        d.ensure_stopped()


def test_a_data_dir_from_before_the_inspector_is_shown(short_tmp: Path, page: Page) -> None:
    """Compile records written before they kept the timeline's figures read as they are:
    grey bars with the estimate alone, "-" for their layers, and their steps compiled as
    of their seq (they recorded no source versions either)."""
    fixture = REPO / "tests" / "fixtures" / "data-v1"
    manifest = json.loads((fixture / "manifest.json").read_text())
    shutil.copytree(fixture / "db", short_tmp / "data" / "db")
    d = DaemonProcess(short_tmp / "data").start()
    try:
        ui = "http://" + str(d.wait_ready()["ui"])
        sid = manifest["session_id"]
        page.goto(f"{ui}/s/{sid}")
        rows = page.locator("#compiles tbody tr")
        assert rows.count() >= 2
        assert page.locator("#timeline-chart rect.unrecorded").count() == rows.count()
        usage = page.locator(f'#compiles tr[data-compile="{manifest["usage_compile_id"]}"]')
        assert (
            n(usage.locator('[data-field="estimate"]').inner_text()) == (manifest["usage_estimate"])
        )
        assert usage.locator('[data-layer="history"]').inner_text() == "-"
        page.goto(f"{ui}/s/{sid}/step?compile={manifest['usage_compile_id']}")
        expect(page.locator("#provenance")).to_contain_text("compiled now as of seq")
        assert page.locator("#messages article.msg").count() > 0
    finally:
        assert d.terminate() == 0


def test_sessions_named_dot_and_dot_dot_open_in_the_browser(world: World, page: Page) -> None:
    """ "." and ".." are valid session ids, and dot segments to a browser (as "%2e" too):
    their links led to /s/ (a 404) and to /, and /s/./step showed the session "step".
    The inspector's links write them "~." and "~.." ("~" is no id character)."""
    for sid in (".", ".."):
        agent = Agent(world.channel, sid, "gpt-4o")
        agent.create()
        agent.append(user(f"hello from {sid}"))
        agent.step()
    for sid in (".", ".."):
        page.goto(world.ui + "/")
        page.locator(f'#sessions tr[data-session="{sid}"] td a').click()
        expect(page.locator("h1 code")).to_have_text(sid)
        expect(page.locator("#compiles tbody tr")).to_have_count(1)
        page.click("text=latest step")
        expect(page.locator("#step-seq")).to_have_text("1")
        expect(page.locator(".crumb a")).to_have_text(sid)
        expect(page.locator("#messages")).to_contain_text(f"hello from {sid}")
        page.locator("#messages article.msg header a").first.click()
        expect(page.locator("#events")).to_contain_text(f"hello from {sid}")
        page.locator(".crumb a").click()
        expect(page.locator("h1 code")).to_have_text(sid)


# Every fetch of the page's script answers 7 s late (a long session's page; the list
# refreshes every 5 s), counting how many are in flight at once.
SLOW_FETCH = """
window.__calls = 0; window.__inflight = 0; window.__most = 0;
const realFetch = window.fetch;
window.fetch = async (...args) => {
  window.__calls += 1; window.__inflight += 1;
  window.__most = Math.max(window.__most, window.__inflight);
  try {
    await new Promise((done) => setTimeout(done, 7000));
    return await realFetch(...args);
  } finally {
    window.__inflight -= 1;
  }
};
"""


def test_the_sessions_list_refreshes_one_request_at_a_time(world: World, page: Page) -> None:
    """The list refreshed every 5 s whether or not the last refresh had answered: on a
    daemon whose list took longer, one open tab had 9 of 13 requests in flight at once.
    With answers 7 s late, the second refresh starts only after the first answered."""
    page.add_init_script(SLOW_FETCH)
    page.goto(world.ui + "/")
    # Polled from here: the page's CSP forbids the eval of wait_for_function.
    for _ in range(160):
        if page.evaluate("() => window.__calls") >= 2:
            break
        page.wait_for_timeout(250)
    assert page.evaluate("() => window.__calls") == 2
    assert page.evaluate("() => window.__most") == 1
    assert page.evaluate("() => Number(document.body.dataset.refreshed || 0)") >= 1


def test_a_texts_line_breaks_and_control_characters_are_shown_as_sent(
    world: World, page: Page
) -> None:
    """A browser drops the line feed that opens a <pre>, drops NUL, and reads CR and CR LF
    as a line feed: a message that began with an empty line, or held CR LF line ends, was
    shown as another text than the model got. Line feeds and tabs are shown as they are,
    other control characters as their pictures (␍, ␀), one for one."""
    sessions = session_service_pb2_grpc.SessionServiceStub(world.channel)
    sessions.CreateSession(
        session_service_pb2.CreateSessionRequest(session=session_pb2.Session(session_id="ctl"))
    )
    sent = "\n\n  indented\r\nCRLF\rCR\x00NUL\x1bESC\x7fDEL\tTAB"
    sessions.AppendEvents(
        session_service_pb2.AppendEventsRequest(session_id="ctl", events=[user(sent)])
    )
    shown = "\n\n  indented␍\nCRLF␍CR␀NUL␛ESC␡DEL\tTAB"
    page.goto(world.ui + "/s/ctl/step?seq=1&model=claude-sonnet-4")
    texts = page.locator("#messages pre.text").evaluate_all("es => es.map(e => e.textContent)")
    assert texts == [shown], texts
    page.goto(world.ui + "/s/ctl/events")
    texts = page.locator("#events pre.text").evaluate_all("es => es.map(e => e.textContent)")
    assert len(texts) == 1 and texts[0].endswith(shown), texts
