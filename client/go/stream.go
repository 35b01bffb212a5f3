package ctxcc

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/ctxcc/ctxcc/client/go/ctxccv1"
)

// Stream is one long-lived CompileStream. Step sends events and a compile request and
// returns the whole view, reassembling chunked views and applying delta views. When the
// daemon goes away (a restart, SIGTERM ending idle streams with Unavailable, a dropped
// connection) Step reopens the stream and resends the step with the same request id: the
// append is replayed, never duplicated.
//
// Deltas are on unless WithoutDeltas: each step names the last view this stream received
// and checked, and the daemon may answer with only what changed against it (a ViewDelta).
// Step rebuilds the whole view from it and checks its digest; on a mismatch it fetches the
// view whole (a ResumeRequest) and returns that. The digest asked for is the chained one
// with the compaction apart (DELTA_DIGEST_MESSAGE_CHAIN_COMPACTION_APART: continued from
// the base's, so only the new messages and the view without messages are hashed, and a
// compaction request the turn's deltas keep once); WithWholeViewDigest asks for the whole
// view's sha256. The views Step returns are the bases of
// later deltas and share their unchanged messages, sections and tools, whose encodings the
// stream remembers by object: treat them as read-only (proto.Clone one to change it).
//
// ReportUsage queues the provider's usage of a view and the next Step carries it: the
// daemon records it before that step's append and compile, so a step is one round trip
// instead of a step and a unary ReportUsage. A report with no step to ride on (the stream is
// closed, or a second report is queued first) goes by the unary ReportUsage.
//
// Every answer is matched to what is in flight by its step_id: the step's own (also in its
// chunks and its StepError), or the fresh one each ResumeRequest carries (the daemon echoes
// it on every message of the resume's answer). One for a step or resume already answered
// (e.g. a response a proxy delivered twice, the rest of a step that failed, the answer to an
// earlier resume arriving late) is skipped and counted in StreamStats.Stale, never returned;
// any other ends the stream, and Step resends the step on a new one with its request id, as
// after Unavailable. A daemon that predates the resume's step_id answers it with an empty
// one: an empty id is taken for the resume's answer only until the stream's daemon has
// echoed a resume's id (so on such a daemon a resume's answer delivered twice cannot be told
// from the next one's).
type Stream struct {
	c   *Client
	ctx context.Context
	// Held by one step at a time (and briefly by the other methods): a one-slot semaphore
	// rather than a mutex, so a step bounded by its context stops waiting for its turn when
	// that context ends.
	turn chan struct{}
	// What Stats and LastUsage report: stats and lastUsage as the last holder of the turn
	// left them, published under their own lock.
	shown      sync.Mutex
	shownStats StreamStats
	shownUsage *ctxccv1.ReportUsageResponse
	stream     grpc.BidiStreamingClient[ctxccv1.CompileStreamRequest, ctxccv1.CompileStreamResponse]
	cancel     context.CancelFunc
	// The ids of steps and resumes: one counter, so an earlier one's is a smaller number.
	step int
	// Whether the open stream's daemon echoed a resume's step_id: until it has, an answer
	// with none is taken for the resume's (a daemon that predates the field). Per stream: a
	// reopened one may reach another daemon. On a daemon that echoes, no answer on the
	// stream has an empty id, so one cannot be an earlier resume's.
	echoes bool
	// The request id of a step that failed, by its events: calling Step again with the
	// same events (the natural "try again") reuses it instead of appending them twice.
	unfinishedKey, unfinishedID string
	deltas                      bool
	digest                      ctxccv1.DeltaDigest
	hook                        func(*ctxccv1.ViewDelta)
	// The last view received completely and checked on the current stream: the base of the
	// next delta. A reopened stream starts without one (the daemon keeps views per stream).
	base *ctxccv1.CompiledView
	// The encodings of base's messages, sections and tools when it was rebuilt from a delta
	// (its sections and tools only, with the chained digest): the next delta keeps most of
	// them, and only the new ones are encoded for its digest.
	baseRecords records
	// The chain values of base's messages when it was rebuilt from a chained delta (nil:
	// computed from base when the next chained delta comes).
	baseChain chain
	// Q of the last compaction request hashed with the compaction apart, by pointer: a
	// delta that keeps its base's request hands on the same one, and no other matches.
	baseQ compactionSum
	// Deltas that failed in a row; at maxMismatches the stream stops asking for them.
	mismatchRun int
	stats       StreamStats
	// The usage report the next step carries, and the daemon's answer to the one the last
	// step carried (nil: it carried none).
	usage     *ctxccv1.ReportUsageRequest
	lastUsage *ctxccv1.ReportUsageResponse
}

// A daemon whose views this client cannot rebuild (e.g. one with fields this client does
// not know) would otherwise cost a refetch at every step.
const maxMismatches = 3

// maxChunks bounds the chunk count a view may announce: 65,536 chunks of the daemon's
// 1 MiB default are far beyond any view it serves (its gRPC messages stop at 64 MiB).
const maxChunks = 1 << 16

// StreamStats counts how a stream's views arrived.
type StreamStats struct {
	// Views that arrived whole (in one message or in chunks), refetches included.
	Whole int
	// Views rebuilt from a ViewDelta whose digest checked.
	Deltas int
	// Deltas that could not be applied or failed the digest check; each was fetched whole.
	Mismatches int
	// Bytes of the answers received (their encoded messages).
	Bytes int64
	// Answers skipped because they answer a step or resume already answered: a response
	// delivered twice, the rest of a step that failed, an earlier resume's answer arriving
	// late. Never returned.
	Stale int
}

// StreamOption configures OpenStream.
type StreamOption func(*Stream)

// WithoutDeltas makes every step ask for the whole view.
func WithoutDeltas() StreamOption { return func(s *Stream) { s.deltas = false } }

// WithWholeViewDigest has deltas checked by the sha256 of the whole view (view_sha256)
// instead of the chained digest, as clients did before the chained one.
func WithWholeViewDigest() StreamOption {
	return func(s *Stream) { s.digest = ctxccv1.DeltaDigest_DELTA_DIGEST_UNSPECIFIED }
}

// WithDeltaHook calls fn with every ViewDelta as it arrives, before it is applied (for
// tracing; tests change one to see a mismatch handled).
func WithDeltaHook(fn func(*ctxccv1.ViewDelta)) StreamOption {
	return func(s *Stream) { s.hook = fn }
}

// OpenStream opens a compile stream; it reopens itself when the connection drops.
func (c *Client) OpenStream(ctx context.Context, opts ...StreamOption) *Stream {
	s := &Stream{c: c, ctx: ctx, turn: make(chan struct{}, 1), deltas: true, digest: ctxccv1.DeltaDigest_DELTA_DIGEST_MESSAGE_CHAIN_COMPACTION_APART}
	for _, o := range opts {
		o(s)
	}
	return s
}

func (s *Stream) lock() { s.turn <- struct{}{} }

// unlock publishes what Stats and LastUsage report, then lets the next holder in: those
// two never wait for the turn (a step may hold it for as long as the daemon takes).
func (s *Stream) unlock() {
	s.shown.Lock()
	s.shownStats, s.shownUsage = s.stats, s.lastUsage
	s.shown.Unlock()
	<-s.turn
}

// lockContext is lock unless ctx ends first (a step of another goroutine may hold the
// stream for as long as the daemon takes): then ctx's error, and the stream is not held.
func (s *Stream) lockContext(ctx context.Context) error {
	select {
	case s.turn <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Stats reports how the stream's views arrived so far: as of the last step (or other call
// of the stream) that ended; it never waits for one still running.
func (s *Stream) Stats() StreamStats {
	s.shown.Lock()
	defer s.shown.Unlock()
	return s.shownStats
}

// ReportUsage queues the provider's usage of a view (req.CompileId): the next Step carries
// it, and the daemon records it before that step's append and compile (the step's view is
// estimated from it; its answer is then LastUsage). If a report for another compile is
// still queued, that one is sent now by the unary ReportUsage and its answer returned;
// otherwise nothing is sent and the answer is nil. A step whose report is refused fails
// with an *Error whose UsageRefused is set, having appended nothing: the report is
// dropped, so calling Step again goes without it. Called while another goroutine's step
// runs, it waits for that step, or until ctx ends (then ctx's error, and nothing queued).
func (s *Stream) ReportUsage(ctx context.Context, req *ctxccv1.ReportUsageRequest) (*ctxccv1.ReportUsageResponse, error) {
	if err := s.lockContext(ctx); err != nil {
		return nil, err
	}
	earlier := s.usage
	s.usage = req
	s.unlock()
	if earlier == nil || earlier.GetCompileId() == req.GetCompileId() {
		return nil, nil
	}
	return s.c.ReportUsage(ctx, earlier)
}

// LastUsage is the daemon's answer to the usage report the last step carried (nil when it
// carried none), the last step being the last one that ended: it never waits for one
// still running.
func (s *Stream) LastUsage() *ctxccv1.ReportUsageResponse {
	s.shown.Lock()
	defer s.shown.Unlock()
	return s.shownUsage
}

// FlushUsage sends the queued usage report now by the unary ReportUsage (nil, nil: none
// queued); for a view after which no step follows. Close does it too.
func (s *Stream) FlushUsage(ctx context.Context) (*ctxccv1.ReportUsageResponse, error) {
	if err := s.lockContext(ctx); err != nil {
		return nil, err
	}
	usage := s.usage
	s.usage = nil
	s.unlock()
	if usage == nil {
		return nil, nil
	}
	return s.c.ReportUsage(ctx, usage)
}

// Close ends the stream; a usage report still queued is sent by the unary ReportUsage
// (its error, if any, is returned).
func (s *Stream) Close() error {
	s.lock()
	var err error
	if s.stream != nil {
		err = s.stream.CloseSend()
		s.drop()
	}
	s.unlock()
	if _, uerr := s.FlushUsage(s.ctx); uerr != nil {
		return uerr
	}
	return err
}

func (s *Stream) drop() {
	if s.cancel != nil {
		s.cancel()
	}
	s.stream, s.cancel, s.base, s.baseRecords, s.baseChain = nil, nil, nil, nil, nil
	s.echoes = false
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
// here, before the first attempt ("" picks one), and every retry resends it. It waits as
// long as the stream's context allows; StepContext bounds one step.
func (s *Stream) Step(req *ctxccv1.CompileRequest, events []*ctxccv1.Event, requestID string) (*ctxccv1.CompiledView, *ctxccv1.AppendResult, error) {
	return s.StepContext(context.Background(), req, events, requestID)
}

// StepContext is Step bounded by ctx (a deadline for one step): when ctx ends before the
// answer, the step fails with ctx's error and the stream is dropped (the next step opens
// a new one); when it ends while the step waits its turn behind another goroutine's, the
// step fails with it and is never sent. The daemon may have appended the events all the same: the same events sent
// again on this Stream reuse the step's request id, so they are appended once.
func (s *Stream) StepContext(ctx context.Context, req *ctxccv1.CompileRequest, events []*ctxccv1.Event, requestID string) (*ctxccv1.CompiledView, *ctxccv1.AppendResult, error) {
	// Its turn comes after the step running (another goroutine's), unless ctx ends first:
	// then nothing of it was sent.
	if err := s.lockContext(ctx); err != nil {
		return nil, nil, err
	}
	defer s.unlock()
	// Retries end with the stream's context or the step's, whichever ends first.
	bounded, cancel := context.WithCancel(s.ctx)
	defer cancel()
	defer context.AfterFunc(ctx, cancel)()
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
	step := &ctxccv1.StepRequest{StepId: fmt.Sprint(s.step), Events: events, RequestId: requestID, Compile: req, Usage: s.usage}
	usage := s.usage
	s.usage, s.lastUsage = nil, nil
	msg := &ctxccv1.CompileStreamRequest{Request: &ctxccv1.CompileStreamRequest_Step{Step: step}}
	view, appended, err := retry2(bounded, s.c.RetryFor, func() (*ctxccv1.CompiledView, *ctxccv1.AppendResult, error) {
		if s.stream == nil {
			ctx, cancel := context.WithCancel(s.ctx)
			st, err := s.c.Compiles.CompileStream(ctx)
			if err != nil {
				cancel()
				return nil, nil, err
			}
			s.stream, s.cancel = st, cancel
		}
		// The step's end ends the call it waits on (a Recv takes no context of its own).
		defer context.AfterFunc(bounded, s.cancel)()
		// Set at each attempt: a reopened stream has no base.
		step.DeltaBaseCompileId, step.DeltaDigest = "", ctxccv1.DeltaDigest_DELTA_DIGEST_UNSPECIFIED
		step.KeepCompaction = false
		if s.deltas && s.base != nil {
			step.DeltaBaseCompileId, step.DeltaDigest = s.base.GetCompileId(), s.digest
			step.KeepCompaction = true
		}
		view, appended, err := s.roundTrip(msg, req)
		// Only a StepError (an *Error) leaves the call open. Any other error is the call's
		// end (a status gRPC gave it: a step over the daemon's --max-message-bytes is
		// RESOURCE_EXHAUSTED, before the daemon reads it) or an answer this stream could not
		// read: its next Send or Recv would only fail again, so it is reopened on the next
		// attempt, or at the next step.
		var inBand *Error
		if err != nil && (retryable(bounded, err) || bounded.Err() != nil || !errors.As(err, &inBand)) {
			s.drop()
		}
		return view, appended, err
	})
	if err != nil && ctx.Err() != nil {
		err = ctx.Err() // the step's own deadline, not the call it cut short
	}
	switch {
	case err == nil:
		s.unfinishedKey, s.unfinishedID = "", ""
	case len(events) > 0:
		// Whatever the error: the events may have been appended before it (a compile over
		// its CPU budget fails after the append), and an id that appended nothing appends
		// them as new.
		s.unfinishedKey, s.unfinishedID = key, requestID
	}
	// A report the daemon neither recorded nor refused rides on the next step (or goes by
	// the unary call at Close).
	if err != nil && usage != nil && s.lastUsage == nil && s.usage == nil {
		if e, ok := AsError(err); !ok || !e.UsageRefused {
			s.usage = usage
		}
	}
	return view, appended, err
}

// roundTrip sends a step and returns its whole view: as sent, reassembled from chunks, or
// rebuilt from a delta (fetched whole when that fails).
func (s *Stream) roundTrip(msg *ctxccv1.CompileStreamRequest, compile *ctxccv1.CompileRequest) (*ctxccv1.CompiledView, *ctxccv1.AppendResult, error) {
	if err := s.send(msg); err != nil {
		return nil, nil, err
	}
	stepID := msg.GetStep().GetStepId()
	view, delta, appended, err := s.receive(stepID, false)
	if err != nil {
		return nil, appended, err
	}
	if delta == nil {
		s.keep(view, nil, nil)
		return view, appended, nil
	}
	if s.hook != nil {
		s.hook(delta)
	}
	headID := delta.GetHead().GetCompileId()
	view, recs, values, err := s.apply(delta)
	if err == nil {
		s.stats.Deltas++
		s.mismatchRun = 0
		s.keep(view, recs, values)
		return view, appended, nil
	}
	s.stats.Mismatches++
	s.mismatchRun++
	s.base, s.baseRecords, s.baseChain = nil, nil, nil
	// Its answer comes on this stream under the resume's own id (Step holds the lock).
	s.step++
	resumeID := fmt.Sprint(s.step)
	resume := &ctxccv1.CompileStreamRequest{Request: &ctxccv1.CompileStreamRequest_Resume{
		Resume: &ctxccv1.ResumeRequest{CompileId: headID, Compile: compile, StepId: resumeID}}}
	if err := s.send(resume); err != nil {
		return nil, appended, err
	}
	view, delta, _, err = s.receive(resumeID, true)
	if err == nil && delta != nil {
		err = fmt.Errorf("the daemon answered a ResumeRequest with a delta")
	}
	if err != nil {
		return nil, appended, err
	}
	s.keep(view, nil, nil)
	return view, appended, nil
}

// apply rebuilds and checks a delta against the base with the digest it carries: the
// chained one when the daemon sent it, else the whole view's sha256 (a daemon that does
// not know the chained digest sends that one).
func (s *Stream) apply(d *ctxccv1.ViewDelta) (*ctxccv1.CompiledView, records, chain, error) {
	if d.GetChainSha256() == "" {
		view, recs, err := applyDelta(s.base, d, s.baseRecords)
		return view, recs, nil, err
	}
	values := s.baseChain
	if values == nil && s.base != nil { // the base came whole: its chain, once
		var err error
		if values, err = extendChain(nil, 0, s.base.GetMessages()); err != nil {
			return nil, nil, nil, err
		}
	}
	var apart *compactionSum
	if s.digest == ctxccv1.DeltaDigest_DELTA_DIGEST_MESSAGE_CHAIN_COMPACTION_APART {
		q := s.baseQ
		apart = &q
	}
	view, values, recs, err := applyChainedDelta(s.base, d, values, s.baseRecords, apart)
	if err == nil && apart != nil {
		s.baseQ = *apart
	}
	return view, recs, values, err
}

// keep records a view received whole or rebuilt and checked as the next delta's base.
func (s *Stream) keep(view *ctxccv1.CompiledView, recs records, values chain) {
	if s.deltas && s.mismatchRun >= maxMismatches {
		s.deltas = false
	}
	if s.deltas {
		s.base, s.baseRecords, s.baseChain = view, recs, values
	}
}

func (s *Stream) send(msg *ctxccv1.CompileStreamRequest) error {
	if err := s.stream.Send(msg); err != nil {
		_, err = s.stream.Recv() // the real status is on Recv
		return err
	}
	return nil
}

// matches tells whether an answer whose step_id is answer is the one awaited: the one under
// id awaited (a step's, also in its chunks and its StepError, or the ResumeRequest's the step
// made after a delta that did not check), or when bare one with no id (a resume's answer
// from a daemon that does not echo its id). stale is true for an answer to a step or resume
// already answered: ids are the stream's counter, so a smaller number (the step itself while
// its resume is awaited, an earlier resume's answer delivered late). Neither for anything
// else, an empty id when not bare too: nothing tells which resume it answers.
func matches(answer, awaited string, bare bool) (ours, stale bool) {
	if answer == awaited || (bare && answer == "") {
		return true, false
	}
	if answer == "" {
		return false, false
	}
	n, err := strconv.ParseUint(answer, 10, 64) // digits only, as the stream writes them
	m, err2 := strconv.ParseUint(awaited, 10, 64)
	return false, answer[0] != '0' && err == nil && err2 == nil && n < m
}

// receive reads one answer under id stepID (a step's, or its resume's when resuming): a
// whole view (reassembled from chunks when chunked), a delta, or the error. Answers to a
// step or resume already answered are skipped; any other answer that is not the awaited one
// is an Unavailable error, so the stream is dropped and the step resent on a new one.
func (s *Stream) receive(stepID string, resuming bool) (*ctxccv1.CompiledView, *ctxccv1.ViewDelta, *ctxccv1.AppendResult, error) {
	var chunks [][]byte
	var appended *ctxccv1.AppendResult
	for {
		resp, err := s.stream.Recv()
		if err == io.EOF {
			// Closed without a status: the daemon went away; reconnect and resend.
			return nil, nil, nil, status.Error(codes.Unavailable, "the stream ended")
		}
		if err != nil {
			return nil, nil, nil, err
		}
		s.stats.Bytes += int64(proto.Size(resp))
		ours, stale := matches(resp.GetStepId(), stepID, resuming && !s.echoes)
		if stale {
			s.stats.Stale++
			continue
		}
		if !ours {
			awaited := "step " + stepID
			if resuming {
				awaited = "resume " + stepID
			}
			return nil, nil, nil, status.Errorf(codes.Unavailable,
				"the stream answered %s with an answer for step %q: reopened", awaited, resp.GetStepId())
		}
		if resuming && resp.GetStepId() == stepID {
			s.echoes = true
		}
		if resp.GetAppend() != nil {
			appended = resp.GetAppend()
		}
		if resp.GetUsage() != nil {
			s.lastUsage = resp.GetUsage()
		}
		switch r := resp.GetResponse().(type) {
		case *ctxccv1.CompileStreamResponse_View:
			s.stats.Whole++
			return r.View, nil, appended, nil
		case *ctxccv1.CompileStreamResponse_Delta:
			return nil, r.Delta, appended, nil
		case *ctxccv1.CompileStreamResponse_Error:
			return nil, nil, appended, &Error{Code: codes.Code(r.Error.GetCode()), Reason: r.Error.GetReason(),
				Message: r.Error.GetMessage(), Metadata: r.Error.GetMetadata(),
				UsageRefused: r.Error.GetUsageRefused()}
		case *ctxccv1.CompileStreamResponse_Chunk:
			ch := r.Chunk
			if chunks == nil {
				// A count far above any real view would allocate on the daemon's word alone.
				if ch.GetCount() == 0 || ch.GetCount() > maxChunks {
					return nil, nil, appended, fmt.Errorf("view %s: chunk count %d out of range", ch.GetCompileId(), ch.GetCount())
				}
				chunks = make([][]byte, ch.GetCount())
			}
			if ch.GetIndex() >= uint32(len(chunks)) || int(ch.GetCount()) != len(chunks) {
				return nil, nil, appended, fmt.Errorf("view %s: chunk %d of %d does not fit a view of %d chunks", ch.GetCompileId(), ch.GetIndex(), ch.GetCount(), len(chunks))
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
				return nil, nil, appended, fmt.Errorf("view %s arrived damaged", ch.GetCompileId())
			}
			view := &ctxccv1.CompiledView{}
			if err := proto.Unmarshal(data, view); err != nil {
				return nil, nil, appended, err
			}
			s.stats.Whole++
			return view, nil, appended, nil
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
