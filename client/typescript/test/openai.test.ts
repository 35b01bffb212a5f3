import assert from "node:assert/strict";
import { readFileSync, writeFileSync } from "node:fs";
import { test } from "node:test";

// The SDKs' own types (type-only: erased from the compiled test; `tsc --strict` over this
// file checks that the openai SDK's Response is assignable to the helper's parameter).
import type { Message } from "@anthropic-ai/sdk/resources/messages";
import type { Response } from "openai/resources/responses/responses";

import { assistantFromOpenAIResponses, connect, Event, OPENAI_REASONING, RenderFormat, user } from "../src/index.js";
import { appendLogged } from "./fixtures.js";

/** tests/fixtures/client-thinking/openai-response.json, a Responses API response body: a
 * reasoning item with its encrypted content and one without, a message of two output_text
 * parts, two function calls and a web search call between them. */
const fixture = JSON.parse(
  readFileSync(new URL("../../../../tests/fixtures/client-thinking/openai-response.json", import.meta.url), "utf8"),
) as { output: Array<Record<string, unknown> & { type: string }> };

/** What the fixture says, read from its JSON: the message's text, the calls, and what is
 * logged of its reasoning: the item right before its first message or call, when sealed, as
 * the daemon takes it back (type, id, summary, encrypted_content). */
const output = fixture.output;
const text = output
  .filter((i) => i.type === "message")
  .flatMap((i) => (i.content as Array<{ text: string }>).map((c) => c.text))
  .join("");
const calls = output.filter((i) => i.type === "function_call").map((i) => [i.call_id, i.name, i.arguments]);
const first = output.findIndex((i) => i.type === "message" || i.type === "function_call");
const leading = output.slice(0, first).filter((i) => i.type === "reasoning").at(-1);
const sealed = leading?.encrypted_content
  ? [{ type: leading.type, id: leading.id, summary: leading.summary, encrypted_content: leading.encrypted_content }]
  : [];

test("the logged response says what it said: its text as one part, its calls, the reasoning item right before its message as the native state", () => {
  const ev = assistantFromOpenAIResponses(fixture, "r1");
  assert.equal(ev.payload?.$case, "assistantMessage");
  const m = ev.payload.value;
  assert.deepEqual(m.parts.map((p) => p.part?.value), [text]);
  assert.deepEqual(m.toolCalls.map((c) => [c.callId, c.name, c.argumentsJson]), calls);
  assert.equal(m.nativeState?.kind, OPENAI_REASONING);
  assert.equal(m.nativeState?.routeId, "r1");
  assert.deepEqual(JSON.parse(m.nativeState.data.toString("utf8")), sealed);
  assert.equal(m.reasoning, ""); // R-MISC-2: no raw reasoning text
  assert.ok(!m.nativeState.data.toString("utf8").includes("raw reasoning"));
  assert.equal(sealed.length, 1);
  // The item right before the message has no seal: no native state (the sealed one before
  // it is not sent in its place); no output: an empty message.
  const plain = assistantFromOpenAIResponses({ output: [output[1], output[0], ...output.slice(2)] }, "r1");
  assert.equal(plain.payload?.$case === "assistantMessage" ? plain.payload.value.nativeState : "?", undefined);
  assert.deepEqual(assistantFromOpenAIResponses({}, "r1"), Event.fromPartial({ payload: { $case: "assistantMessage", value: {} } }));
});

// The SDK's response fits; other shapes do not type-check.
export const fromSdk = (r: Response): Event => assistantFromOpenAIResponses(r, "r1");
export function wrongShapes(message: Message): void {
  // @ts-expect-error an Anthropic message is not a Responses response
  assistantFromOpenAIResponses(message, "r1");
}

// The daemon the tests that need one run against: tests/e2e/test_clients.py starts it and sets
// CTXCC_TARGET (skipped without it), and CTXCC_OPENAI_BODY, the file to write the body to (it
// checks the body against the openai SDK's types).
const daemonTarget = process.env.CTXCC_TARGET;

test(
  "against a daemon: the logged response's reasoning items lead its calls in the Responses body",
  { skip: daemonTarget ? false : "CTXCC_TARGET is not set (tests/e2e/test_clients.py runs this against a daemon)" },
  async () => {
    // The event, appended with its tools' results, is stored as it was sent, and the
    // Responses body sends the sealed reasoning item back before its calls; another model's
    // body has none.
    const ctx = connect(daemonTarget!, { retrySeconds: 5 });
    try {
      const route = { connection: "c", protocol: "openai-responses", endpoint: "api", model: "o4-mini" };
      const sid = (await ctx.createSession()).sessionId;
      const body = async (r: typeof route) => {
        const view = await ctx.compile({ sessionId: sid, route: r, renderFormats: [RenderFormat.RENDER_FORMAT_OPENAI_RESPONSES] });
        const bodyJson = view.renderings[0].bodyJson;
        return { view, bodyJson, input: (JSON.parse(bodyJson) as { input: Array<Record<string, unknown>> }).input };
      };
      await ctx.append(sid, [user("fix the parser bug")]);
      const { view } = await body(route);
      await appendLogged(ctx, sid, assistantFromOpenAIResponses(fixture, view.routeId));
      const sent = await body(route);
      assert.deepEqual(
        sent.input.map((i) => i.type),
        ["message", "reasoning", "message", "function_call", "function_call", "function_call_output", "function_call_output"],
      );
      assert.deepEqual(sent.input.filter((i) => i.type === "reasoning"), sealed);
      assert.deepEqual(sent.input.filter((i) => i.type === "function_call").map((i) => i.call_id), calls.map((c) => c[0]));
      if (process.env.CTXCC_OPENAI_BODY) writeFileSync(process.env.CTXCC_OPENAI_BODY, sent.bodyJson);
      const other = await body({ ...route, model: "gpt-5" });
      assert.ok(other.input.every((i) => i.type !== "reasoning"));
    } finally {
      ctx.close();
    }
  },
);
