package ctxcc

import (
	"encoding/json"
	"os"
	"reflect"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/ctxcc/ctxcc/client/go/ctxccv1"
)

// geminiResponse is tests/fixtures/client-thinking/gemini-response.json, a Gemini
// generateContent response body: a thought summary, a text part and three parallel
// function calls, the first signed and without id (args with non-ASCII and control
// characters and numbers written in many ways), the second with an id, the third with
// neither.
func geminiResponse(t *testing.T) []byte {
	return thinkingFixture(t, "gemini-response.json")
}

// geminiCall is a call as the test expects it: id ("" when the response gave none), name,
// args parsed with numbers as written, and signature ("" when unsigned).
type geminiCall struct {
	id, name  string
	args      any // numbers as written
	value     any // numbers as float64
	signature string
}

// geminiCalls are the calls of a response's first candidate, read from the JSON on its
// own, not through GeminiResponse.
func geminiCalls(t *testing.T, raw []byte) (texts []string, calls []geminiCall) {
	t.Helper()
	var resp struct {
		Candidates []struct {
			Content struct {
				Parts []map[string]json.RawMessage `json:"parts"`
			} `json:"content"`
		} `json:"candidates"`
	}
	if err := json.Unmarshal(raw, &resp); err != nil {
		t.Fatal(err)
	}
	for _, p := range resp.Candidates[0].Content.Parts {
		var text, signature string
		var thought bool
		_ = json.Unmarshal(p["text"], &text)
		_ = json.Unmarshal(p["thought"], &thought)
		_ = json.Unmarshal(p["thoughtSignature"], &signature)
		if fc, ok := p["functionCall"]; ok {
			var call struct {
				ID   string          `json:"id"`
				Name string          `json:"name"`
				Args json.RawMessage `json:"args"`
			}
			if err := json.Unmarshal(fc, &call); err != nil {
				t.Fatal(err)
			}
			calls = append(calls, geminiCall{call.ID, call.Name, decodeJSON(t, call.Args), jsonValue(t, call.Args), signature})
		} else if text != "" && !thought {
			texts = append(texts, text)
		}
	}
	return texts, calls
}

// checkGeminiEvent checks that m says what the response said: its text parts but the
// thought summary, its calls in order (the response's id where it gave one, else a new
// one unique among the calls; name; args that parse to the response's), and the native
// state: on route, each signed call's id to its signature, nothing for the others.
func checkGeminiEvent(t *testing.T, m *ctxccv1.AssistantMessage, raw []byte, route string) {
	t.Helper()
	texts, calls := geminiCalls(t, raw)
	var gotTexts []string
	for _, p := range m.GetParts() {
		gotTexts = append(gotTexts, p.GetText())
	}
	if !reflect.DeepEqual(gotTexts, texts) {
		t.Errorf("text parts %q, want %q (the thought summary left out)", gotTexts, texts)
	}
	if len(m.GetToolCalls()) != len(calls) {
		t.Fatalf("%d tool calls, want %d", len(m.GetToolCalls()), len(calls))
	}
	seen := map[string]bool{}
	signed := map[string]string{}
	for i, c := range m.GetToolCalls() {
		want := calls[i]
		if want.id != "" && c.GetCallId() != want.id {
			t.Errorf("call %d: id %q, want the response's %q", i, c.GetCallId(), want.id)
		}
		if c.GetCallId() == "" || seen[c.GetCallId()] {
			t.Errorf("call %d: id %q is empty or not unique", i, c.GetCallId())
		}
		seen[c.GetCallId()] = true
		if c.GetName() != want.name || !reflect.DeepEqual(decodeJSON(t, []byte(c.GetArgumentsJson())), want.args) {
			t.Errorf("call %d: %s(%s), want %s(%v)", i, c.GetName(), c.GetArgumentsJson(), want.name, want.args)
		}
		if want.signature != "" {
			signed[c.GetCallId()] = want.signature
		}
	}
	state := m.GetNativeState()
	if state.GetKind() != GeminiThoughtSignatures || state.GetRouteId() != route {
		t.Fatalf("native state kind %q route %q", state.GetKind(), state.GetRouteId())
	}
	var got map[string]string
	if err := json.Unmarshal(state.GetData(), &got); err != nil || !reflect.DeepEqual(got, signed) {
		t.Errorf("native state data %s (%v), want %v", state.GetData(), err, signed)
	}
	if m.GetReasoning() != "" {
		t.Error("the thought summary logged as reasoning (R-MISC-2)")
	}
}

// The event logged for the fixture says what the response said; the ids it makes for the
// calls without one are new on every call of the helper (unique in the session).
func TestAssistantFromGemini(t *testing.T) {
	raw := geminiResponse(t)
	resp := decodeFixture[GeminiResponse](t, raw)
	first := AssistantFromGemini(resp, "r1").GetAssistantMessage()
	checkGeminiEvent(t, first, raw, "r1")
	again := AssistantFromGemini(resp, "r1").GetAssistantMessage()
	for i, c := range again.GetToolCalls() {
		made := first.GetToolCalls()[i].GetCallId()
		if (made == c.GetCallId()) != (i == 1) { // only the second call has the response's id
			t.Errorf("call %d: ids %q and %q of two loggings", i, made, c.GetCallId())
		}
	}
}

// Parallel calls with the API's ids: the signature is the first call's, the second has
// none; a signature on a text part is not logged; args null is {}, an integer past 2^64
// and 1E+2 reach the arguments as written; a response without candidates is an empty
// message without native state.
func TestAssistantFromGeminiWithIDs(t *testing.T) {
	body := `{"candidates": [{"content": {"role": "model", "parts": [
		{"text": "thinking...", "thought": true, "thoughtSignature": "AAAA"},
		{"functionCall": {"id": "fc1", "name": "count", "args": {"n": 123456789012345678901, "e": 1E+2}}, "thoughtSignature": "c2lnLW9uZQ=="},
		{"functionCall": {"id": "fc2", "name": "noop", "args": null}},
		{"inlineData": {"mimeType": "image/png", "data": "iVBORw0KGgo="}},
		{"text": "done", "thoughtSignature": "dGV4dA=="}]}},
		{"content": {"parts": [{"text": "another candidate"}]}}]}`
	var resp GeminiResponse
	if err := json.Unmarshal([]byte(body), &resp); err != nil {
		t.Fatal(err)
	}
	got := AssistantFromGemini(resp, "r2")
	want := &ctxccv1.Event{Payload: &ctxccv1.Event_AssistantMessage{AssistantMessage: &ctxccv1.AssistantMessage{
		Parts: []*ctxccv1.ContentPart{{Part: &ctxccv1.ContentPart_Text{Text: "done"}}},
		ToolCalls: []*ctxccv1.ToolCall{
			{CallId: "fc1", Name: "count", ArgumentsJson: `{"n":123456789012345678901,"e":1E+2}`},
			{CallId: "fc2", Name: "noop", ArgumentsJson: "{}"},
		},
	}}}
	state := got.GetAssistantMessage().GetNativeState()
	var signatures map[string]string
	if err := json.Unmarshal(state.GetData(), &signatures); err != nil ||
		!reflect.DeepEqual(signatures, map[string]string{"fc1": "c2lnLW9uZQ=="}) ||
		state.GetKind() != GeminiThoughtSignatures || state.GetRouteId() != "r2" {
		t.Fatalf("native state %v", state)
	}
	got.GetAssistantMessage().NativeState = nil
	if !proto.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	empty := AssistantFromGemini(GeminiResponse{}, "r2")
	if !isEmptyAssistant(empty) {
		t.Fatalf("no candidates: %v", empty)
	}
}

// Against a real daemon (daemonClient: CTXCC_TARGET, skipped without): the event logged
// for the response, appended with its tools' results under the event's call ids, is
// stored as it was sent, and the Gemini body's model turn holds the response's text, not
// its thought summary, and its calls as functionCall parts, each signed call with its signature and the others with none; a model of another
// route gets no signature. With CTXCC_GEMINI_BODY set, the body is written to that file
// (tests/e2e/test_clients.py checks it against google-genai's types).
func TestAssistantFromGeminiAgainstADaemon(t *testing.T) {
	raw := geminiResponse(t)
	resp := decodeFixture[GeminiResponse](t, raw)
	route := &ctxccv1.Route{Connection: "c", Protocol: "gemini", Endpoint: "api", Model: "gemini-3-pro-preview"}
	d := newDaemonSession(t)
	type part struct {
		FunctionCall *struct {
			ID   string          `json:"id"`
			Name string          `json:"name"`
			Args json.RawMessage `json:"args"`
		} `json:"functionCall"`
		ThoughtSignature *string `json:"thoughtSignature"`
		Text             string  `json:"text"`
	}
	// body is the route's view, and its Gemini body's functionCall parts and model text.
	var modelText []string
	body := func(route *ctxccv1.Route) (*ctxccv1.CompiledView, []part) {
		t.Helper()
		view, text := d.body(route, ctxccv1.RenderFormat_RENDER_FORMAT_GEMINI)
		var parsed struct {
			Contents []struct {
				Role  string `json:"role"`
				Parts []part `json:"parts"`
			} `json:"contents"`
		}
		if err := json.Unmarshal([]byte(text), &parsed); err != nil {
			t.Fatal(err)
		}
		var calls []part
		modelText = nil
		for _, content := range parsed.Contents {
			for _, p := range content.Parts {
				if p.FunctionCall != nil {
					calls = append(calls, p)
				} else if content.Role == "model" && p.Text != "" {
					modelText = append(modelText, p.Text)
				}
			}
		}
		return view, calls
	}
	view, _ := body(route)
	logged := AssistantFromGemini(resp, view.GetRouteId())
	// INVALID_FIELD if the state's data were not call ids to base64.
	d.appendLogged(logged)

	view, parts := body(route)
	texts, calls := geminiCalls(t, raw)
	if !reflect.DeepEqual(modelText, texts) {
		t.Errorf("the model turn's text %q, want %q (no thought summary)", modelText, texts)
	}
	if len(parts) != len(calls) {
		t.Fatalf("functionCall parts %v, want %d", parts, len(calls))
	}
	for i, p := range parts {
		want, id := calls[i], logged.GetAssistantMessage().GetToolCalls()[i].GetCallId()
		// The daemon writes the numbers its own way: the args are compared as values. The
		// body carries no call id (Vertex AI refuses one): the logged event holds it.
		if id == "" || p.FunctionCall.ID != "" || p.FunctionCall.Name != want.name || !reflect.DeepEqual(jsonValue(t, p.FunctionCall.Args), want.value) {
			t.Errorf("functionCall %d: %q %s(%s), want no id (logged %q) %s(%v)", i, p.FunctionCall.ID, p.FunctionCall.Name, p.FunctionCall.Args, id, want.name, want.args)
		}
		got := ""
		if p.ThoughtSignature != nil {
			got = *p.ThoughtSignature
		}
		if got != want.signature || (want.signature == "") != (p.ThoughtSignature == nil) {
			t.Errorf("functionCall %d (%s): thoughtSignature %q, want %q", i, want.name, got, want.signature)
		}
	}
	if out := os.Getenv("CTXCC_GEMINI_BODY"); out != "" {
		if err := os.WriteFile(out, []byte(view.GetRenderings()[0].GetBodyJson()), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// The signatures are the route's: another model's body has none of them; on Gemini 3
	// the step's first call carries the daemon's stand-in instead, the others nothing.
	other := proto.Clone(route).(*ctxccv1.Route)
	other.Model = "gemini-3-flash-preview"
	if _, parts := body(other); len(parts) != len(calls) {
		t.Fatalf("on another model: %v", parts)
	} else {
		for i, p := range parts {
			want := ""
			if i == 0 {
				want = "skip_thought_signature_validator"
			}
			got := ""
			if p.ThoughtSignature != nil {
				got = *p.ThoughtSignature
			}
			if got != want {
				t.Fatalf("on another model: %s has signature %q, want %q", p.FunctionCall.Name, got, want)
			}
		}
	}
}

// jsonValue parses data with numbers as float64: equal for 1E+2 and 100.0.
func jsonValue(t *testing.T, data []byte) any {
	t.Helper()
	var v any
	if err := json.Unmarshal(data, &v); err != nil {
		t.Fatalf("%v: %s", err, data)
	}
	return v
}

func TestAssistantFromGeminiJoinsTextSplitOverParts(t *testing.T) {
	// Gemini may split one text over parts (a signature on the last); a view joins parts
	// with line breaks, so "4" + "2" would read "4\n2". A thought summary or a call stands
	// between texts; an empty part (a signature alone) does not.
	body := `{"candidates": [{"content": {"role": "model", "parts": [
		{"text": "The answer is 4"},
		{"text": "2, as computed."},
		{"text": "", "thoughtSignature": "c2ln"},
		{"text": " Checking it."},
		{"text": "planning the check", "thought": true},
		{"text": "Now the call:"},
		{"functionCall": {"id": "c1", "name": "run", "args": {}}},
		{"text": "After the call."}]}}]}`
	var resp GeminiResponse
	if err := json.Unmarshal([]byte(body), &resp); err != nil {
		t.Fatal(err)
	}
	var texts []string
	for _, p := range AssistantFromGemini(resp, "r1").GetAssistantMessage().GetParts() {
		texts = append(texts, p.GetText())
	}
	want := []string{"The answer is 42, as computed. Checking it.", "Now the call:", "After the call."}
	if !reflect.DeepEqual(texts, want) {
		t.Fatalf("parts %q, want %q", texts, want)
	}
}
