package ctxcc

import (
	"math"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/ctxcc/ctxcc/client/go/ctxccv1"
)

func TestUsageFromProviders(t *testing.T) {
	cases := []struct {
		name string
		got  UsageCounts
		want UsageCounts
	}{
		{
			// Anthropic's input_tokens leaves the prompt cache out: the whole input adds
			// the cache writes and reads; only the reads are cached tokens.
			"anthropic with cache reads",
			UsageFromAnthropic(AnthropicUsage{InputTokens: 12, CacheCreationInputTokens: 310,
				CacheReadInputTokens: 48000, OutputTokens: 420, ThinkingTokens: 300}),
			UsageCounts{InputTokens: 48322, OutputTokens: 420, CachedInputTokens: 48000, ReasoningTokens: 300},
		},
		{
			"anthropic without caching",
			UsageFromAnthropic(AnthropicUsage{InputTokens: 900, OutputTokens: 40}),
			UsageCounts{InputTokens: 900, OutputTokens: 40},
		},
		{
			"openai chat",
			UsageFromOpenAIChat(OpenAIChatUsage{PromptTokens: 2006, CachedTokens: 1920,
				CompletionTokens: 300, ReasoningTokens: 256}),
			UsageCounts{InputTokens: 2006, OutputTokens: 300, CachedInputTokens: 1920, ReasoningTokens: 256},
		},
		{
			"openai responses",
			UsageFromOpenAIResponses(OpenAIResponsesUsage{InputTokens: 5200, CachedTokens: 4096,
				OutputTokens: 700, ReasoningTokens: 512}),
			UsageCounts{InputTokens: 5200, OutputTokens: 700, CachedInputTokens: 4096, ReasoningTokens: 512},
		},
		{
			// Gemini counts thoughts apart from the candidates: the output adds them.
			"gemini with thoughts",
			UsageFromGemini(GeminiUsage{PromptTokenCount: 1000, CachedContentTokenCount: 800,
				CandidatesTokenCount: 50, ThoughtsTokenCount: 120}),
			UsageCounts{InputTokens: 1000, OutputTokens: 170, CachedInputTokens: 800, ReasoningTokens: 120},
		},
		{
			// Merged continuation hops: the cached counts added up past the prompt.
			"gemini cached over the prompt",
			UsageFromGemini(GeminiUsage{PromptTokenCount: 1000, CachedContentTokenCount: 2100,
				CandidatesTokenCount: 8}),
			UsageCounts{InputTokens: 1000, OutputTokens: 8, CachedInputTokens: 1000},
		},
		{
			"counts out of a report's range saturate",
			UsageFromOpenAIChat(OpenAIChatUsage{PromptTokens: math.MaxUint32 + 5, CompletionTokens: -3}),
			UsageCounts{InputTokens: math.MaxUint32},
		},
	}
	for _, c := range cases {
		if c.got != c.want {
			t.Errorf("%s: got %+v, want %+v", c.name, c.got, c.want)
		}
		// Every mapping gives a report the daemon can accept: cached within the input,
		// reasoning within the output.
		if c.got.CachedInputTokens > c.got.InputTokens || c.got.ReasoningTokens > c.got.OutputTokens {
			t.Errorf("%s: %+v is a report no provider can make", c.name, c.got)
		}
	}
}

func TestUsageCountsRequest(t *testing.T) {
	route := &ctxccv1.Route{Connection: "c", Protocol: "anthropic-messages", Endpoint: "api", Model: "claude-sonnet-4"}
	counts := UsageFromAnthropic(AnthropicUsage{InputTokens: 5, CacheCreationInputTokens: 7,
		CacheReadInputTokens: 11, OutputTokens: 13, ThinkingTokens: 2})
	got := counts.Request("s1:c1", route)
	want := &ctxccv1.ReportUsageRequest{CompileId: "s1:c1", Route: route, InputTokens: 23,
		OutputTokens: 13, CachedInputTokens: 11, ReasoningTokens: 2}
	if !proto.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	if r := counts.Request("s1:c2", nil); r.GetRoute() != nil || r.GetInputTokens() != 23 {
		t.Fatalf("without a route: %v", r)
	}
}
