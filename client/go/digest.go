package ctxcc

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sort"
	"strconv"

	"github.com/ctxcc/ctxcc/client/go/ctxccv1"
)

// CoveredDigest is a checkpoint's covered_digest for events 1..N as ListEvents returns
// them, in seq order: the canonical encoding that checkpoint.proto documents, hashed
// with sha256. Send it with CreateCheckpoint in COVERED_DIGEST_MODE_VERIFY to prove the
// summary was written from the log's own events.
func CoveredDigest(events []*ctxccv1.Event) (string, error) {
	h := sha256.New()
	for _, ev := range events {
		var e enc
		e.list(3)
		e.int(int64(ev.GetSeq()))
		e.str(ev.GetEventId())
		if err := e.payload(ev); err != nil {
			return "", err
		}
		h.Write(e.buf)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

type enc struct{ buf []byte }

func (e *enc) raw(s string)   { e.buf = append(e.buf, s...) }
func (e *enc) int(n int64)    { e.raw("I" + strconv.FormatInt(n, 10) + ";") }
func (e *enc) str(s string)   { e.raw("S" + strconv.Itoa(len(s)) + ":" + s) }
func (e *enc) bytes(b []byte) { e.raw("B" + strconv.Itoa(len(b)) + ":"); e.buf = append(e.buf, b...) }
func (e *enc) absent()        { e.raw("N") }
func (e *enc) list(k int)     { e.raw("L" + strconv.Itoa(k) + ":") }
func (e *enc) record(name string, fields int) {
	e.raw("D" + strconv.Itoa(len(name)) + ":" + name + strconv.Itoa(fields) + ":")
}
func (e *enc) bool(b bool) {
	if b {
		e.raw("T")
	} else {
		e.raw("F")
	}
}

func (e *enc) payload(ev *ctxccv1.Event) error {
	switch p := ev.GetPayload().(type) {
	case *ctxccv1.Event_UserMessage:
		e.record("UserMessage", 1)
		return e.parts(p.UserMessage.GetParts())
	case *ctxccv1.Event_AssistantMessage:
		m := p.AssistantMessage
		e.record("AssistantMessage", 5)
		if err := e.parts(m.GetParts()); err != nil {
			return err
		}
		e.list(len(m.GetToolCalls()))
		for _, c := range m.GetToolCalls() {
			e.call(c)
		}
		e.str(m.GetReasoning())
		if s := m.GetNativeState(); s != nil {
			e.record("NativeState", 3)
			e.str(s.GetRouteId())
			e.str(s.GetKind())
			e.bytes(s.GetData())
		} else {
			e.absent()
		}
		if r := m.GetRoute(); r != nil {
			e.record("Route", 4)
			e.str(r.GetConnection())
			e.str(r.GetProtocol())
			e.str(r.GetEndpoint())
			e.str(r.GetModel())
		} else {
			e.absent()
		}
	case *ctxccv1.Event_ToolCall:
		e.call(p.ToolCall)
	case *ctxccv1.Event_ToolResult:
		r := p.ToolResult
		e.record("ToolResult", 5)
		e.str(r.GetCallId())
		e.str(r.GetToolName())
		switch c := r.GetContent().(type) {
		case *ctxccv1.ToolResult_Text:
			e.str(c.Text)
			e.absent()
		case *ctxccv1.ToolResult_Blob:
			e.absent()
			e.record("BlobRef", 3)
			e.str(c.Blob.GetSha256())
			e.int(int64(c.Blob.GetSizeBytes()))
			e.str(c.Blob.GetPreview())
		default:
			e.absent()
			e.absent()
		}
		e.bool(r.GetIsError())
	case *ctxccv1.Event_ImportedMessage:
		m := p.ImportedMessage
		e.record("ImportedMessage", 4)
		e.str(m.GetOriginSessionId())
		e.int(int64(m.GetOriginSeq()))
		e.int(int64(m.GetRole()))
		return e.parts(m.GetParts())
	case *ctxccv1.Event_Attachment:
		e.record("Attachment", 1)
		e.artifact(p.Attachment)
	case *ctxccv1.Event_BrowserElement:
		e.record("BrowserSelection", 1)
		e.element(p.BrowserElement)
	case *ctxccv1.Event_TurnStarted:
		e.record("TurnStarted", 1)
		e.str(p.TurnStarted.GetTurnId())
	case *ctxccv1.Event_TurnCancelled:
		e.record("TurnCancelled", 2)
		e.str(p.TurnCancelled.GetReason())
		e.bool(p.TurnCancelled.GetKeepReasoning())
	case *ctxccv1.Event_TurnCompleted:
		e.record("TurnCompleted", 0)
	default:
		return fmt.Errorf("event %d has no payload this client knows", ev.GetSeq())
	}
	return nil
}

func (e *enc) call(c *ctxccv1.ToolCall) {
	e.record("ToolCall", 3)
	e.str(c.GetCallId())
	e.str(c.GetName())
	e.str(c.GetArgumentsJson())
}

func (e *enc) parts(parts []*ctxccv1.ContentPart) error {
	e.list(len(parts))
	for _, part := range parts {
		e.record("ContentPart", 3)
		switch c := part.GetPart().(type) {
		case *ctxccv1.ContentPart_Text:
			e.str(c.Text)
			e.absent()
			e.absent()
		case *ctxccv1.ContentPart_Attachment:
			e.absent()
			e.artifact(c.Attachment)
			e.absent()
		case *ctxccv1.ContentPart_BrowserElement:
			e.absent()
			e.absent()
			e.element(c.BrowserElement)
		default:
			return fmt.Errorf("a content part has no content")
		}
	}
	return nil
}

func (e *enc) artifact(a *ctxccv1.ArtifactRef) {
	e.record("ArtifactRef", 6)
	e.str(a.GetArtifactId())
	e.str(a.GetMimeType())
	e.int(int64(a.GetSizeBytes()))
	e.str(a.GetSha256())
	e.int(int64(a.GetWidth()))
	e.int(int64(a.GetHeight()))
}

func (e *enc) element(el *ctxccv1.BrowserElement) {
	e.record("BrowserElement", 5)
	e.str(el.GetUrl())
	e.str(el.GetSelector())
	e.str(el.GetTag())
	e.str(el.GetText())
	keys := make([]string, 0, len(el.GetAttributes()))
	for k := range el.GetAttributes() {
		keys = append(keys, k)
	}
	sort.Strings(keys) // Go compares strings bytewise, as the encoding requires
	e.list(len(keys))
	for _, k := range keys {
		e.list(2)
		e.str(k)
		e.str(el.GetAttributes()[k])
	}
}
