package ctxcc

import (
	"github.com/ctxcc/ctxcc/client/go/ctxccv1"
)

// OpenAIReasoning is the native state kind of OpenAI's reasoning items (see
// AssistantFromOpenAIResponses).
const OpenAIReasoning = "openai.reasoning"

// OpenAIResponse is an OpenAI Responses API response (the API's Response), as much of it
// as AssistantFromOpenAIResponses reads: json.Unmarshal of the response body fills it
// (with openai-go, of resp.RawJSON()).
type OpenAIResponse struct {
	// output: the response's items, in their order.
	Output []OpenAIOutputItem `json:"output"`
}

// OpenAIOutputItem is one item of a response's output, the fields of the item types
// AssistantFromOpenAIResponses uses. An item of another type (web_search_call,
// file_search_call, ...) decodes to its Type alone and is left out of the event.
type OpenAIOutputItem struct {
	// type: "message", "function_call", "reasoning", or another one.
	Type string `json:"type"`
	// id (reasoning items: what the API names them by).
	ID string `json:"id,omitempty"`
	// content (message items): output_text and refusal parts.
	Content []OpenAIOutputContent `json:"content,omitempty"`
	// call_id, name and arguments (function_call items): arguments is the JSON text the
	// model produced.
	CallID    string `json:"call_id,omitempty"`
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments,omitempty"`
	// summary and encrypted_content (reasoning items).
	Summary          []OpenAIReasoningSummary `json:"summary,omitempty"`
	EncryptedContent string                   `json:"encrypted_content,omitempty"`
}

// OpenAIOutputContent is one part of a message item: type "output_text" (text) or
// "refusal" (refusal).
type OpenAIOutputContent struct {
	Type    string `json:"type"`
	Text    string `json:"text,omitempty"`
	Refusal string `json:"refusal,omitempty"`
}

// OpenAIReasoningSummary is one part of a reasoning item's summary.
type OpenAIReasoningSummary struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// UnmarshalJSON reads an item's fields only when its type is one the helper uses: an item
// type whose fields of these names hold something else does not fail the decoding of the
// whole response.
func (it *OpenAIOutputItem) UnmarshalJSON(data []byte) error {
	type plain OpenAIOutputItem // without this method
	p, kind, err := decodeKnown[plain](data, "message", "function_call", "reasoning")
	*it = OpenAIOutputItem(p)
	it.Type = kind
	return err
}

// reasoningItem is a reasoning item as a stateless request takes it back: its id, summary
// and encrypted content (not its raw reasoning text, R-MISC-2, nor its status).
type reasoningItem struct {
	Type             string                   `json:"type"`
	ID               string                   `json:"id"`
	Summary          []OpenAIReasoningSummary `json:"summary"`
	EncryptedContent string                   `json:"encrypted_content"`
}

// AssistantFromOpenAIResponses is the assistant event to log for an OpenAI Responses API
// response. The output_text (and refusal) parts of its message items become the message's
// text (one part per message item: a view joins parts with line breaks), its function_call
// items its tool calls (CallId = call_id, which the function_call_output names; Name;
// ArgumentsJson = arguments as the model wrote them), and the reasoning item right before
// its first message or call its native state of kind OpenAIReasoning on routeID (the
// compiled view's RouteId): the item's id, summary and encrypted_content. OpenAI asks that
// a reasoning model's items since the latest user message go back with its calls; the
// daemon's Responses body sends it, stateless (store: false), on that route only and only
// in the turn that made it.
//
// The API refuses a reasoning item that is not right before the item that followed it, and
// an event keeps no order between its text and its calls: so only that item is logged (the
// reasoning items before it, and any after the first message or call, are left out, as a
// client that keeps no reasoning leaves them all), and only with its encrypted content (a
// stateless request cannot name a stored item). A response with nothing but reasoning (cut
// at its output cap) gives a message with only that state, which the daemon logs and sends
// nowhere.
func AssistantFromOpenAIResponses(resp OpenAIResponse, routeID string) *ctxccv1.Event {
	m := &ctxccv1.AssistantMessage{}
	var leading *OpenAIOutputItem // the last reasoning item before the first message or call
	started := false
	for i, it := range resp.Output {
		switch it.Type {
		case "reasoning":
			if !started {
				leading = &resp.Output[i]
			}
		case "message":
			started = true
			afterText := false
			for _, c := range it.Content {
				text := c.Text
				if c.Type == "refusal" {
					text = c.Refusal
				} else if c.Type != "output_text" {
					continue
				}
				if text != "" {
					addText(m, text, afterText)
					afterText = true
				}
			}
		case "function_call":
			started = true
			args := it.Arguments
			if args == "" {
				args = "{}"
			}
			m.ToolCalls = append(m.ToolCalls, &ctxccv1.ToolCall{CallId: it.CallID, Name: it.Name, ArgumentsJson: args})
		}
	}
	if leading != nil && leading.EncryptedContent != "" {
		summary := make([]OpenAIReasoningSummary, 0, len(leading.Summary))
		for _, s := range leading.Summary {
			summary = append(summary, OpenAIReasoningSummary{Type: "summary_text", Text: s.Text})
		}
		item := reasoningItem{"reasoning", leading.ID, summary, leading.EncryptedContent}
		m.NativeState = &ctxccv1.ProviderNativeState{RouteId: routeID, Kind: OpenAIReasoning, Data: marshalJSON([]reasoningItem{item})}
	}
	return &ctxccv1.Event{Payload: &ctxccv1.Event_AssistantMessage{AssistantMessage: m}}
}
