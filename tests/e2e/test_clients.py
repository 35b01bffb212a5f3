"""Interop: the Go, TypeScript and Python example agents run 20-step loops against a
daemon started here, over the Unix socket and TCP, receive a chunked view larger than
4 MB intact, and survive restarts without duplicating an event: the daemon down for 2 s
between steps, and SIGKILLed in the middle of a step. The Go and TypeScript clients' own
unit tests run here too. `make test` builds the clients first (`make clients`);
tests/e2e/test_client_install.py installs them as their READMEs say."""

from __future__ import annotations

import base64
import json
import os
import queue
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest
from google.genai import types as gt

from ctxcc.v1 import session_service_pb2 as spb
from ctxcc.v1 import session_service_pb2_grpc
from tests.conformance.sdk_types import errors_for
from tests.e2e.proc import CLIENT_LOOPS, REPO, DaemonProcess
from tests.helpers import leading_reasoning
from tests.helpers import usage_counts as counts_at

CLIENTS = CLIENT_LOOPS
# A Gemini response with a thought summary, text and three parallel calls, the first signed.
GEMINI_RESPONSE = REPO / "tests" / "fixtures" / "client-thinking" / "gemini-response.json"
OPENAI_RESPONSE = REPO / "tests" / "fixtures" / "client-thinking" / "openai-response.json"
OK = re.compile(r"ok (\d+) steps session (\S+) seq (\d+)(?: largest_view_bytes (\d+))?")
# The Go and TypeScript loops end their `ok` line with how their stream's views arrived.
ARRIVED = re.compile(r"whole (\d+) deltas (\d+) mismatches (\d+)$")
# How many steps were answered with the result of the usage report they carried.
CARRIED = re.compile(r"usage_carried (\d+)")
# The loops that carry each view's usage on their next step.
CARRYING = {"go", "python", "typescript"}


def usage_counts(daemon: DaemonProcess) -> tuple[float, float]:
    return counts_at(str(daemon.endpoints["metrics"]))


def arrived(client: str, ok_line: str) -> tuple[int, int, int] | None:
    """(whole views, deltas, mismatches) of a loop's stream; None for the Python loop."""
    m = ARRIVED.search(ok_line)
    assert m or client == "python", ok_line
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None


def _events(target: str, sid: str) -> list[str]:
    texts, token = [], ""
    with grpc.insecure_channel(
        target, options=[("grpc.max_receive_message_length", 64 << 20)]
    ) as ch:
        stub = session_service_pb2_grpc.SessionServiceStub(ch)
        while True:
            page = stub.ListEvents(
                spb.ListEventsRequest(session_id=sid, page_token=token), timeout=30
            )
            for e in page.events:
                m = e.user_message if e.HasField("user_message") else e.assistant_message
                texts.append(m.parts[0].text[:40])
            token = page.next_page_token
            if not token:
                return texts


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    d = DaemonProcess(Path(os.path.realpath("/tmp")) / f"ctxcc-cl-{os.getpid()}")
    d.start()
    d.wait_ready()
    yield d
    d.terminate()
    shutil.rmtree(d.data_dir, ignore_errors=True)
    d.log_path.unlink(missing_ok=True)


@pytest.mark.parametrize("transport", ["unix", "tcp"])
@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_twenty_step_loop_with_a_chunked_view(
    daemon: DaemonProcess, client: str, transport: str
) -> None:
    cmd = CLIENTS[client]
    assert Path(cmd[-1]).exists(), f"{cmd[-1]} missing: run `make clients`"
    target = (
        f"unix://{daemon.endpoints['unix']}"
        if transport == "unix"
        else str(daemon.endpoints["tcp"])
    )
    args = [*cmd, "--steps", "20", "--big-step", "5"]
    reports, unary = usage_counts(daemon)
    done = subprocess.run(
        args,
        env={**os.environ, "CTXCC_TARGET": target},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    m = OK.search(done.stdout)
    assert m, done.stdout
    steps, sid, seq = int(m.group(1)), m.group(2), int(m.group(3))
    assert steps == 20 and seq == 45
    # Six ~840 KB messages: the view is over 4 MB, came in chunks, and is intact.
    assert int(m.group(4)) == 5_040_375
    assert "missing_reason SESSION_NOT_FOUND" in done.stdout
    # Whole views at step 0 and at step 5 (its ~5 MB of new messages would make a delta
    # over the chunk size, and deltas are never chunked); deltas otherwise (18 today; a few
    # more whole views are the daemon's right when a delta would not be smaller).
    ok_line = next(ln for ln in done.stdout.splitlines() if OK.match(ln))
    counts = arrived(client, ok_line)
    if counts:
        whole, deltas, mismatches = counts
        assert whole + deltas == 20 and whole >= 2 and deltas >= 15 and mismatches == 0, counts
    # Each view's usage rode on the next step: 19 answered with their report's result,
    # the last view's report went by the unary ReportUsage at close. All 20 are recorded.
    now_reports, now_unary = usage_counts(daemon)
    assert now_reports - reports == 20
    if client in CARRYING:
        carried = CARRIED.search(ok_line)
        assert carried and int(carried.group(1)) == 19, ok_line
        assert now_unary - unary == 1
    events = _events(str(daemon.endpoints["tcp"]), sid)
    assert len(events) == seq
    assert events[-1].startswith("next step 19") or events[-2].startswith("reply 18")


STEP = re.compile(r"step (\d+) append (\d+)-(\d+) replayed (true|false) ms ([\d.]+) estimate \d+")

ESTIMATE = re.compile(r"^step (\d+) append .* estimate (\d+)$", re.M)


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_a_long_loop_reports_what_the_provider_counted(daemon: DaemonProcess, client: str) -> None:
    """The example loops' fake provider reported ctxcc's own estimate plus 2 %: as the
    estimate after a report is that report plus what is new, the count compounded step
    after step, past any model's window (2^28 tokens, refused, at ~step 510). It counts
    the request it was sent now, as a provider does; over 150 steps of two short
    messages each the estimate grows by what those add, not by a factor."""
    done = subprocess.run(
        [*CLIENTS[client], "--steps", "150"],
        env={**os.environ, "CTXCC_TARGET": f"unix://{daemon.endpoints['unix']}"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    estimates = [int(m.group(2)) for m in ESTIMATE.finditer(done.stdout)]
    assert len(estimates) == 150, done.stdout[-2000:]
    # From step 10 on the route's baseline is a report (the first steps carry none).
    growth = estimates[-1] - estimates[10]
    assert 0 < growth < 40 * 140, estimates[::10]


class Agent:
    """An example agent loop as a child process whose output lines are read as they come,
    each stamped with the time it arrived."""

    def __init__(self, client: str, target: str, *args: str) -> None:
        self.client = client
        self.proc = subprocess.Popen(
            [*CLIENTS[client], *args],
            env={**os.environ, "CTXCC_TARGET": target},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[tuple[str, float]] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put((line.strip(), time.monotonic()))
        self.lines.put(("", -1.0))

    def expect(self, pattern: str, timeout: float = 120) -> tuple[re.Match[str], float]:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line, at = self.lines.get(timeout=left)
            except queue.Empty:
                break
            if at < 0:
                err = self.proc.stderr.read() if self.proc.stderr else ""
                raise AssertionError(f"agent ended before {pattern!r}: {self.seen}\n{err}")
            self.seen.append(line)
            if m := re.fullmatch(pattern, line):
                return m, at
        raise AssertionError(f"no {pattern!r} in {timeout}s: {self.seen}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def expected_texts(steps: int, big_step: int = -1) -> list[str]:
    """The log an agent loop leaves, each event once and in order (first 40 characters)."""
    texts = []
    for step in range(steps):
        texts += ["start the task"] if step == 0 else [f"reply {step - 1}", f"next step {step}"]
        if step == big_step:
            texts += [(f"chunk {i} line. " * 60000)[:40] for i in range(6)]
    return texts


def wait_for_head(daemon: DaemonProcess, sid: str, seq: int, timeout: float = 60) -> float:
    """Polls the session until its log reaches `seq`; returns when it saw that."""
    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(daemon.target) as ch:
        stub = session_service_pb2_grpc.SessionServiceStub(ch)
        while time.monotonic() < deadline:
            head = stub.GetSession(spb.GetSessionRequest(session_id=sid), timeout=5).session
            if head.head_seq >= seq:
                return time.monotonic()
            time.sleep(0.002)
    raise AssertionError(f"session {sid} never reached seq {seq}")


@contextmanager
def paused_agent(
    client: str, tmp: Path, *args: str
) -> Iterator[tuple[DaemonProcess, Agent, str, Path]]:
    """A daemon and an agent loop on its socket, paused after a step (`--pause-at`) until
    the yielded resume file exists."""
    daemon = DaemonProcess(tmp / "data").start()
    daemon.wait_ready()
    resume = tmp / "resume"
    target = f"unix://{daemon.endpoints['unix']}"
    agent = Agent(client, target, *args, "--resume-file", str(resume))
    try:
        sid = agent.expect(r"session (\S+)")[0].group(1)
        agent.expect("paused")
        yield daemon, agent, sid, resume
    finally:
        agent.stop()
        daemon.ensure_stopped()


def step_line(agent: Agent, step: int) -> tuple[tuple[str, ...], float]:
    """(first seq, last seq, replayed) of a step's append, and when its line arrived."""
    m, at = agent.expect(STEP.pattern.replace(r"(\d+)", str(step), 1))
    return m.group(1, 2, 3), at


def finished(agent: Agent) -> tuple[int, tuple[int, int, int] | None]:
    """The loop's last seq, and how its stream's views arrived (Go and TypeScript)."""
    done = agent.expect(OK.pattern + r".*")[0]
    assert agent.proc.wait(30) == 0
    return int(done.group(3)), arrived(agent.client, done.group(0))


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_daemon_down_two_seconds_between_steps(client: str, short_tmp: Path) -> None:
    """The step after the pause starts while the daemon is down and goes through once it
    is back, appended exactly once. The client reconnects within about a second: its append
    is in the log a generous 2.5 s after the daemon answers health checks at the latest
    (the step's compile on a cold daemon is not part of that)."""
    args = ("--steps", "20", "--pause-at", "9")
    with paused_agent(client, short_tmp, *args) as (daemon, agent, sid, resume):
        assert daemon.terminate(timeout=60) == 0
        resume.touch()
        time.sleep(2)
        daemon.start()
        daemon.wait_ready()
        back = time.monotonic()
        landed = wait_for_head(daemon, sid, 21) - back
        assert landed < 2.5, f"step 10's append came {landed:.2f}s after the daemon was back"
        assert step_line(agent, 10)[0] == ("20", "21", "false")  # it never landed before
        seq, counts = finished(agent)
        assert seq == 39
        # Whole views at step 0 and on the stream reopened at step 10; deltas otherwise.
        assert counts in (None, (2, 18, 0)), counts
        assert _events(daemon.target, sid) == expected_texts(20)


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_sigkill_mid_step_then_retry(client: str, short_tmp: Path) -> None:
    """SIGKILL after a step's append is durable but before its view is answered (the daemon
    is still compiling ~5 MB): the client resends the step with the same request id after
    the restart, the append is replayed, and every event is in the log exactly once."""
    args = ("--steps", "8", "--pause-at", "4", "--big-step", "5")
    with paused_agent(client, short_tmp, *args) as (daemon, agent, sid, resume):
        resume.touch()
        # Step 5 appends reply 4, next step 5 and six ~840 KB messages: seq 10..17.
        wait_for_head(daemon, sid, 17)
        daemon.kill()
        daemon.start()
        daemon.wait_ready()
        assert step_line(agent, 5)[0] == ("10", "17", "true")
        assert finished(agent)[0] == 1 + 7 * 2 + 6
        assert _events(daemon.target, sid) == expected_texts(8, big_step=5)


def _run_suite(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        args,
        cwd=cwd,
        # Offline: `make clients` fetched every module the Go tests need.
        env={**os.environ, "GOPROXY": "off", "GOFLAGS": "-mod=mod", **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_go_client_unit_tests() -> None:
    """Delta views applied against real views, digest mismatches, the stream helper against
    a scripted CompileService (client/go/*_test.go)."""
    out = _run_suite(["go", "test", "-count=1", "-v", "."], REPO / "client/go")
    passed = re.findall(r"^--- PASS: (\w+)", out, re.M)
    assert len(passed) >= 8 and "FAIL" not in out, out


def test_typescript_client_unit_tests() -> None:
    """The same for the TypeScript client (client/typescript/test, compiled by `make
    clients`, run by node's built-in test runner)."""
    files = sorted(str(p) for p in (REPO / "client/typescript/dist/test").glob("*.test.js"))
    assert len(files) >= 2, "run `make clients`"
    out = _run_suite(["node", "--test", *files], REPO / "client/typescript")
    passed = re.search(r"^# pass (\d+)$", out, re.M)
    assert passed and int(passed.group(1)) >= 8 and re.search(r"^# fail 0$", out, re.M), out


def _go_daemon_test(name: str, env: dict[str, str]) -> str:
    """Runs the Go client's test `name` (and its subtests) with the daemon's target in
    `env`: it must have run (not skipped) and passed."""
    out = _run_suite(
        ["go", "test", "-count=1", "-v", "-run", f"^{name}$", "."], REPO / "client/go", env
    )
    assert re.search(rf"^--- PASS: {name}\b", out, re.M), out
    assert "SKIP" not in out and "FAIL" not in out, out
    return out


def _ts_daemon_test(file: str, name: str, env: dict[str, str]) -> None:
    """Runs the TypeScript client's test `name` of `file` (compiled by `make clients`)
    with the daemon's target in `env`: node reports the file's other tests as skipped;
    this one must have run and passed."""
    test_file = REPO / "client/typescript/dist/test" / file
    assert test_file.exists(), "run `make clients`"
    out = _run_suite(
        ["node", "--test", f"--test-name-pattern={re.escape(name)}", str(test_file)],
        REPO / "client/typescript",
        env,
    )
    ran = re.search(rf"^ok \d+ - {re.escape(name)}$", out, re.M)
    assert ran and re.search(r"^# fail 0$", out, re.M), out


# The clients' tests that run against a real daemon (skipped without CTXCC_TARGET): their
# scripted CompileService forwards each request to it, as a proxy that delivers answers
# again late (a resume's answer while the next resume is awaited).
DAEMON_GO_TEST = "TestStreamNeverTakesAnEarlierResumesAnswerFromADaemon"
DAEMON_TS_TEST = "against a daemon: an earlier resume's answer delivered again late is never taken"


def test_go_client_resume_ids_against_a_daemon(daemon: DaemonProcess) -> None:
    """client/go/stepid_test.go: a resume's answer delivered again late (with its id or
    cleared of it) is never returned for the next resume, and a daemon that does not echo
    a resume's id still gets its resumes taken."""
    out = _go_daemon_test(DAEMON_GO_TEST, {"CTXCC_TARGET": daemon.target})
    passed = re.findall(rf"^\s*--- PASS: {DAEMON_GO_TEST}\S*", out, re.M)
    assert len(passed) == 4, out  # the test and its three subtests


def test_typescript_client_resume_ids_against_a_daemon(daemon: DaemonProcess) -> None:
    """The same for the TypeScript client (client/typescript/test/stream.test.ts)."""
    _ts_daemon_test("stream.test.js", DAEMON_TS_TEST, {"CTXCC_TARGET": daemon.target})


# A step over the daemon's --max-message-bytes, refused by gRPC (RESOURCE_EXHAUSTED, which
# ends the call): the stream reopens at the next step instead of failing it the same way.
REFUSED_GO_TEST = "TestAStepGRPCRefusesLeavesTheStreamUsable"
SMALL_MESSAGES = 2 << 20


def test_go_client_stream_usable_after_a_step_grpc_refused(short_tmp: Path) -> None:
    """client/go/stream_test.go: after a step too large for the daemon's message limit
    fails with RESOURCE_EXHAUSTED, the next steps on the same Stream are answered, and the
    refused one appended nothing."""
    d = DaemonProcess(short_tmp / "data", "--max-message-bytes", str(SMALL_MESSAGES))
    d.start()
    try:
        d.wait_ready()
        env = {"CTXCC_TARGET": d.target, "CTXCC_MAX_MESSAGE_BYTES": str(SMALL_MESSAGES)}
        _go_daemon_test(REFUSED_GO_TEST, env)
    finally:
        d.terminate()


# A unary call slower than the client's retry budget is answered, not cut off at it.
UNARY_TS_TEST = (
    "against a daemon: a unary call the daemon answers after retrySeconds is not cut off"
)


def test_typescript_client_unary_calls_outlast_the_retry_budget(daemon: DaemonProcess) -> None:
    """client/typescript/test/unary.test.ts: retrySeconds bounds the wait for an unavailable
    daemon, not the call: a compile the daemon answers after it is returned whole."""
    _ts_daemon_test("unary.test.js", UNARY_TS_TEST, {"CTXCC_TARGET": daemon.target})


# The clients' tests of their Anthropic helper against a real daemon (skipped without
# CTXCC_TARGET).
THINKING_GO_TEST = "TestAssistantFromAnthropicAgainstADaemon"
THINKING_TS_TEST = (
    "against a daemon: the logged response's thinking blocks lead its turn in the Anthropic body"
)


def test_go_client_thinking_blocks_against_a_daemon(daemon: DaemonProcess) -> None:
    """client/go/provider_thinking_test.go: the event AssistantFromAnthropic builds for a
    response with thinking blocks is accepted and stored as sent, and the Anthropic body
    leads the turn with the response's blocks, unchanged, on its route only."""
    _go_daemon_test(THINKING_GO_TEST, {"CTXCC_TARGET": daemon.target})


def test_typescript_client_thinking_blocks_against_a_daemon(daemon: DaemonProcess) -> None:
    """The same for the TypeScript client (client/typescript/test/anthropic.test.ts)."""
    _ts_daemon_test("anthropic.test.js", THINKING_TS_TEST, {"CTXCC_TARGET": daemon.target})


# The clients' tests of their Gemini helper against a real daemon (skipped without
# CTXCC_TARGET); each writes the Gemini body it checked to CTXCC_GEMINI_BODY.
GEMINI_GO_TEST = "TestAssistantFromGeminiAgainstADaemon"
GEMINI_TS_TEST = (
    "against a daemon: the logged response's thought signatures are on their calls in the "
    "Gemini body"
)


def _check_gemini_body(path: Path) -> None:
    """The body a client's test compiled: valid for google-genai's types, and its signed
    call (the fixture's first) carries the response's signature, the others none."""
    body = json.loads(path.read_text(encoding="utf-8"))
    assert errors_for("gemini", body) == []
    response = json.loads(GEMINI_RESPONSE.read_text(encoding="utf-8"))
    parts = response["candidates"][0]["content"]["parts"]
    want = [p.get("thoughtSignature") for p in parts if "functionCall" in p]
    sent = [p for c in body["contents"] for p in c["parts"] if "functionCall" in p]
    assert [gt.Part.model_validate(p).thought_signature for p in sent] == [
        base64.b64decode(s) if s else None for s in want
    ]


def test_go_client_thought_signatures_against_a_daemon(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    """client/go/provider_gemini_test.go: the event AssistantFromGemini builds for a
    response with parallel calls, the first signed, is accepted and stored as sent, and the
    Gemini body puts the signature on that call only, on its route only."""
    body = tmp_path / "gemini-body.json"
    _go_daemon_test(GEMINI_GO_TEST, {"CTXCC_TARGET": daemon.target, "CTXCC_GEMINI_BODY": str(body)})
    _check_gemini_body(body)


def test_typescript_client_thought_signatures_against_a_daemon(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    """The same for the TypeScript client (client/typescript/test/gemini.test.ts)."""
    body = tmp_path / "gemini-body.json"
    env = {"CTXCC_TARGET": daemon.target, "CTXCC_GEMINI_BODY": str(body)}
    _ts_daemon_test("gemini.test.js", GEMINI_TS_TEST, env)
    _check_gemini_body(body)


# The clients' tests of their Responses helper against a real daemon (skipped without
# CTXCC_TARGET); each writes the Responses body it checked to CTXCC_OPENAI_BODY.
OPENAI_GO_TEST = "TestAssistantFromOpenAIResponsesAgainstADaemon"
OPENAI_TS_TEST = (
    "against a daemon: the logged response's reasoning items lead its calls in the Responses body"
)


def _check_openai_body(path: Path) -> None:
    """The body a client's test compiled: valid for the openai SDK's types, stateless, and
    the fixture's reasoning item right before its message goes right before that message
    and the calls, with its id, summary and seal only; the others are not sent."""
    body = json.loads(path.read_text(encoding="utf-8"))
    assert errors_for("openai_responses", body) == [] and body["store"] is False
    output = json.loads(OPENAI_RESPONSE.read_text(encoding="utf-8"))["output"]
    sealed = leading_reasoning(output)
    items = body["input"]
    first_call = next(i for i, item in enumerate(items) if item["type"] == "function_call")
    assert items[first_call - 2]["type"] == "reasoning"  # then the message, then the calls
    reasoning = [item for item in items if item["type"] == "reasoning"]
    assert reasoning == [
        {k: i[k] for k in ("type", "id", "summary", "encrypted_content")} for i in sealed
    ]
    assert items.index(reasoning[0]) < first_call


def test_go_client_reasoning_items_against_a_daemon(daemon: DaemonProcess, tmp_path: Path) -> None:
    """client/go/provider_openai_test.go: the event AssistantFromOpenAIResponses builds for
    a response with reasoning items is accepted and stored as sent, and the Responses body
    sends the sealed item back before its calls, on its route only."""
    body = tmp_path / "openai-body.json"
    _go_daemon_test(OPENAI_GO_TEST, {"CTXCC_TARGET": daemon.target, "CTXCC_OPENAI_BODY": str(body)})
    _check_openai_body(body)


def test_typescript_client_reasoning_items_against_a_daemon(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    """The same for the TypeScript client (client/typescript/test/openai.test.ts)."""
    body = tmp_path / "openai-body.json"
    env = {"CTXCC_TARGET": daemon.target, "CTXCC_OPENAI_BODY": str(body)}
    _ts_daemon_test("openai.test.js", OPENAI_TS_TEST, env)
    _check_openai_body(body)
