"""Tokenizer tables in a real daemon, seen through a real /metrics scrape: by default
only the Claude table is built before SERVING and the OpenAI tables wait for their
family's first compile; with `--preload-tokenizers none` no table is built until the
first compile of its family, and only that family's; `--preload-tokenizers all` has every
table built when health first answers SERVING; all compile the same views to the token."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ctxcc.v1 import (
    common_pb2,
    compile_service_pb2,
    compile_service_pb2_grpc,
    session_pb2,
    session_service_pb2,
    session_service_pb2_grpc,
    view_pb2,
)
from tests.e2e.proc import DaemonProcess
from tests.helpers import assistant, tool_result, user

ALL = ("claude", "cl100k", "o200k")
# Prose, code, digits, Cyrillic and CJK, long enough to be counted in pieces.
TEXT = (
    "Read the failing test and fix the parser: `def parse(s): return s.split(',')`. "
    "Контекст — это все входные данные. 上下文是模型请求收到的一切。 12345 67890\n"
) * 300


def _loaded(daemon: DaemonProcess) -> set[str]:
    url = f"http://{daemon.endpoints['metrics']}/metrics"
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    values = {
        sample.labels["tokenizer"]: sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "ctxcc_tokenizer_loaded"
        for sample in family.samples
    }
    assert set(values) == set(ALL), values  # every tokenizer is a series, 0 or 1
    assert set(values.values()) <= {0.0, 1.0}
    return {name for name, value in values.items() if value == 1.0}


class Api:
    def __init__(self, daemon: DaemonProcess) -> None:
        self.channel = grpc.insecure_channel(daemon.target)
        self.sessions: Any = session_service_pb2_grpc.SessionServiceStub(self.channel)
        self.compiles: Any = compile_service_pb2_grpc.CompileServiceStub(self.channel)

    def conversation(self, sid: str) -> None:
        self.sessions.CreateSession(
            session_service_pb2.CreateSessionRequest(session=session_pb2.Session(session_id=sid))
        )
        events = [
            user(TEXT),
            assistant("Looking.", ("c1", "shell", '{"cmd": "pytest -x tests/parser"}')),
            tool_result("c1", TEXT * 2),
            assistant("Fixed: the parser now splits on commas outside quotes."),
            user("Now the same for the tokenizer module, please."),
        ]
        self.sessions.AppendEvents(
            session_service_pb2.AppendEventsRequest(session_id=sid, events=events)
        )

    def compile(self, sid: str, model: str) -> view_pb2.CompiledView:
        req = compile_service_pb2.CompileRequest(
            session_id=sid,
            route=common_pb2.Route(connection="agent", protocol="p", endpoint="e", model=model),
            # The clock's section aside, the same inputs give the same view on both daemons.
            exclude_sections=[view_pb2.SECTION_KIND_ENVIRONMENT],
        )
        view: view_pb2.CompiledView = self.compiles.Compile(req, timeout=60).view
        return view


@pytest.fixture
def daemons(short_tmp: Path) -> Iterator[tuple[DaemonProcess, DaemonProcess]]:
    lazy = DaemonProcess(short_tmp / "lazy", "--preload-tokenizers", "none")
    eager = DaemonProcess(short_tmp / "eager", "--preload-tokenizers", "all")
    try:
        for d in (lazy, eager):
            d.start()
        for d in (lazy, eager):
            d.wait_ready()
        yield lazy, eager
        assert lazy.terminate() == 0 and eager.terminate() == 0
    finally:
        lazy.ensure_stopped()
        eager.ensure_stopped()


def _estimate(view: view_pb2.CompiledView) -> tuple[int, list[tuple[int, int]]]:
    return view.budget.estimated_input_tokens, [(x.layer, x.tokens) for x in view.layers]


def test_tables_are_built_by_their_familys_first_compile_or_preloaded(
    daemons: tuple[DaemonProcess, DaemonProcess],
) -> None:
    lazy, eager = daemons
    # Readiness is honest: a daemon told to preload says SERVING with every table built.
    assert _loaded(eager) == set(ALL)
    assert _loaded(lazy) == set()
    apis = Api(lazy), Api(eager)
    for api in apis:
        api.conversation("s")
    assert _loaded(lazy) == set()  # appends count nothing
    apis[0].compile("s", "mistral-small")  # character classes: no table
    assert _loaded(lazy) == set()
    built: set[str] = set()
    estimates = set()
    for model, family in (
        ("claude-sonnet-4-20250514", "claude"),
        ("gpt-4o", "o200k"),
        ("llama-4-maverick", "cl100k"),
        ("gpt-4-turbo", "cl100k"),
    ):
        lazy_view, eager_view = (api.compile("s", model) for api in apis)
        built.add(family)
        assert _loaded(lazy) == built, model
        assert _estimate(lazy_view) == _estimate(eager_view), model
        estimates.add(lazy_view.budget.estimated_input_tokens)
    assert len(estimates) == 4  # the families really count differently
    assert _loaded(eager) == set(ALL)


def test_a_default_daemon_builds_claude_before_serving_and_openai_tables_on_first_use(
    short_tmp: Path,
) -> None:
    d = DaemonProcess(short_tmp / "default")
    try:
        d.start()
        d.wait_ready()
        assert _loaded(d) == {"claude"}
        api = Api(d)
        api.conversation("s")
        api.compile("s", "claude-sonnet-4-20250514")
        assert _loaded(d) == {"claude"}
        api.compile("s", "gpt-4o")
        assert _loaded(d) == {"claude", "o200k"}
        assert d.terminate() == 0
    finally:
        d.ensure_stopped()
