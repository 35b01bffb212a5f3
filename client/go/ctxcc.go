// Package ctxcc is the Go client of the ctxcc context compiler daemon.
//
//	c, err := ctxcc.Dial("unix:///run/ctxcc/ctxcc.sock")
//	view, err := c.Compile(ctx, &ctxccv1.CompileRequest{SessionId: "s1", Route: &ctxccv1.Route{Model: "gpt-4o"}})
//
// Errors from the daemon convert to *Error, whose Reason is the stable ErrorInfo reason
// (e.g. "SESSION_NOT_FOUND"); branch on it, never on the message. Only idempotent calls
// are retried on Unavailable: appends (always sent with a request id), usage reports,
// reads and compiles.
package ctxcc

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	"github.com/ctxcc/ctxcc/client/go/ctxccv1"
)

// Error is a failed call with the daemon's stable reason.
type Error struct {
	Code     codes.Code
	Reason   string
	Message  string
	Metadata map[string]string
}

func (e *Error) Error() string { return fmt.Sprintf("%s %s: %s", e.Code, e.Reason, e.Message) }

// AsError extracts the daemon's reason from any error returned by this package or by a
// generated stub.
func AsError(err error) (*Error, bool) {
	var e *Error
	if errors.As(err, &e) {
		return e, true
	}
	st, ok := status.FromError(err)
	if !ok {
		return nil, false
	}
	out := &Error{Code: st.Code(), Reason: st.Code().String(), Message: st.Message()}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			out.Reason, out.Metadata = info.GetReason(), info.GetMetadata()
		}
	}
	return out, true
}

func wrap(err error) error {
	if err == nil {
		return nil
	}
	if e, ok := AsError(err); ok {
		return e
	}
	return err
}

// Client holds one connection and the service stubs.
type Client struct {
	conn     *grpc.ClientConn
	Sessions ctxccv1.SessionServiceClient
	Compiles ctxccv1.CompileServiceClient
	Tools    ctxccv1.ToolServiceClient
	Sources  ctxccv1.SourceServiceClient
}

// Dial connects to target: "unix:///run/ctxcc/ctxcc.sock" or "127.0.0.1:50551".
func Dial(target string, opts ...grpc.DialOption) (*Client, error) {
	base := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64 << 20)),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 30 * time.Second}),
	}
	conn, err := grpc.NewClient(target, append(base, opts...)...)
	if err != nil {
		return nil, err
	}
	return &Client{
		conn:     conn,
		Sessions: ctxccv1.NewSessionServiceClient(conn),
		Compiles: ctxccv1.NewCompileServiceClient(conn),
		Tools:    ctxccv1.NewToolServiceClient(conn),
		Sources:  ctxccv1.NewSourceServiceClient(conn),
	}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// NewRequestID returns a random id for idempotent appends.
func NewRequestID() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

const retries = 6

func retry[T any](ctx context.Context, call func() (T, error)) (T, error) {
	var zero T
	delay := 50 * time.Millisecond
	for attempt := 0; ; attempt++ {
		out, err := call()
		if err == nil || status.Code(err) != codes.Unavailable || attempt == retries-1 {
			return out, wrap(err)
		}
		select {
		case <-ctx.Done():
			return zero, ctx.Err()
		case <-time.After(delay):
		}
		delay = min(2*delay, 2*time.Second)
	}
}

// CreateSession creates a session ("" lets the daemon choose the id).
func (c *Client) CreateSession(ctx context.Context, s *ctxccv1.Session) (*ctxccv1.Session, error) {
	resp, err := c.Sessions.CreateSession(ctx, &ctxccv1.CreateSessionRequest{Session: s})
	if err != nil {
		return nil, wrap(err)
	}
	return resp.GetSession(), nil
}

// Append appends events; requestID "" gets a fresh id, so a retry never duplicates.
func (c *Client) Append(ctx context.Context, sessionID string, events []*ctxccv1.Event, requestID string) (*ctxccv1.AppendEventsResponse, error) {
	if requestID == "" {
		requestID = NewRequestID()
	}
	req := &ctxccv1.AppendEventsRequest{SessionId: sessionID, Events: events, RequestId: requestID}
	return retry(ctx, func() (*ctxccv1.AppendEventsResponse, error) {
		return c.Sessions.AppendEvents(ctx, req, grpc.WaitForReady(true))
	})
}

// Compile compiles one view (unary; use a Stream for views larger than 4 MiB).
func (c *Client) Compile(ctx context.Context, req *ctxccv1.CompileRequest) (*ctxccv1.CompiledView, error) {
	resp, err := retry(ctx, func() (*ctxccv1.CompileResponse, error) {
		return c.Compiles.Compile(ctx, req, grpc.WaitForReady(true))
	})
	if err != nil {
		return nil, err
	}
	return resp.GetView(), nil
}

// ReportUsage reports the provider's real usage for a compile (idempotent).
func (c *Client) ReportUsage(ctx context.Context, req *ctxccv1.ReportUsageRequest) (*ctxccv1.ReportUsageResponse, error) {
	return retry(ctx, func() (*ctxccv1.ReportUsageResponse, error) {
		return c.Compiles.ReportUsage(ctx, req, grpc.WaitForReady(true))
	})
}

// User is a user message event.
func User(text string) *ctxccv1.Event {
	return &ctxccv1.Event{Payload: &ctxccv1.Event_UserMessage{UserMessage: &ctxccv1.UserMessage{
		Parts: []*ctxccv1.ContentPart{{Part: &ctxccv1.ContentPart_Text{Text: text}}}}}}
}

// Assistant is an assistant message event.
func Assistant(text string) *ctxccv1.Event {
	return &ctxccv1.Event{Payload: &ctxccv1.Event_AssistantMessage{AssistantMessage: &ctxccv1.AssistantMessage{
		Parts: []*ctxccv1.ContentPart{{Part: &ctxccv1.ContentPart_Text{Text: text}}}}}}
}
