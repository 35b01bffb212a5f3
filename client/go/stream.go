package ctxcc

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/ctxcc/ctxcc/client/go/ctxccv1"
)

// Stream is one long-lived CompileStream. Step sends events and a compile request and
// returns the view, reassembling chunked views. When the daemon goes away (a restart,
// SIGTERM ending idle streams with Unavailable, a dropped connection) Step reopens the
// stream and resends the step with the same request id: the append is replayed, never
// duplicated.
type Stream struct {
	c      *Client
	ctx    context.Context
	mu     sync.Mutex
	stream grpc.BidiStreamingClient[ctxccv1.CompileStreamRequest, ctxccv1.CompileStreamResponse]
	cancel context.CancelFunc
	step   int
	// The request id of a step that failed, by its events: calling Step again with the
	// same events (the natural "try again") reuses it instead of appending them twice.
	unfinishedKey, unfinishedID string
}

// OpenStream opens a compile stream; it reopens itself when the connection drops.
func (c *Client) OpenStream(ctx context.Context) *Stream { return &Stream{c: c, ctx: ctx} }

// Close ends the stream.
func (s *Stream) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stream == nil {
		return nil
	}
	err := s.stream.CloseSend()
	s.drop()
	return err
}

func (s *Stream) drop() {
	if s.cancel != nil {
		s.cancel()
	}
	s.stream, s.cancel = nil, nil
}

func eventsKey(events []*ctxccv1.Event) string {
	h := sha256.New()
	for _, e := range events {
		b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(e)
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Step appends events (if any) and compiles, in one round trip. The request id is fixed
// here, before the first attempt ("" picks one), and every retry resends it.
func (s *Stream) Step(req *ctxccv1.CompileRequest, events []*ctxccv1.Event, requestID string) (*ctxccv1.CompiledView, *ctxccv1.AppendResult, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	key := ""
	if len(events) > 0 {
		key = eventsKey(events)
	}
	if requestID == "" && len(events) > 0 {
		if key == s.unfinishedKey {
			requestID = s.unfinishedID
		} else {
			requestID = NewRequestID()
		}
	}
	s.step++
	msg := &ctxccv1.CompileStreamRequest{Request: &ctxccv1.CompileStreamRequest_Step{Step: &ctxccv1.StepRequest{
		StepId: fmt.Sprint(s.step), Events: events, RequestId: requestID, Compile: req}}}
	view, appended, err := retry2(s.ctx, s.c.RetryFor, func() (*ctxccv1.CompiledView, *ctxccv1.AppendResult, error) {
		if s.stream == nil {
			ctx, cancel := context.WithCancel(s.ctx)
			st, err := s.c.Compiles.CompileStream(ctx)
			if err != nil {
				cancel()
				return nil, nil, err
			}
			s.stream, s.cancel = st, cancel
		}
		view, appended, err := s.roundTrip(msg)
		if err != nil && status.Code(err) == codes.Unavailable {
			s.drop() // reopen on the next attempt
		}
		return view, appended, err
	})
	switch {
	case err == nil:
		s.unfinishedKey, s.unfinishedID = "", ""
	case len(events) > 0 && status.Code(err) == codes.Unavailable:
		s.unfinishedKey, s.unfinishedID = key, requestID
	}
	return view, appended, err
}

func (s *Stream) roundTrip(msg *ctxccv1.CompileStreamRequest) (*ctxccv1.CompiledView, *ctxccv1.AppendResult, error) {
	if err := s.stream.Send(msg); err != nil {
		_, err = s.stream.Recv() // the real status is on Recv
		return nil, nil, err
	}
	var chunks [][]byte
	var appended *ctxccv1.AppendResult
	for {
		resp, err := s.stream.Recv()
		if err == io.EOF {
			// Closed without a status: the daemon went away; reconnect and resend.
			return nil, nil, status.Error(codes.Unavailable, "the stream ended")
		}
		if err != nil {
			return nil, nil, err
		}
		if resp.GetAppend() != nil {
			appended = resp.GetAppend()
		}
		switch r := resp.GetResponse().(type) {
		case *ctxccv1.CompileStreamResponse_View:
			return r.View, appended, nil
		case *ctxccv1.CompileStreamResponse_Error:
			return nil, appended, &Error{Code: codes.Code(r.Error.GetCode()), Reason: r.Error.GetReason(), Message: r.Error.GetMessage()}
		case *ctxccv1.CompileStreamResponse_Chunk:
			ch := r.Chunk
			if chunks == nil {
				chunks = make([][]byte, ch.GetCount())
			}
			chunks[ch.GetIndex()] = ch.GetData()
			if int(ch.GetIndex()) != len(chunks)-1 {
				continue
			}
			var data []byte
			for _, part := range chunks {
				data = append(data, part...)
			}
			sum := sha256.Sum256(data)
			if hex.EncodeToString(sum[:]) != ch.GetSha256() {
				return nil, appended, fmt.Errorf("view %s arrived damaged", ch.GetCompileId())
			}
			view := &ctxccv1.CompiledView{}
			if err := proto.Unmarshal(data, view); err != nil {
				return nil, appended, err
			}
			return view, appended, nil
		}
	}
}

func retry2(ctx context.Context, budget time.Duration, call func() (*ctxccv1.CompiledView, *ctxccv1.AppendResult, error)) (*ctxccv1.CompiledView, *ctxccv1.AppendResult, error) {
	type pair struct {
		v *ctxccv1.CompiledView
		a *ctxccv1.AppendResult
	}
	p, err := retry(ctx, budget, func() (pair, error) {
		v, a, err := call()
		return pair{v, a}, err
	})
	return p.v, p.a, err
}
