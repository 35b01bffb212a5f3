// Package ctxcc is the Go client of the ctxcc context compiler daemon.
//
//	c, err := ctxcc.Dial("unix:///run/ctxcc/ctxcc.sock")
//	view, err := c.Compile(ctx, &ctxccv1.CompileRequest{SessionId: "s1", Route: &ctxccv1.Route{Model: "gpt-4o"}})
//
// Every RPC is reachable with typed requests through the generated stubs (c.Sessions,
// c.Compiles, c.Tools, c.Sources, c.Artifacts) and c.Conn(); the helpers here add retries,
// request ids, streams and uploads. Errors from the daemon convert to *Error, whose Reason
// is the stable ErrorInfo reason (e.g. "SESSION_NOT_FOUND"); branch on it, never on the
// message. Calls that are safe to repeat are retried on Unavailable for up to
// Client.RetryFor, and every call on a transient quota (transientQuota): appends, checkpoints and stream steps carry a request id fixed before the
// first attempt, so a resend is replayed, never duplicated. CreateSession carries a session
// id fixed the same way ("s-" and 24 hex digits when the caller gives none): a retry
// answered SESSION_ALREADY_EXISTS reads the session back and returns it as created when its
// creation fields (workspace, project, labels, project root, working directory) are the
// request's, as it is then the session an earlier attempt stored before its answer was
// lost. Deletes are not retried: a repeat of a delete that went through finds nothing, and
// nothing tells that apart from a delete of nothing.
package ctxcc

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"strings"
	"time"

	rpccode "google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/ctxcc/ctxcc/client/go/ctxccv1"
)

// Error is a failed call with the daemon's stable reason.
type Error struct {
	Code     codes.Code
	Reason   string
	Message  string
	Metadata map[string]string
	// UsageRefused: a stream step failed because the usage report it carried was refused;
	// nothing of the step was done (no append, no compile).
	UsageRefused bool
}

func (e *Error) Error() string {
	name := codeName(e.Code)
	if e.Reason == name {
		// Without an ErrorInfo the reason is the code's name: said once, not twice.
		return fmt.Sprintf("%s: %s", e.Reason, e.Message)
	}
	// The code as the Python and TypeScript clients spell it ("NOT_FOUND", not "NotFound").
	return fmt.Sprintf("%s %s: %s", name, e.Reason, e.Message)
}

// codeName is a code as google.rpc.Code spells it ("NOT_FOUND"): the reason of a status
// that carries no ErrorInfo (gRPC's own, a proxy's), as the Python and TypeScript
// clients give it.
func codeName(c codes.Code) string {
	if name, ok := rpccode.Code_name[int32(c)]; ok {
		return name
	}
	return c.String()
}

// GRPCStatus keeps status.Code(err) and status.FromError(err) working on an *Error.
func (e *Error) GRPCStatus() *status.Status { return status.New(e.Code, e.Message) }

// AsError extracts the daemon's reason from any error returned by this package or by a
// generated stub. A nil error is no error from the daemon: (nil, false).
func AsError(err error) (*Error, bool) {
	if err == nil {
		// status.FromError(nil) reports success as an OK status, "ok".
		return nil, false
	}
	var e *Error
	if errors.As(err, &e) {
		return e, true
	}
	st, ok := status.FromError(err)
	if !ok {
		return nil, false
	}
	out := &Error{Code: st.Code(), Reason: codeName(st.Code()), Message: st.Message()}
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
	conn      *grpc.ClientConn
	Sessions  ctxccv1.SessionServiceClient
	Compiles  ctxccv1.CompileServiceClient
	Tools     ctxccv1.ToolServiceClient
	Sources   ctxccv1.SourceServiceClient
	Artifacts ctxccv1.ArtifactServiceClient
	// RetryFor bounds how long a call or a stream step waits out an unavailable daemon.
	RetryFor time.Duration
}

// DefaultRetryFor is Client.RetryFor unless changed.
const DefaultRetryFor = 30 * time.Second

// Dial connects to target: "unix:///run/ctxcc/ctxcc.sock" or "127.0.0.1:50551".
func Dial(target string, opts ...grpc.DialOption) (*Client, error) {
	base := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64 << 20)),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 30 * time.Second}),
		// grpc-go backs reconnects off from 1 s up to 120 s; a sidecar restarts in about a
		// second, so look again at most every 500 ms.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 500 * time.Millisecond},
			MinConnectTimeout: 5 * time.Second,
		}),
	}
	c := &Client{RetryFor: DefaultRetryFor}
	base = append(base, grpc.WithChainUnaryInterceptor(c.unary))
	conn, err := grpc.NewClient(target, append(base, opts...)...)
	if err != nil {
		return nil, err
	}
	c.conn = conn
	c.Sessions = ctxccv1.NewSessionServiceClient(conn)
	c.Compiles = ctxccv1.NewCompileServiceClient(conn)
	c.Tools = ctxccv1.NewToolServiceClient(conn)
	c.Sources = ctxccv1.NewSourceServiceClient(conn)
	c.Artifacts = ctxccv1.NewArtifactServiceClient(conn)
	return c, nil
}

// Unary RPCs that a blind repeat would change: a second delete finds nothing where the first
// found something, and the caller cannot tell which one its answer came from. Every other
// unary RPC is a read, an upsert by a client-chosen id, carries a request id, or is
// CreateSession (see createSession).
var notRetried = map[string]bool{
	"DeleteSession": true, "DeleteMemory": true, "DeleteRule": true, "DeleteSkill": true,
}

// SessionAlreadyExists is the reason of a CreateSession whose id is taken.
const SessionAlreadyExists = "SESSION_ALREADY_EXISTS"

// NewSessionID returns a session id of the daemon's own shape: "s-" and 24 hex digits.
func NewSessionID() string { return "s-" + NewRequestID() }

// sameCreation tells whether stored is what creating asked stores: the same creation fields.
func sameCreation(stored, asked *ctxccv1.Session) bool {
	return stored.GetWorkspaceId() == asked.GetWorkspaceId() &&
		stored.GetProjectId() == asked.GetProjectId() &&
		maps.Equal(stored.GetLabels(), asked.GetLabels()) &&
		stored.GetProjectRoot() == asked.GetProjectRoot() &&
		stored.GetWorkingDirectory() == asked.GetWorkingDirectory()
}

// createSession is CreateSession retried like any safe call under one session id fixed
// before the first attempt. SESSION_ALREADY_EXISTS for a retry may be an earlier attempt's
// session, stored before its answer was lost: it is read and returned when its creation
// fields are the request's. The first attempt refused so is a real conflict, returned as it
// is.
func (c *Client) createSession(ctx context.Context, method string, r *ctxccv1.CreateSessionRequest, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if r.GetSession().GetSessionId() == "" {
		cp := proto.Clone(r).(*ctxccv1.CreateSessionRequest)
		if cp.Session == nil {
			cp.Session = &ctxccv1.Session{}
		}
		cp.Session.SessionId = NewSessionID()
		r = cp
	}
	attempts := 0
	_, err := retry(ctx, c.RetryFor, func() (struct{}, error) {
		attempts++
		return struct{}{}, invoker(ctx, method, r, reply, cc, opts...)
	})
	if e, ok := AsError(err); !ok || attempts < 2 || e.Reason != SessionAlreadyExists {
		return err
	}
	get := strings.TrimSuffix(method, "CreateSession") + "GetSession"
	got := &ctxccv1.GetSessionResponse{}
	_, gerr := retry(ctx, c.RetryFor, func() (struct{}, error) {
		return struct{}{}, invoker(ctx, get, &ctxccv1.GetSessionRequest{SessionId: r.GetSession().GetSessionId()}, got, cc, opts...)
	})
	if gerr != nil || !sameCreation(got.GetSession(), r.GetSession()) {
		return err
	}
	out := reply.(*ctxccv1.CreateSessionResponse)
	proto.Reset(out)
	out.Session = got.GetSession()
	return nil
}

// unary is every unary call's interceptor: an append or checkpoint without a request id gets
// one here, once, before any attempt, a CreateSession without a session id likewise; calls that are safe to repeat are retried on
// Unavailable, every call on a transient quota (transientQuota); errors become *Error.
func (c *Client) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	switch r := req.(type) {
	case *ctxccv1.AppendEventsRequest:
		if r.GetRequestId() == "" {
			cp := proto.Clone(r).(*ctxccv1.AppendEventsRequest)
			cp.RequestId = NewRequestID()
			req = cp
		}
	case *ctxccv1.CreateCheckpointRequest:
		if r.GetRequestId() == "" {
			cp := proto.Clone(r).(*ctxccv1.CreateCheckpointRequest)
			cp.RequestId = NewRequestID()
			req = cp
		}
	case *ctxccv1.CreateSessionRequest:
		return c.createSession(ctx, method, r, reply, cc, invoker, opts...)
	}
	if notRetried[method[strings.LastIndex(method, "/")+1:]] {
		// Only a transient quota's refusal, which did none of it, is tried again.
		_, err := retryOn(ctx, c.RetryFor, func(_ context.Context, err error) bool { return transientQuota(err) }, func() (struct{}, error) {
			return struct{}{}, invoker(ctx, method, req, reply, cc, opts...)
		})
		return err
	}
	_, err := retry(ctx, c.RetryFor, func() (struct{}, error) {
		return struct{}{}, invoker(ctx, method, req, reply, cc, opts...)
	})
	return err
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Conn is the underlying connection, for health checks, reflection or your own stubs.
func (c *Client) Conn() *grpc.ClientConn { return c.conn }

// NewRequestID returns a random id for idempotent appends.
func NewRequestID() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

const maxPause = 250 * time.Millisecond

// retryable: Unavailable, or a bare Canceled (no ErrorInfo) this process did not cause
// (its context is live, its connection open). gRPC's own stop in a daemon shutting down
// cancels so the calls that reach it after the daemon's drain; whether such a call ran is
// unknown, as when a connection drops, and it is repeated only where that is safe.
func retryable(ctx context.Context, err error) bool {
	st, ok := status.FromError(err)
	if !ok {
		return false
	}
	switch st.Code() {
	case codes.Unavailable:
		return true
	case codes.Canceled:
		if ctx.Err() != nil || strings.Contains(st.Message(), "client connection is closing") {
			return false
		}
		for _, d := range st.Details() {
			if _, isInfo := d.(*errdetails.ErrorInfo); isInfo {
				return false
			}
		}
		return true
	}
	return false
}

// transientQuotas are the daemon's quotas on what calls in progress hold at once (README
// "Memory of requests", --max-calls-in-progress): a call refused under one was not started,
// and the refusal ends when other calls end, so sending it again later is safe and can pass.
// Every other quota (a session's bytes, max_message_bytes, compile_cpu_budget_ms, watchers)
// would refuse the same call again: it fails at once.
var transientQuotas = map[string]bool{
	"request_bytes_in_memory":  true,
	"calls_in_progress":        true,
	"upload_bytes_in_memory":   true,
	"download_bytes_in_memory": true,
	"watch_bytes_in_memory":    true,
}

// transientQuota: ResourceExhausted/QUOTA_EXCEEDED under one of transientQuotas, as a
// call's status or a stream step's in-band *Error. Nothing of the call was done, so any
// call is retried on it, a delete included.
func transientQuota(err error) bool {
	if status.Code(err) != codes.ResourceExhausted {
		return false
	}
	e, ok := AsError(err)
	return ok && e.Reason == "QUOTA_EXCEEDED" && transientQuotas[e.Metadata["quota"]]
}

// retry runs call until it succeeds, fails with anything but what retryable or
// transientQuota accepts, or
// budget has passed since the first attempt; pauses grow from 50 ms to 250 ms.
func retry[T any](ctx context.Context, budget time.Duration, call func() (T, error)) (T, error) {
	return retryOn(ctx, budget, func(ctx context.Context, err error) bool {
		return retryable(ctx, err) || transientQuota(err)
	}, call)
}

// retryOn is retry with the errors tried again chosen by again.
func retryOn[T any](ctx context.Context, budget time.Duration, again func(context.Context, error) bool, call func() (T, error)) (T, error) {
	var zero T
	deadline := time.Now().Add(budget)
	pause := 50 * time.Millisecond
	for {
		out, err := call()
		left := time.Until(deadline)
		if err == nil || !again(ctx, err) || left <= 0 {
			return out, wrap(err)
		}
		select {
		case <-ctx.Done():
			return zero, ctx.Err()
		case <-time.After(min(pause, left)):
		}
		pause = min(2*pause, maxPause)
	}
}

// CreateSession creates a session; one without an id gets one here ("s-" and 24 hex digits),
// fixed before the first attempt, so a retry names the same session.
func (c *Client) CreateSession(ctx context.Context, s *ctxccv1.Session) (*ctxccv1.Session, error) {
	resp, err := c.Sessions.CreateSession(ctx, &ctxccv1.CreateSessionRequest{Session: s})
	if err != nil {
		return nil, err
	}
	return resp.GetSession(), nil
}

// GetSession reads a session (its head_seq, stored_bytes, current route): NotFound with the
// reason SESSION_NOT_FOUND when there is none under the id.
func (c *Client) GetSession(ctx context.Context, sessionID string) (*ctxccv1.Session, error) {
	resp, err := c.Sessions.GetSession(ctx, &ctxccv1.GetSessionRequest{SessionId: sessionID})
	if err != nil {
		return nil, err
	}
	return resp.GetSession(), nil
}

// Append appends events. The request id is fixed before the first attempt ("" gets a fresh
// one) and reused by every retry, so a retry is replayed, never duplicated.
func (c *Client) Append(ctx context.Context, sessionID string, events []*ctxccv1.Event, requestID string) (*ctxccv1.AppendEventsResponse, error) {
	if requestID == "" {
		requestID = NewRequestID()
	}
	req := &ctxccv1.AppendEventsRequest{SessionId: sessionID, Events: events, RequestId: requestID}
	return c.Sessions.AppendEvents(ctx, req)
}

// Compile compiles one view (unary: a view over the daemon's --max-message-bytes, 64 MiB
// by default, is refused with the reason QUOTA_EXCEEDED; a Stream receives any view, in
// chunks).
func (c *Client) Compile(ctx context.Context, req *ctxccv1.CompileRequest) (*ctxccv1.CompiledView, error) {
	resp, err := c.Compiles.Compile(ctx, req)
	if err != nil {
		return nil, err
	}
	return resp.GetView(), nil
}

// ReportUsage reports the provider's real usage for a compile (idempotent).
func (c *Client) ReportUsage(ctx context.Context, req *ctxccv1.ReportUsageRequest) (*ctxccv1.ReportUsageResponse, error) {
	return c.Compiles.ReportUsage(ctx, req)
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
