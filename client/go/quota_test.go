package ctxcc

import (
	"context"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ctxcc/ctxcc/client/go/ctxccv1"
)

func quotaErr(t *testing.T, quota string) error {
	t.Helper()
	st, err := status.New(codes.ResourceExhausted, "retry later").WithDetails(&errdetails.ErrorInfo{
		Reason: "QUOTA_EXCEEDED", Domain: "ctxcc.dev", Metadata: map[string]string{"quota": quota, "limit": "2"},
	})
	if err != nil {
		t.Fatal(err)
	}
	return st.Err()
}

// Only the quotas on what calls in progress hold pass with time; the others would refuse
// the same call again.
func TestTransientQuotaIsOnlyTheFourInProgressQuotas(t *testing.T) {
	for _, q := range []string{"request_bytes_in_memory", "calls_in_progress", "upload_bytes_in_memory", "download_bytes_in_memory", "watch_bytes_in_memory"} {
		if !transientQuota(quotaErr(t, q)) {
			t.Errorf("%s: not transient", q)
		}
		// A stream step's in-band error arrives as an *Error.
		e, _ := AsError(quotaErr(t, q))
		if !transientQuota(e) {
			t.Errorf("%s as *Error: not transient", q)
		}
	}
	for _, q := range []string{"max_session_bytes", "max_sessions", "max_message_bytes", "compile_cpu_budget_ms", "watchers", "watchers_per_session", ""} {
		if transientQuota(quotaErr(t, q)) {
			t.Errorf("%q: transient", q)
		}
	}
	if transientQuota(status.Error(codes.ResourceExhausted, "grpc: received message larger than max")) {
		t.Error("a bare RESOURCE_EXHAUSTED: transient")
	}
	if transientQuota(&Error{Code: codes.Unavailable, Reason: "QUOTA_EXCEEDED", Metadata: map[string]string{"quota": "calls_in_progress"}}) {
		t.Error("another code: transient")
	}
}

func TestRetryWaitsOutATransientQuotaButNotAnother(t *testing.T) {
	calls := 0
	_, err := retry(context.Background(), 5*time.Second, func() (struct{}, error) {
		calls++
		if calls < 3 {
			return struct{}{}, quotaErr(t, "calls_in_progress")
		}
		return struct{}{}, nil
	})
	if err != nil || calls != 3 {
		t.Fatalf("retry = %v after %d calls; want success on the 3rd", err, calls)
	}
	calls = 0
	_, err = retry(context.Background(), 5*time.Second, func() (struct{}, error) {
		calls++
		return struct{}{}, quotaErr(t, "compile_cpu_budget_ms")
	})
	if e, ok := AsError(err); !ok || e.Metadata["quota"] != "compile_cpu_budget_ms" || calls != 1 {
		t.Fatalf("retry = %v after %d calls; want the quota at once", err, calls)
	}
	// The budget still bounds it: the last refusal is returned.
	calls = 0
	_, err = retry(context.Background(), 120*time.Millisecond, func() (struct{}, error) {
		calls++
		return struct{}{}, quotaErr(t, "request_bytes_in_memory")
	})
	if !transientQuota(err) || calls < 2 {
		t.Fatalf("retry = %v after %d calls; want the refusal after retries", err, calls)
	}
}

// daemonMetric is the sum of the samples of name whose labels include each of labels (as
// `key="value"`), from the /metrics of the daemon at CTXCC_METRICS_URL.
func daemonMetric(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	resp, err := http.Get(os.Getenv("CTXCC_METRICS_URL"))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, line := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		ok := true
		for _, l := range labels {
			ok = ok && strings.Contains(line, l)
		}
		if f := strings.Fields(line); ok && len(f) >= 2 {
			v, err := strconv.ParseFloat(f[len(f)-1], 64)
			if err != nil {
				t.Fatalf("%q: %v", line, err)
			}
			sum += v
		}
	}
	return sum
}

// waitMetric polls until daemonMetric reaches at least want: a state the test waits for
// rather than sleeps through.
func waitMetric(t *testing.T, want float64, name string, labels ...string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for daemonMetric(t, name, labels...) < want {
		if time.Now().After(deadline) {
			t.Fatalf("%s %v never reached %v", name, labels, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitMetricAtMost polls until daemonMetric is at most most.
func waitMetricAtMost(t *testing.T, most float64, name string, labels ...string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for daemonMetric(t, name, labels...) > most {
		if time.Now().After(deadline) {
			t.Fatalf("%s %v never came down to %v", name, labels, most)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

const quotaRefusals = "ctxcc_errors_total"

const quotaReason = `reason="QUOTA_EXCEEDED"`

// holdCalls runs call while two idle CompileStreams hold a daemon started with
// --max-calls-in-progress 2, ends one of them once the daemon has refused call at least
// once, and returns call's error.
func holdCalls(t *testing.T, c *Client, call func() error) error {
	t.Helper()
	// The streams an earlier hold cancelled may not have ended on the daemon yet: while
	// one had, two in flight could be it and one new stream (the other refused), and the
	// call then found a free slot, was never refused, and the wait below ran out.
	waitMetricAtMost(t, 0, "ctxcc_rpcs_in_flight", `method="CompileService/CompileStream"`)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var idle []context.CancelFunc
	for range 2 {
		sctx, scancel := context.WithCancel(ctx)
		if _, err := c.Compiles.CompileStream(sctx); err != nil {
			t.Fatal(err)
		}
		idle = append(idle, scancel)
	}
	waitMetric(t, 2, "ctxcc_rpcs_in_flight", `method="CompileService/CompileStream"`)
	before := daemonMetric(t, quotaRefusals, quotaReason)
	done := make(chan error, 1)
	go func() { done <- call() }()
	waitMetric(t, before+1, quotaRefusals, quotaReason)
	idle[0]()
	return <-done
}

// Against a real daemon (CTXCC_TARGET, CTXCC_METRICS_URL; tests/e2e/test_client_quota_retry.py)
// started with --max-calls-in-progress 2 and --max-session-bytes 65536: a unary call and a
// stream step refused for calls_in_progress are retried and succeed once a call ends; a
// session over its bytes fails on its first refusal.
func TestTransientQuotasAreWaitedOutAgainstADaemon(t *testing.T) {
	c := daemonClient(t)
	c.RetryFor = time.Minute
	ctx := context.Background()
	s, err := c.CreateSession(ctx, &ctxccv1.Session{SessionId: "go-" + NewRequestID()})
	if err != nil {
		t.Fatal(err)
	}
	var appended *ctxccv1.AppendEventsResponse
	if err := holdCalls(t, c, func() error {
		var err error
		appended, err = c.Append(ctx, s.GetSessionId(), []*ctxccv1.Event{User("hello")}, "")
		return err
	}); err != nil || appended.GetLastSeq() != 1 {
		t.Fatalf("Append = %v, %v; want it appended once", appended, err)
	}
	stream := c.OpenStream(ctx)
	defer stream.Close()
	req := &ctxccv1.CompileRequest{SessionId: s.GetSessionId(), Route: &ctxccv1.Route{Connection: "example", Protocol: "fake", Endpoint: "local", Model: "gpt-4o"}}
	var result *ctxccv1.AppendResult
	if err := holdCalls(t, c, func() error {
		var err error
		_, result, err = stream.Step(req, []*ctxccv1.Event{User("again")}, "")
		return err
	}); err != nil || result.GetLastSeq() != 2 {
		t.Fatalf("Step = %v, %v; want it appended once", result, err)
	}

	big, err := c.CreateSession(ctx, &ctxccv1.Session{SessionId: "go-" + NewRequestID()})
	if err != nil {
		t.Fatal(err)
	}
	before := daemonMetric(t, quotaRefusals, quotaReason)
	_, err = c.Append(ctx, big.GetSessionId(), []*ctxccv1.Event{User(strings.Repeat("x", 100_000))}, "")
	if e, ok := AsError(err); !ok || e.Reason != "QUOTA_EXCEEDED" || transientQuotas[e.Metadata["quota"]] {
		t.Fatalf("Append over the session's bytes = %v; want a lasting QUOTA_EXCEEDED", err)
	}
	// Retried, it would have been refused again and again for RetryFor before it returned.
	waitMetric(t, before+1, quotaRefusals, quotaReason)
	if got := daemonMetric(t, quotaRefusals, quotaReason); got != before+1 {
		t.Fatalf("%v refusals; want one attempt", got-before)
	}
}

// A delete is never repeated on Unavailable (whether it went through is unknown), but a
// transient quota's refusal did none of it: it is sent again.
func TestADeleteIsRetriedOnlyOnATransientQuota(t *testing.T) {
	c := &Client{RetryFor: 5 * time.Second}
	for _, tc := range []struct {
		first error
		calls int
	}{{quotaErr(t, "calls_in_progress"), 2}, {status.Error(codes.Unavailable, "gone"), 1}, {quotaErr(t, "max_sessions"), 1}} {
		calls := 0
		invoker := func(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error {
			calls++
			if calls == 1 {
				return tc.first
			}
			return nil
		}
		err := c.unary(context.Background(), "/ctxcc.v1.SessionService/DeleteSession", &ctxccv1.DeleteSessionRequest{}, &ctxccv1.DeleteSessionResponse{}, nil, invoker)
		if calls != tc.calls || (tc.calls == 2) != (err == nil) {
			t.Fatalf("after %v: %d calls, %v; want %d", tc.first, calls, err, tc.calls)
		}
	}
}
