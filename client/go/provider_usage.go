package ctxcc

import (
	"math"

	"github.com/ctxcc/ctxcc/client/go/ctxccv1"
)

// UsageCounts are the counts of a usage report (ctxccv1.ReportUsageRequest) in ctxcc's
// terms: InputTokens is the whole input the provider read, cached tokens included, and
// OutputTokens all it generated, reasoning included; CachedInputTokens and
// ReasoningTokens are parts of those. The providers count differently; UsageFromAnthropic,
// UsageFromOpenAIChat, UsageFromOpenAIResponses and UsageFromGemini map each one's usage:
//
//	counts := ctxcc.UsageFromAnthropic(ctxcc.AnthropicUsage{
//		InputTokens:              msg.Usage.InputTokens,
//		CacheCreationInputTokens: msg.Usage.CacheCreationInputTokens,
//		CacheReadInputTokens:     msg.Usage.CacheReadInputTokens,
//		OutputTokens:             msg.Usage.OutputTokens,
//	})
//	_, err := stream.ReportUsage(ctx, counts.Request(view.GetCompileId(), route))
//
// The input structs are plain: the client depends on no provider SDK. A count below 0
// maps to 0 and one over 2^32-1 to 2^32-1 (which the daemon refuses as out of range).
type UsageCounts struct {
	InputTokens       uint32
	OutputTokens      uint32
	CachedInputTokens uint32
	ReasoningTokens   uint32
}

// Request is the usage report of these counts for the view compileID (route may be nil:
// the daemon checks it against the compile's route when it is given).
func (u UsageCounts) Request(compileID string, route *ctxccv1.Route) *ctxccv1.ReportUsageRequest {
	return &ctxccv1.ReportUsageRequest{
		CompileId:         compileID,
		Route:             route,
		InputTokens:       u.InputTokens,
		OutputTokens:      u.OutputTokens,
		CachedInputTokens: u.CachedInputTokens,
		ReasoningTokens:   u.ReasoningTokens,
	}
}

// AnthropicUsage is an Anthropic Messages response's usage (Message.usage; when
// streaming, the final message's), field by field.
type AnthropicUsage struct {
	// usage.input_tokens: the input that was neither read from nor written to the prompt
	// cache. Not the whole input once prompt caching is on.
	InputTokens int64
	// usage.cache_creation_input_tokens: input written to the prompt cache.
	CacheCreationInputTokens int64
	// usage.cache_read_input_tokens: input read from the prompt cache.
	CacheReadInputTokens int64
	// usage.output_tokens: all output, thinking included.
	OutputTokens int64
	// usage.output_tokens_details.thinking_tokens: the part of OutputTokens that was
	// reasoning (0 when the response has no output_tokens_details).
	ThinkingTokens int64
}

// UsageFromAnthropic: input = input_tokens + cache_creation_input_tokens +
// cache_read_input_tokens (Anthropic's total input), cached = cache_read_input_tokens,
// output = output_tokens, reasoning = output_tokens_details.thinking_tokens.
func UsageFromAnthropic(u AnthropicUsage) UsageCounts {
	return UsageCounts{
		InputTokens:       tokens(u.InputTokens + u.CacheCreationInputTokens + u.CacheReadInputTokens),
		OutputTokens:      tokens(u.OutputTokens),
		CachedInputTokens: tokens(u.CacheReadInputTokens),
		ReasoningTokens:   tokens(u.ThinkingTokens),
	}
}

// OpenAIChatUsage is an OpenAI Chat Completions response's usage (CompletionUsage), field
// by field.
type OpenAIChatUsage struct {
	// usage.prompt_tokens: the whole input, cached tokens included.
	PromptTokens int64
	// usage.prompt_tokens_details.cached_tokens: the part of PromptTokens read from the cache.
	CachedTokens int64
	// usage.completion_tokens: the whole output, reasoning included.
	CompletionTokens int64
	// usage.completion_tokens_details.reasoning_tokens: the part of CompletionTokens that
	// was reasoning.
	ReasoningTokens int64
}

// UsageFromOpenAIChat: input = prompt_tokens, cached = prompt_tokens_details.cached_tokens,
// output = completion_tokens, reasoning = completion_tokens_details.reasoning_tokens.
func UsageFromOpenAIChat(u OpenAIChatUsage) UsageCounts {
	return UsageCounts{
		InputTokens:       tokens(u.PromptTokens),
		OutputTokens:      tokens(u.CompletionTokens),
		CachedInputTokens: tokens(u.CachedTokens),
		ReasoningTokens:   tokens(u.ReasoningTokens),
	}
}

// OpenAIResponsesUsage is an OpenAI Responses response's usage (ResponseUsage), field by
// field.
type OpenAIResponsesUsage struct {
	// usage.input_tokens: the whole input, cached tokens included.
	InputTokens int64
	// usage.input_tokens_details.cached_tokens: the part of InputTokens read from the cache.
	CachedTokens int64
	// usage.output_tokens: the whole output, reasoning included.
	OutputTokens int64
	// usage.output_tokens_details.reasoning_tokens: the part of OutputTokens that was
	// reasoning.
	ReasoningTokens int64
}

// UsageFromOpenAIResponses: input = input_tokens, cached =
// input_tokens_details.cached_tokens, output = output_tokens, reasoning =
// output_tokens_details.reasoning_tokens.
func UsageFromOpenAIResponses(u OpenAIResponsesUsage) UsageCounts {
	return UsageCounts{
		InputTokens:       tokens(u.InputTokens),
		OutputTokens:      tokens(u.OutputTokens),
		CachedInputTokens: tokens(u.CachedTokens),
		ReasoningTokens:   tokens(u.ReasoningTokens),
	}
}

// GeminiUsage is a Gemini response's usage_metadata (GenerateContentResponseUsageMetadata),
// field by field. Its tool_use_prompt_token_count (the results of tools the provider ran
// during the call, fed back to the model) has no field: it is not part of the request ctxcc
// compiled, and Gemini counts it apart from prompt_token_count.
type GeminiUsage struct {
	// usage_metadata.prompt_token_count: the whole prompt, cached content included.
	PromptTokenCount int64
	// usage_metadata.cached_content_token_count: the part of PromptTokenCount that came
	// from cached content.
	CachedContentTokenCount int64
	// usage_metadata.candidates_token_count: the generated candidates, thoughts not included.
	CandidatesTokenCount int64
	// usage_metadata.thoughts_token_count: the model's thoughts, counted apart from the
	// candidates.
	ThoughtsTokenCount int64
}

// UsageFromGemini: input = prompt_token_count, cached = cached_content_token_count (at
// most the input: a usage merged from several continuation hops adds their counts up),
// output = candidates_token_count + thoughts_token_count, reasoning = thoughts_token_count.
func UsageFromGemini(u GeminiUsage) UsageCounts {
	return UsageCounts{
		InputTokens:       tokens(u.PromptTokenCount),
		OutputTokens:      tokens(u.CandidatesTokenCount + u.ThoughtsTokenCount),
		CachedInputTokens: tokens(min(u.CachedContentTokenCount, u.PromptTokenCount)),
		ReasoningTokens:   tokens(u.ThoughtsTokenCount),
	}
}

// tokens saturates a provider's count into a report's uint32.
func tokens(n int64) uint32 {
	if n <= 0 {
		return 0
	}
	if n > math.MaxUint32 {
		return math.MaxUint32
	}
	return uint32(n)
}
