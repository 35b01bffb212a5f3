/**
 * A provider response's usage, as the counts ctxcc's usage report takes:
 *
 *   const msg = await anthropic.messages.create({ ... });
 *   await stream.reportUsage({ compileId: view.compileId, route, ...usageFromAnthropic(msg.usage) });
 *
 * ctxcc's `inputTokens` is the whole input the provider read, cached tokens included, and
 * `outputTokens` all it generated, reasoning included (`cachedInputTokens` and
 * `reasoningTokens` are parts of those). The providers count differently:
 *
 * - Anthropic Messages: `usage.input_tokens` leaves the prompt cache out; the whole input is
 *   `input_tokens + cache_creation_input_tokens + cache_read_input_tokens`. Reporting
 *   `input_tokens` alone reports a fraction of the input whenever the cache is used, and
 *   every estimate anchored on it is too low.
 * - OpenAI Chat Completions: `prompt_tokens` counts `prompt_tokens_details.cached_tokens`,
 *   `completion_tokens` counts `completion_tokens_details.reasoning_tokens`.
 * - OpenAI Responses: `input_tokens` counts `input_tokens_details.cached_tokens`,
 *   `output_tokens` counts `output_tokens_details.reasoning_tokens`.
 * - Gemini (`@google/genai`'s `usageMetadata`): `promptTokenCount` counts
 *   `cachedContentTokenCount`; the output is `candidatesTokenCount + thoughtsTokenCount`.
 *   `toolUsePromptTokenCount` (results of tools the provider ran during the call, fed back to
 *   the model) is left out: it is not part of the request ctxcc compiled.
 *
 * The parameter types are structural: the SDKs' own usage types (`openai`'s `CompletionUsage`
 * and `ResponseUsage`, `@anthropic-ai/sdk`'s `Usage`, `@google/genai`'s
 * `GenerateContentResponseUsageMetadata`) are assignable to them, and so is the response's
 * JSON. The client depends on none of the SDKs. A field missing or null counts 0.
 */

/** The counts of a usage report (`ReportUsageRequest` without `compileId` and `route`). */
export interface UsageCounts {
  inputTokens: number;
  outputTokens: number;
  cachedInputTokens: number;
  reasoningTokens: number;
}

type Count = number | null | undefined;

/** An Anthropic Messages usage (`Message.usage`; when streaming, the final message's). */
export interface AnthropicUsage {
  /** Input neither read from nor written to the prompt cache. */
  input_tokens?: Count;
  /** Input written to the prompt cache. */
  cache_creation_input_tokens?: Count;
  /** Input read from the prompt cache. */
  cache_read_input_tokens?: Count;
  /** All output, thinking included. */
  output_tokens?: Count;
  /** `thinking_tokens`: the part of `output_tokens` that was reasoning. */
  output_tokens_details?: { thinking_tokens?: Count } | null;
}

/** An OpenAI Chat Completions usage (`CompletionUsage`). */
export interface OpenAIChatUsage {
  /** The whole input, cached tokens included. */
  prompt_tokens?: Count;
  /** The whole output, reasoning included. */
  completion_tokens?: Count;
  prompt_tokens_details?: { cached_tokens?: Count } | null;
  completion_tokens_details?: { reasoning_tokens?: Count } | null;
}

/** An OpenAI Responses usage (`ResponseUsage`). */
export interface OpenAIResponsesUsage {
  /** The whole input, cached tokens included. */
  input_tokens?: Count;
  /** The whole output, reasoning included. */
  output_tokens?: Count;
  input_tokens_details?: { cached_tokens?: Count } | null;
  output_tokens_details?: { reasoning_tokens?: Count } | null;
}

/** A Gemini `usageMetadata` (`@google/genai`'s `GenerateContentResponseUsageMetadata`). */
export interface GeminiUsage {
  /** The whole prompt, cached content included. */
  promptTokenCount?: Count;
  /** The part of `promptTokenCount` that came from cached content. */
  cachedContentTokenCount?: Count;
  /** The generated candidates, thoughts not included. */
  candidatesTokenCount?: Count;
  /** The model's thoughts, counted apart from the candidates. */
  thoughtsTokenCount?: Count;
  /** The first hop's prompt when the SDK merged automatic continuation hops, whose counts it
   * adds up (`promptTokenCount` is then every hop's prompt): the request ctxcc compiled. */
  initialPromptTokenCount?: Count;
}

function n(count: Count): number {
  return count ?? 0;
}

/** input = `input_tokens + cache_creation_input_tokens + cache_read_input_tokens`, cached =
 * `cache_read_input_tokens`, output = `output_tokens`, reasoning =
 * `output_tokens_details.thinking_tokens`. */
export function usageFromAnthropic(usage: AnthropicUsage): UsageCounts {
  const read = n(usage.cache_read_input_tokens);
  return {
    inputTokens: n(usage.input_tokens) + n(usage.cache_creation_input_tokens) + read,
    outputTokens: n(usage.output_tokens),
    cachedInputTokens: read,
    reasoningTokens: n(usage.output_tokens_details?.thinking_tokens),
  };
}

/** input = `prompt_tokens`, cached = `prompt_tokens_details.cached_tokens`, output =
 * `completion_tokens`, reasoning = `completion_tokens_details.reasoning_tokens`. */
export function usageFromOpenAIChat(usage: OpenAIChatUsage): UsageCounts {
  return {
    inputTokens: n(usage.prompt_tokens),
    outputTokens: n(usage.completion_tokens),
    cachedInputTokens: n(usage.prompt_tokens_details?.cached_tokens),
    reasoningTokens: n(usage.completion_tokens_details?.reasoning_tokens),
  };
}

/** input = `input_tokens`, cached = `input_tokens_details.cached_tokens`, output =
 * `output_tokens`, reasoning = `output_tokens_details.reasoning_tokens`. */
export function usageFromOpenAIResponses(usage: OpenAIResponsesUsage): UsageCounts {
  return {
    inputTokens: n(usage.input_tokens),
    outputTokens: n(usage.output_tokens),
    cachedInputTokens: n(usage.input_tokens_details?.cached_tokens),
    reasoningTokens: n(usage.output_tokens_details?.reasoning_tokens),
  };
}

/** input = `promptTokenCount`, or `initialPromptTokenCount` when the SDK merged continuation
 * hops (it adds their counts up: the input is the first hop's prompt), cached =
 * `cachedContentTokenCount` (at most the input), output = `candidatesTokenCount +
 * thoughtsTokenCount`, reasoning = `thoughtsTokenCount`. */
export function usageFromGemini(usage: GeminiUsage): UsageCounts {
  const prompt = n(usage.initialPromptTokenCount) || n(usage.promptTokenCount);
  const thoughts = n(usage.thoughtsTokenCount);
  return {
    inputTokens: prompt,
    outputTokens: n(usage.candidatesTokenCount) + thoughts,
    cachedInputTokens: Math.min(n(usage.cachedContentTokenCount), prompt),
    reasoningTokens: thoughts,
  };
}
