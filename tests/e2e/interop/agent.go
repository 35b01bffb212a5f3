// The scripted agent of the interop suite in Go: the same script as agent.py and agent.ts,
// built in a temp module that requires the client the way its README says. Prints one
// line, `RESULT {json}`, and one, `DELTAS {json}`, for a session on delta views. Ends the
// RESULT part with an Anthropic response with thinking blocks (the file
// CTXCC_ANTHROPIC_RESPONSE), a Gemini response with a signed call (the file
// CTXCC_GEMINI_RESPONSE) and an OpenAI Responses response with reasoning items (the file
// CTXCC_OPENAI_RESPONSE), each logged with the client's helper.
package main

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"sort"
	"strings"
	"time"

	ctxcc "github.com/ctxcc/ctxcc/client/go"
	"github.com/ctxcc/ctxcc/client/go/ctxccv1"
)

var png, _ = hex.DecodeString("89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c489" +
	"0000000d49444154789c63f8cfc0f01f00050001ff89993d1d0000000049454e44ae426082")

func main() {
	out, deltas, err := run(os.Getenv("CTXCC_TARGET"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "agent:", err)
		os.Exit(1)
	}
	line, _ := json.Marshal(out) // map keys come out sorted
	fmt.Println("RESULT " + string(line))
	line, _ = json.Marshal(deltas)
	fmt.Println("DELTAS " + string(line))
}

// thinkingSession logs an Anthropic response with thinking blocks and its tools' results,
// and records the block types of the Anthropic body's assistant turn and whether it starts
// with the response's thinking blocks, unchanged.
func thinkingSession(ctx context.Context, c *ctxcc.Client) map[string]any {
	raw := must(os.ReadFile(os.Getenv("CTXCC_ANTHROPIC_RESPONSE")))
	var msg ctxcc.AnthropicMessage
	must(0, json.Unmarshal(raw, &msg))
	claude := &ctxccv1.Route{Connection: "interop", Protocol: "anthropic-messages", Endpoint: "api", Model: "claude-sonnet-4-5"}
	sid := must(c.CreateSession(ctx, &ctxccv1.Session{})).GetSessionId()
	req := &ctxccv1.CompileRequest{SessionId: sid, Route: claude,
		RenderFormats: []ctxccv1.RenderFormat{ctxccv1.RenderFormat_RENDER_FORMAT_ANTHROPIC_MESSAGES}}
	must(c.Append(ctx, sid, []*ctxccv1.Event{ctxcc.User("Fix the parser bug.")}, ""))
	view := must(c.Compile(ctx, req))
	logged := ctxcc.AssistantFromAnthropic(msg, view.GetRouteId())
	events := []*ctxccv1.Event{logged}
	for _, call := range logged.GetAssistantMessage().GetToolCalls() {
		events = append(events, ctxcc.ToolResult(call.GetCallId(), call.GetName(), "ok", false))
	}
	must(c.Append(ctx, sid, events, ""))
	type blocks struct {
		Content []map[string]any `json:"content"`
	}
	var body struct {
		Messages []struct {
			Role string `json:"role"`
			blocks
		} `json:"messages"`
	}
	must(0, json.Unmarshal([]byte(must(c.Compile(ctx, req)).GetRenderings()[0].GetBodyJson()), &body))
	var response blocks
	must(0, json.Unmarshal(raw, &response))
	var sent []map[string]any
	for _, b := range response.Content {
		if b["type"] == "thinking" || b["type"] == "redacted_thinking" {
			sent = append(sent, b)
		}
	}
	types, leads := []string{}, false
	for _, m := range body.Messages {
		if m.Role == "assistant" {
			for _, b := range m.Content {
				types = append(types, fmt.Sprint(b["type"]))
			}
			leads = len(m.Content) >= len(sent) && reflect.DeepEqual(m.Content[:len(sent)], sent)
			break
		}
	}
	return map[string]any{"thinking_session_id": sid, "thinking": []any{types, leads}}
}

// geminiSession logs a Gemini response with parallel calls, the first signed, and its
// tools' results under the event's call ids, and records the Gemini body's functionCall
// parts: each call's name and thoughtSignature (nil when it has none).
func geminiSession(ctx context.Context, c *ctxcc.Client) map[string]any {
	var resp ctxcc.GeminiResponse
	must(0, json.Unmarshal(must(os.ReadFile(os.Getenv("CTXCC_GEMINI_RESPONSE"))), &resp))
	gemini := &ctxccv1.Route{Connection: "interop", Protocol: "gemini", Endpoint: "api", Model: "gemini-3-pro-preview"}
	sid := must(c.CreateSession(ctx, &ctxccv1.Session{})).GetSessionId()
	req := &ctxccv1.CompileRequest{SessionId: sid, Route: gemini,
		RenderFormats: []ctxccv1.RenderFormat{ctxccv1.RenderFormat_RENDER_FORMAT_GEMINI}}
	must(c.Append(ctx, sid, []*ctxccv1.Event{ctxcc.User("Fix the parser bug.")}, ""))
	view := must(c.Compile(ctx, req))
	logged := ctxcc.AssistantFromGemini(resp, view.GetRouteId())
	events := []*ctxccv1.Event{logged}
	for _, call := range logged.GetAssistantMessage().GetToolCalls() {
		events = append(events, ctxcc.ToolResult(call.GetCallId(), call.GetName(), "ok", false))
	}
	must(c.Append(ctx, sid, events, ""))
	var body struct {
		Contents []struct {
			Parts []struct {
				FunctionCall *struct {
					Name string `json:"name"`
				} `json:"functionCall"`
				ThoughtSignature *string `json:"thoughtSignature"`
			} `json:"parts"`
		} `json:"contents"`
	}
	must(0, json.Unmarshal([]byte(must(c.Compile(ctx, req)).GetRenderings()[0].GetBodyJson()), &body))
	calls := []any{}
	for _, content := range body.Contents {
		for _, p := range content.Parts {
			if p.FunctionCall != nil {
				calls = append(calls, []any{p.FunctionCall.Name, p.ThoughtSignature})
			}
		}
	}
	return map[string]any{"gemini_session_id": sid, "gemini": calls}
}

// openAISession logs an OpenAI Responses response with reasoning items and its tools'
// results, and records the item types of the Responses body's input and whether its
// reasoning items are the one right before its message (id, summary, encrypted content).
func openAISession(ctx context.Context, c *ctxcc.Client) map[string]any {
	raw := must(os.ReadFile(os.Getenv("CTXCC_OPENAI_RESPONSE")))
	var resp ctxcc.OpenAIResponse
	must(0, json.Unmarshal(raw, &resp))
	route := &ctxccv1.Route{Connection: "interop", Protocol: "openai-responses", Endpoint: "api", Model: "o4-mini"}
	sid := must(c.CreateSession(ctx, &ctxccv1.Session{})).GetSessionId()
	req := &ctxccv1.CompileRequest{SessionId: sid, Route: route,
		RenderFormats: []ctxccv1.RenderFormat{ctxccv1.RenderFormat_RENDER_FORMAT_OPENAI_RESPONSES}}
	must(c.Append(ctx, sid, []*ctxccv1.Event{ctxcc.User("Fix the parser bug.")}, ""))
	view := must(c.Compile(ctx, req))
	logged := ctxcc.AssistantFromOpenAIResponses(resp, view.GetRouteId())
	events := []*ctxccv1.Event{logged}
	for _, call := range logged.GetAssistantMessage().GetToolCalls() {
		events = append(events, ctxcc.ToolResult(call.GetCallId(), call.GetName(), "ok", false))
	}
	must(c.Append(ctx, sid, events, ""))
	var body, fixture struct {
		Input  []map[string]any `json:"input"`
		Output []map[string]any `json:"output"`
	}
	must(0, json.Unmarshal([]byte(must(c.Compile(ctx, req)).GetRenderings()[0].GetBodyJson()), &body))
	must(0, json.Unmarshal(raw, &fixture))
	types, sent, sealed := []any{}, []any{}, []any{}
	for _, it := range body.Input {
		types = append(types, it["type"])
		if it["type"] == "reasoning" {
			sent = append(sent, it)
		}
	}
	var leading map[string]any // the last reasoning item before the first message or call
	for _, it := range fixture.Output {
		if it["type"] == "message" || it["type"] == "function_call" {
			break
		}
		if it["type"] == "reasoning" {
			leading = it
		}
	}
	if seal, _ := leading["encrypted_content"].(string); seal != "" {
		sealed = append(sealed, map[string]any{"type": "reasoning", "id": leading["id"], "summary": leading["summary"], "encrypted_content": seal})
	}
	return map[string]any{"openai_session_id": sid, "reasoning": []any{types, reflect.DeepEqual(sent, sealed)}}
}

// deltaSession runs steps on a stream with delta views (a tool registered and a memory
// changed on the way, one delta damaged by the hook) and on one without, and counts the
// views that equal, by digest, the same compile rebuilt whole with a unary Compile.
func deltaSession(ctx context.Context, c *ctxcc.Client, route *ctxccv1.Route) (map[string]any, error) {
	sid := must(c.CreateSession(ctx, &ctxccv1.Session{})).GetSessionId()
	const steps, damageAt = 10, 6
	step := 0
	stream := c.OpenStream(ctx, ctxcc.WithDeltaHook(func(d *ctxccv1.ViewDelta) {
		if step == damageAt && len(d.GetAppendedMessages()) > 0 {
			part := d.GetAppendedMessages()[0].GetParts()[0]
			text := []byte(part.GetText())
			text[0] ^= 1
			part.Part = &ctxccv1.ViewPart_Text{Text: string(text)}
		}
	}))
	plain := c.OpenStream(ctx, ctxcc.WithoutDeltas())
	identical := func(view *ctxccv1.CompiledView) int {
		whole := must(c.Compile(ctx, &ctxccv1.CompileRequest{RebuildCompileId: view.GetCompileId()}))
		if must(ctxcc.ViewDigest(view)) == must(ctxcc.ViewDigest(whole)) {
			return 1
		}
		return 0
	}
	same, plainSame := 0, 0
	var deltaBytes, plainBytes int64 // over the steps both streams take
	pending := []*ctxccv1.Event{ctxcc.User("Start the task.")}
	for step = 0; step < steps; step++ {
		switch step {
		case 3:
			must(c.Tools.RegisterTools(ctx, &ctxccv1.RegisterToolsRequest{SessionId: sid, Tools: []*ctxccv1.ToolDefinition{
				{Name: "list_dir", Description: "Lists a directory.", InputSchemaJson: `{"type":"object"}`,
					Visibility: ctxccv1.ToolVisibility_TOOL_VISIBILITY_DIRECT}}}))
		case 5:
			must(c.Sources.PutMemory(ctx, &ctxccv1.PutMemoryRequest{Memory: &ctxccv1.MemoryEntry{
				MemoryId: "m1", Scope: ctxccv1.Scope_SCOPE_SESSION, ScopeId: sid, Text: "Tests run with make test."}}))
		}
		req := &ctxccv1.CompileRequest{SessionId: sid, Route: route}
		before, plainBefore := stream.Stats().Bytes, plain.Stats().Bytes
		view, _, err := stream.Step(req, pending, "")
		if err != nil {
			return nil, err
		}
		same += identical(view)
		if step >= steps-3 {
			view, _, err = plain.Step(req, nil, "")
			if err != nil {
				return nil, err
			}
			plainSame += identical(view)
			deltaBytes += stream.Stats().Bytes - before
			plainBytes += plain.Stats().Bytes - plainBefore
		}
		pending = []*ctxccv1.Event{ctxcc.Assistant(fmt.Sprintf("Done with part %d.", step)), ctxcc.User(fmt.Sprintf("Now part %d.", step+1))}
	}
	stats, plainStats := stream.Stats(), plain.Stats()
	_, _ = stream.Close(), plain.Close()
	fmt.Fprintf(os.Stderr, "bytes over the last 3 steps: deltas %d, whole views %d\n", deltaBytes, plainBytes)
	return map[string]any{"steps": steps, "identical": same, "whole": stats.Whole, "deltas": stats.Deltas,
		"mismatches": stats.Mismatches, "plain_identical": plainSame, "plain_deltas": plainStats.Deltas,
		"plain_whole": plainStats.Whole, "delta_bytes_smaller": deltaBytes < plainBytes}, nil
}

// compactionSession steps a session over its window (1,500 tokens): two turns of tool
// steps, each view recommending a compaction, with a checkpoint between them that moves the
// range to summarise. It records which deltas kept their base's compaction and counts the
// views that equal, by digest, the same compile rebuilt whole.
func compactionSession(ctx context.Context, c *ctxcc.Client, route *ctxccv1.Route) (map[string]any, error) {
	sid := must(c.CreateSession(ctx, &ctxccv1.Session{})).GetSessionId()
	var chat []*ctxccv1.Event
	for i := 0; i < 12; i++ {
		chat = append(chat, ctxcc.User(fmt.Sprintf("question %d ", i)+strings.Repeat("about the design ", 30)),
			ctxcc.Assistant(fmt.Sprintf("answer %d", i)))
	}
	must(c.Append(ctx, sid, chat, ""))
	kept := []bool{}
	stream := c.OpenStream(ctx, ctxcc.WithDeltaHook(func(d *ctxccv1.ViewDelta) { kept = append(kept, d.GetCompactionKept()) }))
	req := &ctxccv1.CompileRequest{SessionId: sid, Route: route, Limits: &ctxccv1.ModelLimits{ContextWindow: 1500}}
	same, over := 0, 0
	run := func(events ...*ctxccv1.Event) error {
		view, _, err := stream.Step(req, events, "")
		if err != nil {
			return err
		}
		whole := must(c.Compile(ctx, &ctxccv1.CompileRequest{RebuildCompileId: view.GetCompileId()}))
		if must(ctxcc.ViewDigest(view)) == must(ctxcc.ViewDigest(whole)) {
			same++
		}
		if view.GetCompaction().GetPrompt() != "" {
			over++
		}
		return nil
	}
	tools := func(prefix string) error {
		for k := 0; k < 3; k++ {
			id := fmt.Sprintf("%s%d", prefix, k)
			if err := run(ctxcc.ToolCalls("", [3]string{id, "sql", "{}"}), ctxcc.ToolResult(id, "sql", "ok", false)); err != nil {
				return err
			}
		}
		return nil
	}
	if err := tools("a"); err != nil {
		return nil, err
	}
	must(c.Compiles.CreateCheckpoint(ctx, &ctxccv1.CreateCheckpointRequest{
		Checkpoint:        &ctxccv1.Checkpoint{SessionId: sid, CoversThroughSeq: 6, Summary: "Asked three design questions."},
		CoveredDigestMode: ctxccv1.CoveredDigestMode_COVERED_DIGEST_MODE_COMPUTE,
	}))
	if err := run(ctxcc.User("next question " + strings.Repeat("about the layout ", 20))); err != nil {
		return nil, err
	}
	if err := tools("b"); err != nil {
		return nil, err
	}
	stats := stream.Stats()
	_ = stream.Close()
	return map[string]any{"compaction_kept": kept, "compaction_identical": same, "compaction_over": over,
		"compaction_mismatches": stats.Mismatches}, nil
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func run(target string) (out, deltas map[string]any, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%v", r)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := must(ctxcc.Dial(target))
	defer c.Close()
	out = map[string]any{}
	route := &ctxccv1.Route{Connection: "interop", Protocol: "fake", Endpoint: "local", Model: "gpt-4o"}
	session := must(c.CreateSession(ctx, &ctxccv1.Session{}))
	sid := session.GetSessionId()
	out["session_id"] = sid
	scope := ctxccv1.Scope_SCOPE_SESSION

	must(c.Sources.PutMemory(ctx, &ctxccv1.PutMemoryRequest{Memory: &ctxccv1.MemoryEntry{
		MemoryId: "m1", Scope: scope, ScopeId: sid, Text: "The repo uses tabs."}}))
	must(c.Sources.PutRule(ctx, &ctxccv1.PutRuleRequest{Rule: &ctxccv1.Rule{
		RuleId: "r1", Scope: scope, ScopeId: sid, Name: "style", Description: "code style",
		Text: "Prefer small functions.", Activation: ctxccv1.RuleActivation_RULE_ACTIVATION_ON_DEMAND}}))
	must(c.Sources.PutSkill(ctx, &ctxccv1.PutSkillRequest{Skill: &ctxccv1.Skill{
		SkillId: "k1", Scope: scope, ScopeId: sid, Name: "deploy", Description: "Deploys the service.",
		LoadHint: "skills/deploy/SKILL.md", Enabled: true}}))
	out["rule_text"] = must(c.Sources.LoadRule(ctx, &ctxccv1.LoadRuleRequest{SessionId: sid, Name: "style"})).GetRule().GetText()
	counts := func() []int {
		return []int{
			len(must(c.Sources.ListMemory(ctx, &ctxccv1.ListMemoryRequest{Scope: scope, ScopeId: sid})).GetMemories()),
			len(must(c.Sources.ListRules(ctx, &ctxccv1.ListRulesRequest{Scope: scope, ScopeId: sid})).GetRules()),
			len(must(c.Sources.ListSkills(ctx, &ctxccv1.ListSkillsRequest{Scope: scope, ScopeId: sid})).GetSkills()),
		}
	}
	out["sources"] = counts()

	registered := must(c.Tools.RegisterTools(ctx, &ctxccv1.RegisterToolsRequest{SessionId: sid, Tools: []*ctxccv1.ToolDefinition{
		{Name: "read_file", Description: "Reads a file.",
			InputSchemaJson: `{"type":"object","properties":{"path":{"type":"string"}}}`,
			Visibility:      ctxccv1.ToolVisibility_TOOL_VISIBILITY_DIRECT},
		{Name: "deploy_service", Description: "Deploys the service to production.", InputSchemaJson: `{"type":"object"}`,
			Visibility: ctxccv1.ToolVisibility_TOOL_VISIBILITY_DEFERRED, SearchKeywords: []string{"deploy", "release"}},
	}}))
	out["registered"] = registered.GetRegistered()
	var listed []string
	for _, t := range must(c.Tools.ListTools(ctx, &ctxccv1.ListToolsRequest{SessionId: sid})).GetTools() {
		listed = append(listed, t.GetName())
	}
	sort.Strings(listed)
	out["listed_tools"] = listed

	stream := c.OpenStream(ctx)
	req := &ctxccv1.CompileRequest{SessionId: sid, Route: route}
	view, _, err := stream.Step(req, []*ctxccv1.Event{ctxcc.User("Read README.md, then deploy.")}, "")
	if err != nil {
		return nil, nil, err
	}
	var tools []string
	for _, t := range view.GetTools() {
		tools = append(tools, t.GetDefinition().GetName())
	}
	sort.Strings(tools)
	out["view1_tools"] = tools
	var found []string
	for _, t := range must(c.Tools.SearchTools(ctx, &ctxccv1.SearchToolsRequest{SessionId: sid, Query: "deploy", MaxResults: 5})).GetTools() {
		found = append(found, t.GetName())
	}
	out["search"] = found
	lines := make([]string, 40)
	for i := range lines {
		lines[i] = fmt.Sprintf("line %d", i+1)
	}
	view2, _, err := stream.Step(req, []*ctxccv1.Event{
		ctxcc.ToolCalls("", [3]string{"c1", "read_file", `{"path":"README.md"}`}),
		ctxcc.ToolResult("c1", "read_file", strings.Join(lines, "\n"), false),
	}, "")
	if err != nil {
		return nil, nil, err
	}
	// Its usage rides on the next step.
	estimate2 := view2.GetBudget().GetEstimatedInputTokens()
	must(stream.ReportUsage(ctx, &ctxccv1.ReportUsageRequest{CompileId: view2.GetCompileId(), Route: route,
		InputTokens: estimate2 + 10, OutputTokens: 20}))
	read := must(c.Tools.ReadToolResult(ctx, &ctxccv1.ReadToolResultRequest{SessionId: sid, CallId: "c1",
		Read: &ctxccv1.ReadToolResultRequest_Lines{Lines: &ctxccv1.LineRange{Offset: 10, Limit: 3}}}))
	out["slice"] = read.GetSlice().GetText()
	ref := must(c.UploadArtifact(ctx, sid, png, "image/png", 1, 1))
	backRef, back, err := c.DownloadArtifact(ctx, sid, ref.GetArtifactId())
	if err != nil {
		return nil, nil, err
	}
	out["artifact"] = []any{ref.GetSha256(), bytes.Equal(back, png), backRef.GetMimeType()}
	every := &ctxccv1.CompileRequest{SessionId: sid, Route: route, RenderFormats: []ctxccv1.RenderFormat{
		ctxccv1.RenderFormat_RENDER_FORMAT_OPENAI_CHAT, ctxccv1.RenderFormat_RENDER_FORMAT_OPENAI_RESPONSES,
		ctxccv1.RenderFormat_RENDER_FORMAT_ANTHROPIC_MESSAGES, ctxccv1.RenderFormat_RENDER_FORMAT_GEMINI}}
	view, appended, err := stream.Step(every, []*ctxccv1.Event{ctxcc.UserWith("What is in this image?", ref)}, "")
	if err != nil {
		return nil, nil, err
	}
	var formats []int
	for _, r := range view.GetRenderings() {
		formats = append(formats, int(r.GetFormat()))
	}
	sort.Ints(formats)
	out["render_formats"] = formats
	out["step3_append"] = []uint64{appended.GetFirstSeq(), appended.GetLastSeq()}
	out["view3_boundary"] = view.GetEventBoundary()
	carried := stream.LastUsage()
	out["carried_usage"] = []any{carried.GetEstimatedInputTokens() == estimate2, carried.GetErrorTokens(), carried.GetReplayed()}
	out["step3_baseline"] = view.GetBudget().GetBaselineTokens() == estimate2+10
	estimate := view.GetBudget().GetEstimatedInputTokens()
	usage := must(c.ReportUsage(ctx, &ctxccv1.ReportUsageRequest{CompileId: view.GetCompileId(), Route: route,
		InputTokens: estimate + 10, OutputTokens: 20}))
	out["usage_estimate_matches"] = usage.GetEstimatedInputTokens() == estimate
	must(stream.ReportUsage(ctx, &ctxccv1.ReportUsageRequest{CompileId: sid + ":no-such-compile", InputTokens: 5, OutputTokens: 1}))
	_, _, err = stream.Step(req, []*ctxccv1.Event{ctxcc.User("never appended")}, "")
	if e, ok := ctxcc.AsError(err); ok {
		out["refused"] = []any{e.Reason, e.UsageRefused}
	}
	view4, _, err := stream.Step(req, nil, "")
	if err != nil {
		return nil, nil, err
	}
	out["after_refusal"] = []any{view4.GetEventBoundary(), stream.LastUsage() != nil}
	must(stream.ReportUsage(ctx, &ctxccv1.ReportUsageRequest{CompileId: view4.GetCompileId(), InputTokens: estimate, OutputTokens: 20}))
	if err := stream.Close(); err != nil { // sends the report queued last by the unary ReportUsage
		return nil, nil, err
	}
	again := must(c.ReportUsage(ctx, &ctxccv1.ReportUsageRequest{CompileId: view4.GetCompileId(), InputTokens: 1, OutputTokens: 1}))
	out["flushed_at_close"] = again.GetReplayed()

	made := must(c.Compiles.CreateCheckpoint(ctx, &ctxccv1.CreateCheckpointRequest{Checkpoint: &ctxccv1.Checkpoint{
		SessionId: sid, CoversThroughSeq: 3, Summary: "Read README.md with read_file.",
		Kind: ctxccv1.CheckpointKind_CHECKPOINT_KIND_MODEL_SUMMARY, SourceRoute: route}}))
	checkpoints := must(c.Compiles.ListCheckpoints(ctx, &ctxccv1.ListCheckpointsRequest{SessionId: sid}))
	out["checkpoint"] = []uint64{made.GetCheckpoint().GetCoversThroughSeq(), uint64(len(checkpoints.GetCheckpoints()))}
	err = c.Watch(ctx, sid, 3, func(u *ctxccv1.WatchSessionResponse) bool {
		kind := "other"
		if u.GetEvent() != nil {
			kind = "event"
		}
		out["watch_first"] = []any{kind, u.GetEvent().GetSeq()}
		return false
	})
	if err != nil {
		return nil, nil, err
	}
	past := must(c.Compile(ctx, &ctxccv1.CompileRequest{SessionId: sid, Route: route, AsOfSeq: 1}))
	out["time_travel"] = []int{int(past.GetEventBoundary()), len(past.GetMessages())}
	var kinds []string
	for _, e := range must(c.Sessions.ListEvents(ctx, &ctxccv1.ListEventsRequest{SessionId: sid})).GetEvents() {
		switch {
		case e.GetUserMessage() != nil:
			kinds = append(kinds, "user_message")
		case e.GetAssistantMessage() != nil:
			kinds = append(kinds, "assistant_message")
		case e.GetToolResult() != nil:
			kinds = append(kinds, "tool_result")
		default:
			kinds = append(kinds, "other")
		}
	}
	out["events"] = kinds
	out["head_seq"] = must(c.GetSession(ctx, sid)).GetHeadSeq()
	// Text UTF-8 cannot carry (invalid UTF-8, Go's form of a lone surrogate): refused
	// before anything is sent.
	_, badErr := c.Append(ctx, sid, []*ctxccv1.Event{ctxcc.User("bad \xff text")}, "")
	out["lone_surrogate"] = []bool{badErr != nil, must(c.GetSession(ctx, sid)).GetHeadSeq() == 4}

	other := must(c.CreateSession(ctx, &ctxccv1.Session{}))
	must(c.Append(ctx, other.GetSessionId(), []*ctxccv1.Event{ctxcc.User("throwaway")}, ""))
	seen := false
	for _, s := range must(c.Sessions.ListSessions(ctx, &ctxccv1.ListSessionsRequest{PageSize: 100})).GetSessions() {
		seen = seen || s.GetSessionId() == sid
	}
	out["listed_session"] = seen
	out["deleted_events"] = must(c.Sessions.DeleteSession(ctx, &ctxccv1.DeleteSessionRequest{SessionId: other.GetSessionId()})).GetDeletedEvents()

	must(c.Sources.DeleteMemory(ctx, &ctxccv1.DeleteMemoryRequest{Scope: scope, ScopeId: sid, MemoryId: "m1"}))
	must(c.Sources.DeleteRule(ctx, &ctxccv1.DeleteRuleRequest{Scope: scope, ScopeId: sid, RuleId: "r1"}))
	must(c.Sources.DeleteSkill(ctx, &ctxccv1.DeleteSkillRequest{Scope: scope, ScopeId: sid, SkillId: "k1"}))
	out["sources_after_delete"] = counts()
	_, err = c.GetSession(ctx, "no-such-session")
	if e, ok := ctxcc.AsError(err); ok {
		out["missing_reason"] = e.Reason
	}
	for k, v := range thinkingSession(ctx, c) {
		out[k] = v
	}
	for k, v := range geminiSession(ctx, c) {
		out[k] = v
	}
	for k, v := range openAISession(ctx, c) {
		out[k] = v
	}
	deltas, err = deltaSession(ctx, c, route)
	if err != nil {
		return out, deltas, err
	}
	over, err := compactionSession(ctx, c, route)
	for k, v := range over {
		deltas[k] = v
	}
	return out, deltas, err
}
