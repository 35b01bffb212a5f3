# mypy: disable-error-code="arg-type, assignment"
# (this file sends out-of-range enum numbers on purpose)
"""Hostile and malformed input (reliability): every answer is OK or a documented code
with an ErrorInfo reason, the daemon stays SERVING, and refused writes leave nothing
behind. Also: bearer-token authentication over TCP and the socket's group."""

from __future__ import annotations

import grp
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxcc.v1 import (
    checkpoint_pb2,
    common_pb2,
    compile_service_pb2_grpc,
    event_pb2,
    session_pb2,
    session_service_pb2_grpc,
    source_pb2,
    source_service_pb2_grpc,
    tool_pb2,
    tool_service_pb2_grpc,
)
from ctxcc.v1 import (
    compile_service_pb2 as cpb,
)
from ctxcc.v1 import (
    session_service_pb2 as spb,
)
from ctxcc.v1 import (
    source_service_pb2 as rpb,
)
from ctxcc.v1 import (
    tool_service_pb2 as tpb,
)
from tests.e2e import raw_h2
from tests.e2e.proc import REPO, DaemonProcess

DOCUMENTED = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.UNAUTHENTICATED,
}


@pytest.fixture(scope="module")
def daemon() -> Iterator[DaemonProcess]:
    d = DaemonProcess(
        Path("/tmp") / f"ctxcc-hostile-{os.getpid()}", "--max-session-bytes", "200000"
    )
    d.start()
    d.wait_ready()
    yield d
    assert d.terminate() == 0
    shutil.rmtree(d.data_dir, ignore_errors=True)
    d.log_path.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def stubs(daemon: DaemonProcess) -> Iterator[dict[str, Any]]:
    with grpc.insecure_channel(daemon.target) as ch:
        s: Any = session_service_pb2_grpc.SessionServiceStub(ch)
        s.CreateSession(spb.CreateSessionRequest(session=session_pb2.Session(session_id="h")))
        yield {
            "channel": ch,
            "sessions": s,
            "compiles": compile_service_pb2_grpc.CompileServiceStub(ch),
            "tools": tool_service_pb2_grpc.ToolServiceStub(ch),
            "sources": source_service_pb2_grpc.SourceServiceStub(ch),
        }


def outcome(call: Any, request: Any) -> tuple[grpc.StatusCode, str]:
    try:
        call(request, timeout=30)
        return grpc.StatusCode.OK, ""
    except grpc.RpcError as err:
        e: Any = err
        reason = ""
        for key, value in e.trailing_metadata() or ():
            if key == "grpc-status-details-bin":
                for detail in status_pb2.Status.FromString(value).details:
                    info = error_details_pb2.ErrorInfo()
                    if detail.Unpack(info):
                        reason = info.reason
        assert e.code() in DOCUMENTED, (e.code(), e.details())
        assert reason, f"{e.code()} without an ErrorInfo reason: {e.details()}"
        assert "Traceback" not in (e.details() or "") and 'File "' not in (e.details() or "")
        return e.code(), reason


def test_undecodable_requests_answer_invalid_argument(stubs: dict[str, Any]) -> None:
    ch = stubs["channel"]
    bad = {
        "/ctxcc.v1.SessionService/GetSession": b"\x0a\x03\xff\xfe\xfd",  # invalid UTF-8
        "/ctxcc.v1.SessionService/AppendEvents": b"\x12\x05\x0a\x03\xff\xff",  # truncated
        "/ctxcc.v1.CompileService/Compile": b"\xff\xff\xff\xff",
        "/ctxcc.v1.ToolService/SearchTools": b"\x0a\x01h\x12\x02\xc3\x28",
    }
    for method, payload in bad.items():
        code, reason = outcome(ch.unary_unary(method), payload)
        assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD"), method
    stream = ch.stream_stream("/ctxcc.v1.CompileService/CompileStream")
    with pytest.raises(grpc.RpcError) as exc:
        list(stream(iter([b"\xff\xff\xff"]), timeout=10))
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT


text = st.one_of(
    st.text(max_size=50),
    st.just(""),
    st.just("../../etc/passwd"),
    st.just("x" * 300_000),
    st.text(alphabet="\x00\x1b\u202e", max_size=5),
)
ints = st.integers(min_value=0, max_value=2**32 - 1)
enum_ints = st.integers(min_value=0, max_value=1000)


def _deep_json(depth: int) -> str:
    return '{"a": ' * depth + "1" + "}" * depth


@st.composite
def events(draw: st.DrawFn) -> event_pb2.Event:
    ev = event_pb2.Event(event_id=draw(st.one_of(st.just(""), text)))
    kind = draw(st.sampled_from(["user", "assistant", "result", "imported", "empty", "attach"]))
    if kind == "user":
        ev.user_message.parts.add(text=draw(text))
    elif kind == "assistant":
        ev.assistant_message.tool_calls.add(
            call_id=draw(text), name=draw(text), arguments_json=draw(text)
        )
    elif kind == "result":
        ev.tool_result.call_id, ev.tool_result.text = draw(text), draw(text)
    elif kind == "imported":
        ev.imported_message.origin_session_id = draw(text)
        ev.imported_message.role = draw(enum_ints)
        ev.imported_message.parts.add(text=draw(text))
    elif kind == "attach":
        ev.attachment.artifact_id = draw(text)
    return ev


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, Any]:
    sid = draw(st.one_of(st.just("h"), text))
    which = draw(
        st.sampled_from(
            ["append", "compile", "tools", "rule", "checkpoint", "read", "session", "list"]
        )
    )
    if which == "append":
        return "sessions.AppendEvents", spb.AppendEventsRequest(
            session_id=sid,
            events=draw(st.lists(events(), max_size=4)),
            request_id=draw(text),
            expected_last_seq=draw(st.one_of(st.just(0), ints)),
        )
    if which == "compile":
        return "compiles.Compile", cpb.CompileRequest(
            session_id=sid,
            route=common_pb2.Route(model=draw(text)),
            as_of_seq=draw(ints),
            approval_mode=draw(enum_ints),
            exclude_sections=draw(st.lists(enum_ints, max_size=3)),
            render_formats=draw(st.lists(enum_ints, max_size=3)),
            limits=cpb.ModelLimits(context_window=draw(ints), max_input_tokens=draw(ints)),
        )
    if which == "tools":
        schema = draw(st.one_of(text, st.just(_deep_json(2000)), st.just('{"type": "object"}')))
        return "tools.RegisterTools", tpb.RegisterToolsRequest(
            session_id=sid,
            tools=[
                tool_pb2.ToolDefinition(
                    name=draw(text), input_schema_json=schema, visibility=draw(enum_ints)
                )
            ],
        )
    if which == "rule":
        return "sources.PutRule", rpb.PutRuleRequest(
            rule=source_pb2.Rule(
                rule_id=draw(text),
                scope=draw(enum_ints),
                scope_id=draw(text),
                name=draw(text),
                text=draw(text),
                activation=draw(enum_ints),
                path_globs=draw(st.lists(text, max_size=2)),
            )
        )
    if which == "checkpoint":
        return "compiles.CreateCheckpoint", cpb.CreateCheckpointRequest(
            checkpoint=checkpoint_pb2.Checkpoint(
                session_id=sid,
                covers_through_seq=draw(ints),
                summary=draw(text),
                kind=draw(enum_ints),
                covered_digest=draw(text),
            )
        )
    if which == "read":
        return "tools.ReadToolResult", tpb.ReadToolResultRequest(
            session_id=sid,
            call_id=draw(text),
            search=tpb.ResultSearch(
                pattern=draw(st.one_of(text, st.just("(a+)+$"))), regex=draw(st.booleans())
            ),
        )
    if which == "session":
        return "sessions.CreateSession", spb.CreateSessionRequest(
            session=session_pb2.Session(
                session_id=draw(text), project_root=draw(text), working_directory=draw(text)
            )
        )
    return "sessions.ListEvents", spb.ListEventsRequest(
        session_id=sid,
        page_size=draw(ints),
        page_token=draw(text),
        kinds=draw(st.lists(enum_ints, max_size=3)),
    )


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(requests())
def test_every_answer_is_ok_or_documented(stubs: dict[str, Any], case: tuple[str, Any]) -> None:
    name, request = case
    service, method = name.split(".")
    before = stubs["sessions"].GetSession(spb.GetSessionRequest(session_id="h")).session.head_seq
    code, _ = outcome(getattr(stubs[service], method), request)
    after = stubs["sessions"].GetSession(spb.GetSessionRequest(session_id="h")).session.head_seq
    if code != grpc.StatusCode.OK and name == "sessions.AppendEvents":
        assert after == before, "a refused append wrote something"


def test_header_values_that_are_not_utf8_leave_nothing_in_the_log(daemon: DaemonProcess) -> None:
    """grpc logged each header value that is not UTF-8 as an ERROR with a traceback
    holding the value: one call of 1,500 one-byte headers wrote 470 KB of a client's
    header contents into the log. The call itself is served."""
    before = len(daemon.log())
    trailers = raw_h2.call(
        str(daemon.endpoints["tcp"]),
        "/ctxcc.v1.SessionService/ListSessions",
        b"",
        [(b"x-secret-%d" % i, b"t\xf6k\xe9n-\xff") for i in range(200)],
    )
    assert trailers.get(b"grpc-status") == b"0", trailers
    # The call's own log lines, if any, are written before its answer is sent.
    after = daemon.log()[before:]
    assert "Invalid encoding" not in after and "Traceback" not in after, after[:2000]
    assert "xf6k" not in after, after[:2000]


def test_still_serving_after_the_storm(daemon: DaemonProcess) -> None:
    assert daemon.health() == health_pb2.HealthCheckResponse.SERVING
    assert (
        "Traceback" not in daemon.log().split("serving {")[-1] or "internal error" in daemon.log()
    )


def test_bearer_token_over_tcp_and_the_socket_group(short_tmp: Path) -> None:
    token = short_tmp / "token"
    token.write_text("s3cret-token-for-tests-0123456789\n")
    group = grp.getgrgid(os.getgid()).gr_name
    d = DaemonProcess(short_tmp / "data", "--auth-token-file", str(token), "--socket-group", group)
    d.start()
    try:
        d.wait_ready()
        req = spb.GetSessionRequest(session_id="nobody")
        with grpc.insecure_channel(str(d.endpoints["tcp"])) as ch:
            stub: Any = session_service_pb2_grpc.SessionServiceStub(ch)
            assert outcome(stub.GetSession, req) == (
                grpc.StatusCode.UNAUTHENTICATED,
                "UNAUTHENTICATED",
            )
            with pytest.raises(grpc.RpcError) as exc:
                stub.GetSession(req, metadata=[("authorization", "Bearer wrong")], timeout=5)
            assert exc.value.code() == grpc.StatusCode.UNAUTHENTICATED
            # A token with non-ASCII bytes (no grpc library sends one; any HTTP/2 peer
            # can): it was UNKNOWN with a TypeError's text and a traceback in the log.
            for sent in (b"Bearer s3cr\xc3\xa9t", b"Bearer \xff\xfe"):
                trailers = raw_h2.call(
                    str(d.endpoints["tcp"]),
                    "/ctxcc.v1.SessionService/GetSession",
                    req.SerializeToString(),
                    [(b"authorization", sent)],
                )
                assert trailers.get(b"grpc-status") == b"16", trailers  # UNAUTHENTICATED
                assert b"grpc-status-details-bin" in trailers, trailers
            with pytest.raises(grpc.RpcError) as exc:
                stub.GetSession(
                    req,
                    metadata=[("authorization", "Bearer s3cret-token-for-tests-0123456789")],
                    timeout=5,
                )
            assert exc.value.code() == grpc.StatusCode.NOT_FOUND
            health: Any = health_pb2_grpc.HealthStub(ch)
            assert health.Check(health_pb2.HealthCheckRequest(), timeout=5).status == 1
        with grpc.insecure_channel(d.target) as ch:  # the socket is trusted
            stub = session_service_pb2_grpc.SessionServiceStub(ch)
            assert outcome(stub.GetSession, req)[0] == grpc.StatusCode.NOT_FOUND
        sock = Path(str(d.endpoints["unix"])).stat()
        assert stat.S_IMODE(sock.st_mode) == 0o660 and sock.st_gid == os.getgid()
        assert "s3cret" not in d.log(), "the token must never be logged"
        assert "Traceback" not in d.log(), d.log()
    finally:
        d.ensure_stopped()
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "server",
            "serve",
            "--data-dir",
            str(short_tmp / "x"),
            "--listen",
            "0.0.0.0:0",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 2 and "without authentication" in bad.stderr


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _certs(d: Path) -> None:
    """A CA, a server certificate for 127.0.0.1, a client certificate from the CA and a
    self-signed impostor."""
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=ctxcc test CA",
        cwd=d,
    )
    for name, san in (("server", "subjectAltName=IP:127.0.0.1,DNS:localhost"), ("client", "")):
        _openssl(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.csr",
            "-subj",
            f"/CN={name}",
            cwd=d,
        )
        ext = d / f"{name}.ext"
        ext.write_text(san + "\n" if san else "basicConstraints=CA:FALSE\n")
        _openssl(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            f"{name}.pem",
            "-days",
            "2",
            "-extfile",
            ext.name,
            cwd=d,
        )
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "rogue.key",
        "-out",
        "rogue.pem",
        "-days",
        "2",
        "-subj",
        "/CN=rogue",
        cwd=d,
    )


def test_mutual_tls_on_tcp(short_tmp: Path) -> None:
    _certs(short_tmp)
    d = DaemonProcess(
        short_tmp / "data",
        "--tls-cert-file",
        str(short_tmp / "server.pem"),
        "--tls-key-file",
        str(short_tmp / "server.key"),
        "--tls-client-ca-file",
        str(short_tmp / "ca.pem"),
    )
    d.start()
    try:
        d.wait_ready()
        ca = (short_tmp / "ca.pem").read_bytes()

        def call(key: str | None) -> grpc.StatusCode:
            creds = grpc.ssl_channel_credentials(
                root_certificates=ca,
                private_key=(short_tmp / f"{key}.key").read_bytes() if key else None,
                certificate_chain=(short_tmp / f"{key}.pem").read_bytes() if key else None,
            )
            with grpc.secure_channel(str(d.endpoints["tcp"]), creds) as ch:
                stub: Any = session_service_pb2_grpc.SessionServiceStub(ch)
                try:
                    stub.GetSession(spb.GetSessionRequest(session_id="nobody"), timeout=5)
                    return grpc.StatusCode.OK
                except grpc.RpcError as err:
                    e: Any = err
                    return e.code()  # type: ignore[no-any-return]

        assert call("client") == grpc.StatusCode.NOT_FOUND  # authenticated: reached the service
        assert call(None) == grpc.StatusCode.UNAVAILABLE  # no client certificate
        assert call("rogue") == grpc.StatusCode.UNAVAILABLE  # not signed by the CA
        with grpc.insecure_channel(str(d.endpoints["tcp"])) as ch:
            stub: Any = session_service_pb2_grpc.SessionServiceStub(ch)
            with pytest.raises(grpc.RpcError):
                stub.GetSession(spb.GetSessionRequest(session_id="nobody"), timeout=5)
    finally:
        d.ensure_stopped()
