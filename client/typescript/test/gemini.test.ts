import assert from "node:assert/strict";
import { readFileSync, writeFileSync } from "node:fs";
import { test } from "node:test";

// The SDKs' own types (type-only: erased from the compiled test; `tsc --strict` over this
// file checks that a GenerateContentResponse is assignable to the helper's parameter).
import type { Message } from "@anthropic-ai/sdk/resources/messages";
import type { GenerateContentResponse, Part } from "@google/genai";
import type { ChatCompletion } from "openai/resources/chat/completions";

import {
  AssistantMessage,
  assistantFromGemini,
  connect,
  Event,
  GEMINI_THOUGHT_SIGNATURES,
  type GeminiPart,
  RenderFormat,
  user,
} from "../src/index.js";
import { appendLogged } from "./fixtures.js";

/** tests/fixtures/client-thinking/gemini-response.json, a generateContent response's REST
 * JSON: a thought summary, a text part and three parallel calls, the first signed and
 * without id, the second with an id, the third with neither. */
const fixture = JSON.parse(
  readFileSync(new URL("../../../../tests/fixtures/client-thinking/gemini-response.json", import.meta.url), "utf8"),
) as { candidates: Array<{ content: { parts: GeminiPart[] } }> };

/** Parallel calls with the API's ids, as the SDK types the parts: the first signed. */
const sdkParts: Part[] = [
  { text: "**Planning** the fix: a.py first.", thought: true, thoughtSignature: "AAAA" },
  { text: "Reading both files \u2014 caf\u00e9 \u{1F642} <b>&amp;</b>\u2028done." },
  {
    functionCall: {
      id: "fc_1",
      name: "read_file",
      args: {
        path: "src/a.py",
        lines: [1, 40],
        opts: { z: true, a: null, ratio: 0.25, tiny: 1.5e-7, huge: 2.5e20, exact: 9007199254740991, more: [5e-324, 1e22, -1.5e-10], "10": "x", "2": "y" },
        ctl: 'tab\there\u0001\u001f\u007f"\\/',
      },
    },
    thoughtSignature: "CiQBcsjafE3wX8mQ7xVn0k2Yb4Rj9TqL1sPZu6dHcWgN5eAoK3I=",
  },
  { functionCall: { id: "fc_2", name: "list_dir", args: { path: "src" } } },
  { inlineData: { mimeType: "image/png", data: "iVBORw0KGgo=" } },
];
const sdkResponse: Pick<GenerateContentResponse, "candidates" | "modelVersion" | "responseId"> = {
  candidates: [{ content: { role: "model", parts: sdkParts } }, { content: { parts: [{ text: "another candidate" }] } }],
  modelVersion: "gemini-3-pro-preview",
  responseId: "kX0vaY6dLpWmz7IP2p7Y8Ag",
};

/** A JSON value as JSON.stringify writes it back: the only change is -0 written as 0. */
const written = (v: unknown): unknown => JSON.parse(JSON.stringify(v ?? {}));

/** Checks that ev says what the parts said: their text but thought summaries, their calls in
 * order (the response's id where it gave one, else a new one unique among the calls; name;
 * args that parse to the response's), and the native state: on route, each signed call's id
 * to its signature, nothing for the others. */
function checkEvent(ev: Event, parts: readonly GeminiPart[], route: string): AssistantMessage {
  assert.equal(ev.payload?.$case, "assistantMessage");
  const m = ev.payload.value;
  assert.deepEqual(
    m.parts.map((p) => p.part?.value),
    parts.filter((p) => p.text && !p.thought && !p.functionCall).map((p) => p.text),
  );
  const calls = parts.filter((p) => p.functionCall);
  assert.equal(m.toolCalls.length, calls.length);
  const signed: Record<string, string> = {};
  m.toolCalls.forEach((c, i) => {
    const want = calls[i];
    if (want.functionCall?.id) assert.equal(c.callId, want.functionCall.id);
    assert.ok(c.callId && m.toolCalls.findIndex((o) => o.callId === c.callId) === i, `call ${i}: id ${c.callId} empty or not unique`);
    assert.deepEqual([c.name, JSON.parse(c.argumentsJson)], [want.functionCall?.name, written(want.functionCall?.args)]);
    if (want.thoughtSignature) signed[c.callId] = want.thoughtSignature;
  });
  assert.equal(m.nativeState?.kind, GEMINI_THOUGHT_SIGNATURES);
  assert.equal(m.nativeState?.routeId, route);
  assert.deepEqual(JSON.parse(m.nativeState.data.toString("utf8")), signed);
  assert.equal(m.reasoning, ""); // R-MISC-2: no copy of the thought summary
  return m;
}

test("parallel calls from the SDK: the first call's signature is the native state, the second has none", () => {
  const ev = assistantFromGemini(sdkResponse, "r1");
  const m = checkEvent(ev, sdkParts, "r1");
  assert.deepEqual(JSON.parse(m.nativeState!.data.toString("utf8")), { fc_1: sdkParts[2].thoughtSignature });
  // The response's JSON, not typed as the SDK's, gives the same event.
  assert.deepEqual(assistantFromGemini(JSON.parse(JSON.stringify(sdkResponse)) as object, "r1"), ev);
});

test("the REST JSON: calls without id get new ids, unique in the session, the signature on the signed one's", () => {
  const parts = fixture.candidates[0].content.parts;
  const first = checkEvent(assistantFromGemini(fixture, "r2"), parts, "r2");
  const again = checkEvent(assistantFromGemini(fixture, "r2"), parts, "r2");
  // Only the second call has the response's id: the others are new on every logging.
  assert.deepEqual(
    first.toolCalls.map((c, i) => c.callId === again.toolCalls[i].callId),
    [false, true, false],
  );
});

test("no candidates, no signature, a null args: no native state, {} as the arguments", () => {
  const empty = Event.fromPartial({ payload: { $case: "assistantMessage", value: {} } });
  assert.deepEqual(assistantFromGemini({}, "r1"), empty);
  assert.deepEqual(assistantFromGemini({ candidates: [] }, "r1"), empty);
  const ev = assistantFromGemini({ candidates: [{ content: { parts: [{ functionCall: { id: "fc", name: "noop", args: null } }, { text: "done", thoughtSignature: "dGV4dA==" }] } }] }, "r1");
  const value = { parts: [{ part: { $case: "text" as const, value: "done" } }], toolCalls: [{ callId: "fc", name: "noop", argumentsJson: "{}" }] };
  assert.deepEqual(ev, Event.fromPartial({ payload: { $case: "assistantMessage", value } }));
});

test("text split over parts is one part; a thought summary or a call stands between texts, an empty part does not", () => {
  const response: GenerateContentResponse = {
    candidates: [
      {
        content: {
          role: "model",
          parts: [
            { text: "The answer is 4" },
            { text: "2, as computed." },
            { text: "", thoughtSignature: "c2ln" },
            { text: " Checking it." },
            { text: "planning the check", thought: true },
            { text: "Now the call:" },
            { functionCall: { id: "c1", name: "run", args: {} } },
            { text: "After the call." },
          ],
        },
      },
    ],
  } as GenerateContentResponse;
  const ev = assistantFromGemini(response, "r1");
  const parts = ev.payload?.$case === "assistantMessage" ? ev.payload.value.parts : [];
  assert.deepEqual(
    parts.map((p) => (p.part?.$case === "text" ? p.part.value : null)),
    ["The answer is 42, as computed. Checking it.", "Now the call:", "After the call."],
  );
});

// The SDK's response fits; other shapes do not type-check.
export const fromSdk = (r: GenerateContentResponse): Event => assistantFromGemini(r, "r1");
export function wrongShapes(completion: ChatCompletion, message: Message): void {
  // @ts-expect-error an OpenAI chat completion is not a Gemini response
  assistantFromGemini(completion, "r1");
  // @ts-expect-error an Anthropic message is not a Gemini response
  assistantFromGemini(message, "r1");
}

// The daemon the tests that need one run against: tests/e2e/test_clients.py starts it and sets
// CTXCC_TARGET (skipped without it), and CTXCC_GEMINI_BODY, the file to write the body to (it
// checks the body against google-genai's types).
const daemonTarget = process.env.CTXCC_TARGET;

interface BodyPart {
  text?: string;
  functionCall?: { id: string; name: string; args: unknown };
  thoughtSignature?: string;
}

test(
  "against a daemon: the logged response's thought signatures are on their calls in the Gemini body",
  { skip: daemonTarget ? false : "CTXCC_TARGET is not set (tests/e2e/test_clients.py runs this against a daemon)" },
  async () => {
    // The event, appended with its tools' results under its call ids, is stored as it was
    // sent, and the Gemini body's model turn holds the response's text, not its thought
    // summary, and its calls as functionCall parts, the signed one with its signature and the
    // others with none; a model of another route gets no signature.
    const ctx = connect(daemonTarget!, { retrySeconds: 5 });
    try {
      const route = { connection: "c", protocol: "gemini", endpoint: "api", model: "gemini-3-pro-preview" };
      const sid = (await ctx.createSession()).sessionId;
      const body = async (r: typeof route) => {
        const view = await ctx.compile({ sessionId: sid, route: r, renderFormats: [RenderFormat.RENDER_FORMAT_GEMINI] });
        const bodyJson = view.renderings[0].bodyJson;
        const parsed = JSON.parse(bodyJson) as { contents: Array<{ role: string; parts: BodyPart[] }> };
        const model = parsed.contents.filter((c) => c.role === "model").flatMap((c) => c.parts);
        const calls = parsed.contents.flatMap((c) => c.parts).filter((p) => p.functionCall);
        return { view, bodyJson, calls, text: model.filter((p) => p.text).map((p) => p.text) };
      };
      await ctx.append(sid, [user("fix the parser bug")]);
      const { view } = await body(route);
      const logged = assistantFromGemini(fixture, view.routeId);
      assert.equal(logged.payload?.$case, "assistantMessage");
      const calls = logged.payload.value.toolCalls;
      await appendLogged(ctx, sid, logged);

      const sent = await body(route);
      const texts = fixture.candidates[0].content.parts.filter((p) => p.text && !p.thought).map((p) => p.text);
      assert.deepEqual(sent.text, texts); // no thought summary
      const parts = fixture.candidates[0].content.parts.filter((p) => p.functionCall);
      // The body carries no call id (Vertex AI refuses one): the logged event holds it.
      assert.ok(calls.every((c) => c.callId !== ""));
      assert.deepEqual(
        sent.calls.map((p) => [p.functionCall?.id, p.functionCall?.name, p.functionCall?.args, p.thoughtSignature]),
        parts.map((p) => [undefined, p.functionCall?.name, written(p.functionCall?.args), p.thoughtSignature ?? undefined]),
      );
      if (process.env.CTXCC_GEMINI_BODY) writeFileSync(process.env.CTXCC_GEMINI_BODY, sent.bodyJson);
      // The signatures are the route's: another model's body has none of them; on Gemini 3
      // the step's first call carries the daemon's stand-in instead, the others nothing.
      const other = await body({ ...route, model: "gemini-3-flash-preview" });
      assert.deepEqual(
        other.calls.map((p) => p.thoughtSignature),
        parts.map((_, i) => (i === 0 ? "skip_thought_signature_validator" : undefined)),
      );
    } finally {
      ctx.close();
    }
  },
);
