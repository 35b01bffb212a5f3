package ctxcc

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/ctxcc/ctxcc/client/go/ctxccv1"
)

// watchScript is a SessionService whose n-th WatchSession call sends calls[n-1]'s events
// after the after_seq asked for, then ends Unavailable (a daemon restart); the last call's
// events end the stream cleanly. It records every after_seq asked for.
type watchScript struct {
	ctxccv1.UnimplementedSessionServiceServer
	mu    sync.Mutex
	asked []uint64
	calls [][]*ctxccv1.Event
	// How a call before the last ends: Unavailable unless set.
	endWith codes.Code
	// The create time header of each call, sent at once (none when empty or missing).
	made []string
}

func (s *watchScript) WatchSession(req *ctxccv1.WatchSessionRequest, st grpc.ServerStreamingServer[ctxccv1.WatchSessionResponse]) error {
	s.mu.Lock()
	s.asked = append(s.asked, req.GetAfterSeq())
	n := len(s.asked)
	s.mu.Unlock()
	log := s.calls[n-1]
	if n <= len(s.made) && s.made[n-1] != "" {
		if err := st.SendHeader(metadata.Pairs(SessionCreateTimeKey, s.made[n-1])); err != nil {
			return err
		}
	}
	head := uint64(0)
	if len(log) > 0 {
		head = log[len(log)-1].GetSeq()
	}
	if req.GetAfterSeq() > head {
		st, _ := status.New(codes.OutOfRange, "after_seq beyond the head").WithDetails(&errdetails.ErrorInfo{
			Reason: "SEQ_OUT_OF_RANGE", Domain: "ctxcc.dev", Metadata: map[string]string{"head_seq": "0"},
		})
		return st.Err()
	}
	for _, ev := range log {
		if ev.GetSeq() <= req.GetAfterSeq() {
			continue
		}
		if err := st.Send(&ctxccv1.WatchSessionResponse{Update: &ctxccv1.WatchSessionResponse_Event{Event: ev}}); err != nil {
			return err
		}
	}
	if n < len(s.calls) {
		if s.endWith != codes.OK {
			return status.Error(s.endWith, "CANCELLED")
		}
		return status.Error(codes.Unavailable, "restarting")
	}
	return nil
}

func logEvent(seq uint64, id string, at int64) *ctxccv1.Event {
	return &ctxccv1.Event{Seq: seq, EventId: id, CreateTime: timestamppb.New(time.Unix(at, 0))}
}

func watchAll(t *testing.T, s *watchScript) ([]string, error) {
	t.Helper()
	c := serveWith(t, func(srv *grpc.Server) { ctxccv1.RegisterSessionServiceServer(srv, s) })
	var got []string
	err := c.Watch(context.Background(), "s", 0, func(m *ctxccv1.WatchSessionResponse) bool {
		got = append(got, m.GetEvent().GetEventId())
		return true
	})
	return got, err
}

// A reconnect to the same log goes on after the last event delivered, which it asks for
// again (after_seq one less) to check it, and does not deliver twice.
func TestWatchReopensAfterTheLastEventOnce(t *testing.T) {
	old := []*ctxccv1.Event{logEvent(1, "e1", 10), logEvent(2, "e2", 11), logEvent(3, "e3", 12)}
	s := &watchScript{calls: [][]*ctxccv1.Event{old[:2], old}}
	got, err := watchAll(t, s)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"e1", "e2", "e3"}; len(got) != 3 || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Fatalf("delivered %v, want %v", got, want)
	}
	if s.asked[0] != 0 || s.asked[1] != 1 {
		t.Fatalf("after_seq asked %v, want [0 1]", s.asked)
	}
}

// The session was deleted and made again while the watch was away: the log under the id
// holds other events at the same seqs. The watch ends SESSION_NOT_FOUND instead of
// delivering the new log's events as the old one's next ones.
func TestWatchDoesNotFollowASessionMadeAgain(t *testing.T) {
	old := []*ctxccv1.Event{logEvent(1, "e1", 10), logEvent(2, "e2", 11)}
	remade := []*ctxccv1.Event{logEvent(1, "n1", 20), logEvent(2, "n2", 21), logEvent(3, "n3", 22)}
	got, err := watchAll(t, &watchScript{calls: [][]*ctxccv1.Event{old, remade}})
	e, ok := AsError(err)
	if !ok || e.Code != codes.NotFound || e.Reason != "SESSION_NOT_FOUND" {
		t.Fatalf("Watch ended with %v after %v, want SESSION_NOT_FOUND", err, got)
	}
	if len(got) != 2 {
		t.Fatalf("delivered %v, want only e1 e2", got)
	}
	// A log made again that is shorter than the position: OUT_OF_RANGE, the same answer.
	_, err = watchAll(t, &watchScript{calls: [][]*ctxccv1.Event{old, remade[:0]}})
	if e, ok := AsError(err); !ok || e.Reason != "SESSION_NOT_FOUND" {
		t.Fatalf("Watch on a shorter log ended with %v, want SESSION_NOT_FOUND", err)
	}
}

// A watch that delivered nothing has no event to ask for again: the create time in the
// daemon's header tells it that the session under the id was made again while it was away,
// and it ends SESSION_NOT_FOUND instead of delivering the new log from seq 1.
func TestWatchThatDeliveredNothingDoesNotFollowASessionMadeAgain(t *testing.T) {
	remade := []*ctxccv1.Event{logEvent(1, "n1", 20), logEvent(2, "n2", 21)}
	got, err := watchAll(t, &watchScript{calls: [][]*ctxccv1.Event{nil, remade}, made: []string{"100", "200"}})
	e, ok := AsError(err)
	if !ok || e.Code != codes.NotFound || e.Reason != "SESSION_NOT_FOUND" {
		t.Fatalf("Watch ended with %v after %v, want SESSION_NOT_FOUND", err, got)
	}
	if len(got) != 0 {
		t.Fatalf("delivered %v, want nothing", got)
	}
	// The same session (the same create time), or a daemon that sends no header: followed.
	for _, made := range [][]string{{"100", "100"}, {"100", ""}, nil} {
		got, err = watchAll(t, &watchScript{calls: [][]*ctxccv1.Event{nil, remade}, made: made})
		if err != nil || len(got) != 2 || got[0] != "n1" || got[1] != "n2" {
			t.Fatalf("headers %v: delivered %v and ended with %v, want [n1 n2]", made, got, err)
		}
	}
}

// gRPC's stop in a daemon shutting down cancels the calls that reach it after the drain
// with a bare Canceled: the watch reopens after the last event, as after Unavailable.
func TestWatchReopensAfterABareCanceled(t *testing.T) {
	old := []*ctxccv1.Event{logEvent(1, "e1", 10), logEvent(2, "e2", 11)}
	s := &watchScript{calls: [][]*ctxccv1.Event{old[:1], old}, endWith: codes.Canceled}
	got, err := watchAll(t, s)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0] != "e1" || got[1] != "e2" {
		t.Fatalf("delivered %v, want [e1 e2]", got)
	}
}

// A step whose stream the daemon's gRPC cancelled as it stopped is sent again, with the same
// request id, on a new stream; a Canceled with an ErrorInfo is the daemon's answer, not
// retried.
func TestStreamResendsAStepAfterABareCanceled(t *testing.T) {
	v1, want1 := fixture(t, 1)
	s := &scripted{}
	s.answer = func(n int, req *ctxccv1.CompileStreamRequest) ([]*ctxccv1.CompileStreamResponse, error) {
		if n == 1 {
			return nil, status.Error(codes.Canceled, "CANCELLED")
		}
		return []*ctxccv1.CompileStreamResponse{whole(v1)}, nil
	}
	c := serve(t, s)
	st := c.OpenStream(context.Background())
	defer st.Close()
	req := &ctxccv1.CompileRequest{SessionId: v1.GetSessionId(), Route: v1.GetRoute()}
	view, _, err := st.Step(req, []*ctxccv1.Event{User("step")}, "r-1")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(marshal(t, view), want1) {
		t.Fatal("the resent step's view differs")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.got) != 2 || s.got[0].stream == s.got[1].stream ||
		s.got[0].req.GetStep().GetRequestId() != "r-1" || s.got[1].req.GetStep().GetRequestId() != "r-1" {
		t.Fatalf("step sent %d times; want twice, on two streams, with request id r-1", len(s.got))
	}
}

func TestACanceledWithAnErrorInfoIsNotRetried(t *testing.T) {
	st, err := status.New(codes.Canceled, "cancelled").WithDetails(&errdetails.ErrorInfo{Reason: "INTERNAL", Domain: "ctxcc.dev"})
	if err != nil {
		t.Fatal(err)
	}
	if retryable(context.Background(), st.Err()) {
		t.Fatal("a Canceled carrying the daemon's ErrorInfo was taken for gRPC's own")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if retryable(ctx, status.Error(codes.Canceled, "context canceled")) {
		t.Fatal("a call this process cancelled was taken for one the daemon's gRPC cancelled")
	}
}
