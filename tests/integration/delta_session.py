"""A scripted agent session for delta views on CompileStream, and a reference reader of
ViewDelta written from the proto's comment with protobuf objects (independent of the
daemon's byte splicing and of the Python client's).

The script covers what changes a view: tool calls and results, user messages, a
checkpoint (the messages shrink), a route switch, tool registration and activation, memory
and rule changes (sections change), an inline image and a browser element with several
attributes. Each step goes through a `Stepper` (a raw stream, the Python client...) and
every view it hands out is compared, byte for byte, with the same compile rebuilt whole
by a unary `Compile(rebuild_compile_id=...)`."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from ctxcc.v1 import (
    checkpoint_pb2,
    common_pb2,
    event_pb2,
    session_pb2,
    source_pb2,
    tool_pb2,
    view_pb2,
)
from ctxcc.v1 import compile_service_pb2 as cpb
from ctxcc.v1 import session_service_pb2 as spb
from ctxcc.v1 import source_service_pb2 as rpb
from ctxcc.v1 import tool_service_pb2 as tpb
from tests.conftest import Stubs
from tests.helpers import ROUTE, assistant, png_upload, tool_result, user

OTHER_ROUTE = common_pb2.Route(
    connection="default", protocol="openai-chat", endpoint="api", model="gpt-4o"
)

Stepper = Callable[[cpb.CompileRequest, list[event_pb2.Event]], Awaitable[view_pb2.CompiledView]]


def encoded(view: view_pb2.CompiledView | view_pb2.ViewMessage) -> bytes:
    return view.SerializeToString(deterministic=True)


def apply_delta(base: view_pb2.CompiledView, delta: cpb.ViewDelta) -> view_pb2.CompiledView:
    """The new view as the proto's comment on ViewDelta says to rebuild it."""
    assert delta.base_compile_id == base.compile_id
    view = view_pb2.CompiledView()
    view.CopyFrom(delta.head)
    view.messages.extend(base.messages[: delta.kept_messages])
    view.messages.extend(delta.appended_messages)
    for slot in delta.sections:
        if slot.WhichOneof("slot") == "base_index":
            view.system_sections.append(base.system_sections[slot.base_index])
        else:
            view.system_sections.append(slot.section)
    view.system_prompt = "\n\n".join(s.text for s in view.system_sections)
    view.tools.extend(delta.tools if delta.tools_changed else base.tools)
    if delta.compaction_kept:
        assert base.HasField("compaction") and not delta.head.HasField("compaction")
        view.compaction.CopyFrom(base.compaction)
    return view


def chained_digest(view: view_pb2.CompiledView) -> str:
    """ViewDelta.chain_sha256 of a whole view, computed in one go from the proto's comment
    (the daemon continues it from the base's chain values instead)."""
    rest = view_pb2.CompiledView()
    rest.CopyFrom(view)
    rest.ClearField("messages")
    chain = bytes(32)
    for m in view.messages:
        chain = hashlib.sha256(chain + hashlib.sha256(encoded(m)).digest()).digest()
    return hashlib.sha256(hashlib.sha256(encoded(rest)).digest() + chain).hexdigest()


def apart_digest(view: view_pb2.CompiledView) -> str:
    """ViewDelta.chain_sha256 with the compaction apart
    (DELTA_DIGEST_MESSAGE_CHAIN_COMPACTION_APART), computed in one go from the proto's
    comment: sha256(R' || C || Q)."""
    rest = view_pb2.CompiledView()
    rest.CopyFrom(view)
    rest.ClearField("messages")
    rest.ClearField("compaction")
    chain = bytes(32)
    for m in view.messages:
        chain = hashlib.sha256(chain + hashlib.sha256(encoded(m)).digest()).digest()
    request = view.compaction.SerializeToString(deterministic=True)
    q = hashlib.sha256(request).digest() if view.HasField("compaction") else bytes(32)
    return hashlib.sha256(hashlib.sha256(encoded(rest)).digest() + chain + q).hexdigest()


def common_prefix(a: view_pb2.CompiledView, b: view_pb2.CompiledView) -> int:
    """How many messages at the start of two views are equal (the smallest delta's
    kept_messages)."""
    n = 0
    for x, y in zip(a.messages, b.messages, strict=False):
        if x.SerializeToString(deterministic=True) != y.SerializeToString(deterministic=True):
            break
        n += 1
    return n


class RawStream:
    """A CompileStream driven with the generated stub: names its last view as the delta
    base (when `deltas`, asking to keep its compaction when `keep_compaction`), applies
    deltas with `apply_delta`, checks their digest (the one
    `digest` asks for: view_sha256 and no chain_sha256 when unspecified, chain_sha256 and
    no view_sha256 for the chained one), and records every answer."""

    def __init__(
        self,
        api: Stubs,
        deltas: bool = True,
        digest: int = cpb.DELTA_DIGEST_UNSPECIFIED,
        keep_compaction: bool = False,
    ) -> None:
        self.digest = digest
        self.keep_compaction = keep_compaction
        self._queue: asyncio.Queue[cpb.CompileStreamRequest | None] = asyncio.Queue()
        self._call: Any = api.compiles.CompileStream(self._requests())
        self._it = self._call.__aiter__()
        self.deltas = deltas
        self.view: view_pb2.CompiledView | None = None
        self.answers: list[cpb.CompileStreamResponse] = []
        # (base view, delta) of every delta answer
        self.applied: list[tuple[view_pb2.CompiledView, cpb.ViewDelta]] = []
        self._count = 0

    async def _requests(self) -> AsyncIterator[cpb.CompileStreamRequest]:
        while (item := await self._queue.get()) is not None:
            yield item

    async def send(self, msg: cpb.CompileStreamRequest) -> cpb.CompileStreamResponse:
        """One answer; a chunked view is returned as one response holding the view."""
        await self._queue.put(msg)
        chunks: list[cpb.ViewChunk] = []
        while True:
            resp: cpb.CompileStreamResponse = await self._it.__anext__()
            self.answers.append(resp)
            if resp.WhichOneof("response") != "chunk":
                return resp
            chunks.append(resp.chunk)
            if len(chunks) == resp.chunk.count:
                data = b"".join(c.data for c in chunks)
                assert hashlib.sha256(data).hexdigest() == resp.chunk.sha256
                return cpb.CompileStreamResponse(
                    step_id=resp.step_id, view=view_pb2.CompiledView.FromString(data)
                )

    async def step(
        self, req: cpb.CompileRequest, events: list[event_pb2.Event], base: str | None = None
    ) -> view_pb2.CompiledView:
        self._count += 1
        if base is None:
            base = self.view.compile_id if self.deltas and self.view is not None else ""
        msg = cpb.CompileStreamRequest(
            step=cpb.StepRequest(
                step_id=str(self._count),
                events=events,
                request_id=f"r{self._count}-{id(self)}",
                compile=req,
                delta_base_compile_id=base,
                delta_digest=self.digest,  # type: ignore[arg-type]
                keep_compaction=self.keep_compaction,
            )
        )
        resp = await self.send(msg)
        kind = resp.WhichOneof("response")
        assert kind in ("view", "delta"), resp
        if kind == "view":
            self.view = resp.view
        else:
            assert self.view is not None
            view = apply_delta(self.view, resp.delta)
            if self.digest == cpb.DELTA_DIGEST_MESSAGE_CHAIN:
                assert not resp.delta.view_sha256, "not computed when the chain is asked for"
                assert resp.delta.chain_sha256 == chained_digest(view)
            elif self.digest == cpb.DELTA_DIGEST_MESSAGE_CHAIN_COMPACTION_APART:
                assert not resp.delta.view_sha256, "not computed when the chain is asked for"
                assert resp.delta.chain_sha256 == apart_digest(view)
            else:
                assert not resp.delta.chain_sha256
                assert hashlib.sha256(encoded(view)).hexdigest() == resp.delta.view_sha256
            self.applied.append((self.view, resp.delta))
            self.view = view
        return self.view

    async def close(self) -> None:
        await self._queue.put(None)
        self._call.cancel()


@dataclass
class Outcome:
    views: list[view_pb2.CompiledView] = field(default_factory=list)
    rebuilt: list[view_pb2.CompiledView] = field(default_factory=list)


async def _upload_image(api: Stubs, sid: str, size: int = 3_072) -> common_pb2.ArtifactRef:
    """A 32x32 PNG of about `size` bytes uploaded to session `sid`."""
    data = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * (size // 256)
    return (await api.artifacts.UploadArtifact(iter(png_upload(sid, data)))).artifact


def _result_text(i: int) -> str:
    return f"result {i}: " + "".join(f"line {k}: value = compute({k}, {i})\n" for k in range(20))


async def scripted_session(api: Stubs, sid: str, step: Stepper) -> Outcome:
    """Runs the script through `step`; every view is checked against its rebuild."""
    await api.sessions.CreateSession(
        spb.CreateSessionRequest(session=session_pb2.Session(session_id=sid, project_id="dp"))
    )
    schema = '{"type": "object", "properties": {"path": {"type": "string"}}}'
    await api.tools.RegisterTools(
        tpb.RegisterToolsRequest(
            session_id=sid,
            tools=[
                tool_pb2.ToolDefinition(name="read", description="Read", input_schema_json=schema),
                tool_pb2.ToolDefinition(
                    name="deploy",
                    description="Deploy the service",
                    input_schema_json=schema,
                    visibility=tool_pb2.TOOL_VISIBILITY_DEFERRED,
                    search_keywords=["release"],
                ),
            ],
        )
    )
    out = Outcome()
    route = ROUTE
    seq = [0]

    async def run(*events: event_pb2.Event) -> None:
        view = await step(cpb.CompileRequest(session_id=sid, route=route), list(events))
        seq[0] += len(events)
        assert view.event_boundary == seq[0]
        again = await api.compiles.Compile(cpb.CompileRequest(rebuild_compile_id=view.compile_id))
        assert encoded(view) == encoded(again.view), f"step {len(out.views) + 1} differs"
        out.views.append(view)
        out.rebuilt.append(again.view)

    await run(user("Please fix the failing test in tests/test_a.py"))
    for i in range(4):
        await run(
            assistant(f"Reading file {i}", (f"c{i}", "read", '{"path": "a.py"}')),
            tool_result(f"c{i}", _result_text(i), name="read"),
        )
    await run(assistant("", ("open", "read", "{}")))  # left open: a synthetic result
    await run(tool_result("open", _result_text(99), name="read"))
    await api.sources.PutMemory(
        rpb.PutMemoryRequest(
            memory=source_pb2.MemoryEntry(
                memory_id="style", scope=common_pb2.SCOPE_PROJECT, scope_id="dp", text="Tabs."
            )
        )
    )
    await run(user("Now release it"))
    await run(
        assistant("", ("s1", "tool_search", '{"query": "release deploy"}')),
        tool_result("s1", "deploy: Deploy the service", name="tool_search"),
    )
    await run(assistant("Deploying", ("d1", "deploy", '{"path": "."}')))
    await run(tool_result("d1", _result_text(7), name="deploy"))
    await api.sources.PutRule(
        rpb.PutRuleRequest(
            rule=source_pb2.Rule(
                rule_id="sql",
                scope=common_pb2.SCOPE_PROJECT,
                scope_id="dp",
                name="sql",
                description="How to write SQL",
                text="Always use bound parameters.",
                activation=source_pb2.RULE_ACTIVATION_ALWAYS,
            )
        )
    )
    await api.sources.PutMemory(
        rpb.PutMemoryRequest(
            memory=source_pb2.MemoryEntry(
                memory_id="style", scope=common_pb2.SCOPE_PROJECT, scope_id="dp", text="Spaces."
            )
        )
    )
    element = event_pb2.Event()
    element.user_message.parts.add(text="Why is this button disabled?")
    picked = element.user_message.parts.add().browser_element
    picked.url, picked.selector, picked.tag, picked.text = "https://x.test/", "#go", "button", "Go"
    picked.attributes.update(
        {"id": "go", "class": "btn primary", "disabled": "", "data-step": "3", "aria-label": "Go"}
    )
    await run(element)
    image = user("And what is in this screenshot?")
    image.user_message.parts.add(attachment=await _upload_image(api, sid))
    await run(image)
    await run(assistant("A login form.", ("c9", "read", '{"path": "b.py"}')))
    await run(tool_result("c9", _result_text(9), name="read"))
    route = OTHER_ROUTE  # a route switch: another estimate, tokenizer and budget
    await run(user("Continue on the other model"))
    await run(assistant("Sure", ("c10", "read", '{"path": "c.py"}')))
    # A checkpoint over most of the log: the next view's messages shrink.
    await api.compiles.CreateCheckpoint(
        cpb.CreateCheckpointRequest(
            checkpoint=checkpoint_pb2.Checkpoint(
                session_id=sid,
                covers_through_seq=seq[0] - 2,
                summary="Fixed the test, released, looked at a screenshot.",
                portable=True,
            ),
            covered_digest_mode=cpb.COVERED_DIGEST_MODE_COMPUTE,
        )
    )
    await run(tool_result("c10", _result_text(10), name="read"))
    await run(user("Thanks, one more thing"))
    for i in range(11, 14):
        await run(
            assistant(f"Checking {i}", (f"c{i}", "read", '{"path": "d.py"}')),
            tool_result(f"c{i}", _result_text(i), name="read"),
        )
    return out


async def over_budget_session(api: Stubs, sid: str, step: Stepper) -> Outcome:
    """A session over its window (1,500 tokens): two turns of tool steps, each view
    recommending a compaction, with a model-written checkpoint between them that moves the
    range to summarise; every view is checked against its rebuild."""
    await api.sessions.CreateSession(
        spb.CreateSessionRequest(session=session_pb2.Session(session_id=sid))
    )
    chat: list[event_pb2.Event] = []
    for i in range(12):
        chat += [user(f"question {i} " + "about the design " * 30), assistant(f"answer {i}")]
    await api.sessions.AppendEvents(spb.AppendEventsRequest(session_id=sid, events=chat))
    req = cpb.CompileRequest(
        session_id=sid, route=ROUTE, limits=cpb.ModelLimits(context_window=1_500)
    )
    out = Outcome()

    async def run(*events: event_pb2.Event) -> None:
        view = await step(req, list(events))
        again = await api.compiles.Compile(cpb.CompileRequest(rebuild_compile_id=view.compile_id))
        assert encoded(view) == encoded(again.view), f"step {len(out.views) + 1} differs"
        assert view.compaction.prompt, f"step {len(out.views) + 1} is not over budget"
        out.views.append(view)
        out.rebuilt.append(again.view)

    for k in range(3):
        await run(assistant("", (f"a{k}", "sql", "{}")), tool_result(f"a{k}", "ok"))
    await api.compiles.CreateCheckpoint(
        cpb.CreateCheckpointRequest(
            checkpoint=checkpoint_pb2.Checkpoint(
                session_id=sid, covers_through_seq=6, summary="Asked three design questions."
            ),
            covered_digest_mode=cpb.COVERED_DIGEST_MODE_COMPUTE,
        )
    )
    await run(user("next question " + "about the layout " * 20))
    for k in range(3):
        await run(assistant("", (f"b{k}", "sql", "{}")), tool_result(f"b{k}", "ok"))
    return out
