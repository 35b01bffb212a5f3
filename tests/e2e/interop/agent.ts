/**
 * The scripted agent of the interop suite in TypeScript: the same script as agent.py and
 * agent.go, built in a temp project against @ctxcc/client installed from its npm pack
 * tarball. Ends with an Anthropic response with thinking blocks (the file
 * CTXCC_ANTHROPIC_RESPONSE), a Gemini response with a signed call (the file
 * CTXCC_GEMINI_RESPONSE) and an OpenAI Responses response with reasoning items (the file
 * CTXCC_OPENAI_RESPONSE), each logged with the client's helper. Prints one line,
 * `RESULT {json}`, and one, `DELTAS {json}`, for a session on delta views.
 */
import { readFileSync } from "node:fs";
import { isDeepStrictEqual } from "node:util";

import {
  assistant,
  assistantFromAnthropic,
  assistantFromGemini,
  assistantFromOpenAIResponses,
  CheckpointKind,
  connect,
  CoveredDigestMode,
  CtxccError,
  RenderFormat,
  RuleActivation,
  Scope,
  toolResult,
  ToolVisibility,
  user,
  viewDigest,
  type Client,
  type CompiledView,
  type Event,
  type Route,
} from "@ctxcc/client";

const route: Route = { connection: "interop", protocol: "fake", endpoint: "local", model: "gpt-4o" };
const gemini: Route = { connection: "interop", protocol: "gemini", endpoint: "api", model: "gemini-3-pro-preview" };
const claude: Route = { connection: "interop", protocol: "anthropic-messages", endpoint: "api", model: "claude-sonnet-4-5" };
const openai: Route = { connection: "interop", protocol: "openai-responses", endpoint: "api", model: "o4-mini" };
const PNG = Buffer.from(
  "89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c489" +
    "0000000d49444154789c63f8cfc0f01f00050001ff89993d1d0000000049454e44ae426082",
  "hex",
);
const TOOL_OUTPUT = Array.from({ length: 40 }, (_, i) => `line ${i + 1}`).join("\n");
const FORMATS = [
  RenderFormat.RENDER_FORMAT_OPENAI_CHAT,
  RenderFormat.RENDER_FORMAT_OPENAI_RESPONSES,
  RenderFormat.RENDER_FORMAT_ANTHROPIC_MESSAGES,
  RenderFormat.RENDER_FORMAT_GEMINI,
];

async function main(): Promise<void> {
  const out: Record<string, unknown> = {};
  const ctx = connect(process.env.CTXCC_TARGET ?? "127.0.0.1:50551");
  const session = await ctx.createSession();
  const sid = (out.session_id = session.sessionId);
  const scope = Scope.SCOPE_SESSION;

  await ctx.sources.putMemory({ memory: { memoryId: "m1", scope, scopeId: sid, text: "The repo uses tabs." } });
  await ctx.sources.putRule({
    rule: {
      ruleId: "r1", scope, scopeId: sid, name: "style", description: "code style",
      text: "Prefer small functions.", activation: RuleActivation.RULE_ACTIVATION_ON_DEMAND,
    },
  });
  await ctx.sources.putSkill({
    skill: {
      skillId: "k1", scope, scopeId: sid, name: "deploy", description: "Deploys the service.",
      loadHint: "skills/deploy/SKILL.md", enabled: true,
    },
  });
  out.rule_text = (await ctx.sources.loadRule({ sessionId: sid, name: "style" })).rule?.text;
  const counts = async () => [
    (await ctx.sources.listMemory({ scope, scopeId: sid })).memories.length,
    (await ctx.sources.listRules({ scope, scopeId: sid })).rules.length,
    (await ctx.sources.listSkills({ scope, scopeId: sid })).skills.length,
  ];
  out.sources = await counts();

  const registered = await ctx.tools.registerTools({
    sessionId: sid,
    tools: [
      {
        name: "read_file", description: "Reads a file.",
        inputSchemaJson: '{"type":"object","properties":{"path":{"type":"string"}}}',
        visibility: ToolVisibility.TOOL_VISIBILITY_DIRECT,
      },
      {
        name: "deploy_service", description: "Deploys the service to production.",
        inputSchemaJson: '{"type":"object"}', visibility: ToolVisibility.TOOL_VISIBILITY_DEFERRED,
        searchKeywords: ["deploy", "release"],
      },
    ],
  });
  out.registered = registered.registered;
  out.listed_tools = (await ctx.tools.listTools({ sessionId: sid })).tools.map((t) => t.name).sort();

  const stream = ctx.openStream();
  const compileReq = { sessionId: sid, route };
  let { view } = await stream.step(compileReq, [user("Read README.md, then deploy.")]);
  out.view1_tools = view.tools.map((t) => t.definition?.name ?? "").sort();
  out.search = (await ctx.tools.searchTools({ sessionId: sid, query: "deploy", maxResults: 5 })).tools.map((t) => t.name);
  const second = await stream.step(compileReq, [
    assistant("", [["c1", "read_file", '{"path":"README.md"}']]),
    toolResult("c1", TOOL_OUTPUT, "read_file"),
  ]);
  // Its usage rides on the next step.
  const estimate2 = second.view.budget!.estimatedInputTokens;
  await stream.reportUsage({ compileId: second.view.compileId, route, inputTokens: estimate2 + 10, outputTokens: 20 });
  const read = await ctx.tools.readToolResult({ sessionId: sid, callId: "c1", read: { $case: "lines", value: { offset: 10, limit: 3 } } });
  out.slice = read.slice?.text;
  const ref = await ctx.uploadArtifact(sid, PNG, "image/png", { width: 1, height: 1 });
  const back = await ctx.downloadArtifact(sid, ref.artifactId);
  out.artifact = [ref.sha256, back.data.equals(PNG), back.artifact.mimeType];
  const third = await stream.step({ ...compileReq, renderFormats: FORMATS }, [user("What is in this image?", ref)]);
  view = third.view;
  out.render_formats = view.renderings.map((r) => r.format).sort();
  out.step3_append = third.append ? [third.append.firstSeq, third.append.lastSeq] : [];
  out.view3_boundary = view.eventBoundary;
  out.carried_usage = [third.usage?.estimatedInputTokens === estimate2, third.usage?.errorTokens, third.usage?.replayed];
  out.step3_baseline = view.budget!.baselineTokens === estimate2 + 10;
  const estimate = view.budget!.estimatedInputTokens;
  const usage = await ctx.reportUsage({ compileId: view.compileId, route, inputTokens: estimate + 10, outputTokens: 20 });
  out.usage_estimate_matches = usage.estimatedInputTokens === estimate;
  await stream.reportUsage({ compileId: `${sid}:no-such-compile`, inputTokens: 5, outputTokens: 1 });
  try {
    await stream.step(compileReq, [user("never appended")]);
  } catch (err) {
    out.refused = [(err as CtxccError).reason, (err as CtxccError).usageRefused];
  }
  const fourth = await stream.step(compileReq, []);
  out.after_refusal = [fourth.view.eventBoundary, stream.lastUsage !== undefined];
  await stream.reportUsage({ compileId: fourth.view.compileId, inputTokens: estimate, outputTokens: 20 });
  await stream.close(); // sends the report queued last by the unary ReportUsage
  const again = await ctx.reportUsage({ compileId: fourth.view.compileId, inputTokens: 1, outputTokens: 1 });
  out.flushed_at_close = again.replayed;

  const made = await ctx.compiles.createCheckpoint({
    checkpoint: {
      sessionId: sid, coversThroughSeq: 3, summary: "Read README.md with read_file.",
      kind: CheckpointKind.CHECKPOINT_KIND_MODEL_SUMMARY, sourceRoute: route,
    },
  });
  const listed = await ctx.compiles.listCheckpoints({ sessionId: sid });
  out.checkpoint = [made.checkpoint?.coversThroughSeq, listed.checkpoints.length];
  for await (const update of ctx.watch(sid, 3)) {
    out.watch_first = [update.update?.$case, update.update?.$case === "event" ? update.update.value.seq : 0];
    break;
  }
  const past = await ctx.compile({ sessionId: sid, route, asOfSeq: 1 });
  out.time_travel = [past.eventBoundary, past.messages.length];
  const events = await ctx.sessions.listEvents({ sessionId: sid });
  out.events = events.events.map((e) => e.payload?.$case.replace(/[A-Z]/g, (c) => "_" + c.toLowerCase()));
  out.head_seq = (await ctx.getSession(sid)).headSeq;
  // Text UTF-8 cannot carry (a lone surrogate): refused before anything is sent.
  let refused = false;
  try {
    await ctx.append(sid, [user("bad \ud800 text")]);
  } catch (err) {
    refused = err instanceof CtxccError && err.reason === "INVALID_FIELD";
  }
  out.lone_surrogate = [refused, (await ctx.getSession(sid)).headSeq === 4];

  const other = await ctx.createSession();
  await ctx.append(other.sessionId, [user("throwaway")]);
  const sessions = await ctx.sessions.listSessions({ pageSize: 100 });
  out.listed_session = sessions.sessions.some((s) => s.sessionId === sid);
  out.deleted_events = (await ctx.sessions.deleteSession({ sessionId: other.sessionId })).deletedEvents;

  await ctx.sources.deleteMemory({ scope, scopeId: sid, memoryId: "m1" });
  await ctx.sources.deleteRule({ scope, scopeId: sid, ruleId: "r1" });
  await ctx.sources.deleteSkill({ scope, scopeId: sid, skillId: "k1" });
  out.sources_after_delete = await counts();
  try {
    await ctx.getSession("no-such-session");
  } catch (err) {
    out.missing_reason = (err as CtxccError).reason;
  }
  Object.assign(out, await thinkingSession(ctx));
  Object.assign(out, await geminiSession(ctx));
  Object.assign(out, await openAISession(ctx));
  const deltas = { ...(await deltaSession(ctx)), ...(await compactionSession(ctx)) };
  ctx.close();
  console.log("RESULT " + JSON.stringify(sortedKeys(out)));
  console.log("DELTAS " + JSON.stringify(sortedKeys(deltas)));
}

const sortedKeys = (o: Record<string, unknown>) => Object.fromEntries(Object.entries(o).sort(([a], [b]) => (a < b ? -1 : 1)));

interface Block {
  type: string;
}

/** Logs an Anthropic response with thinking blocks and its tools' results; records the block
 * types of the Anthropic body's assistant turn and whether it starts with the response's
 * thinking blocks, unchanged. */
async function thinkingSession(ctx: Client): Promise<Record<string, unknown>> {
  const response = JSON.parse(readFileSync(process.env.CTXCC_ANTHROPIC_RESPONSE!, "utf8")) as { content: Block[] };
  const sid = (await ctx.createSession()).sessionId;
  const req = { sessionId: sid, route: claude, renderFormats: [RenderFormat.RENDER_FORMAT_ANTHROPIC_MESSAGES] };
  await ctx.append(sid, [user("Fix the parser bug.")]);
  const view = await ctx.compile(req);
  const logged = assistantFromAnthropic(response, view.routeId);
  const calls = logged.payload?.$case === "assistantMessage" ? logged.payload.value.toolCalls : [];
  await ctx.append(sid, [logged, ...calls.map((c) => toolResult(c.callId, "ok", c.name))]);
  const body = JSON.parse((await ctx.compile(req)).renderings[0].bodyJson) as { messages: { role: string; content: Block[] }[] };
  const turn = body.messages.find((m) => m.role === "assistant")!;
  const sent = response.content.filter((b) => b.type === "thinking" || b.type === "redacted_thinking");
  return { thinking_session_id: sid, thinking: [turn.content.map((b) => b.type), isDeepStrictEqual(turn.content.slice(0, sent.length), sent)] };
}

/** Logs a Gemini response with parallel calls, the first signed, and its tools' results under
 * the event's call ids; records the Gemini body's functionCall parts: each call's name and
 * thoughtSignature (null when it has none). */
async function geminiSession(ctx: Client): Promise<Record<string, unknown>> {
  const response = JSON.parse(readFileSync(process.env.CTXCC_GEMINI_RESPONSE!, "utf8")) as object;
  const sid = (await ctx.createSession()).sessionId;
  const req = { sessionId: sid, route: gemini, renderFormats: [RenderFormat.RENDER_FORMAT_GEMINI] };
  await ctx.append(sid, [user("Fix the parser bug.")]);
  const view = await ctx.compile(req);
  const logged = assistantFromGemini(response, view.routeId);
  const calls = logged.payload?.$case === "assistantMessage" ? logged.payload.value.toolCalls : [];
  await ctx.append(sid, [logged, ...calls.map((c) => toolResult(c.callId, "ok", c.name))]);
  type Part = { functionCall?: { name: string }; thoughtSignature?: string };
  const body = JSON.parse((await ctx.compile(req)).renderings[0].bodyJson) as { contents: { parts: Part[] }[] };
  const parts = body.contents.flatMap((c) => c.parts).filter((p) => p.functionCall);
  return { gemini_session_id: sid, gemini: parts.map((p) => [p.functionCall!.name, p.thoughtSignature ?? null]) };
}

/** Logs an OpenAI Responses response with reasoning items and its tools' results; records the
 * item types of the Responses body's input and whether its reasoning items are the response's
 * one right before its message (id, summary, encrypted content). */
async function openAISession(ctx: Client): Promise<Record<string, unknown>> {
  type Item = { type: string; id?: string; summary?: unknown; encrypted_content?: string | null };
  const response = JSON.parse(readFileSync(process.env.CTXCC_OPENAI_RESPONSE!, "utf8")) as { output: Item[] };
  const sid = (await ctx.createSession()).sessionId;
  const req = { sessionId: sid, route: openai, renderFormats: [RenderFormat.RENDER_FORMAT_OPENAI_RESPONSES] };
  await ctx.append(sid, [user("Fix the parser bug.")]);
  const view = await ctx.compile(req);
  const logged = assistantFromOpenAIResponses(response, view.routeId);
  const calls = logged.payload?.$case === "assistantMessage" ? logged.payload.value.toolCalls : [];
  await ctx.append(sid, [logged, ...calls.map((c) => toolResult(c.callId, "ok", c.name))]);
  const body = JSON.parse((await ctx.compile(req)).renderings[0].bodyJson) as { input: Item[] };
  const first = response.output.findIndex((i) => i.type === "message" || i.type === "function_call");
  const leading = response.output.slice(0, first).filter((i) => i.type === "reasoning").at(-1);
  const sealed = leading?.encrypted_content
    ? [{ type: leading.type, id: leading.id, summary: leading.summary, encrypted_content: leading.encrypted_content }]
    : [];
  const sent = body.input.filter((i) => i.type === "reasoning");
  return { openai_session_id: sid, reasoning: [body.input.map((i) => i.type), isDeepStrictEqual(sent, sealed)] };
}

/** Steps on a stream with delta views (a tool registered and a memory changed on the way, one
 * delta damaged by the hook) and on one without; counts the views that equal, by digest, the
 * same compile rebuilt whole with a unary compile. */
async function deltaSession(ctx: Client): Promise<Record<string, unknown>> {
  const sid = (await ctx.createSession()).sessionId;
  const steps = 10;
  const damageAt = 6;
  let step = 0;
  const stream = ctx.openStream({
    onDelta: (d) => {
      const part = d.appendedMessages[0]?.parts[0]?.part;
      if (step === damageAt && part?.$case === "text") {
        const text = Buffer.from(part.value);
        text[0] ^= 1;
        part.value = text.toString();
      }
    },
  });
  const plain = ctx.openStream({ deltas: false });
  const identical = async (view: CompiledView) =>
    viewDigest(view) === viewDigest(await ctx.compile({ rebuildCompileId: view.compileId })) ? 1 : 0;
  let same = 0;
  let plainSame = 0;
  let deltaBytes = 0; // over the steps both streams take
  let plainBytes = 0;
  let pending: Event[] = [user("Start the task.")];
  for (step = 0; step < steps; step++) {
    if (step === 3) {
      await ctx.tools.registerTools({
        sessionId: sid,
        tools: [{ name: "list_dir", description: "Lists a directory.", inputSchemaJson: '{"type":"object"}', visibility: ToolVisibility.TOOL_VISIBILITY_DIRECT }],
      });
    } else if (step === 5) {
      await ctx.sources.putMemory({ memory: { memoryId: "m1", scope: Scope.SCOPE_SESSION, scopeId: sid, text: "Tests run with make test." } });
    }
    const req = { sessionId: sid, route };
    const [before, plainBefore] = [stream.stats.bytes, plain.stats.bytes];
    same += await identical((await stream.step(req, pending)).view);
    if (step >= steps - 3) {
      plainSame += await identical((await plain.step(req)).view);
      deltaBytes += stream.stats.bytes - before;
      plainBytes += plain.stats.bytes - plainBefore;
    }
    pending = [assistant(`Done with part ${step}.`), user(`Now part ${step + 1}.`)];
  }
  const stats = stream.stats;
  const plainStats = plain.stats;
  await stream.close();
  await plain.close();
  console.error(`bytes over the last 3 steps: deltas ${deltaBytes}, whole views ${plainBytes}`);
  return {
    steps, identical: same, whole: stats.whole, deltas: stats.deltas, mismatches: stats.mismatches,
    plain_identical: plainSame, plain_deltas: plainStats.deltas, plain_whole: plainStats.whole,
    delta_bytes_smaller: deltaBytes < plainBytes,
  };
}

/** Steps a session over its window (1,500 tokens): two turns of tool steps, each view
 * recommending a compaction, with a checkpoint between them that moves the range to
 * summarise. Records which deltas kept their base's compaction and counts the views that
 * equal, by digest, the same compile rebuilt whole. */
async function compactionSession(ctx: Client): Promise<Record<string, unknown>> {
  const sid = (await ctx.createSession()).sessionId;
  const chat: Event[] = [];
  for (let i = 0; i < 12; i++) chat.push(user(`question ${i} ` + "about the design ".repeat(30)), assistant(`answer ${i}`));
  await ctx.append(sid, chat);
  const kept: boolean[] = [];
  const stream = ctx.openStream({ onDelta: (d) => kept.push(d.compactionKept) });
  const req = { sessionId: sid, route, limits: { contextWindow: 1500, maxOutputTokens: 0, maxInputTokens: 0 } };
  let same = 0;
  let over = 0;
  const run = async (...events: Event[]) => {
    const { view } = await stream.step(req, events);
    if (viewDigest(view) === viewDigest(await ctx.compile({ rebuildCompileId: view.compileId }))) same++;
    if (view.compaction?.prompt) over++;
  };
  const tools = async (prefix: string) => {
    for (let k = 0; k < 3; k++) await run(assistant("", [[`${prefix}${k}`, "sql", "{}"]]), toolResult(`${prefix}${k}`, "ok", "sql"));
  };
  await tools("a");
  await ctx.compiles.createCheckpoint({
    checkpoint: { sessionId: sid, coversThroughSeq: 6, summary: "Asked three design questions." },
    coveredDigestMode: CoveredDigestMode.COVERED_DIGEST_MODE_COMPUTE,
  });
  await run(user("next question " + "about the layout ".repeat(20)));
  await tools("b");
  const mismatches = stream.stats.mismatches;
  await stream.close();
  return { compaction_kept: kept, compaction_identical: same, compaction_over: over, compaction_mismatches: mismatches };
}

main().catch((err) => {
  console.error("agent:", err);
  process.exit(1);
});
