package ctxcc

import (
	"encoding/json"
	"os"
	"reflect"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/ctxcc/ctxcc/client/go/ctxccv1"
)

// openAIResponse is tests/fixtures/client-thinking/openai-response.json, a Responses API
// response body: a reasoning item with its encrypted content and one without, a message
// of two output_text parts, two function calls (arguments with numbers and escapes as the
// model wrote them) and a web search call between them.
func openAIResponse(t *testing.T) []byte {
	return thinkingFixture(t, "openai-response.json")
}

// openAIExpected is what the fixture says, read from its JSON on its own, not through
// OpenAIResponse: the message's text, the calls, and what is logged of its reasoning: the
// item right before its first message or call, when sealed, as the daemon takes it back
// (type, id, summary, encrypted_content).
func openAIExpected(t *testing.T, raw []byte) (text string, calls [][3]string, sealed []any) {
	t.Helper()
	var resp struct {
		Output []map[string]any `json:"output"`
	}
	if err := json.Unmarshal(raw, &resp); err != nil {
		t.Fatal(err)
	}
	var leading map[string]any
	for _, it := range resp.Output {
		switch it["type"] {
		case "message":
			for _, c := range it["content"].([]any) {
				text += c.(map[string]any)["text"].(string)
			}
		case "function_call":
			calls = append(calls, [3]string{it["call_id"].(string), it["name"].(string), it["arguments"].(string)})
		case "reasoning":
			if text == "" && calls == nil {
				leading = it
			}
		}
	}
	if seal, ok := leading["encrypted_content"].(string); ok && seal != "" {
		sealed = []any{map[string]any{"type": "reasoning", "id": leading["id"], "summary": leading["summary"], "encrypted_content": seal}}
	}
	return text, calls, sealed
}

// The event logged for the fixture says what the response said: its message's text as one
// part, its calls with their arguments as written, and the reasoning item right before its
// message alone as the native state on the route given (no raw reasoning text, no status,
// nothing of the unsealed item before it, the item after the first call or the web search
// call).
func TestAssistantFromOpenAIResponses(t *testing.T) {
	raw := openAIResponse(t)
	resp := decodeFixture[OpenAIResponse](t, raw)
	m := AssistantFromOpenAIResponses(resp, "r1").GetAssistantMessage()
	text, calls, sealed := openAIExpected(t, raw)
	if len(m.GetParts()) != 1 || m.GetParts()[0].GetText() != text {
		t.Errorf("parts %v, want one of %q", m.GetParts(), text)
	}
	var got [][3]string
	for _, c := range m.GetToolCalls() {
		got = append(got, [3]string{c.GetCallId(), c.GetName(), c.GetArgumentsJson()})
	}
	if !reflect.DeepEqual(got, calls) {
		t.Errorf("calls %q, want %q", got, calls)
	}
	state := m.GetNativeState()
	if state.GetKind() != OpenAIReasoning || state.GetRouteId() != "r1" {
		t.Fatalf("native state kind %q route %q", state.GetKind(), state.GetRouteId())
	}
	var data any
	if err := json.Unmarshal(state.GetData(), &data); err != nil || !reflect.DeepEqual(data, any(sealed)) {
		t.Errorf("native state data %s (%v), want %v", state.GetData(), err, sealed)
	}
	if m.GetReasoning() != "" {
		t.Error("reasoning logged as text (R-MISC-2)")
	}
	// The item right before the message has no seal: no native state (the sealed one
	// before it is not sent in its place); no output: an empty message.
	swapped := append([]OpenAIOutputItem{resp.Output[1], resp.Output[0]}, resp.Output[2:]...)
	if plain := AssistantFromOpenAIResponses(OpenAIResponse{Output: swapped}, "r1"); plain.GetAssistantMessage().GetNativeState() != nil {
		t.Errorf("state without a sealed item right before the message: %v", plain)
	}
	empty := AssistantFromOpenAIResponses(OpenAIResponse{}, "r1")
	if !isEmptyAssistant(empty) {
		t.Fatalf("no output: %v", empty)
	}
}

// Against a real daemon (daemonClient: CTXCC_TARGET, skipped without): the event logged
// for the response, appended with its tools' results, is stored as it was sent, and the
// Responses body leads the message and the calls with the reasoning item logged; another
// model's body has
// none. With CTXCC_OPENAI_BODY set, the body is written to that file
// (tests/e2e/test_clients.py checks it against the openai SDK's types).
func TestAssistantFromOpenAIResponsesAgainstADaemon(t *testing.T) {
	raw := openAIResponse(t)
	resp := decodeFixture[OpenAIResponse](t, raw)
	route := &ctxccv1.Route{Connection: "c", Protocol: "openai-responses", Endpoint: "api", Model: "o4-mini"}
	d := newDaemonSession(t)
	// items is the route's view and its Responses body's input items.
	items := func(route *ctxccv1.Route) (*ctxccv1.CompiledView, []map[string]any) {
		t.Helper()
		view, text := d.body(route, ctxccv1.RenderFormat_RENDER_FORMAT_OPENAI_RESPONSES)
		var parsed struct {
			Input []map[string]any `json:"input"`
		}
		if err := json.Unmarshal([]byte(text), &parsed); err != nil {
			t.Fatal(err)
		}
		return view, parsed.Input
	}
	view, _ := items(route)
	// INVALID_FIELD if the state's data were not sealed reasoning items.
	d.appendLogged(AssistantFromOpenAIResponses(resp, view.GetRouteId()))
	view, input := items(route)
	_, calls, sealed := openAIExpected(t, raw)
	var kinds []string
	var reasoning []any
	for _, it := range input {
		kinds = append(kinds, it["type"].(string))
		if it["type"] == "reasoning" {
			reasoning = append(reasoning, it)
		}
	}
	want := []string{"message", "reasoning", "message", "function_call", "function_call", "function_call_output", "function_call_output"}
	if !reflect.DeepEqual(kinds, want) || !reflect.DeepEqual(reasoning, sealed) {
		t.Fatalf("input items %v (reasoning %v), want %v (reasoning %v)", kinds, reasoning, want, sealed)
	}
	if input[3]["call_id"] != calls[0][0] || input[4]["call_id"] != calls[1][0] {
		t.Errorf("calls %v %v, want %v", input[3], input[4], calls)
	}
	if out := os.Getenv("CTXCC_OPENAI_BODY"); out != "" {
		if err := os.WriteFile(out, []byte(view.GetRenderings()[0].GetBodyJson()), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// The items are the route's model's: another model's body has none of them.
	other := proto.Clone(route).(*ctxccv1.Route)
	other.Model = "gpt-5"
	if _, input := items(other); len(input) != len(want)-1 {
		t.Fatalf("on another model: %v", input)
	}
}
