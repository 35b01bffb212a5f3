package ctxcc

import (
	"context"
	"errors"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A nil error did not come from the daemon: `if e, ok := AsError(err); ok` must not take
// a successful call for a failed one.
func TestAsErrorOfNilIsNotAnError(t *testing.T) {
	if e, ok := AsError(nil); ok || e != nil {
		t.Fatalf("AsError(nil) = %v, %v; want nil, false", e, ok)
	}
}

func TestAsErrorOfAPlainErrorIsNotTheDaemons(t *testing.T) {
	if e, ok := AsError(context.Canceled); ok || e != nil {
		t.Fatalf("AsError(context.Canceled) = %v, %v; want nil, false", e, ok)
	}
}

func TestAsErrorReadsTheReasonAndMetadata(t *testing.T) {
	st, err := status.New(codes.NotFound, "no such session").WithDetails(&errdetails.ErrorInfo{
		Reason: "SESSION_NOT_FOUND", Domain: "ctxcc.dev", Metadata: map[string]string{"session_id": "x"},
	})
	if err != nil {
		t.Fatal(err)
	}
	e, ok := AsError(st.Err())
	if !ok || e.Code != codes.NotFound || e.Reason != "SESSION_NOT_FOUND" || e.Metadata["session_id"] != "x" {
		t.Fatalf("AsError = %+v, %v", e, ok)
	}
	wrapped, ok := AsError(errors.Join(errors.New("step"), e))
	if !ok || wrapped != e {
		t.Fatalf("AsError of a wrapped *Error = %+v, %v", wrapped, ok)
	}
}

// A status without an ErrorInfo (gRPC's own, a proxy's) has its code's name as its reason,
// spelled as google.rpc.Code spells it (the Python and TypeScript clients' spelling), and
// the message says it once.
func TestAsErrorWithoutErrorInfoNamesTheCodeOnce(t *testing.T) {
	e, ok := AsError(status.Error(codes.Unavailable, "connection refused"))
	if !ok || e.Reason != "UNAVAILABLE" {
		t.Fatalf("AsError = %+v, %v; want reason UNAVAILABLE", e, ok)
	}
	if got := e.Error(); got != "UNAVAILABLE: connection refused" {
		t.Fatalf("Error() = %q", got)
	}
	e, _ = AsError(status.Error(codes.FailedPrecondition, "head moved"))
	if e.Reason != "FAILED_PRECONDITION" {
		t.Fatalf("reason = %q", e.Reason)
	}
	daemon := &Error{Code: codes.NotFound, Reason: "SESSION_NOT_FOUND", Message: "no such session"}
	if got := daemon.Error(); got != "NOT_FOUND SESSION_NOT_FOUND: no such session" {
		t.Fatalf("Error() = %q", got)
	}
}
