package ctxcc

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/ctxcc/ctxcc/client/go/ctxccv1"
)

// scripted is a CompileService whose stream answers each request with what answer returns
// for it (an error ends the stream with that status), and records every request with the
// number of the stream it came on. An answer to a step or a resume goes under its id, as the
// daemon sends it, unless it has one already or verbatim is set; with twice every response
// is sent twice in a row, as a proxy that duplicates messages delivers them.
type scripted struct {
	ctxccv1.UnimplementedCompileServiceServer
	verbatim bool
	twice    bool
	mu       sync.Mutex
	streams  int
	got      []recorded
	sent     int64 // bytes of the answers sent
	reports  []*ctxccv1.ReportUsageRequest
	answer   func(n int, req *ctxccv1.CompileStreamRequest) ([]*ctxccv1.CompileStreamResponse, error)
}

type recorded struct {
	stream int
	req    *ctxccv1.CompileStreamRequest
}

func (s *scripted) CompileStream(st grpc.BidiStreamingServer[ctxccv1.CompileStreamRequest, ctxccv1.CompileStreamResponse]) error {
	s.mu.Lock()
	s.streams++
	n := s.streams
	s.mu.Unlock()
	for {
		req, err := st.Recv()
		if err != nil {
			return nil
		}
		s.mu.Lock()
		s.got = append(s.got, recorded{n, req})
		count := len(s.got)
		s.mu.Unlock()
		out, err := s.answer(count, req)
		if err != nil {
			return err
		}
		for _, r := range out {
			if !s.verbatim && r.GetStepId() == "" && req.GetStep() != nil {
				r.StepId = req.GetStep().GetStepId()
			}
			if !s.verbatim && r.GetStepId() == "" && req.GetResume() != nil {
				r.StepId = req.GetResume().GetStepId()
			}
			copies := 1
			if s.twice {
				copies = 2
			}
			for range copies {
				s.mu.Lock()
				s.sent += int64(proto.Size(r))
				s.mu.Unlock()
				if err := st.Send(r); err != nil {
					return err
				}
			}
		}
	}
}

// ReportUsage records the unary reports (the ones no step carried).
func (s *scripted) ReportUsage(_ context.Context, req *ctxccv1.ReportUsageRequest) (*ctxccv1.ReportUsageResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reports = append(s.reports, req)
	return &ctxccv1.ReportUsageResponse{EstimatedInputTokens: 1}, nil
}

func (s *scripted) sentBytes() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sent
}

func serve(t *testing.T, s *scripted) *Client {
	t.Helper()
	return serveWith(t, func(srv *grpc.Server) { ctxccv1.RegisterCompileServiceServer(srv, s) })
}

// serveWith starts a gRPC server on a free local port with the services `register` adds,
// and a client of it that retries for up to 5 s; both stop when the test ends.
func serveWith(t *testing.T, register func(*grpc.Server)) *Client {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	register(srv)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	c, err := Dial(lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c.RetryFor = 5 * time.Second
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func whole(v *ctxccv1.CompiledView) *ctxccv1.CompileStreamResponse {
	return &ctxccv1.CompileStreamResponse{Response: &ctxccv1.CompileStreamResponse_View{View: v}}
}

func asDelta(d *ctxccv1.ViewDelta, appended *ctxccv1.AppendResult) *ctxccv1.CompileStreamResponse {
	return &ctxccv1.CompileStreamResponse{Response: &ctxccv1.CompileStreamResponse_Delta{Delta: d}, Append: appended}
}

// chunked sends a view in two chunks, as the daemon does above its chunk size.
func chunked(t *testing.T, v *ctxccv1.CompiledView) []*ctxccv1.CompileStreamResponse {
	data := marshal(t, v)
	sum := sha256.Sum256(data)
	var out []*ctxccv1.CompileStreamResponse
	for i, part := range [][]byte{data[:len(data)/2], data[len(data)/2:]} {
		out = append(out, &ctxccv1.CompileStreamResponse{Response: &ctxccv1.CompileStreamResponse_Chunk{Chunk: &ctxccv1.ViewChunk{
			CompileId: v.GetCompileId(), Index: uint32(i), Count: 2, Data: part, Sha256: hex.EncodeToString(sum[:])}}})
	}
	return out
}

func baseOf(r recorded) string { return r.req.GetStep().GetDeltaBaseCompileId() }

func TestStreamAppliesDeltasAndRefetchesOnMismatch(t *testing.T) {
	v1, want1 := fixture(t, 1)
	v2, want2 := fixture(t, 2)
	v3, want3 := fixture(t, 3)
	d12, d23 := makeDelta(t, v1, v2), makeDelta(t, v2, v3)
	s := &scripted{}
	s.answer = func(n int, req *ctxccv1.CompileStreamRequest) ([]*ctxccv1.CompileStreamResponse, error) {
		switch n {
		case 1:
			return []*ctxccv1.CompileStreamResponse{whole(v1)}, nil
		case 2:
			return []*ctxccv1.CompileStreamResponse{asDelta(d12, &ctxccv1.AppendResult{FirstSeq: 2, LastSeq: 3})}, nil
		case 3:
			return []*ctxccv1.CompileStreamResponse{asDelta(d23, &ctxccv1.AppendResult{FirstSeq: 4, LastSeq: 5})}, nil
		case 4: // the resume after the mismatch
			return chunked(t, v3), nil
		case 5: // the daemon goes away
			return nil, status.Error(codes.Unavailable, "restarting")
		default:
			return []*ctxccv1.CompileStreamResponse{whole(v3)}, nil
		}
	}
	c := serve(t, s)
	corrupt := 0
	st := c.OpenStream(context.Background(), WithDeltaHook(func(d *ctxccv1.ViewDelta) {
		if d.GetHead().GetCompileId() == v3.GetCompileId() {
			corrupt++
			d.AppendedMessages[0].Tokens++
		}
	}))
	defer st.Close()
	req := &ctxccv1.CompileRequest{SessionId: v1.GetSessionId(), Route: v1.GetRoute()}
	want := [][]byte{want1, want2, want3, want3}
	var appends []*ctxccv1.AppendResult
	for i, w := range want {
		view, appended, err := st.Step(req, []*ctxccv1.Event{User("step")}, "")
		if err != nil {
			t.Fatalf("step %d: %v", i+1, err)
		}
		if !bytes.Equal(marshal(t, view), w) {
			t.Fatalf("step %d: the view differs from the daemon's", i+1)
		}
		appends = append(appends, appended)
	}
	if corrupt != 1 {
		t.Fatalf("the hook saw %d deltas for v3", corrupt)
	}
	if got := st.Stats(); got != (StreamStats{Whole: 3, Deltas: 1, Mismatches: 1, Bytes: s.sentBytes()}) || got.Bytes == 0 {
		t.Fatalf("stats %+v", got)
	}
	// The refetched view comes with the append of the step whose delta failed.
	if appends[2].GetFirstSeq() != 4 {
		t.Fatalf("step 3's append: %v", appends[2])
	}
	got := s.got
	if len(got) != 6 {
		t.Fatalf("%d requests", len(got))
	}
	// Each step names the last view applied and checked; after a mismatch the resume quotes
	// the delta's compile with the step's compile request; a reopened stream names none.
	for i, wantBase := range []string{"", v1.GetCompileId(), v2.GetCompileId()} {
		if baseOf(got[i]) != wantBase {
			t.Fatalf("request %d names base %q, not %q", i+1, baseOf(got[i]), wantBase)
		}
	}
	resume := got[3].req.GetResume()
	if resume.GetCompileId() != v3.GetCompileId() || !proto.Equal(resume.GetCompile(), req) {
		t.Fatalf("no resume of %s after the mismatch: %v", v3.GetCompileId(), got[3].req)
	}
	if baseOf(got[4]) != v3.GetCompileId() || got[4].stream != 1 {
		t.Fatalf("the step after the refetch names %q", baseOf(got[4]))
	}
	if baseOf(got[5]) != "" || got[5].stream != 2 || got[5].req.GetStep().GetRequestId() != got[4].req.GetStep().GetRequestId() {
		t.Fatalf("the resent step on a new stream: %v (stream %d)", got[5].req, got[5].stream)
	}
}

func TestStreamWithoutDeltas(t *testing.T) {
	v1, _ := fixture(t, 1)
	v2, want2 := fixture(t, 2)
	s := &scripted{}
	s.answer = func(n int, req *ctxccv1.CompileStreamRequest) ([]*ctxccv1.CompileStreamResponse, error) {
		switch n {
		case 1:
			return []*ctxccv1.CompileStreamResponse{whole(v1)}, nil
		case 2: // a delta nobody asked for cannot be applied: fetched whole
			return []*ctxccv1.CompileStreamResponse{asDelta(makeDelta(t, v1, v2), nil)}, nil
		default:
			return []*ctxccv1.CompileStreamResponse{whole(v2)}, nil
		}
	}
	c := serve(t, s)
	st := c.OpenStream(context.Background(), WithoutDeltas())
	defer st.Close()
	req := &ctxccv1.CompileRequest{SessionId: v1.GetSessionId()}
	var view *ctxccv1.CompiledView
	for range 3 {
		var err error
		if view, _, err = st.Step(req, nil, ""); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(marshal(t, view), want2) {
		t.Fatal("the last view differs")
	}
	for i, r := range s.got {
		if r.req.GetStep() != nil && baseOf(r) != "" {
			t.Fatalf("request %d asks for a delta against %q", i+1, baseOf(r))
		}
	}
	if len(s.got) != 4 || s.got[2].req.GetResume().GetCompileId() != v2.GetCompileId() {
		t.Fatalf("requests: %v", s.got)
	}
	if got := st.Stats(); got != (StreamStats{Whole: 3, Deltas: 0, Mismatches: 1, Bytes: s.sentBytes()}) {
		t.Fatalf("stats %+v", got)
	}
}

// A daemon whose deltas never check out (say, views with fields this client does not know)
// is asked for whole views after three failures in a row.
func TestStreamStopsAskingAfterRepeatedMismatches(t *testing.T) {
	v1, _ := fixture(t, 1)
	v2, _ := fixture(t, 2)
	bad := makeDelta(t, v1, v2)
	bad.ViewSha256 = hex.EncodeToString(make([]byte, 32))
	s := &scripted{}
	s.answer = func(n int, req *ctxccv1.CompileStreamRequest) ([]*ctxccv1.CompileStreamResponse, error) {
		if base := req.GetStep().GetDeltaBaseCompileId(); base != "" {
			return []*ctxccv1.CompileStreamResponse{asDelta(proto.Clone(bad).(*ctxccv1.ViewDelta), nil)}, nil
		}
		return []*ctxccv1.CompileStreamResponse{whole(v1)}, nil
	}
	c := serve(t, s)
	st := c.OpenStream(context.Background())
	defer st.Close()
	for range 6 {
		if _, _, err := st.Step(&ctxccv1.CompileRequest{}, nil, ""); err != nil {
			t.Fatal(err)
		}
	}
	if got := st.Stats(); got.Mismatches != 3 || got.Deltas != 0 {
		t.Fatalf("stats %+v", got)
	}
	last := s.got[len(s.got)-1]
	if baseOf(last) != "" {
		t.Fatalf("still asks for deltas: %v", last.req)
	}
}

// Chunks whose index or count do not fit the view they belong to are an error of the step,
// not a panic of the agent.
func TestStreamRefusesChunksOutOfRange(t *testing.T) {
	v1, _ := fixture(t, 1)
	for name, bad := range map[string][]*ctxccv1.ViewChunk{
		"index past count": {{CompileId: "c", Index: 2, Count: 2}},
		"count zero":       {{CompileId: "c", Index: 0, Count: 0}},
		"count too large":  {{CompileId: "c", Index: 0, Count: maxChunks + 1}},
		"count changes":    {{CompileId: "c", Index: 0, Count: 2}, {CompileId: "c", Index: 2, Count: 3}},
	} {
		t.Run(name, func(t *testing.T) {
			s := &scripted{}
			s.answer = func(n int, req *ctxccv1.CompileStreamRequest) ([]*ctxccv1.CompileStreamResponse, error) {
				var out []*ctxccv1.CompileStreamResponse
				for _, ch := range bad {
					out = append(out, &ctxccv1.CompileStreamResponse{Response: &ctxccv1.CompileStreamResponse_Chunk{Chunk: ch}})
				}
				return out, nil
			}
			c := serve(t, s)
			st := c.OpenStream(context.Background(), WithoutDeltas())
			defer st.Close()
			_, _, err := st.Step(&ctxccv1.CompileRequest{SessionId: v1.GetSessionId()}, nil, "")
			if err == nil || !strings.Contains(err.Error(), "chunk") {
				t.Fatalf("err = %v, want a chunk error", err)
			}
		})
	}
}

// A step whose compile failed in-band after its events may have been appended (over the
// daemon's CPU budget, say) keeps its request id when Step is called again with the same
// events, so the append is replayed; a step after a success gets a new id.
func TestStreamReusesTheRequestIDOfAStepThatFailedInBand(t *testing.T) {
	v1, _ := fixture(t, 1)
	s := &scripted{}
	s.answer = func(n int, req *ctxccv1.CompileStreamRequest) ([]*ctxccv1.CompileStreamResponse, error) {
		if n == 1 {
			return []*ctxccv1.CompileStreamResponse{{
				Append: &ctxccv1.AppendResult{FirstSeq: 1, LastSeq: 1},
				Response: &ctxccv1.CompileStreamResponse_Error{Error: &ctxccv1.StepError{
					Code: int32(codes.ResourceExhausted), Reason: "QUOTA_EXCEEDED", Message: "over budget"}},
			}}, nil
		}
		return []*ctxccv1.CompileStreamResponse{whole(v1)}, nil
	}
	c := serve(t, s)
	c.RetryFor = 0
	st := c.OpenStream(context.Background())
	req := &ctxccv1.CompileRequest{SessionId: v1.GetSessionId(), Route: v1.GetRoute()}
	events := []*ctxccv1.Event{User("one")}
	if _, _, err := st.Step(req, events, ""); err == nil {
		t.Fatal("step 1 should fail in-band")
	}
	for i := 0; i < 2; i++ {
		if _, _, err := st.Step(req, events, ""); err != nil {
			t.Fatalf("step %d: %v", i+2, err)
		}
	}
	var ids []string
	for _, r := range s.got {
		ids = append(ids, r.req.GetStep().GetRequestId())
	}
	if len(ids) != 3 || ids[0] == "" || ids[1] != ids[0] || ids[2] == ids[0] {
		t.Fatalf("request ids %q: want the failed step's again, then a new one", ids)
	}
}

// A step's in-band error carries the ErrorInfo metadata a unary call would (head_seq of a
// SEQUENCE_MISMATCH, to retry an optimistic append without parsing the message).
func TestAStepErrorCarriesItsMetadata(t *testing.T) {
	v1, _ := fixture(t, 1)
	s := &scripted{}
	s.answer = func(n int, req *ctxccv1.CompileStreamRequest) ([]*ctxccv1.CompileStreamResponse, error) {
		return []*ctxccv1.CompileStreamResponse{{
			Response: &ctxccv1.CompileStreamResponse_Error{Error: &ctxccv1.StepError{
				Code: int32(codes.FailedPrecondition), Reason: "SEQUENCE_MISMATCH", Message: "head moved",
				Metadata: map[string]string{"head_seq": "7", "expected_last_seq": "5"}}},
		}}, nil
	}
	c := serve(t, s)
	c.RetryFor = 0
	st := c.OpenStream(context.Background())
	req := &ctxccv1.CompileRequest{SessionId: v1.GetSessionId(), Route: v1.GetRoute()}
	_, _, err := st.Step(req, []*ctxccv1.Event{User("one")}, "")
	e, ok := AsError(err)
	if !ok || e.Reason != "SEQUENCE_MISMATCH" || e.Metadata["head_seq"] != "7" {
		t.Fatalf("err = %#v, want SEQUENCE_MISMATCH with head_seq 7", err)
	}
}

// A step larger than the daemon's --max-message-bytes is refused by gRPC itself
// (RESOURCE_EXHAUSTED, no reason), which ends the call: the stream must not keep it. The
// next step (smaller) goes on a new stream and is answered, the refused step appended
// nothing, and every step after it is answered too. Against a real daemon (CTXCC_TARGET,
// CTXCC_MAX_MESSAGE_BYTES its --max-message-bytes; tests/e2e/test_clients.py starts one
// with 2 MiB), skipped without.
func TestAStepGRPCRefusesLeavesTheStreamUsable(t *testing.T) {
	c := daemonClient(t)
	limit := 64 << 20
	if v := os.Getenv("CTXCC_MAX_MESSAGE_BYTES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			t.Fatal(err)
		}
		limit = n
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	session, err := c.CreateSession(ctx, &ctxccv1.Session{})
	if err != nil {
		t.Fatal(err)
	}
	route := &ctxccv1.Route{Connection: "default", Protocol: "openai-chat", Endpoint: "api", Model: "gpt-4o"}
	req := &ctxccv1.CompileRequest{SessionId: session.GetSessionId(), Route: route}
	st := c.OpenStream(ctx)
	defer st.Close()
	if _, _, err := st.Step(req, []*ctxccv1.Event{User("start")}, ""); err != nil {
		t.Fatal(err)
	}
	// Events under the daemon's 1 MiB per event, together over its message limit.
	var big []*ctxccv1.Event
	for n := 0; n <= limit; n += 900_000 {
		big = append(big, User(strings.Repeat("x", 900_000)))
	}
	_, _, err = st.Step(req, big, "")
	if e, ok := AsError(err); !ok || e.Code != codes.ResourceExhausted {
		t.Fatalf("the step over the message limit: %v, want ResourceExhausted", err)
	}
	for i, text := range []string{"after the refused step", "and the next"} {
		view, appended, err := st.Step(req, []*ctxccv1.Event{User(text)}, "")
		if err != nil {
			t.Fatalf("step %d after the refused one: %v", i+1, err)
		}
		if appended.GetFirstSeq() != uint64(i+2) || len(view.GetMessages()) != i+2 {
			t.Fatalf("step %d after the refused one: appended %v, %d messages", i+1, appended, len(view.GetMessages()))
		}
	}
}

// A step refused in-band under a transient quota (request_bytes_in_memory: nothing of it
// was done) is sent again on the same stream, with the same step and request ids, and
// answered; one refused under a lasting quota fails on its first answer.
func TestAStepRefusedForATransientQuotaIsSentAgainOnTheSameStream(t *testing.T) {
	v1, _ := fixture(t, 1)
	for _, tc := range []struct {
		quota string
		sent  int
	}{{"request_bytes_in_memory", 3}, {"max_message_bytes", 1}} {
		t.Run(tc.quota, func(t *testing.T) {
			s := &scripted{}
			s.answer = func(n int, req *ctxccv1.CompileStreamRequest) ([]*ctxccv1.CompileStreamResponse, error) {
				if n < 3 {
					return []*ctxccv1.CompileStreamResponse{{
						StepId: req.GetStep().GetStepId(),
						Response: &ctxccv1.CompileStreamResponse_Error{Error: &ctxccv1.StepError{
							Code: int32(codes.ResourceExhausted), Reason: "QUOTA_EXCEEDED", Message: "retry later",
							Metadata: map[string]string{"quota": tc.quota, "limit": "1048576"}}},
					}}, nil
				}
				return []*ctxccv1.CompileStreamResponse{whole(v1)}, nil
			}
			c := serve(t, s)
			c.RetryFor = 5 * time.Second
			st := c.OpenStream(context.Background())
			req := &ctxccv1.CompileRequest{SessionId: v1.GetSessionId(), Route: v1.GetRoute()}
			_, _, err := st.Step(req, []*ctxccv1.Event{User("one")}, "")
			if tc.sent == 1 {
				if e, ok := AsError(err); !ok || e.Metadata["quota"] != tc.quota {
					t.Fatalf("err = %v; want the %s refusal", err, tc.quota)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			if len(s.got) != tc.sent {
				t.Fatalf("%d steps sent; want %d", len(s.got), tc.sent)
			}
			for _, r := range s.got {
				first := s.got[0]
				if r.stream != first.stream || r.req.GetStep().GetRequestId() != first.req.GetStep().GetRequestId() ||
					r.req.GetStep().GetStepId() != first.req.GetStep().GetStepId() {
					t.Fatalf("sent %v on stream %d; want %v again on stream %d", r.req, r.stream, first.req, first.stream)
				}
			}
		})
	}
}
