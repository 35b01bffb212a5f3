import assert from "node:assert/strict";
import { test } from "node:test";

// The SDKs' own types (type-only: erased from the compiled test; `tsc --strict` over this
// file checks that a Message is assignable to the helper's parameter).
import type { BetaMessage } from "@anthropic-ai/sdk/resources/beta/messages";
import type { Message, RedactedThinkingBlock, ThinkingBlock, Usage } from "@anthropic-ai/sdk/resources/messages";
import type { ChatCompletion } from "openai/resources/chat/completions";

import { ANTHROPIC_THINKING, assistantFromAnthropic, connect, Event, RenderFormat, user } from "../src/index.js";
import { appendLogged } from "./fixtures.js";

const thinking: ThinkingBlock = {
  type: "thinking",
  thinking: 'The parser fails on "a\\tb": look at a.py first\u2026\nThen b.py, where x < y && y > z (caf\u00e9 \ud83e\udd14).',
  signature:
    "EqQBCkgIARABGAIiQL7d9Ws0fXJlYWx0eXBlc2NyaXB0c2lnbmF0dXJlAAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJygpKissLS4vMDEyMzQ1Njc4OTo7PD0+P0BBQkNERUZHSA==",
};
const redacted: RedactedThinkingBlock = {
  type: "redacted_thinking",
  data: "EmwKAhgBEgy3va3pzGAVNiTUTEUaDK0a+Gv0ZdP3G3wQ5yIwdHlwZXNjcmlwdHJlZGFjdGVkdGhpbmtpbmdibG9ja2RhdGE=",
};
const usage: Usage = {
  cache_creation: null,
  cache_creation_input_tokens: 0,
  cache_read_input_tokens: 1800,
  inference_geo: null,
  input_tokens: 2095,
  output_tokens: 503,
  output_tokens_details: null,
  server_tool_use: null,
  service_tier: "standard",
  speed: null,
};

/** A response with extended thinking that calls two tools, as the SDK types it. */
const message: Message = {
  id: "msg_01Ub3T5Ldp3yWmXvE8nRkQcZ",
  type: "message",
  role: "assistant",
  model: "claude-sonnet-4-5-20250929",
  container: null,
  content: [
    thinking,
    redacted,
    { type: "text", text: "Reading both files \u2014 a.py holds parse() \u{1F642} <b>&amp;</b>\u2028done.", citations: null },
    {
      type: "tool_use",
      id: "toolu_01T3sZ8qWbN4xRkV2mLp9Ydc",
      name: "read_file",
      input: {
        path: "src/a.py",
        lines: [1, 40],
        opts: {
          z: true,
          a: null,
          ratio: 0.25,
          scale: 1.0,
          tiny: 1.5e-7,
          small: 0.0001,
          huge: 2.5e20,
          exact: 9007199254740991,
          third: 0.3333333333333333,
          more: [5e-324, 1.7976931348623157e308, 1e22, 0.1, -1.5e-10],
          "10": "an index-like key after the others",
          "2": "and another",
        },
        ctl: 'tab\there\u0001\u001f\u007f"\\/',
        emoji: "\u{1F600} \u00e9 caf\u00e9",
      },
      caller: { type: "direct" },
    },
    { type: "tool_use", id: "toolu_01Q4wE7rTy6uI8oP0aSdF2gH", name: "list_dir", input: {}, caller: { type: "direct" } },
  ],
  diagnostics: null,
  stop_details: null,
  stop_reason: "tool_use",
  stop_sequence: null,
  usage,
};

test("the thinking blocks are the native state, whole and in order; text and tool calls the message", () => {
  const ev = assistantFromAnthropic(message, "r1");
  assert.equal(ev.payload?.$case, "assistantMessage");
  const m = ev.payload.value;
  assert.equal(m.nativeState?.kind, ANTHROPIC_THINKING);
  assert.equal(m.nativeState?.routeId, "r1");
  assert.deepEqual(JSON.parse(m.nativeState.data.toString("utf8")), [thinking, redacted]);
  assert.equal(m.reasoning, ""); // R-MISC-2: no text copy of the thinking
  assert.deepEqual(
    m.parts.map((p) => p.part?.value),
    [(message.content[2] as { text: string }).text],
  );
  assert.deepEqual(
    m.toolCalls.map((c) => [c.callId, c.name, JSON.parse(c.argumentsJson)]),
    message.content.slice(3).map((b) => {
      const use = b as { id: string; name: string; input: unknown };
      return [use.id, use.name, use.input];
    }),
  );
  // The response's JSON, not typed as the SDK's Message, gives the same event.
  assert.deepEqual(assistantFromAnthropic(JSON.parse(JSON.stringify(message)) as { content: [] }, "r1"), ev);
});

test("a response without thinking has no native state; blocks of other types are left out; a null input is {}", () => {
  const plain: Message = {
    ...message,
    content: [
      { type: "server_tool_use", id: "srvtoolu_1", name: "web_search", input: { query: "x" }, caller: { type: "direct" } },
      { type: "text", text: "", citations: null },
      { type: "text", text: "done", citations: null },
      { type: "tool_use", id: "toolu_1", name: "noop", input: null, caller: { type: "direct" } },
    ],
  };
  const ev = assistantFromAnthropic(plain, "r1");
  const toolCalls = [{ callId: "toolu_1", name: "noop", argumentsJson: "{}" }]; // a null input is {}
  assert.deepEqual(ev, Event.fromPartial({ payload: { $case: "assistantMessage", value: { parts: [{ part: { $case: "text", value: "done" } }], toolCalls } } }));
});

test("adjacent text blocks (Claude splits a text at each citation) are one part; text around a call or thinking stays apart", () => {
  const cited: Message = {
    ...message,
    content: [
      { type: "text", text: "The latest release is ", citations: null },
      {
        type: "text",
        text: "Python 3.14.1",
        citations: [
          { type: "web_search_result_location", url: "https://python.org", title: "Python", encrypted_index: "Eo8B", cited_text: "3.14.1" },
        ],
      },
      { type: "text", text: "", citations: null },
      { type: "text", text: ". I'll save it.", citations: null },
      { type: "tool_use", id: "toolu_1", name: "save", input: {}, caller: { type: "direct" } },
      { type: "text", text: "Saved.", citations: null },
      { type: "thinking", thinking: "t", signature: "s" },
      { type: "text", text: "Done.", citations: null },
      { type: "tool_use", id: "toolu_2", name: "save", input: {}, caller: { type: "direct" } },
      { type: "text", text: "", citations: null },
      { type: "text", text: "After.", citations: null },
    ],
  };
  const ev = assistantFromAnthropic(cited, "r1");
  const parts = ev.payload?.$case === "assistantMessage" ? ev.payload.value.parts : [];
  // An empty block after a call joins nothing across the call.
  assert.deepEqual(
    parts.map((p) => (p.part?.$case === "text" ? p.part.value : null)),
    ["The latest release is Python 3.14.1. I'll save it.", "Saved.", "Done.", "After."],
  );
});

// The beta Message fits too; other shapes do not type-check.
export const fromBeta = (m: BetaMessage): Event => assistantFromAnthropic(m, "r1");
export function wrongShapes(completion: ChatCompletion): void {
  // @ts-expect-error an OpenAI chat completion is not an Anthropic message
  assistantFromAnthropic(completion, "r1");
  // @ts-expect-error a usage is not a message
  assistantFromAnthropic(usage, "r1");
}

// The daemon the tests that need one run against: tests/e2e/test_clients.py starts it and sets
// CTXCC_TARGET (skipped without it).
const daemonTarget = process.env.CTXCC_TARGET;

interface Block {
  type: string;
  [field: string]: unknown;
}

test(
  "against a daemon: the logged response's thinking blocks lead its turn in the Anthropic body",
  { skip: daemonTarget ? false : "CTXCC_TARGET is not set (tests/e2e/test_clients.py runs this against a daemon)" },
  async () => {
    // The event, appended with its tools' results, is stored as it was sent, and the Anthropic
    // body leads the assistant turn with the response's thinking blocks, unchanged, and carries
    // its text and tool calls; a model of another route gets no block.
    const ctx = connect(daemonTarget!, { retrySeconds: 5 });
    try {
      const route = { connection: "c", protocol: "anthropic-messages", endpoint: "api", model: "claude-sonnet-4-5" };
      const sid = (await ctx.createSession()).sessionId;
      const body = async (r: typeof route) => {
        const view = await ctx.compile({ sessionId: sid, route: r, renderFormats: [RenderFormat.RENDER_FORMAT_ANTHROPIC_MESSAGES] });
        const parsed = JSON.parse(view.renderings[0].bodyJson) as { messages: Array<{ role: string; content: Block[] }> };
        return { view, turns: parsed.messages.filter((m) => m.role === "assistant").map((m) => m.content) };
      };
      await ctx.append(sid, [user("fix the parser bug")]);
      const { view } = await body(route);
      const logged = assistantFromAnthropic(message, view.routeId);
      assert.equal(logged.payload?.$case, "assistantMessage");
      await appendLogged(ctx, sid, logged);

      const { turns } = await body(route);
      assert.equal(turns.length, 1);
      const blocks = message.content.filter((b) => b.type === "thinking" || b.type === "redacted_thinking");
      assert.deepEqual(turns[0].slice(0, blocks.length), blocks);
      assert.deepEqual(
        turns[0].slice(blocks.length).map((b) => [b.type, b.text ?? b.id]),
        message.content.slice(2).map((b) => [b.type, b.type === "text" ? b.text : (b as { id: string }).id]),
      );
      // The signatures are the route's: another model's body has no block.
      const other = await body({ ...route, model: "claude-haiku-4-5" });
      assert.equal(other.turns[0][0].type, "text");
    } finally {
      ctx.close();
    }
  },
);
