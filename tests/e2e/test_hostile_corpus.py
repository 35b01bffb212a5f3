"""The hostile corpus: requests an attacker or an unlucky user sends, each against a
running daemon while a probe on another session measures health-check and append
latency. Every case must answer its documented code and ErrorInfo reason, and the
probe's p99 must stay under 250 ms (the bound the reliability requirements set).

Adding a case: append a `Case` to `CASES` (or build one in a fixture-aware helper).
`setup` runs before the probe window opens; `request` is the hostile call, timed;
`after` checks what must hold afterwards (e.g. the session still compiles).
"""

from __future__ import annotations

import functools
import os
import shutil
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ctxcc.v1 import (
    artifact_service_pb2_grpc,
    checkpoint_pb2,
    common_pb2,
    compile_service_pb2_grpc,
    event_pb2,
    session_pb2,
    session_service_pb2_grpc,
    source_pb2,
    source_service_pb2_grpc,
    tool_service_pb2_grpc,
    view_pb2,
)
from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_service_pb2 as spb
from ctxcc.v1 import source_service_pb2 as rpb
from ctxcc.v1 import tool_service_pb2 as tpb
from tests.e2e.proc import DaemonProcess
from tests.helpers import png_upload, varint

P99_BOUND_S = 0.250
QUIET_WINDOW_S = 0.5
OK = grpc.StatusCode.OK


@dataclass
class Env:
    """What a case can use: stubs on the daemon's socket and a workspace root on disk."""

    channel: grpc.Channel
    workspace: Path
    stubs: dict[str, Any] = field(default_factory=dict)
    # The session the last setup made, for `after` checks.
    current: str = ""

    def __getattr__(self, name: str) -> Any:
        try:
            return self.stubs[name]
        except KeyError:
            raise AttributeError(name) from None

    def session(self, sid: str, **fields: Any) -> None:
        self.sessions.CreateSession(
            spb.CreateSessionRequest(session=session_pb2.Session(session_id=sid, **fields))
        )

    def user(self, sid: str, text: str) -> None:
        ev = event_pb2.Event()
        ev.user_message.parts.add(text=text)
        self.sessions.AppendEvents(spb.AppendEventsRequest(session_id=sid, events=[ev]))

    def compile(self, sid: str, model: str = "gpt-4o", **fields: Any) -> cpb.CompileResponse:
        req = cpb.CompileRequest(session_id=sid, route=common_pb2.Route(model=model), **fields)
        resp: cpb.CompileResponse = self.compiles.Compile(req, timeout=60)
        return resp


@dataclass(frozen=True)
class Case:
    name: str
    # The hostile call; its return value is passed to `after`.
    request: Callable[[Env], Any]
    # (OK, "") or (code, ErrorInfo.reason)
    expect: tuple[grpc.StatusCode, str]
    setup: Callable[[Env], None] | None = None
    after: Callable[[Env, Any], None] | None = None
    # ErrorInfo metadata the refusal must carry (e.g. which field was over its limit).
    metadata: dict[str, str] = field(default_factory=dict)


def error_info(err: grpc.RpcError) -> error_details_pb2.ErrorInfo:
    e: Any = err
    info = error_details_pb2.ErrorInfo()
    for key, value in e.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            for detail in status_pb2.Status.FromString(value).details:
                detail.Unpack(info)
    return info


def error_of(err: grpc.RpcError) -> tuple[grpc.StatusCode, str]:
    e: Any = err
    return e.code(), error_info(err).reason


class Probe:
    """Health checks and one-event appends to its own session, back to back."""

    def __init__(self, target: str) -> None:
        self._channel = grpc.insecure_channel(target)
        self._health: Any = health_pb2_grpc.HealthStub(self._channel)
        self._sessions: Any = session_service_pb2_grpc.SessionServiceStub(self._channel)
        self._sessions.CreateSession(
            spb.CreateSessionRequest(session=session_pb2.Session(session_id="probe"))
        )
        # (start, latency, kind, ok)
        self.samples: list[tuple[float, float, str, bool]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _one(self, kind: str, call: Callable[[], Any]) -> None:
        start = time.monotonic()
        ok = True
        try:
            call()
        except grpc.RpcError:
            ok = False
        self.samples.append((start, time.monotonic() - start, kind, ok))

    def _run(self) -> None:
        ev = event_pb2.Event()
        ev.assistant_message.parts.add(text="probe")
        append = spb.AppendEventsRequest(session_id="probe", events=[ev])
        check = health_pb2.HealthCheckRequest()
        while not self._stop.is_set():
            self._one("health", lambda: self._health.Check(check, timeout=30))
            self._one("append", lambda: self._sessions.AppendEvents(append, timeout=30))
            time.sleep(0.01)

    def window(self, t0: float, t1: float) -> list[tuple[float, float, str, bool]]:
        """Probe calls that overlapped [t0, t1]; for each kind with none (a request
        quicker than one probe round), the first call after t1."""
        # Wait for the calls in flight at t1: a stall shows up as their latency.
        deadline = time.monotonic() + 35
        while time.monotonic() < deadline and sum(s[0] > t1 for s in self.samples[-4:]) < 2:
            time.sleep(0.01)
        done = list(self.samples)
        hit = [s for s in done if s[0] <= t1 and s[0] + s[1] >= t0]
        for kind in ("health", "append"):
            if not any(s[2] == kind for s in hit):
                hit += [s for s in done if s[0] > t1 and s[2] == kind][:1]
        return hit

    def close(self) -> None:
        self._stop.set()
        self._thread.join(40)
        self._channel.close()


def _p99(values: list[float]) -> float:
    if len(values) < 2:
        return max(values, default=0.0)
    return statistics.quantiles(values, n=100, method="inclusive")[98]


# -- the corpus -----------------------------------------------------------------------


def _rule(env: Env, rule_id: str, globs: list[str]) -> Any:
    return env.sources.PutRule(
        rpb.PutRuleRequest(
            rule=source_pb2.Rule(
                rule_id=rule_id,
                scope=common_pb2.SCOPE_SESSION,
                scope_id=rule_id,
                name=rule_id,
                text="follow the rule",
                activation=source_pb2.RULE_ACTIVATION_MATCHED,
                path_globs=globs,
            )
        )
    )


def _tool_result(env: Env, sid: str, text: str) -> None:
    call = event_pb2.Event()
    call.assistant_message.tool_calls.add(call_id="c1", name="shell", arguments_json="{}")
    result = event_pb2.Event()
    result.tool_result.call_id, result.tool_result.text = "c1", text
    env.sessions.AppendEvents(spb.AppendEventsRequest(session_id=sid, events=[call, result]))


def _search(env: Env, sid: str, pattern: str, regex: bool = True) -> Any:
    return env.tools.ReadToolResult(
        tpb.ReadToolResultRequest(
            session_id=sid, call_id="c1", search=tpb.ResultSearch(pattern=pattern, regex=regex)
        ),
        timeout=60,
    )


def _compiles(env: Env, _: Any) -> None:
    assert env.compile(env.current).view.event_boundary > 0


def _path_scan(env: Env) -> None:
    env.current = "paths"
    env.session("paths")
    env.user("paths", "a" * 1_000_000)


def _word_for_cl100k(env: Env) -> None:
    env.current = "cl100k"
    env.session("cl100k")
    env.user("cl100k", "b" * 1_000_000)


def _word_for_gpt4(env: Env) -> None:
    env.current = "gpt4word"
    env.session("gpt4word")
    env.user("gpt4word", "c" * 1_000_000)


def _glob_backtrack(env: Env) -> None:
    env.current = "globs"
    env.session("globs")
    _rule(env, "globs", ["**a**a**a**a**a**a**b"])
    env.user("globs", "look at " + "/".join(["a" * 40, "a" * 40]) + " " + "a" * 80)


def _glob_file(env: Env) -> None:
    root = env.workspace / "globfile"
    (root / ".ctxcc" / "rules").mkdir(parents=True)
    # Just under the 1 MiB a rule file is read up to.
    many = ", ".join(f"**a**a**a**a**a**a**b{i}" for i in range(30_000))
    (root / ".ctxcc" / "rules" / "hostile.md").write_text(
        f"---\nactivation: matched\nglobs: [{many}]\n---\nfollow the rule\n"
    )
    env.current = "globfile"
    env.session("globfile", project_root=str(root))
    env.user("globfile", "edit " + "a" * 80 + " and src/" + "a" * 80 + ".py")


def _result(sid: str, text: str) -> Callable[[Env], None]:
    """A session whose one tool result holds `text`."""

    def setup(env: Env) -> None:
        env.current = sid
        env.session(sid)
        env.user(sid, "run it")
        _tool_result(env, sid, text)

    return setup


# The regex-module pattern that took 14 s on a 60-line result: 0.5 s per line.
_EVIL_LINES = "\n".join("x" * 28 for _ in range(60))


def _report_huge_usage(env: Env) -> Any:
    env.current = "usage"
    env.session("usage")
    env.user("usage", "hello")
    compiled = env.compile("usage")
    return env.compiles.ReportUsage(
        cpb.ReportUsageRequest(
            compile_id=compiled.view.compile_id,
            input_tokens=2**32 - 1,
            output_tokens=2**32 - 1,
            cached_input_tokens=2**32 - 1,
            reasoning_tokens=2**32 - 1,
        )
    )


def _compiles_after_more(env: Env, _: Any) -> None:
    env.user(env.current, "and now something longer " * 200)
    view = env.compile(env.current).view
    assert view.budget.estimated_input_tokens > 0


def _create(sid: str, **fields: Any) -> Callable[[Env], Any]:
    def call(env: Env) -> Any:
        env.current = sid
        return env.sessions.CreateSession(
            spb.CreateSessionRequest(session=session_pb2.Session(session_id=sid, **fields))
        )

    return call


def _no_session(env: Env, _: Any) -> None:
    try:
        env.sessions.GetSession(spb.GetSessionRequest(session_id=env.current))
    except grpc.RpcError as err:
        assert error_of(err)[1] == "SESSION_NOT_FOUND"
    else:
        pytest.fail("a refused session was stored")


def _deep_arguments(env: Env) -> None:
    env.current = "deep"
    env.session("deep")
    env.user("deep", "call it")
    call = event_pb2.Event()
    deep = '{"a": ' * 5_000 + "1" + "}" * 5_000
    call.assistant_message.tool_calls.add(call_id="d1", name="shell", arguments_json=deep)
    result = event_pb2.Event()
    result.tool_result.call_id, result.tool_result.text = "d1", "ok"
    env.sessions.AppendEvents(spb.AppendEventsRequest(session_id="deep", events=[call, result]))


def _rendered(env: Env) -> Any:
    return env.compile(
        "deep",
        render_formats=[
            view_pb2.RENDER_FORMAT_OPENAI_CHAT,
            view_pb2.RENDER_FORMAT_OPENAI_RESPONSES,
            view_pb2.RENDER_FORMAT_ANTHROPIC_MESSAGES,
            view_pb2.RENDER_FORMAT_GEMINI,
        ],
    )


def _all_rendered(env: Env, resp: Any) -> None:
    assert len(resp.view.renderings) == 4, resp.view.renderings


def _list_after_max(env: Env) -> Any:
    env.current = "listmax"
    env.session("listmax")
    env.user("listmax", "hello")
    return env.sessions.ListEvents(spb.ListEventsRequest(session_id="listmax", after_seq=2**64 - 1))


def _bad_environment(env: Env) -> Any:
    env.current = "badenv"
    env.session("badenv")
    env.user("badenv", "hello")
    return env.compile("badenv", environment=cpb.Environment(working_directory="/tmp/a\x00b"))


def _million_events(env: Env, before: bytes = b"", sid: str = "flood") -> Any:
    """2,000,000 one-character user messages in one AppendEvents to a new session `sid`,
    encoded by hand (the Python message API would take the client longer than the
    daemon), after `before`."""
    env.current = sid
    env.session(sid)
    ev = event_pb2.Event()
    ev.user_message.parts.add(text="x")
    one = ev.SerializeToString()
    field = b"\x12" + varint(len(one)) + one
    body = before + _len_field(1, sid.encode()) + field * 2_000_000
    call: Any = env.channel.unary_unary("/ctxcc.v1.SessionService/AppendEvents")
    return call(body, timeout=60)


# An empty group of an unknown field (99): no field of ours is a group, and the decoder
# keeps it as an unknown field; the wire count must step over it, not give up.
_UNKNOWN_GROUP = varint(99 << 3 | 3) + varint(99 << 3 | 4)


# Each over-limit list below ends with an element that is not valid UTF-8: decoding the
# request would fail on it (INVALID_FIELD, field "request"), so an answer naming the
# capped field shows the count was read from the raw bytes, before any decoding.
_BAD_STRING = b"\xff\xfe"


def _len_field(number: int, payload: bytes) -> bytes:
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def _raw_unary(env: Env, method: str, body: bytes) -> Any:
    call: Any = env.channel.unary_unary(method)
    return call(body, timeout=60)


def _many_globs(env: Env) -> Any:
    """PutRuleRequest.rule (1) -> Rule.path_globs (8) x 200,000."""
    rule = source_pb2.Rule(
        rule_id="many",
        scope=common_pb2.SCOPE_SESSION,
        scope_id="many",
        name="many",
        text="follow the rule",
        activation=source_pb2.RULE_ACTIVATION_MATCHED,
    ).SerializeToString()
    rule += _len_field(8, b"*.py") * 200_000 + _len_field(8, _BAD_STRING)
    return _raw_unary(env, "/ctxcc.v1.SourceService/PutRule", _len_field(1, rule))


@functools.cache
def _labels_body() -> bytes:
    """CreateSessionRequest.session (1) -> Session.labels (6) x 200,000 map entries.
    Built before the probe window (its setup), as the client's work would skew it."""
    session = session_pb2.Session(session_id="labels").SerializeToString()
    entries = b"".join(
        _len_field(6, _len_field(1, b"k%d" % i) + _len_field(2, b"v")) for i in range(200_000)
    )
    session += entries + _len_field(6, _len_field(1, _BAD_STRING))
    return _len_field(1, session)


def _labels_setup(env: Env) -> None:
    _labels_body()


def _many_labels(env: Env) -> Any:
    env.current = "labels"
    return _raw_unary(env, "/ctxcc.v1.SessionService/CreateSession", _labels_body())


_FLOOD_ROUTE = common_pb2.Route(model="gpt-4o")


@functools.cache
def _flood_body() -> bytes:
    """CompileStreamRequest.step (1) -> StepRequest.events (2) x 2,000,000."""
    ev = event_pb2.Event()
    ev.user_message.parts.add(text="x")
    one = _len_field(2, ev.SerializeToString())
    bad = ev.SerializeToString().replace(b"x", _BAD_STRING)
    compile_req = cpb.CompileRequest(session_id="sflood", route=_FLOOD_ROUTE)
    step = (
        _len_field(1, b"s1")
        + one * 2_000_000
        + _len_field(2, bad)
        + _len_field(5, compile_req.SerializeToString())
    )
    return _len_field(1, step)


def _stream_flood_setup(env: Env) -> None:
    env.current = "sflood"
    env.session("sflood")
    _flood_body()


def _stream_flood(env: Env) -> Any:
    # Then an ordinary step on the same stream: a refused step is answered in-band.
    ev = event_pb2.Event()
    ev.user_message.parts.add(text="y")
    fine = cpb.CompileStreamRequest(
        step=cpb.StepRequest(
            step_id="s2",
            events=[ev],
            compile=cpb.CompileRequest(session_id="sflood", route=_FLOOD_ROUTE),
        )
    ).SerializeToString()
    call: Any = env.channel.stream_stream("/ctxcc.v1.CompileService/CompileStream")
    replies = call(iter([_flood_body(), fine]), timeout=60)
    return [cpb.CompileStreamResponse.FromString(r) for r in replies]


def _resume_enums(env: Env) -> Any:
    """A CompileStream resume whose compile names 5,000,000 excluded sections (5 MB),
    encoded by hand: CompileStreamRequest.resume (2) -> ResumeRequest.compile (2) ->
    CompileRequest.exclude_sections (7, packed)."""
    env.current = "renums"
    env.session("renums")
    env.user("renums", "hello")
    head = cpb.CompileRequest(session_id="renums", route=_FLOOD_ROUTE).SerializeToString()
    compile_req = head + _len_field(7, b"\x01" * 5_000_000)
    resume = _len_field(2, compile_req) + _len_field(3, b"r1")
    call: Any = env.channel.stream_stream("/ctxcc.v1.CompileService/CompileStream")
    replies = call(iter([_len_field(2, resume)]), timeout=60)
    return [cpb.CompileStreamResponse.FromString(r) for r in replies]


def _resume_enums_refused(env: Env, replies: list[cpb.CompileStreamResponse]) -> None:
    got = [(r.step_id, r.error.reason, dict(r.error.metadata)) for r in replies]
    assert got == [("r1", "INVALID_FIELD", {"field": "compile"})], got


def _flood_step_refused(env: Env, replies: list[cpb.CompileStreamResponse]) -> None:
    got = [(r.step_id, r.WhichOneof("response"), r.error.reason) for r in replies]
    assert got == [("s1", "error", "TOO_MANY_EVENTS"), ("s2", "view", "")], got
    events = env.sessions.ListEvents(spb.ListEventsRequest(session_id="sflood")).events
    assert [e.seq for e in events] == [1]  # only the second step's event


@functools.cache
def _parts_body() -> bytes:
    """AppendEventsRequest.events (2) -> Event.user_message (10) -> parts (1): one event
    of 10,000,000 empty parts (20 MB), the last one's text not UTF-8."""
    parts = _len_field(1, b"") * 10_000_000 + _len_field(1, _len_field(1, _BAD_STRING))
    return _len_field(1, b"parts") + _len_field(2, _len_field(10, parts))


def _parts_setup(env: Env) -> None:
    env.current = "parts"
    env.session("parts")
    _parts_body()


def _million_kinds(env: Env) -> Any:
    env.current = "kinds"
    env.session("kinds")
    env.user("kinds", "hello")
    request = spb.ListEventsRequest(session_id="kinds")
    request.kinds.extend([event_pb2.EVENT_KIND_USER_MESSAGE] * 1_000_000)
    return env.sessions.ListEvents(request, timeout=60)


def _big_history(env: Env) -> None:
    """About 34 MB of messages: more than one unary Compile may carry (32 MiB here)."""
    env.current = "history"
    env.session("history")
    line = "the build failed in src/pkg/module_42/handler.py, retrying with a clean cache\n"
    for i in range(17):
        body = f"message {i}\n" + line * (1_000_000 // len(line))
        ev = event_pb2.Event()
        ev.user_message.parts.add(text=body)
        reply = event_pb2.Event()
        reply.assistant_message.parts.add(text=body)
        env.sessions.AppendEvents(
            spb.AppendEventsRequest(session_id="history", events=[ev, reply]), timeout=60
        )


def _swap_race(env: Env) -> list[str]:
    """200 compiles whose working directory is swapped, all along, between a real
    directory and a symlink to a directory outside every workspace root."""
    root = env.workspace / "race"
    real = root / "sub.real"
    real.mkdir(parents=True)
    (real / "AGENTS.md").write_text("inside sub")
    outside = env.workspace.parent / "outside"
    outside.mkdir()
    (outside / "AGENTS.md").write_text("OUTSIDE-SECRET")
    sub, link = root / "sub", root / "sub.link"
    link.symlink_to(outside)
    env.current = "race"
    env.session("race", project_root=str(root), working_directory=str(sub))
    env.user("race", "hello")
    stop = threading.Event()

    def swap() -> None:
        while not stop.is_set():
            os.rename(real, sub)
            os.rename(sub, real)
            os.rename(link, sub)
            os.rename(sub, link)

    swapper = threading.Thread(target=swap)
    swapper.start()
    try:
        return [env.compile("race").view.system_prompt for _ in range(200)]
    finally:
        stop.set()
        swapper.join()


def _no_outside_bytes(env: Env, prompts: list[str]) -> None:
    leaked = sum("OUTSIDE-SECRET" in p for p in prompts)
    inside = sum("inside sub" in p for p in prompts)
    print(
        f"swap race: {leaked} of {len(prompts)} views held outside bytes, {inside} the inside file"
    )
    assert leaked == 0
    assert inside > 0  # the race really ran both ways


INVALID = (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD")
OUTSIDE = (grpc.StatusCode.INVALID_ARGUMENT, "PATH_OUTSIDE_ROOT")

CASES: list[Case] = [
    Case(
        "path scan on a 1 MiB word run",
        lambda e: e.compile("paths"),
        (OK, ""),
        _path_scan,
    ),
    Case(
        # The Claude vocabulary, counted in 8K-character pieces so that other requests
        # are served between them (once tiktoken's cl100k BPE: 0.6-3 s for this word).
        "first count of a 1 MiB word for a Claude model",
        lambda e: e.compile("cl100k", model="claude-sonnet-4-20250514"),
        (OK, ""),
        _word_for_cl100k,
    ),
    Case(
        # cl100k_base through bpe-openai, linear (tiktoken's BPE: 0.6-3 s for this word).
        "first count of a 1 MiB word for GPT-4",
        lambda e: e.compile("gpt4word", model="gpt-4-turbo"),
        (OK, ""),
        _word_for_gpt4,
    ),
    Case(
        "backtracking rule glob",
        lambda e: e.compile("globs"),
        (OK, ""),
        _glob_backtrack,
    ),
    Case(
        "200,000 globs over the API, refused before decoding",
        _many_globs,
        (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD"),
        lambda e: e.session("many"),
        metadata={"field": "rule.path_globs"},
    ),
    Case(
        "200,000 session labels, refused before decoding",
        _many_labels,
        (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD"),
        _labels_setup,
        after=_no_session,
        metadata={"field": "session.labels"},
    ),
    Case(
        "2,000,000 events in one CompileStream step, refused before decoding",
        _stream_flood,
        (OK, ""),
        _stream_flood_setup,
        _flood_step_refused,
    ),
    Case(
        "5,000,000 excluded sections in a CompileStream resume, refused before decoding",
        _resume_enums,
        (OK, ""),
        after=_resume_enums_refused,
    ),
    Case(
        "30,000 backtracking globs in a rule file",
        lambda e: e.compile("globfile"),
        (OK, ""),
        _glob_file,
        lambda e, resp: (
            None
            if any("glob" in n for n in resp.view.notes)
            else pytest.fail(f"no note on the cut globs: {list(resp.view.notes)}")
        ),
    ),
    Case(
        "huge repetition count, no such session",
        lambda e: _search(e, "nobody", "a{4294967294}"),
        (grpc.StatusCode.NOT_FOUND, "SESSION_NOT_FOUND"),
    ),
    Case(
        "huge repetition count",
        lambda e: _search(e, "rep", "a{4294967294}"),
        (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_PATTERN"),
        _result("rep", "hello"),
    ),
    Case(
        "catastrophic regex over a 60-line result",
        lambda e: _search(e, "evil", "(x+x+)+y"),
        (OK, ""),
        _result("evil", _EVIL_LINES),
        lambda e, resp: None if len(resp.matches) == 0 else pytest.fail("matched a line without y"),
    ),
    Case(
        "catastrophic regex over a 20 MiB result",
        lambda e: _search(e, "evil20", "(x+x+)+y"),
        (OK, ""),
        _result("evil20", ("x" * 1000 + "\n") * 20_000),
    ),
    Case(
        "usage of 2^32-1 tokens, then compiles",
        _report_huge_usage,
        (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD"),
        after=_compiles_after_more,
    ),
    Case(
        "NUL in project_root",
        _create("nul1", project_root="/tmp/a\x00b"),
        INVALID,
        after=_no_session,
    ),
    Case(
        "NUL in working_directory",
        _create("nul2", project_root="/tmp", working_directory="/tmp/a\x00"),
        INVALID,
        after=_no_session,
    ),
    Case(
        "5,000-character project_root",
        _create("longroot", project_root="/" + "a" * 5_000),
        INVALID,
        after=_no_session,
    ),
    Case("NUL in the compile's working directory", _bad_environment, INVALID, after=_compiles),
    Case(
        "tool arguments nested 5,000 deep, rendered for every provider",
        _rendered,
        (OK, ""),
        _deep_arguments,
        _all_rendered,
    ),
    Case(
        "ListEvents after_seq=2^64-1",
        _list_after_max,
        (OK, ""),
        after=lambda e, resp: None if not resp.events else pytest.fail("events after 2^64-1"),
    ),
    Case(
        "2,000,000 events in one append",
        _million_events,
        (grpc.StatusCode.INVALID_ARGUMENT, "TOO_MANY_EVENTS"),
        after=lambda e, _: (
            None
            if not e.sessions.ListEvents(spb.ListEventsRequest(session_id="flood")).events
            else pytest.fail("a refused append wrote events")
        ),
    ),
    Case(
        "2,000,000 events in one append behind an empty unknown group",
        lambda e: _million_events(e, _UNKNOWN_GROUP, "gflood"),
        (grpc.StatusCode.INVALID_ARGUMENT, "TOO_MANY_EVENTS"),
        after=lambda e, _: (
            None
            if not e.sessions.ListEvents(spb.ListEventsRequest(session_id="gflood")).events
            else pytest.fail("a refused append wrote events")
        ),
    ),
    Case("1,000,000 kinds in ListEvents", _million_kinds, INVALID),
    Case(
        "10,000,000 empty content parts in one event, refused before decoding",
        lambda e: _raw_unary(e, "/ctxcc.v1.SessionService/AppendEvents", _parts_body()),
        INVALID,
        _parts_setup,
        lambda e, _: (
            None
            if not e.sessions.ListEvents(spb.ListEventsRequest(session_id="parts")).events
            else pytest.fail("a refused append wrote events")
        ),
        metadata={"field": "events"},
    ),
    Case(
        "a session with 34 MB of history",
        lambda e: e.compile("history"),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, "QUOTA_EXCEEDED"),
        _big_history,
    ),
]


def _checkpoint_setup(env: Env) -> None:
    env.session("ckrace")
    for i in range(4):
        env.user("ckrace", f"message {i}")


def _checkpoint_race(env: Env) -> set[str]:
    """Eight CreateCheckpoint calls with one request id, at once."""
    req = cpb.CreateCheckpointRequest(
        request_id="compact-1",
        checkpoint=checkpoint_pb2.Checkpoint(
            session_id="ckrace", covers_through_seq=3, summary="the first three messages"
        ),
    )
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: env.compiles.CreateCheckpoint(req), range(8)))
    return {a.checkpoint.checkpoint_id for a in answers}


def _one_checkpoint(env: Env, ids: set[str]) -> None:
    listed = env.compiles.ListCheckpoints(cpb.ListCheckpointsRequest(session_id="ckrace"))
    assert len(ids) == 1
    assert [c.checkpoint_id for c in listed.checkpoints] == list(ids)


def _big_events(env: Env) -> None:
    env.session("pages")
    text = "lorem ipsum " * 5_500  # ~64 KB per event
    for chunk in range(4):
        events = []
        for i in range(50):
            ev = event_pb2.Event()
            ev.user_message.parts.add(text=f"{chunk}-{i} {text}")
            events.append(ev)
        env.sessions.AppendEvents(spb.AppendEventsRequest(session_id="pages", events=events))


def _pages_on_a_default_client(env: Env) -> list[int]:
    """Every page of 64 KB events, through a client with grpc's default 4 MiB limit."""
    seqs: list[int] = []
    with grpc.insecure_channel(env.daemon.target) as ch:
        stub: Any = session_service_pb2_grpc.SessionServiceStub(ch)
        token = ""
        while True:
            req = spb.ListEventsRequest(session_id="pages", page_size=1000, page_token=token)
            page = stub.ListEvents(req, timeout=30)
            seqs += [e.seq for e in page.events]
            if not (token := page.next_page_token):
                return seqs


def _segment_jpeg(e: Env) -> Any:
    """A 20 MiB "JPEG" (the upload limit) of 5 million empty comment segments: measuring
    its size used to walk every one of them, in Python on the event loop."""
    data = (b"\xff\xd8" + b"\xff\xfe\x00\x02" * ((20 << 20) // 4))[: 20 << 20]
    upload = png_upload(e.current, data, 77, mime_type="image/jpeg")
    return e.artifacts.UploadArtifact(iter(upload), timeout=60)


def _jpeg_setup(e: Env) -> None:
    e.current = "jpeg"
    e.session("jpeg")


def _declared_size_kept(e: Env, resp: Any) -> None:
    # Not readable within the walk's bounds: the declared size is kept.
    ref = resp.artifact
    assert (ref.width, ref.height, ref.size_bytes) == (77, 77, 20 << 20)


CASES += [
    Case(
        "20 MiB JPEG upload of 5 million tiny segments",
        _segment_jpeg,
        (OK, ""),
        _jpeg_setup,
        _declared_size_kept,
    ),
    Case(
        "8 concurrent CreateCheckpoint with one request_id",
        _checkpoint_race,
        (OK, ""),
        _checkpoint_setup,
        _one_checkpoint,
    ),
    Case(
        "ListEvents of 200 events of 64 KB on a default 4 MiB client",
        _pages_on_a_default_client,
        (OK, ""),
        _big_events,
        lambda e, seqs: None if seqs == list(range(1, 201)) else pytest.fail(f"pages {seqs}"),
    ),
    Case(
        "symlink swap under the working directory during 200 compiles",
        _swap_race,
        (OK, ""),
        after=_no_outside_bytes,
    ),
]


@pytest.fixture(scope="module")
def env() -> Iterator[Env]:
    base = Path("/tmp") / f"ctxcc-corpus-{os.getpid()}"
    workspace = base / "ws"
    workspace.mkdir(parents=True)
    # 32 MiB messages: room for 2,000,000 tiny events, and a history that outgrows a
    # unary Compile without tens of MB of setup.
    daemon = DaemonProcess(
        base / "data",
        "--workspace-roots",
        str(workspace),
        "--max-message-bytes",
        str(32 << 20),
    )
    daemon.start()
    daemon.wait_ready()
    try:
        options = [("grpc.max_receive_message_length", 64 << 20)]
        with grpc.insecure_channel(daemon.target, options=options) as ch:
            e = Env(ch, workspace)
            e.stubs.update(
                sessions=session_service_pb2_grpc.SessionServiceStub(ch),
                compiles=compile_service_pb2_grpc.CompileServiceStub(ch),
                tools=tool_service_pb2_grpc.ToolServiceStub(ch),
                sources=source_service_pb2_grpc.SourceServiceStub(ch),
                artifacts=artifact_service_pb2_grpc.ArtifactServiceStub(ch),
                daemon=daemon,
            )
            # The OpenAI tokenizer tables are built by the first compile that needs one,
            # holding the GIL (o200k ~65 ms on a quiet machine, several times that on a
            # loaded one): a start-up cost, not a hostile input. Built here, before the
            # probe, so that each case's window measures the case alone.
            e.session("warm")
            e.user("warm", "hello")
            for model in ("gpt-4o", "gpt-4-turbo"):
                e.compile("warm", model=model)
            probe = Probe(daemon.target)
            e.stubs["probe"] = probe
            try:
                yield e
            finally:
                probe.close()
        assert daemon.terminate() == 0
    finally:
        daemon.ensure_stopped()
        shutil.rmtree(base, ignore_errors=True)


def _quiet_p99(env: Env) -> float:
    """The probe's p99 with nothing else asked of the daemon: the machine's own noise
    (other processes on shared cores), allowed on top of the bound."""
    t0 = time.monotonic()
    time.sleep(QUIET_WINDOW_S)
    return _p99([s[1] for s in env.probe.window(t0, time.monotonic())])


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_case(env: Env, case: Case) -> None:
    if case.setup is not None:
        case.setup(env)
    noise = _quiet_p99(env)
    t0 = time.monotonic()
    result: Any = None
    try:
        result = case.request(env)
        got: tuple[grpc.StatusCode, str] = (OK, "")
    except grpc.RpcError as err:
        got = error_of(err)
        metadata = dict(error_info(err).metadata)
        assert metadata.items() >= case.metadata.items(), metadata
    took = time.monotonic() - t0
    samples = env.probe.window(t0, t0 + took)
    health = [s[1] for s in samples if s[2] == "health"]
    append = [s[1] for s in samples if s[2] == "append"]
    print(
        f"\n{case.name}: answered {got[0].name} {got[1] or '-'} in {took * 1000:.0f} ms; "
        f"probe health p99 {_p99(health) * 1000:.0f} ms (n={len(health)}), "
        f"append p99 {_p99(append) * 1000:.0f} ms (n={len(append)}); "
        f"quiet p99 {noise * 1000:.0f} ms"
    )
    assert got == case.expect
    assert all(s[3] for s in samples), "a probe call failed during the case"
    assert health and append, "the probe got no answer during the case"
    bound = P99_BOUND_S + noise
    assert _p99(health) < bound and _p99(append) < bound, f"probe p99 over {bound * 1000:.0f} ms"
    assert env.daemon.health() == health_pb2.HealthCheckResponse.SERVING
    if case.after is not None:
        case.after(env, result)
