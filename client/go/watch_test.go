package ctxcc

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
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
}

func (s *watchScript) WatchSession(req *ctxccv1.WatchSessionRequest, st grpc.ServerStreamingServer[ctxccv1.WatchSessionResponse]) error {
	s.mu.Lock()
	s.asked = append(s.asked, req.GetAfterSeq())
	n := len(s.asked)
	s.mu.Unlock()
	log := s.calls[n-1]
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
		return status.Error(codes.Unavailable, "restarting")
	}
	return nil
}

func logEvent(seq uint64, id string, at int64) *ctxccv1.Event {
	return &ctxccv1.Event{Seq: seq, EventId: id, CreateTime: timestamppb.New(time.Unix(at, 0))}
}

func watchAll(t *testing.T, s *watchScript) ([]string, error) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	ctxccv1.RegisterSessionServiceServer(srv, s)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	c, err := Dial(lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c.RetryFor = 5 * time.Second
	t.Cleanup(func() { _ = c.Close() })
	var got []string
	err = c.Watch(context.Background(), "s", 0, func(m *ctxccv1.WatchSessionResponse) bool {
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
