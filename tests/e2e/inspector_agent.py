"""A small scripted agent for the inspector's browser tests: it drives a daemon over gRPC
(tools of every visibility, a session memory, an image, a tool search, a checkpoint,
usage reports) and keeps every compile response it got, so the pages can be checked
against what the gRPC API said."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc

from ctxcc.v1 import (
    artifact_service_pb2,
    artifact_service_pb2_grpc,
    checkpoint_pb2,
    common_pb2,
    compile_service_pb2,
    compile_service_pb2_grpc,
    session_pb2,
    session_service_pb2,
    session_service_pb2_grpc,
    source_pb2,
    source_service_pb2,
    source_service_pb2_grpc,
    tool_pb2,
    tool_service_pb2,
    tool_service_pb2_grpc,
    view_pb2,
)
from tests.helpers import assistant, tool_result, user

# Hostile strings: each would run script if a page put it into HTML unescaped.
XSS_USER = '<script>window.__pwned="user"</script><img src=x onerror="window.__pwned=\'img\'">'
XSS_RESULT = "</pre><svg onload=\"window.__pwned='svg'\"></svg><b>bold?</b>"
XSS_TOOL = '<iframe srcdoc="<script>parent.__pwned=1</script>"></iframe>'
XSS_MEMORY = "<style>body{display:none}</style><a href=\"javascript:window.__pwned='a'\">x</a>"
XSS_SUMMARY = "\"><script>window.__pwned='summary'</script>"
XSS_MODEL = "evil<img src=x onerror=\"window.__pwned='model'\">"


@dataclass
class Agent:
    channel: grpc.Channel
    session_id: str
    model: str
    views: list[view_pb2.CompiledView] = field(default_factory=list)
    reported: dict[str, int] = field(default_factory=dict)  # compile id -> input tokens

    def __post_init__(self) -> None:
        self.sessions: Any = session_service_pb2_grpc.SessionServiceStub(self.channel)
        self.compiles: Any = compile_service_pb2_grpc.CompileServiceStub(self.channel)
        self.tools: Any = tool_service_pb2_grpc.ToolServiceStub(self.channel)
        self.sources: Any = source_service_pb2_grpc.SourceServiceStub(self.channel)
        self.artifacts: Any = artifact_service_pb2_grpc.ArtifactServiceStub(self.channel)

    @property
    def route(self) -> common_pb2.Route:
        return common_pb2.Route(model=self.model)

    def create(self) -> None:
        self.sessions.CreateSession(
            session_service_pb2.CreateSessionRequest(
                session=session_pb2.Session(session_id=self.session_id)
            )
        )

    def append(self, *events: Any) -> int:
        done = self.sessions.AppendEvents(
            session_service_pb2.AppendEventsRequest(session_id=self.session_id, events=events)
        )
        return int(done.last_seq)

    def step(self, report: int | None = None) -> view_pb2.CompiledView:
        """Compile as an agent does, then report the provider's usage (estimate + report)."""
        view: view_pb2.CompiledView = self.compiles.Compile(
            compile_service_pb2.CompileRequest(
                session_id=self.session_id,
                route=self.route,
                image_mode=compile_service_pb2.IMAGE_MODE_REFERENCE,
            )
        ).view
        self.views.append(view)
        if report is not None:
            tokens = view.budget.estimated_input_tokens + report
            self.compiles.ReportUsage(
                compile_service_pb2.ReportUsageRequest(
                    compile_id=view.compile_id, input_tokens=tokens, output_tokens=120
                )
            )
            self.reported[view.compile_id] = tokens
        return view

    def dry_run(
        self, seq: int, model: str = "", fmt: view_pb2.RenderFormat.ValueType | None = None
    ) -> compile_service_pb2.CompileResponse:
        resp: compile_service_pb2.CompileResponse = self.compiles.Compile(
            compile_service_pb2.CompileRequest(
                session_id=self.session_id,
                route=common_pb2.Route(model=model) if model else self.route,
                as_of_seq=seq,
                dry_run=True,
                image_mode=compile_service_pb2.IMAGE_MODE_REFERENCE,
                render_formats=[fmt] if fmt is not None else [],
            )
        )
        return resp

    def upload_png(self) -> Any:
        data = b"\x89PNG\r\n\x1a\n" + bytes(3000)

        def chunks() -> Iterator[artifact_service_pb2.UploadArtifactRequest]:
            yield artifact_service_pb2.UploadArtifactRequest(
                header=artifact_service_pb2.ArtifactHeader(
                    session_id=self.session_id,
                    mime_type="image/png",
                    size_bytes=len(data),
                    sha256=hashlib.sha256(data).hexdigest(),
                    width=32,
                    height=32,
                )
            )
            yield artifact_service_pb2.UploadArtifactRequest(data=data)

        return self.artifacts.UploadArtifact(chunks()).artifact


def drive_demo(channel: grpc.Channel, session_id: str, model: str = "claude-sonnet-4") -> Agent:
    """Four steps over two turns with every kind of thing the step page shows."""
    a = Agent(channel, session_id, model)
    a.create()
    a.sources.PutMemory(
        source_service_pb2.PutMemoryRequest(
            memory=source_pb2.MemoryEntry(
                memory_id="m1",
                scope=common_pb2.SCOPE_SESSION,
                scope_id=session_id,
                text="The user prefers short answers. " + XSS_MEMORY,
            )
        )
    )
    schema = '{"type": "object", "properties": {"path": {"type": "string"}}}'
    a.tools.RegisterTools(
        tool_service_pb2.RegisterToolsRequest(
            session_id=session_id,
            tools=[
                tool_pb2.ToolDefinition(
                    name="read_file",
                    description="Read a file " + XSS_TOOL,
                    input_schema_json=schema,
                ),
                tool_pb2.ToolDefinition(
                    name="deploy",
                    description="Deploy the service",
                    input_schema_json=schema,
                    visibility=tool_pb2.TOOL_VISIBILITY_DEFERRED,
                    search_keywords=["release"],
                ),
                tool_pb2.ToolDefinition(
                    name="rm_rf",
                    description="Never offered",
                    input_schema_json=schema,
                    visibility=tool_pb2.TOOL_VISIBILITY_HIDDEN,
                ),
            ],
        )
    )
    a.append(user("Look at src/app.py and tell me what it does. " + XSS_USER))
    a.step(report=900)
    a.append(
        assistant("Reading it.", ("c1", "read_file", '{"path": "src/app.py"}')),
        tool_result("c1", "def main():\n    print('hello')\n" + XSS_RESULT, name="read_file"),
    )
    a.step(report=950)
    ref = a.upload_png()
    image = user("Now deploy it; here is the screenshot of the error.")
    image.user_message.parts.add(attachment=ref)
    a.append(
        assistant("It prints hello."),
        image,
        assistant("", ("s1", "tool_search", '{"query": "deploy release"}')),
        tool_result("s1", "deploy: Deploy the service", name="tool_search"),
    )
    a.step(report=1000)
    a.compiles.CreateCheckpoint(
        compile_service_pb2.CreateCheckpointRequest(
            checkpoint=checkpoint_pb2.Checkpoint(
                session_id=session_id,
                covers_through_seq=3,
                summary="The user asked what src/app.py does: it prints hello. " + XSS_SUMMARY,
                kind=checkpoint_pb2.CHECKPOINT_KIND_MODEL_SUMMARY,
                portable=True,
            )
        )
    )
    a.append(
        assistant("", ("d1", "deploy", '{"path": "."}')),
        tool_result("d1", "deployed", name="deploy"),
    )
    a.step()
    return a
