import assert from "node:assert/strict";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { test } from "node:test";

import { GoogleGenAI } from "@google/genai";

// The SDKs' own usage types (type-only: erased from the compiled test; `tsc --strict` over
// this file checks that each is assignable to the parameter of its mapping).
import type { BetaUsage } from "@anthropic-ai/sdk/resources/beta/messages";
import type { Message, MessageDeltaUsage, Usage } from "@anthropic-ai/sdk/resources/messages";
import type { CompletionUsage } from "openai/resources/completions";
import type { ResponseUsage } from "openai/resources/responses/responses";

import {
  ReportUsageRequest,
  usageFromAnthropic,
  usageFromGemini,
  usageFromOpenAIChat,
  usageFromOpenAIResponses,
  type UsageCounts,
} from "../src/index.js";

const anthropic: Usage = {
  cache_creation: null,
  cache_creation_input_tokens: 310,
  cache_read_input_tokens: 48_000,
  inference_geo: null,
  input_tokens: 12,
  output_tokens: 420,
  output_tokens_details: { thinking_tokens: 300 },
  server_tool_use: null,
  service_tier: "standard",
  speed: null,
};

const chat: CompletionUsage = {
  prompt_tokens: 2006,
  completion_tokens: 300,
  total_tokens: 2306,
  prompt_tokens_details: { cached_tokens: 1920 },
  completion_tokens_details: { reasoning_tokens: 256 },
};

const responses: ResponseUsage = {
  input_tokens: 5200,
  input_tokens_details: { cached_tokens: 4096, cache_write_tokens: 1000 },
  output_tokens: 700,
  output_tokens_details: { reasoning_tokens: 512 },
  total_tokens: 5900,
};

function counts(inputTokens: number, outputTokens: number, cachedInputTokens: number, reasoningTokens: number): UsageCounts {
  return { inputTokens, outputTokens, cachedInputTokens, reasoningTokens };
}

test("Anthropic: the whole input adds the prompt cache's writes and reads to input_tokens", () => {
  assert.deepEqual(usageFromAnthropic(anthropic), counts(12 + 310 + 48_000, 420, 48_000, 300));
  const plain: Usage = { ...anthropic, cache_creation_input_tokens: null, cache_read_input_tokens: null, output_tokens_details: null };
  assert.deepEqual(usageFromAnthropic(plain), counts(12, 420, 0, 0));
  // A message's usage, the beta one and a stream's cumulative delta usage all fit.
  const message = { usage: anthropic } as Pick<Message, "usage">;
  const beta: BetaUsage = { ...anthropic, fallback_credit: null, iterations: null };
  const delta: MessageDeltaUsage = { ...anthropic };
  for (const u of [message.usage, beta, delta]) {
    assert.equal(usageFromAnthropic(u).inputTokens, 48_322);
  }
});

test("OpenAI Chat and Responses: cached and reasoning tokens are inside the totals", () => {
  assert.deepEqual(usageFromOpenAIChat(chat), counts(2006, 300, 1920, 256));
  const bare: CompletionUsage = { prompt_tokens: 15, completion_tokens: 3, total_tokens: 18 };
  assert.deepEqual(usageFromOpenAIChat(bare), counts(15, 3, 0, 0));
  assert.deepEqual(usageFromOpenAIResponses(responses), counts(5200, 700, 4096, 512));
});

test("Gemini: thoughts add to the output; tool-use prompts stay out; cached is capped at the prompt", () => {
  const meta = {
    promptTokenCount: 1000,
    cachedContentTokenCount: 800,
    candidatesTokenCount: 50,
    thoughtsTokenCount: 120,
    toolUsePromptTokenCount: 400,
    totalTokenCount: 1570,
  };
  assert.deepEqual(usageFromGemini(meta), counts(1000, 170, 800, 120));
  assert.deepEqual(usageFromGemini({ promptTokenCount: 1000, cachedContentTokenCount: 2100, candidatesTokenCount: 8 }), counts(1000, 8, 1000, 0));
  assert.deepEqual(usageFromGemini({}), counts(0, 0, 0, 0));
});

test("Gemini: after @google/genai's automatic continuation, the input is the first hop's prompt", async () => {
  // Two hops of one generateContent, served here as the Gemini API would: the first ends
  // with a continuationToken, so the SDK asks again and merges the two responses, adding
  // their counts up (prompt 2250, cached 2100). The request ctxcc compiled is the first
  // hop's prompt, which the SDK keeps as initialPromptTokenCount.
  const hops = [
    { promptTokenCount: 1000, cachedContentTokenCount: 900, candidatesTokenCount: 200, continuationToken: "t1" },
    { promptTokenCount: 1250, cachedContentTokenCount: 1200, candidatesTokenCount: 30, finishReason: "STOP" },
  ].map(({ continuationToken, finishReason, ...usageMetadata }, i) => ({
    candidates: [{ content: { role: "model", parts: [{ text: `part ${i}` }] }, continuationToken, finishReason }],
    usageMetadata,
  }));
  let served = 0;
  const api = http.createServer((req, res) => {
    req.resume().on("end", () => {
      res.setHeader("content-type", "application/json");
      res.end(JSON.stringify(hops[served++]));
    });
  });
  await new Promise<void>((resolve) => api.listen(0, "127.0.0.1", resolve));
  try {
    const baseUrl = `http://127.0.0.1:${(api.address() as AddressInfo).port}`;
    const genai = new GoogleGenAI({ apiKey: "test", httpOptions: { baseUrl } });
    const response = await genai.models.generateContent({ model: "gemini-3-pro-preview", contents: "hi" });
    assert.equal(served, 2);
    const usage = response.usageMetadata;
    assert.ok(usage);
    assert.equal(usage.promptTokenCount, 2250);
    assert.deepEqual(usageFromGemini(usage), counts(1000, 230, 1000, 0));
  } finally {
    api.close();
  }
});

test("the counts spread into a report request", () => {
  const req = ReportUsageRequest.fromPartial({ compileId: "s1:c1", ...usageFromAnthropic(anthropic) });
  const back = ReportUsageRequest.decode(ReportUsageRequest.encode(req).finish());
  assert.equal(back.compileId, "s1:c1");
  assert.equal(back.inputTokens, 48_322);
  assert.equal(back.cachedInputTokens, 48_000);
  assert.equal(back.outputTokens, 420);
  assert.equal(back.reasoningTokens, 300);
});

// One provider's usage passed to another's mapping does not type-check.
export function wrongProvider(): void {
  // @ts-expect-error OpenAI Chat usage is not Anthropic's
  usageFromAnthropic(chat);
  // @ts-expect-error OpenAI Responses usage is not Anthropic's (its details name reasoning_tokens)
  usageFromAnthropic(responses);
  // @ts-expect-error Anthropic usage is not OpenAI Chat's
  usageFromOpenAIChat(anthropic);
  // @ts-expect-error Anthropic usage is not OpenAI Responses' (its details name thinking_tokens)
  usageFromOpenAIResponses(anthropic);
  // @ts-expect-error OpenAI usage is not Gemini's
  usageFromGemini(chat);
}
