/** Helpers of the client's tests: the real views of tests/fixtures/client-views (three
 * successive views of one session as the daemon serialized them, written by
 * scripts/gen_view_fixtures.py) and deltas built between them by hand. */
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";

import type { MessageFns } from "../src/gen/ctxcc/v1/common.js";
import { SectionSlot, ViewDelta } from "../src/gen/ctxcc/v1/compile_service.js";
import { CompiledView, SystemSection, ViewMessage, ViewTool } from "../src/gen/ctxcc/v1/view.js";
import { viewDigest } from "../src/delta.js";
import { AssistantMessage, type Client, Event, toolResult } from "../src/index.js";

const DIR = new URL("../../../../tests/fixtures/client-views/", import.meta.url);

export function fixture(n: number): { view: CompiledView; bytes: Buffer } {
  const bytes = readFileSync(new URL(`view${n}.binpb`, DIR));
  return { view: CompiledView.decode(bytes), bytes };
}

export const encoded = (v: CompiledView): Buffer => Buffer.from(CompiledView.encode(v).finish());

function same<T>(fns: MessageFns<T>, a: T, b: T): boolean {
  return Buffer.compare(fns.encode(a).finish(), fns.encode(b).finish()) === 0;
}

/** Describes target against base the way the proto says a daemon may: the common prefix of
 * messages kept, sections found in base by index, tools sent only when they differ. */
export function makeDelta(base: CompiledView, target: CompiledView): ViewDelta {
  let kept = 0;
  while (kept < base.messages.length && kept < target.messages.length && same(ViewMessage, base.messages[kept], target.messages[kept])) kept++;
  const sections = target.systemSections.map((s): SectionSlot => {
    const i = base.systemSections.findIndex((b) => same(SystemSection, b, s));
    return i >= 0 ? { slot: { $case: "baseIndex", value: i } } : { slot: { $case: "section", value: s } };
  });
  const toolsChanged =
    base.tools.length !== target.tools.length || target.tools.some((t, i) => !same(ViewTool, t, base.tools[i]));
  const head = CompiledView.fromPartial({ ...target, messages: [], systemSections: [], systemPrompt: "", tools: [] });
  const delta = ViewDelta.fromPartial({
    baseCompileId: base.compileId,
    head,
    keptMessages: kept,
    appendedMessages: target.messages.slice(kept),
    sections,
    toolsChanged,
    tools: toolsChanged ? target.tools : [],
    viewSha256: viewDigest(target),
  });
  // A copy of its own, as one decoded from the wire would be.
  return ViewDelta.decode(ViewDelta.encode(delta).finish());
}

/** The chained digest of fixture view `n` as the daemon's code computes it (chain_sha256.txt
 * beside the views, checked against the proto's rule by the Python tests). */
export function daemonChain(n: number): string {
  return daemonDigest("chain_sha256.txt", n);
}

/** The digest with the compaction apart of fixture view `n` as the daemon's code computes it
 * (apart_sha256.txt, checked likewise; views 4 and 5 carry one compaction request). */
export function daemonApart(n: number): string {
  return daemonDigest("apart_sha256.txt", n);
}

function daemonDigest(file: string, n: number): string {
  const lines = readFileSync(new URL(file, DIR), "utf8").split("\n");
  const found = lines.map((l) => l.split(" ")).find(([name]) => name === `view${n}`);
  if (!found) throw new Error(`no digest for view${n} in ${file}`);
  return found[1];
}

/** `d` with the chained digest `sum` instead of view_sha256. */
export function chained(d: ViewDelta, sum: string): ViewDelta {
  d.viewSha256 = "";
  d.chainSha256 = sum;
  return d;
}

/** Appends the assistant event a provider helper logged, with an "ok" result for each of its
 * calls (refused with INVALID_FIELD if its native state's data were not what the daemon
 * reads), and checks the daemon stored the message as it was sent. */
export async function appendLogged(ctx: Client, sessionId: string, logged: Event): Promise<void> {
  assert.equal(logged.payload?.$case, "assistantMessage");
  const message = logged.payload.value;
  const results = message.toolCalls.map((c) => toolResult(c.callId, "ok", c.name));
  await ctx.append(sessionId, [logged, ...results]);
  const stored = (await ctx.sessions.listEvents({ sessionId })).events[1];
  assert.equal(stored.payload?.$case, "assistantMessage");
  const encode = (m: AssistantMessage) => Buffer.from(AssistantMessage.encode(m).finish());
  assert.ok(encode(stored.payload.value).equals(encode(message)), "stored otherwise than sent");
}
