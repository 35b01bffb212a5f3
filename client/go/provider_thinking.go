package ctxcc

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"

	"github.com/ctxcc/ctxcc/client/go/ctxccv1"
)

// AnthropicThinking is the native state kind of Claude's thinking blocks (see
// AssistantFromAnthropic).
const AnthropicThinking = "anthropic.thinking"

// AnthropicMessage is an Anthropic Messages response (the API's Message), as much of it as
// AssistantFromAnthropic reads: json.Unmarshal of the response body fills it (with
// anthropic-sdk-go, of msg.RawJSON()).
type AnthropicMessage struct {
	// content: the response's blocks, in their order.
	Content []AnthropicContentBlock `json:"content"`
}

// AnthropicContentBlock is one block of a response's content, the fields of the block
// types AssistantFromAnthropic uses. A block of another type (server_tool_use,
// web_search_tool_result, ...) decodes to its Type alone and is left out of the event.
type AnthropicContentBlock struct {
	// type: "text", "thinking", "redacted_thinking", "tool_use", or another one.
	Type string `json:"type"`
	// text (text blocks).
	Text string `json:"text,omitempty"`
	// thinking and signature (thinking blocks).
	Thinking  string `json:"thinking,omitempty"`
	Signature string `json:"signature,omitempty"`
	// data (redacted_thinking blocks).
	Data string `json:"data,omitempty"`
	// id, name and input (tool_use blocks): input is the JSON the model produced.
	ID    string          `json:"id,omitempty"`
	Name  string          `json:"name,omitempty"`
	Input json.RawMessage `json:"input,omitempty"`
}

// UnmarshalJSON reads a block's fields only when its type is one AssistantFromAnthropic
// uses: a block type added to the API later, whose fields of these names may hold
// something else, does not fail the decoding of the whole response.
func (b *AnthropicContentBlock) UnmarshalJSON(data []byte) error {
	type plain AnthropicContentBlock // without this method
	p, kind, err := decodeKnown[plain](data, "text", "thinking", "redacted_thinking", "tool_use")
	*b = AnthropicContentBlock(p)
	b.Type = kind
	return err
}

// decodeKnown decodes a JSON object of a provider's response into T when its "type" is one
// of known, and answers T's zero value otherwise, with the type either way.
func decodeKnown[T any](data []byte, known ...string) (T, string, error) {
	var head struct {
		Type string `json:"type"`
	}
	var out T
	if err := json.Unmarshal(data, &head); err != nil {
		return out, "", err
	}
	for _, k := range known {
		if head.Type == k {
			err := json.Unmarshal(data, &out)
			return out, head.Type, err
		}
	}
	return out, head.Type, nil
}

// AssistantFromAnthropic is the assistant event to log for an Anthropic Messages
// response. Its text blocks become the message's text parts (adjacent ones, as Claude
// splits a text at each citation, one part: a view joins parts with line breaks), its
// tool_use blocks its tool
// calls (CallId = id, Name = name, ArgumentsJson = input), and its thinking /
// redacted_thinking blocks, unchanged and in order, its native state of kind
// AnthropicThinking on routeID (the compiled view's RouteId, the route the request went
// to). With extended thinking on, the API refuses a tool loop whose assistant turn does
// not start with those blocks; the daemon's Anthropic body puts them back at the head of
// their turn, on that route only and only in the turn that made them. The thinking text is
// not logged as reasoning: the model gets it back through the blocks, and no other route
// may see it (R-MISC-2).
//
// The state's data is the blocks as a JSON array ({type, thinking, signature} and {type,
// data}); each call's arguments are the input's JSON as the response held it, compacted
// (numbers and keys as the model wrote them). A missing or null input is {}; an input that
// is not JSON (a block built by hand) is logged as it is, for the daemon to judge.
func AssistantFromAnthropic(msg AnthropicMessage, routeID string) *ctxccv1.Event {
	m := &ctxccv1.AssistantMessage{}
	var thinking []any
	afterText := false // the previous block was text: this one continues its part
	for _, b := range msg.Content {
		if b.Type == "text" {
			// An empty block adds nothing and joins nothing: across it, text stays apart or
			// together as it was.
			if b.Text != "" {
				addText(m, b.Text, afterText)
				afterText = true
			}
			continue
		}
		afterText = false
		switch b.Type {
		case "tool_use":
			m.ToolCalls = append(m.ToolCalls, &ctxccv1.ToolCall{CallId: b.ID, Name: b.Name, ArgumentsJson: toolInput(b.Input)})
		case "thinking":
			thinking = append(thinking, thinkingBlock{b.Type, b.Thinking, b.Signature})
		case "redacted_thinking":
			thinking = append(thinking, redactedThinkingBlock{b.Type, b.Data})
		}
	}
	if thinking != nil {
		m.NativeState = &ctxccv1.ProviderNativeState{RouteId: routeID, Kind: AnthropicThinking, Data: marshalJSON(thinking)}
	}
	return &ctxccv1.Event{Payload: &ctxccv1.Event_AssistantMessage{AssistantMessage: m}}
}

// thinkingBlock and redactedThinkingBlock are the blocks as the API takes them back: every
// field written, an empty one too (the daemon refuses a block without its fields).
type thinkingBlock struct {
	Type      string `json:"type"`
	Thinking  string `json:"thinking"`
	Signature string `json:"signature"`
}

type redactedThinkingBlock struct {
	Type string `json:"type"`
	Data string `json:"data"`
}

// marshalJSON is v's JSON, with <, > and & as they are (the thinking text stays readable
// in the log).
func marshalJSON(v any) []byte {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v) // strings only: cannot fail
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}

// toolInput is a tool_use input's JSON, compacted; none (or null) is {}.
func toolInput(raw json.RawMessage) string {
	trimmed := bytes.TrimSpace(raw)
	if len(trimmed) == 0 || string(trimmed) == "null" {
		return "{}"
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, trimmed); err != nil {
		return string(raw)
	}
	return buf.String()
}

// GeminiThoughtSignatures is the native state kind of Gemini's thought signatures (see
// AssistantFromGemini).
const GeminiThoughtSignatures = "gemini.thought_signatures"

// GeminiResponse is a Gemini generateContent response (the REST API's
// GenerateContentResponse, camelCase), as much of it as AssistantFromGemini reads:
// json.Unmarshal of the response body fills it.
type GeminiResponse struct {
	// candidates: the first one is the answer logged.
	Candidates []GeminiCandidate `json:"candidates"`
}

// GeminiCandidate is one candidate of a response.
type GeminiCandidate struct {
	Content GeminiContent `json:"content"`
}

// GeminiContent is a candidate's content: its parts, in their order.
type GeminiContent struct {
	Parts []GeminiPart `json:"parts"`
}

// GeminiPart is one part of a candidate's content, the fields AssistantFromGemini uses;
// a part of another kind (inlineData, executableCode, ...) decodes to none of them and is
// left out of the event.
type GeminiPart struct {
	// text, and thought: true when it is a thought summary (not logged: R-MISC-2).
	Text    string `json:"text,omitempty"`
	Thought bool   `json:"thought,omitempty"`
	// functionCall: a call of one of the request's tools.
	FunctionCall *GeminiFunctionCall `json:"functionCall,omitempty"`
	// thoughtSignature: base64, on the first function call of each step Gemini 3 makes.
	ThoughtSignature string `json:"thoughtSignature,omitempty"`
}

// GeminiFunctionCall is a part's functionCall: id (the API may give none), name, and args,
// the JSON object the model produced.
type GeminiFunctionCall struct {
	ID   string          `json:"id,omitempty"`
	Name string          `json:"name"`
	Args json.RawMessage `json:"args,omitempty"`
}

// AssistantFromGemini is the assistant event to log for a Gemini generateContent
// response. Its first candidate's text parts become the message's text parts (thought
// summaries, thought: true, are left out: R-MISC-2), its functionCall parts its tool calls
// (CallId = the call's id, or a new unique one when the API gave none: log the tools'
// results under the ids the event holds; ArgumentsJson = args), and the calls' thought
// signatures its native state of kind GeminiThoughtSignatures on routeID (the compiled
// view's RouteId), with data the JSON object from each signed call's CallId to its
// signature. Gemini 3 refuses a tool loop whose signed call comes back without its
// signature; the daemon's Gemini body puts each back on its call, on that route only and
// only in the turn that made it.
//
// Each call's arguments are args as the response held it, compacted (a missing or null
// args is {}). A signature on a part other than a call is not logged: the daemon has no
// place to send it back.
func AssistantFromGemini(resp GeminiResponse, routeID string) *ctxccv1.Event {
	m := &ctxccv1.AssistantMessage{}
	signatures := map[string]string{}
	var parts []GeminiPart
	if len(resp.Candidates) > 0 {
		parts = resp.Candidates[0].Content.Parts
	}
	afterText := false // the previous part was text: this one continues its part
	for _, p := range parts {
		switch {
		case p.FunctionCall != nil:
			afterText = false
			call := p.FunctionCall
			id := call.ID
			if id == "" {
				id = newCallID()
			}
			m.ToolCalls = append(m.ToolCalls, &ctxccv1.ToolCall{CallId: id, Name: call.Name, ArgumentsJson: toolInput(call.Args)})
			if p.ThoughtSignature != "" {
				signatures[id] = p.ThoughtSignature
			}
		case p.Thought:
			afterText = false // a thought summary, left out, stands between texts
		case p.Text != "":
			// Gemini may split one text over parts (a signature on the last): one part here,
			// since a view joins parts with line breaks.
			addText(m, p.Text, afterText)
			afterText = true
		}
		// An empty part (a signature alone) joins nothing and breaks nothing.
	}
	if len(signatures) > 0 {
		m.NativeState = &ctxccv1.ProviderNativeState{RouteId: routeID, Kind: GeminiThoughtSignatures, Data: marshalJSON(signatures)}
	}
	return &ctxccv1.Event{Payload: &ctxccv1.Event_AssistantMessage{AssistantMessage: m}}
}

// newCallID is a call id for a function call the API gave none: unique in the session,
// the form the Python client's assistant_from_gemini makes.
func newCallID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return "call_" + hex.EncodeToString(b)
}

// addText adds text as a part of its own, or, right after text, to that part.
func addText(m *ctxccv1.AssistantMessage, text string, afterText bool) {
	if n := len(m.Parts); afterText && n > 0 {
		m.Parts[n-1].Part = &ctxccv1.ContentPart_Text{Text: m.Parts[n-1].GetText() + text}
		return
	}
	m.Parts = append(m.Parts, &ctxccv1.ContentPart{Part: &ctxccv1.ContentPart_Text{Text: text}})
}
