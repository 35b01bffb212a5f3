"""A real Prometheus server (Debian's, fetched into .tools/ by scripts/get_prometheus.sh)
scraping a ctxcc daemon, and the dashboard's queries as Grafana would send them.

Used by tests/e2e/test_prometheus.py and scripts/plot_dashboard.py, so the README's
picture comes from the same scrape the test checks.
"""

from __future__ import annotations

import contextlib
import json
import lzma
import math
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import yaml

from bench.paths import dev_traces
from ctxcc.v1 import (
    common_pb2,
    compile_service_pb2,
    compile_service_pb2_grpc,
    event_pb2,
    session_pb2,
    session_service_pb2,
    session_service_pb2_grpc,
)
from tests.e2e.proc import DaemonProcess

REPO = Path(__file__).resolve().parents[2]
PROMETHEUS = REPO / ".tools" / "prometheus"
RULES = REPO / "deploy" / "prometheus" / "ctxcc-rules.yaml"
DASHBOARD = REPO / "deploy" / "grafana" / "ctxcc-dashboard.json"
# A replay sends a request every few milliseconds, where agents wait seconds for their
# model: a fast scrape keeps series born mid-replay from hiding much of their first count.
SCRAPE_SECONDS = 0.5
# What a scrape of a sidecar looks like through the Prometheus Operator's PodMonitor:
# each daemon is a pod agent-N in this namespace.
NAMESPACE = "agents"
JOB = "ctxcc"


def _free_port() -> int:
    # Prometheus cannot report a port it chose itself; take one the kernel just gave out.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Series:
    labels: dict[str, str]
    values: list[tuple[float, float]]


class Prometheus:
    """`prometheus` on 127.0.0.1 with ctxcc's rules, scraping each pod's /metrics every
    SCRAPE_SECONDS."""

    def __init__(self, workdir: Path, targets: dict[str, str], rules: Path = RULES) -> None:
        self.workdir = workdir
        self.targets = targets
        self.rules = rules
        self.url = ""
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        assert PROMETHEUS.exists(), "run `make test` (it fetches it) or scripts/get_prometheus.sh"
        config = {
            "global": {
                "scrape_interval": f"{int(SCRAPE_SECONDS * 1000)}ms",
                "evaluation_interval": f"{int(SCRAPE_SECONDS * 1000)}ms",
            },
            "rule_files": [str(self.rules)],
            "scrape_configs": [
                {
                    "job_name": JOB,
                    "static_configs": [
                        {"targets": [url], "labels": {"namespace": NAMESPACE, "pod": pod}}
                        for pod, url in self.targets.items()
                    ],
                }
            ],
        }
        (self.workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        log = (self.workdir / "prometheus.log").open("wb")
        for _attempt in range(5):
            port = _free_port()
            self.url = f"http://127.0.0.1:{port}"
            self._proc = subprocess.Popen(
                [
                    str(PROMETHEUS),
                    f"--config.file={self.workdir / 'prometheus.yml'}",
                    f"--storage.tsdb.path={self.workdir / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            if self._wait_ready():
                return
            self.stop()  # the port was taken between our probe and its bind: try another
        raise RuntimeError(f"prometheus did not start: {self.log()[-2000:]}")

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self._proc is not None
            if self._proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return True
            except OSError:
                pass
            time.sleep(0.2)
        return False

    def log(self) -> str:
        return (self.workdir / "prometheus.log").read_text(errors="replace")

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None

    def api(self, path: str, **params: str) -> Any:
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=30) as r:
                body = json.loads(r.read())
        except urllib.error.HTTPError as err:
            raise AssertionError(f"{path} {params}: {err.read().decode()}") from None
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[Series]:
        params = {"query": expr} | ({"time": f"{at:.3f}"} if at is not None else {})
        data = self.api("query", **params)
        assert data["resultType"] == "vector", data
        return [
            Series(r["metric"], [(float(r["value"][0]), float(r["value"][1]))])
            for r in data["result"]
        ]

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[Series]:
        data = self.api(
            "query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step=f"{step}"
        )
        return [
            Series(r["metric"], [(float(t), float(v)) for t, v in r["values"]])
            for r in data["result"]
        ]

    def alerts(self, name: str, state: str = "firing") -> dict[str, dict[str, Any]]:
        """The alerts called `name` in `state` now, by pod."""
        return {
            a["labels"]["pod"]: a
            for a in self.api("alerts")["alerts"]
            if a["labels"]["alertname"] == name and a["state"] == state
        }

    def scrapes(self) -> int:
        """Successful scrapes of the least-scraped pod so far."""
        done = self.query(f'min(sum_over_time(up{{job="{JOB}"}}[1h]))')
        return int(done[0].values[0][1]) if done else 0

    def settled(self, timeout: float = 60) -> float:
        """A moment at which every pod's latest scrape succeeded. On a busy machine one
        can time out, and Prometheus then marks the pod's series stale until the next."""
        deadline = time.monotonic() + timeout
        while True:
            at = time.time()
            up = self.query(f'min(up{{job="{JOB}"}})', at=at)
            if up and up[0].values[0][1] == 1:
                return at
            assert time.monotonic() < deadline, f"scrapes keep failing: {self.log()}"
            time.sleep(SCRAPE_SECONDS / 2)

    def wait_scrapes(self, more: int, timeout: float = 60) -> None:
        want = self.scrapes() + more
        deadline = time.monotonic() + timeout
        while self.scrapes() < want:
            assert time.monotonic() < deadline, f"fewer than {more} new scrapes: {self.log()}"
            time.sleep(SCRAPE_SECONDS / 2)


def rules_firing_at_once(workdir: Path) -> Path:
    """ctxcc's rules with every `for` cut to a second, so a test sees its alerts fire (with
    their labels and annotations) in a real Prometheus; `promtool test rules` checks the
    durations."""
    doc = yaml.safe_load(RULES.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            rule["for"] = "1s"
    out = workdir / "ctxcc-rules-at-once.yaml"
    out.write_text(yaml.safe_dump(doc))
    return out


@dataclass
class Run:
    prom: Prometheus
    started: float  # before the first scrape
    at: float  # after the last scrape of the final state
    scrape: str  # the daemon's /metrics at the end


def dense_provider_session(target: str, steps: int = 3) -> None:
    """A session whose provider counts 100 tokens fewer than the daemon's layers (a
    provider-side cut of what the layers hold), on a route of its own: its provider
    overhead is -100 from its second compile on, which a histogram must carry without its
    _sum ever falling. Each report after the first is the estimate itself (error 0), the
    first ~3 % off: no alert has a reason to fire."""
    route = common_pb2.Route(
        connection="dense", protocol="anthropic-messages", endpoint="api", model="claude-sonnet-4"
    )
    with grpc.insecure_channel(target) as ch:
        sessions: Any = session_service_pb2_grpc.SessionServiceStub(ch)
        compiles: Any = compile_service_pb2_grpc.CompileServiceStub(ch)
        sessions.CreateSession(
            session_service_pb2.CreateSessionRequest(
                session=session_pb2.Session(session_id="dense")
            )
        )
        for step in range(steps):
            event = event_pb2.Event()
            event.user_message.parts.add(text="word " * 3_000 + f"step {step}")
            sessions.AppendEvents(
                session_service_pb2.AppendEventsRequest(session_id="dense", events=[event])
            )
            view = compiles.Compile(
                compile_service_pb2.CompileRequest(session_id="dense", route=route)
            ).view
            b = view.budget
            tokens = b.ledger_tokens - 100 if step == 0 else b.estimated_input_tokens
            if step:
                assert b.provider_overhead_tokens < 0, b
            compiles.ReportUsage(
                compile_service_pb2.ReportUsageRequest(
                    compile_id=view.compile_id, route=route, input_tokens=tokens, output_tokens=10
                )
            )


@contextlib.contextmanager
def replay_under_prometheus(
    work: Path, requests: int, *, pods: int = 1, rounds: int = 1
) -> Iterator[Run]:
    """`pods` daemon processes, each a sidecar of its own, scraped by Prometheus while
    `ctxcc replay` sends them the first `requests` requests of each session of the
    development traces (sessions dealt out in turn), `rounds` times over (each round's
    sessions are new). Before the replay, pod agent-0 answers one NOT_FOUND."""
    by_session: dict[str, list[str]] = {}
    with lzma.open(dev_traces(), "rt") as f:
        for line in f:
            by_session.setdefault(json.loads(line)["session"], []).append(line)
    sessions = list(by_session.values())
    short = Path("/tmp") / f"ctxcc-prom-{time.monotonic_ns()}"  # a socket path must be short
    daemons = [
        DaemonProcess(short / f"pod{i}", log_path=work / f"daemon{i}.log") for i in range(pods)
    ]
    traces = []
    for i, daemon in enumerate(daemons):
        trace = work / f"pod{i}.jsonl"
        trace.write_text("".join(ln for lines in sessions[i::pods] for ln in lines[:requests]))
        traces.append(trace)
        daemon.start()
    prom: Prometheus | None = None
    try:
        metrics = {f"agent-{i}": str(d.wait_ready()["metrics"]) for i, d in enumerate(daemons)}
        prom = Prometheus(work, metrics)
        started = time.time()
        prom.start()
        # Scrapes before any traffic: counters and pre-created series are seen at zero.
        prom.wait_scrapes(2)
        with grpc.insecure_channel(daemons[0].target) as ch:
            stub: Any = session_service_pb2_grpc.SessionServiceStub(ch)
            try:
                stub.GetSession(session_service_pb2.GetSessionRequest(session_id="nope"))
                raise AssertionError("a session that was never created exists")
            except grpc.RpcError as err:
                assert isinstance(err, grpc.Call) and err.code() == grpc.StatusCode.NOT_FOUND
        for _round in range(rounds):
            replays = [
                subprocess.Popen(
                    [sys.executable, "-m", "server", "replay", str(t), "--target", d.target],
                    cwd=REPO,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    text=True,
                )
                for t, d in zip(traces, daemons, strict=True)
            ]
            for replay in replays:
                _, err = replay.communicate(timeout=900)
                assert replay.returncode == 0, err
        dense_provider_session(daemons[0].target)
        prom.wait_scrapes(3)  # the final state is in Prometheus, and the rules ran over it
        scrapes = []
        for url in metrics.values():
            with urllib.request.urlopen(f"http://{url}/metrics", timeout=10) as r:
                scrapes.append(r.read().decode())
        yield Run(prom, started, prom.settled(), "".join(scrapes))
    finally:
        if prom is not None:
            prom.stop()
        for daemon in daemons:
            daemon.terminate()
            daemon.ensure_stopped()
        shutil.rmtree(short, ignore_errors=True)


def finite(series: list[Series]) -> list[Series]:
    """Series with at least one real number (a panel with only NaN draws nothing)."""
    return [s for s in series if any(math.isfinite(v) for _, v in s.values)]


def dashboard() -> dict[str, Any]:
    board: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return board


def grafana_expr(expr: str, variables: dict[str, str], rate_interval: str) -> str:
    """The query Grafana sends: template variables and $__rate_interval substituted."""
    out = expr.replace("$__rate_interval", rate_interval)
    for name in sorted(variables, key=len, reverse=True):
        out = out.replace(f"${{{name}}}", variables[name]).replace(f"${name}", variables[name])
    return out


def until(what: str, check: Callable[[], Any], timeout: float = 60) -> Any:
    """Polls `check` until it returns something true; fails with `what` at the deadline."""
    deadline = time.monotonic() + timeout
    while not (got := check()):
        assert time.monotonic() < deadline, f"{what}: not after {timeout} s"
        time.sleep(0.2)
    return got
