package ctxcc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/ctxcc/ctxcc/client/go/ctxccv1"
)

// Every response delivered twice (a proxy that duplicates messages): each copy of a step's
// answer read at a later step is skipped, so every step returns its own view, append and
// error, on one stream. Before, the copy was taken for the next step's answer and every step
// from then on returned the previous step's view.
func TestStreamSkipsAnswersDeliveredTwice(t *testing.T) {
	v1, want1 := fixture(t, 1)
	v2, want2 := fixture(t, 2)
	v3, want3 := fixture(t, 3)
	v4, want4 := fixture(t, 4)
	v5, want5 := fixture(t, 5)
	s := &scripted{twice: true}
	s.answer = func(n int, req *ctxccv1.CompileStreamRequest) ([]*ctxccv1.CompileStreamResponse, error) {
		switch n {
		case 1:
			return []*ctxccv1.CompileStreamResponse{whole(v1)}, nil
		case 2:
			return []*ctxccv1.CompileStreamResponse{asDelta(makeDelta(t, v1, v2), &ctxccv1.AppendResult{FirstSeq: 2, LastSeq: 3})}, nil
		case 3:
			return chunked(t, v3), nil
		case 4:
			return []*ctxccv1.CompileStreamResponse{asDelta(makeDelta(t, v3, v4), nil)}, nil
		case 5:
			return []*ctxccv1.CompileStreamResponse{{Response: &ctxccv1.CompileStreamResponse_Error{Error: &ctxccv1.StepError{
				Code: int32(codes.FailedPrecondition), Reason: "SEQUENCE_MISMATCH", Message: "head moved"}}}}, nil
		default:
			return []*ctxccv1.CompileStreamResponse{whole(v5)}, nil
		}
	}
	c := serve(t, s)
	c.RetryFor = 0
	st := c.OpenStream(context.Background())
	defer st.Close()
	req := &ctxccv1.CompileRequest{SessionId: v1.GetSessionId(), Route: v1.GetRoute()}
	var appends []*ctxccv1.AppendResult
	for i, want := range [][]byte{want1, want2, want3, want4, nil, want5} {
		view, appended, err := st.Step(req, nil, "")
		if want == nil {
			if e, ok := AsError(err); !ok || e.Reason != "SEQUENCE_MISMATCH" {
				t.Fatalf("step %d: err = %v, want its own SEQUENCE_MISMATCH", i+1, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("step %d: %v", i+1, err)
		}
		if !bytes.Equal(marshal(t, view), want) {
			t.Fatalf("step %d: the view is not the step's own", i+1)
		}
		appends = append(appends, appended)
	}
	if appends[1].GetLastSeq() != 3 || appends[2] != nil {
		t.Fatalf("appends %v: step 3 took step 2's append from its copy", appends)
	}
	// Read at a later step: the copies of the view, the delta, the last chunk, the delta and
	// the error (the first chunk's copy came within its own step).
	if got := st.Stats(); got.Stale != 5 || got.Mismatches != 0 || got.Deltas != 2 || got.Whole != 3 {
		t.Fatalf("stats %+v", got)
	}
	if s.streams != 1 || len(s.got) != 6 {
		t.Fatalf("%d streams, %d requests: a copy of an earlier answer reopened the stream", s.streams, len(s.got))
	}
}

// While the step's resume is in flight (its delta did not check), a copy of the step's own
// delta is skipped and the resume's answer (under the resume's step id) is returned.
func TestStreamSkipsTheStepsOwnAnswerWhileItsResumeIsInFlight(t *testing.T) {
	v1, _ := fixture(t, 1)
	v2, want2 := fixture(t, 2)
	s := &scripted{}
	s.answer = func(n int, req *ctxccv1.CompileStreamRequest) ([]*ctxccv1.CompileStreamResponse, error) {
		switch {
		case req.GetResume() != nil:
			return []*ctxccv1.CompileStreamResponse{whole(v2)}, nil
		case n == 1:
			return []*ctxccv1.CompileStreamResponse{whole(v1)}, nil
		default: // the delta, damaged by the hook below, and a copy of it
			d := makeDelta(t, v1, v2)
			return []*ctxccv1.CompileStreamResponse{asDelta(d, nil), asDelta(d, nil)}, nil
		}
	}
	c := serve(t, s)
	c.RetryFor = 0
	damaged := 0
	st := c.OpenStream(context.Background(), WithDeltaHook(func(d *ctxccv1.ViewDelta) {
		damaged++
		d.AppendedMessages[0].Tokens++
	}))
	defer st.Close()
	req := &ctxccv1.CompileRequest{SessionId: v1.GetSessionId(), Route: v1.GetRoute()}
	if _, _, err := st.Step(req, nil, ""); err != nil {
		t.Fatal(err)
	}
	view, _, err := st.Step(req, nil, "")
	if err != nil {
		t.Fatalf("step 2: %v", err)
	}
	if !bytes.Equal(marshal(t, view), want2) {
		t.Fatal("step 2: not the view its resume fetched")
	}
	if got := st.Stats(); got.Stale != 1 || got.Mismatches != 1 || damaged != 1 {
		t.Fatalf("stats %+v, %d deltas seen by the hook", got, damaged)
	}
	if len(s.got) != 3 || s.got[2].req.GetResume() == nil || s.streams != 1 {
		t.Fatalf("requests %v", s.got)
	}
}

// An answer whose step id names nothing the stream sent (a step not yet sent, no id while a
// step is awaited, not one of the stream's ids) is never returned: the stream is ended and
// the step resent on a new one, with its request id and no delta base.
func TestStreamReopensOnAnAnswerForNoStepItSent(t *testing.T) {
	v1, _ := fixture(t, 1)
	v2, want2 := fixture(t, 2)
	v3, _ := fixture(t, 3)
	for name, id := range map[string]string{"a step not sent": "7", "no step id": "", "not a step id": "x2"} {
		t.Run(name, func(t *testing.T) {
			s := &scripted{verbatim: true}
			s.answer = func(n int, req *ctxccv1.CompileStreamRequest) ([]*ctxccv1.CompileStreamResponse, error) {
				var r *ctxccv1.CompileStreamResponse
				switch n {
				case 1:
					r = whole(v1)
				case 2: // another view, and an append the step must not report
					r = whole(v3)
					r.Append = &ctxccv1.AppendResult{FirstSeq: 9, LastSeq: 9}
					r.StepId = id
					return []*ctxccv1.CompileStreamResponse{r}, nil
				default:
					r = whole(v2)
				}
				r.StepId = req.GetStep().GetStepId()
				return []*ctxccv1.CompileStreamResponse{r}, nil
			}
			c := serve(t, s)
			st := c.OpenStream(context.Background())
			defer st.Close()
			req := &ctxccv1.CompileRequest{SessionId: v1.GetSessionId(), Route: v1.GetRoute()}
			if _, _, err := st.Step(req, []*ctxccv1.Event{User("one")}, ""); err != nil {
				t.Fatal(err)
			}
			view, appended, err := st.Step(req, []*ctxccv1.Event{User("two")}, "")
			if err != nil {
				t.Fatalf("step 2: %v", err)
			}
			if !bytes.Equal(marshal(t, view), want2) || appended != nil {
				t.Fatalf("step 2 returned another step's answer (append %v)", appended)
			}
			if len(s.got) != 3 {
				t.Fatalf("%d requests", len(s.got))
			}
			sent, again := s.got[1], s.got[2]
			if again.stream != 2 || sent.stream != 1 || baseOf(again) != "" ||
				again.req.GetStep().GetRequestId() != sent.req.GetStep().GetRequestId() ||
				again.req.GetStep().GetStepId() != sent.req.GetStep().GetStepId() {
				t.Fatalf("step 2 was not resent on a new stream as it was: %v then %v", sent.req, again.req)
			}
		})
	}
}

// daemonClient is a client of the real daemon the tests that need one run against: the one
// at CTXCC_TARGET, which tests/e2e/test_clients.py starts and sets (skipped without it).
func daemonClient(t *testing.T) *Client {
	t.Helper()
	target := os.Getenv("CTXCC_TARGET")
	if target == "" {
		t.Skip("CTXCC_TARGET is not set (tests/e2e/test_clients.py runs this against a daemon)")
	}
	c, err := Dial(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// forward makes s a proxy of the daemon up: each request goes on to the daemon, on one
// stream of its own per stream of s, and what relay makes of the daemon's answer to it
// (its messages up to the view, the last chunk, the delta or the error) is sent, verbatim.
func forward(t *testing.T, s *scripted, up *Client,
	relay func(stream int, req *ctxccv1.CompileStreamRequest, answer []*ctxccv1.CompileStreamResponse) []*ctxccv1.CompileStreamResponse) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	var mu sync.Mutex
	ups := map[int]grpc.BidiStreamingClient[ctxccv1.CompileStreamRequest, ctxccv1.CompileStreamResponse]{}
	s.verbatim = true
	s.answer = func(n int, req *ctxccv1.CompileStreamRequest) ([]*ctxccv1.CompileStreamResponse, error) {
		s.mu.Lock()
		stream := s.got[n-1].stream
		s.mu.Unlock()
		mu.Lock()
		st, ok := ups[stream]
		if !ok {
			var err error
			if st, err = up.Compiles.CompileStream(ctx); err != nil {
				mu.Unlock()
				return nil, err
			}
			ups[stream] = st
		}
		mu.Unlock()
		if err := st.Send(req); err != nil {
			return nil, err
		}
		var answer []*ctxccv1.CompileStreamResponse
		for {
			r, err := st.Recv()
			if err != nil {
				return nil, err
			}
			answer = append(answer, r)
			if c := r.GetChunk(); c == nil || c.GetIndex()+1 == c.GetCount() {
				return relay(stream, req, answer), nil
			}
		}
	}
}

// Against a real daemon, behind a proxy that damages every delta's digest (so each step with
// a delta fetches its view whole with a ResumeRequest) and delivers each resume's answer a
// second time right after the next delta, while that step's own resume is awaited. The copy
// carries the earlier resume's step id: skipped, every step gets its own view on one stream.
// Cleared of its id, it is not taken either (the daemon echoed the first resume's id, so an
// empty one answers nothing the stream sent): the stream is reopened and the step resent. A
// daemon too old to echo the id (the proxy clears it on every resume's answer, and sends no
// copies) still gets its resumes answered. Before resumes had ids, the copy (no id, as every
// resume's answer) was returned as step 3's view: step 2's.
func TestStreamNeverTakesAnEarlierResumesAnswerFromADaemon(t *testing.T) {
	up := daemonClient(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name                   string
		clear, copies, oldEcho bool
		stale, streams, copied int
	}{
		{name: "copies with their id", copies: true, stale: 2, streams: 1, copied: 2},
		// Step 3 is resent on a new stream (no base: whole, no resume); step 4 resumes there
		// and no delta follows to carry its answer's copy.
		{name: "copies without an id", copies: true, clear: true, stale: 0, streams: 2, copied: 1},
		{name: "a daemon that does not echo", oldEcho: true, stale: 0, streams: 1, copied: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &scripted{}
			held := map[int][]*ctxccv1.CompileStreamResponse{}
			copied := 0
			forward(t, s, up, func(stream int, req *ctxccv1.CompileStreamRequest, answer []*ctxccv1.CompileStreamResponse) []*ctxccv1.CompileStreamResponse {
				if req.GetResume() != nil {
					for _, r := range answer {
						if tc.copies {
							c := proto.Clone(r).(*ctxccv1.CompileStreamResponse)
							if tc.clear {
								c.StepId = ""
							}
							held[stream] = append(held[stream], c)
						}
						if tc.oldEcho {
							r.StepId = ""
						}
					}
					return answer
				}
				if d := answer[0].GetDelta(); d != nil {
					if d.ChainSha256 != "" {
						d.ChainSha256 = strings.Repeat("0", 64)
					} else {
						d.ViewSha256 = strings.Repeat("0", 64)
					}
					copied += len(held[stream])
					answer = append(answer, held[stream]...)
					held[stream] = nil
				}
				return answer
			})
			c := serve(t, s)
			st := c.OpenStream(ctx)
			defer st.Close()
			sid := must(t)(up.CreateSession(ctx, &ctxccv1.Session{})).GetSessionId()
			req := &ctxccv1.CompileRequest{SessionId: sid, Route: &ctxccv1.Route{Connection: "example", Protocol: "fake", Endpoint: "local", Model: "gpt-4o"}}
			for n := 1; n <= 4; n++ {
				view, appended, err := st.Step(req, []*ctxccv1.Event{User(fmt.Sprintf("ask %d", n))}, "")
				if err != nil {
					t.Fatalf("step %d: %v", n, err)
				}
				if view.GetEventBoundary() != uint64(n) || appended.GetLastSeq() != uint64(n) {
					t.Fatalf("step %d was handed step %d's view (append %v)", n, view.GetEventBoundary(), appended)
				}
				again, err := up.Compile(ctx, &ctxccv1.CompileRequest{RebuildCompileId: view.GetCompileId()})
				if err != nil {
					t.Fatal(err)
				}
				if digestOf(t, view) != digestOf(t, again) {
					t.Fatalf("step %d: the view differs from its compile rebuilt whole", n)
				}
			}
			if got := st.Stats(); got.Stale != tc.stale || got.Mismatches != 3 || s.streams != tc.streams || copied != tc.copied {
				t.Fatalf("stats %+v, %d streams, %d copies delivered", got, s.streams, copied)
			}
		})
	}
}

func must(t *testing.T) func(*ctxccv1.Session, error) *ctxccv1.Session {
	return func(s *ctxccv1.Session, err error) *ctxccv1.Session {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
}

func digestOf(t *testing.T, v *ctxccv1.CompiledView) string {
	t.Helper()
	d, err := ViewDigest(v)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// A step bounded by StepContext whose answer never comes (a stalled daemon or
// connection) fails with the context's error once it ends, instead of waiting forever;
// the same events sent again go on a new stream under the same request id, so a daemon
// that appended them replays the append instead of appending them twice.
func TestAStepBoundedByItsContextKeepsItsRequestID(t *testing.T) {
	v1, _ := fixture(t, 1)
	s := &scripted{}
	s.answer = func(n int, req *ctxccv1.CompileStreamRequest) ([]*ctxccv1.CompileStreamResponse, error) {
		if n == 1 {
			return nil, nil // never answered
		}
		return []*ctxccv1.CompileStreamResponse{whole(v1)}, nil
	}
	c := serve(t, s)
	st := c.OpenStream(context.Background())
	defer st.Close()
	req := &ctxccv1.CompileRequest{SessionId: v1.GetSessionId(), Route: v1.GetRoute()}
	events := []*ctxccv1.Event{User("please run the tests")}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, _, err := st.StepContext(ctx, req, events, ""); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want the step's deadline", err)
	}
	view, _, err := st.Step(req, events, "")
	if err != nil || view.GetCompileId() != v1.GetCompileId() {
		t.Fatalf("the step again: %v, %v", view.GetCompileId(), err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.got) != 2 || s.got[0].stream == s.got[1].stream {
		t.Fatalf("requests %d on streams %v", len(s.got), s.got)
	}
	first, again := s.got[0].req.GetStep().GetRequestId(), s.got[1].req.GetStep().GetRequestId()
	if first == "" || first != again {
		t.Fatalf("request ids %q then %q, want the same", first, again)
	}
}

// A stream whose first step (sent from another goroutine, its error on `running`) is
// never answered; the scripted daemon answers any later request with a whole view.
// `endStream` ends the stream (and so that step).
func stalledStep(t *testing.T) (*scripted, *Stream, *ctxccv1.CompileRequest, context.CancelFunc, chan error) {
	t.Helper()
	v1, _ := fixture(t, 1)
	s := &scripted{}
	first := make(chan struct{})
	s.answer = func(n int, req *ctxccv1.CompileStreamRequest) ([]*ctxccv1.CompileStreamResponse, error) {
		if n == 1 {
			close(first)
			return nil, nil // never answered
		}
		return []*ctxccv1.CompileStreamResponse{whole(v1)}, nil
	}
	c := serve(t, s)
	streamCtx, endStream := context.WithCancel(context.Background())
	st := c.OpenStream(streamCtx)
	req := &ctxccv1.CompileRequest{SessionId: v1.GetSessionId(), Route: v1.GetRoute()}
	running := make(chan error, 1)
	go func() {
		_, _, err := st.Step(req, []*ctxccv1.Event{User("one")}, "")
		running <- err
	}()
	<-first
	return s, st, req, endStream, running
}

// endsCanceled takes the next error from errs, which must be the caller's context's: a
// call waiting behind a step that never ends returns once its own context ends. The
// minute is a bound, not a wait (the stalled step never ends).
func endsCanceled(t *testing.T, errs <-chan error, stuck string) {
	t.Helper()
	select {
	case err := <-errs:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want the call's context's", err)
		}
	case <-time.After(time.Minute):
		t.Fatal(stuck)
	}
}

// A step bounded by StepContext that waits its turn behind another goroutine's step (one
// whose answer never comes) fails with its context's error when that ends, and is never
// sent; it waited for the lock the running step held, as long as that step ran.
func TestAStepWaitingItsTurnEndsWithItsContext(t *testing.T) {
	s, st, req, endStream, running := stalledStep(t)
	defer endStream()
	ctx, cancel := context.WithCancel(context.Background())
	queued := make(chan error, 1)
	go func() {
		_, _, err := st.StepContext(ctx, req, []*ctxccv1.Event{User("two")}, "")
		queued <- err
	}()
	cancel()
	endsCanceled(t, queued, "the step whose context ended still waits behind the stalled one")
	endStream()
	<-running
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.got) != 1 {
		t.Fatalf("%d requests sent, want the first step's alone", len(s.got))
	}
}

// ReportUsage and FlushUsage called while another goroutine's step runs (one whose answer
// never comes) return their context's error when it ends, queuing and sending nothing;
// they waited for the step as long as it ran, whatever their context.
func TestUsageCallsWaitingForAStepEndWithTheirContext(t *testing.T) {
	s, st, _, endStream, running := stalledStep(t)
	defer endStream()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 2)
	go func() {
		_, err := st.ReportUsage(ctx, &ctxccv1.ReportUsageRequest{CompileId: "s:c1", InputTokens: 10})
		done <- err
	}()
	go func() {
		_, err := st.FlushUsage(ctx)
		done <- err
	}()
	cancel()
	for range 2 {
		endsCanceled(t, done, "a usage call whose context ended still waits behind the stalled step")
	}
	endStream()
	<-running
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.reports) != 0 {
		t.Fatalf("%d unary reports sent, want none", len(s.reports))
	}
}

// Stats and LastUsage answer while another goroutine's step runs (one whose answer never
// comes), with what the last step that ended left; they waited for the running step, so
// an agent's monitoring goroutine hung as long as the daemon did.
func TestStatsAndLastUsageDoNotWaitForARunningStep(t *testing.T) {
	_, st, _, endStream, running := stalledStep(t)
	defer endStream()
	answered := make(chan StreamStats, 1)
	go func() {
		if st.LastUsage() != nil {
			t.Error("a usage answer before any step ended")
		}
		answered <- st.Stats()
	}()
	select {
	case got := <-answered:
		if got != (StreamStats{}) {
			t.Fatalf("stats %+v before any step ended", got)
		}
	case <-time.After(time.Minute): // a bound, not a wait: the step never ends
		t.Fatal("Stats waits for the running step")
	}
	endStream()
	<-running
}
