package ctxcc

import (
	"context"
	"slices"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ctxcc/ctxcc/client/go/ctxccv1"
)

// A queued report rides on the next step only; a refused one is dropped; one whose step
// never reached the daemon rides on the next step; a second report sends the first by the
// unary call, and Close sends the one still queued.
func TestStreamCarriesQueuedUsageOnTheNextStep(t *testing.T) {
	v1, _ := fixture(t, 1)
	s := &scripted{}
	recorded := &ctxccv1.ReportUsageResponse{EstimatedInputTokens: 100, ErrorTokens: 5}
	s.answer = func(n int, req *ctxccv1.CompileStreamRequest) ([]*ctxccv1.CompileStreamResponse, error) {
		switch n {
		case 2: // the report is refused: nothing of the step is done
			return []*ctxccv1.CompileStreamResponse{{Response: &ctxccv1.CompileStreamResponse_Error{Error: &ctxccv1.StepError{
				Code: int32(codes.NotFound), Reason: "COMPILE_NOT_FOUND", Message: "no such compile", UsageRefused: true}}}}, nil
		case 4: // the daemon goes away before it reads the step
			return nil, status.Error(codes.Unavailable, "restarting")
		}
		resp := whole(v1)
		if req.GetStep().GetUsage() != nil {
			resp.Usage = recorded
		}
		return []*ctxccv1.CompileStreamResponse{resp}, nil
	}
	c := serve(t, s)
	c.RetryFor = 0
	st := c.OpenStream(context.Background())
	req := &ctxccv1.CompileRequest{SessionId: v1.GetSessionId(), Route: v1.GetRoute()}
	ctx := context.Background()
	report := func(id string) {
		t.Helper()
		if sent, err := st.ReportUsage(ctx, &ctxccv1.ReportUsageRequest{CompileId: id, InputTokens: 105}); err != nil || sent != nil {
			t.Fatalf("queueing sent %v: %v", sent, err)
		}
	}
	if _, _, err := st.Step(req, nil, ""); err != nil || st.LastUsage() != nil {
		t.Fatalf("step 1: %v, usage %v", err, st.LastUsage())
	}
	report("bad")
	_, _, err := st.Step(req, nil, "")
	if e, ok := AsError(err); !ok || !e.UsageRefused || e.Reason != "COMPILE_NOT_FOUND" {
		t.Fatalf("a refused report: %v", err)
	}
	if _, _, err := st.Step(req, nil, ""); err != nil || st.LastUsage() != nil {
		t.Fatalf("the step after a refusal: %v, usage %v", err, st.LastUsage())
	}
	report("good")
	if _, _, err := st.Step(req, nil, ""); status.Code(err) != codes.Unavailable {
		t.Fatalf("step 4 should fail unavailable: %v", err)
	}
	if _, _, err := st.Step(req, nil, ""); err != nil || st.LastUsage().GetErrorTokens() != 5 {
		t.Fatalf("step 5: %v, usage %v", err, st.LastUsage())
	}
	var carried []string
	for _, r := range s.got {
		carried = append(carried, r.req.GetStep().GetUsage().GetCompileId())
	}
	if want := []string{"", "bad", "", "good", "good"}; !slices.Equal(carried, want) {
		t.Fatalf("steps carried %q, want %q", carried, want)
	}
	report("third")
	sent, err := st.ReportUsage(ctx, &ctxccv1.ReportUsageRequest{CompileId: "fourth"})
	if err != nil || sent.GetEstimatedInputTokens() != 1 {
		t.Fatalf("a second queued report sends the first: %v %v", sent, err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	var unary []string
	for _, r := range s.reports {
		unary = append(unary, r.GetCompileId())
	}
	if !slices.Equal(unary, []string{"third", "fourth"}) {
		t.Fatalf("unary reports %q", unary)
	}
}
