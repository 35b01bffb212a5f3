package ctxcc

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/ctxcc/ctxcc/client/go/ctxccv1"
)

// anthropicResponse is tests/fixtures/client-thinking/anthropic-response.json, an
// Anthropic Messages response body: thinking, redacted_thinking, an empty and a non-empty
// text block, and two tool_use blocks, one with non-ASCII and control characters and
// numbers written in many ways (1.0, 1E+2, -0.0, 5e-324, 2^53-1, index-like keys).
func anthropicResponse(t *testing.T) []byte {
	return thinkingFixture(t, "anthropic-response.json")
}

// decodeFixture is a provider response's JSON decoded into the helper's own type.
func decodeFixture[T any](t *testing.T, raw []byte) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

// isEmptyAssistant is whether ev is an assistant message holding nothing (what a helper
// gives for a response without output).
func isEmptyAssistant(ev *ctxccv1.Event) bool {
	return proto.Equal(ev, &ctxccv1.Event{Payload: &ctxccv1.Event_AssistantMessage{AssistantMessage: &ctxccv1.AssistantMessage{}}})
}

// thinkingFixture is the file name of tests/fixtures/client-thinking, the provider
// responses all three clients' helpers are tested with.
func thinkingFixture(t *testing.T, name string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "tests", "fixtures", "client-thinking", name))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// decodeJSON parses data with numbers kept as written (json.Number), so that two values
// are equal only when they hold the same keys, items and number text.
func decodeJSON(t *testing.T, data []byte) any {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("%v: %s", err, data)
	}
	return v
}

// The event logged for a response says what the response said: its non-empty text blocks
// as the text parts, its tool_use blocks as the calls (id, name, and arguments that parse
// to the input), and its thinking blocks, whole and in the response's order, as the native
// state's data on the route given. The expectations come from the response parsed on its
// own, not through AnthropicMessage.
func TestAssistantFromAnthropic(t *testing.T) {
	raw := anthropicResponse(t)
	msg := decodeFixture[AnthropicMessage](t, raw)
	m := AssistantFromAnthropic(msg, "r1").GetAssistantMessage()

	var texts []string
	var calls [][3]any
	var blocks []any
	for _, b := range decodeJSON(t, raw).(map[string]any)["content"].([]any) {
		block := b.(map[string]any)
		switch block["type"] {
		case "text":
			if block["text"] != "" {
				texts = append(texts, block["text"].(string))
			}
		case "tool_use":
			calls = append(calls, [3]any{block["id"], block["name"], block["input"]})
		case "thinking", "redacted_thinking":
			blocks = append(blocks, block)
		}
	}
	if len(texts) != 1 || len(calls) != 2 || len(blocks) != 2 {
		t.Fatalf("the fixture changed: %d texts, %d calls, %d thinking blocks", len(texts), len(calls), len(blocks))
	}

	var gotTexts []string
	for _, p := range m.GetParts() {
		gotTexts = append(gotTexts, p.GetText())
	}
	if !reflect.DeepEqual(gotTexts, texts) {
		t.Errorf("text parts %q, want %q", gotTexts, texts)
	}
	var gotCalls [][3]any
	for _, c := range m.GetToolCalls() {
		gotCalls = append(gotCalls, [3]any{c.GetCallId(), c.GetName(), decodeJSON(t, []byte(c.GetArgumentsJson()))})
	}
	if !reflect.DeepEqual(gotCalls, calls) {
		t.Errorf("tool calls %v, want %v", gotCalls, calls)
	}
	state := m.GetNativeState()
	if state.GetKind() != AnthropicThinking || state.GetRouteId() != "r1" {
		t.Fatalf("native state kind %q route %q", state.GetKind(), state.GetRouteId())
	}
	if got := decodeJSON(t, state.GetData()); !reflect.DeepEqual(got, blocks) {
		t.Errorf("native state data %s, want the response's blocks %v", state.GetData(), blocks)
	}
	if m.GetReasoning() != "" {
		t.Error("thinking text logged as reasoning (R-MISC-2)")
	}
}

func TestAssistantFromAnthropicWithoutThinking(t *testing.T) {
	// A block type the helper does not use, whose fields of the names it reads hold other
	// things, neither fails the decoding nor reaches the event; a null input is {}; an
	// integer past 2^64 and 1E+2 reach the arguments as the model wrote them.
	body := `{"id": "msg_1", "type": "message", "role": "assistant", "content": [
		{"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "x"}},
		{"type": "future_block", "text": {"nested": true}, "data": [1, 2]},
		{"type": "text", "text": "done"},
		{"type": "tool_use", "id": "toolu_1", "name": "noop", "input": null},
		{"type": "tool_use", "id": "toolu_2", "name": "count", "input": {"n": 123456789012345678901, "e": 1E+2}}]}`
	var msg AnthropicMessage
	if err := json.Unmarshal([]byte(body), &msg); err != nil {
		t.Fatal(err)
	}
	got := AssistantFromAnthropic(msg, "r1")
	want := &ctxccv1.Event{Payload: &ctxccv1.Event_AssistantMessage{AssistantMessage: &ctxccv1.AssistantMessage{
		Parts: []*ctxccv1.ContentPart{{Part: &ctxccv1.ContentPart_Text{Text: "done"}}},
		ToolCalls: []*ctxccv1.ToolCall{
			{CallId: "toolu_1", Name: "noop", ArgumentsJson: "{}"},
			{CallId: "toolu_2", Name: "count", ArgumentsJson: `{"n":123456789012345678901,"e":1E+2}`},
		},
	}}}
	if !proto.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	// Built by hand: an input that is not JSON is logged as it is (the daemon judges it).
	hand := AnthropicMessage{Content: []AnthropicContentBlock{
		{Type: "tool_use", ID: "toolu_2", Name: "noop", Input: json.RawMessage(`{"a": `)},
	}}
	if a := AssistantFromAnthropic(hand, "r1").GetAssistantMessage().GetToolCalls()[0].GetArgumentsJson(); a != `{"a": ` {
		t.Fatalf("arguments %q", a)
	}
}

func TestAssistantFromAnthropicJoinsAdjacentText(t *testing.T) {
	// Claude splits a text at each citation; a view joins parts with line breaks, so the
	// adjacent blocks are one part. Text on either side of a call or a thinking block is not
	// adjacent: it stays apart.
	body := `{"content": [
		{"type": "text", "text": "The latest release is "},
		{"type": "text", "text": "Python 3.14.1", "citations": [{"type": "web_search_result_location", "url": "https://python.org", "title": "Python", "encrypted_index": "Eo8B", "cited_text": "3.14.1"}]},
		{"type": "text", "text": ""},
		{"type": "text", "text": ". I'll save it."},
		{"type": "tool_use", "id": "toolu_1", "name": "save", "input": {}},
		{"type": "text", "text": "Saved."},
		{"type": "thinking", "thinking": "t", "signature": "s"},
		{"type": "text", "text": "Done."},
		{"type": "tool_use", "id": "toolu_2", "name": "save", "input": {}},
		{"type": "text", "text": ""},
		{"type": "text", "text": "After."}]}`
	var msg AnthropicMessage
	if err := json.Unmarshal([]byte(body), &msg); err != nil {
		t.Fatal(err)
	}
	var texts []string
	for _, p := range AssistantFromAnthropic(msg, "r1").GetAssistantMessage().GetParts() {
		texts = append(texts, p.GetText())
	}
	// An empty block after a call joins nothing across the call.
	if want := []string{"The latest release is Python 3.14.1. I'll save it.", "Saved.", "Done.", "After."}; !reflect.DeepEqual(texts, want) {
		t.Fatalf("parts %q, want %q", texts, want)
	}
}

// Against a real daemon (daemonClient: CTXCC_TARGET, skipped without): the event logged
// for the response, appended with its tools' results, is stored as it was sent, and the
// Anthropic body leads the assistant turn with the response's thinking blocks, unchanged,
// and carries its text and tool calls; a model of another route gets no block.
func TestAssistantFromAnthropicAgainstADaemon(t *testing.T) {
	raw := anthropicResponse(t)
	msg := decodeFixture[AnthropicMessage](t, raw)
	route := &ctxccv1.Route{Connection: "c", Protocol: "anthropic-messages", Endpoint: "api", Model: "claude-sonnet-4-5"}
	d := newDaemonSession(t)
	body := func(route *ctxccv1.Route) (*ctxccv1.CompiledView, []anthropicTurn) {
		t.Helper()
		view, text := d.body(route, ctxccv1.RenderFormat_RENDER_FORMAT_ANTHROPIC_MESSAGES)
		var parsed struct {
			Messages []anthropicTurn `json:"messages"`
		}
		if err := json.Unmarshal([]byte(text), &parsed); err != nil {
			t.Fatal(err)
		}
		var turns []anthropicTurn
		for _, m := range parsed.Messages {
			if m.Role == "assistant" {
				turns = append(turns, m)
			}
		}
		return view, turns
	}
	view, _ := body(route)
	// INVALID_FIELD if the state's data were not the blocks.
	d.appendLogged(AssistantFromAnthropic(msg, view.GetRouteId()))

	var response struct {
		Content []map[string]any `json:"content"`
	}
	if err := json.Unmarshal(raw, &response); err != nil {
		t.Fatal(err)
	}
	var sent []map[string]any
	var calls []string
	for _, b := range response.Content {
		switch b["type"] {
		case "thinking", "redacted_thinking":
			sent = append(sent, b)
		case "tool_use":
			calls = append(calls, fmt.Sprint(b["id"], " ", b["name"]))
		}
	}
	_, turns := body(route)
	if len(turns) != 1 || len(turns[0].Content) != len(sent)+1+len(calls) {
		t.Fatalf("assistant turns %v", turns)
	}
	turn := turns[0].Content
	if !reflect.DeepEqual(turn[:len(sent)], sent) {
		t.Fatalf("the turn starts with %v, not the response's blocks %v", turn[:len(sent)], sent)
	}
	if turn[len(sent)]["type"] != "text" || turn[len(sent)]["text"] != msg.Content[3].Text {
		t.Fatalf("text block %v", turn[len(sent)])
	}
	for i, want := range calls {
		if b := turn[len(sent)+1+i]; fmt.Sprint(b["id"], " ", b["name"]) != want || b["type"] != "tool_use" {
			t.Fatalf("tool_use block %v, want %s", b, want)
		}
	}
	// The signatures are the route's: another model's body has no block.
	other := proto.Clone(route).(*ctxccv1.Route)
	other.Model = "claude-haiku-4-5"
	if _, turns := body(other); len(turns) != 1 || turns[0].Content[0]["type"] != "text" {
		t.Fatalf("on another model: %v", turns)
	}
}

// anthropicTurn is a message of an Anthropic request body.
type anthropicTurn struct {
	Role    string           `json:"role"`
	Content []map[string]any `json:"content"`
}

// daemonSession is a session on a real daemon (daemonClient: CTXCC_TARGET, skipped
// without) opened by a user message, for the provider helpers' tests.
type daemonSession struct {
	t   *testing.T
	c   *Client
	ctx context.Context
	sid string
}

func newDaemonSession(t *testing.T) *daemonSession {
	t.Helper()
	c := daemonClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	session, err := c.CreateSession(ctx, &ctxccv1.Session{})
	if err != nil {
		t.Fatal(err)
	}
	d := &daemonSession{t, c, ctx, session.GetSessionId()}
	if _, err := c.Append(ctx, d.sid, []*ctxccv1.Event{User("fix the parser bug")}, ""); err != nil {
		t.Fatal(err)
	}
	return d
}

// body is the session's view on route and its body rendered in format.
func (d *daemonSession) body(route *ctxccv1.Route, format ctxccv1.RenderFormat) (*ctxccv1.CompiledView, string) {
	d.t.Helper()
	view, err := d.c.Compile(d.ctx, &ctxccv1.CompileRequest{SessionId: d.sid, Route: route,
		RenderFormats: []ctxccv1.RenderFormat{format}})
	if err != nil {
		d.t.Fatal(err)
	}
	return view, view.GetRenderings()[0].GetBodyJson()
}

// appendLogged appends the event a helper logged, with a result for each of its calls,
// and checks the daemon stored the message as it was sent.
func (d *daemonSession) appendLogged(logged *ctxccv1.Event) {
	d.t.Helper()
	events := []*ctxccv1.Event{logged}
	for _, call := range logged.GetAssistantMessage().GetToolCalls() {
		events = append(events, ToolResult(call.GetCallId(), call.GetName(), "ok", false))
	}
	if _, err := d.c.Append(d.ctx, d.sid, events, ""); err != nil {
		d.t.Fatal(err)
	}
	stored, err := d.c.Sessions.ListEvents(d.ctx, &ctxccv1.ListEventsRequest{SessionId: d.sid})
	if err != nil {
		d.t.Fatal(err)
	}
	if got := stored.GetEvents()[1].GetAssistantMessage(); !proto.Equal(got, logged.GetAssistantMessage()) {
		d.t.Fatalf("stored %v, sent %v", got, logged.GetAssistantMessage())
	}
}
