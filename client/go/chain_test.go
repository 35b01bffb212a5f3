package ctxcc

import (
	"bytes"
	"context"
	"encoding/hex"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/ctxcc/ctxcc/client/go/ctxccv1"
)

// daemonChain is the chained digest of fixture view n as the daemon's code computes it
// (tests/fixtures/client-views/chain_sha256.txt, checked against the proto's rule by the
// Python tests).
func daemonChain(t *testing.T, n int) string {
	t.Helper()
	return daemonDigest(t, "chain_sha256.txt", n)
}

// daemonApart is the digest with the compaction apart of fixture view n as the daemon's
// code computes it (apart_sha256.txt, checked against the proto's rule likewise).
func daemonApart(t *testing.T, n int) string {
	t.Helper()
	return daemonDigest(t, "apart_sha256.txt", n)
}

func daemonDigest(t *testing.T, file string, n int) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "tests", "fixtures", "client-views", file))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if name, sum, ok := strings.Cut(line, " "); ok && name == "view"+string(rune('0'+n)) {
			return sum
		}
	}
	t.Fatalf("no digest for view%d in %s", n, file)
	return ""
}

// chained turns a delta made by makeDelta into one with the chained digest sum.
func chained(d *ctxccv1.ViewDelta, sum string) *ctxccv1.ViewDelta {
	d.ViewSha256, d.ChainSha256 = "", sum
	return d
}

func TestChainDigestIsTheDaemons(t *testing.T) {
	for n := 1; n <= 3; n++ {
		view, _ := fixture(t, n)
		if got, err := ChainDigest(view); err != nil || got != daemonChain(t, n) {
			t.Fatalf("view%d: %s (%v), the daemon's is %s", n, got, err, daemonChain(t, n))
		}
	}
}

// A chain of chained deltas, each continued from the chain values and the encodings of
// sections and tools the previous one left (the sections change along it), rebuilds the
// daemon's views and checks against the daemon's digests.
func TestChainedDeltasContinueFromTheBase(t *testing.T) {
	v1, _ := fixture(t, 1)
	values, err := extendChain(nil, 0, v1.GetMessages())
	if err != nil {
		t.Fatal(err)
	}
	base := v1
	var recs records
	for _, n := range []int{2, 2, 3, 1} {
		target, want := fixture(t, n)
		d := chained(makeDelta(t, base, target), daemonChain(t, n))
		view, next, nextRecs, err := applyChainedDelta(base, d, values, recs, nil)
		if err != nil {
			t.Fatalf("to view%d: %v", n, err)
		}
		if !bytes.Equal(marshal(t, view), want) || len(next) != len(view.GetMessages()) {
			t.Fatalf("to view%d: the rebuilt view differs from the daemon's", n)
		}
		if len(nextRecs) != len(view.GetSystemSections())+len(view.GetTools()) {
			t.Fatalf("to view%d: %d encodings kept", n, len(nextRecs))
		}
		base, values, recs = view, next, nextRecs
	}
	// The kept encodings of sections and tools are really the ones used: spoiled ones
	// fail the digest.
	again, _ := fixture(t, 1)
	spoiledRecs := records{}
	for m, b := range recs {
		spoiledRecs[m] = append([]byte{}, b...)
		spoiledRecs[m][len(b)-1] ^= 1
	}
	if _, _, _, err := applyChainedDelta(base, chained(makeDelta(t, base, again), daemonChain(t, 1)), values, spoiledRecs, nil); err == nil {
		t.Fatal("spoiled encodings of sections and tools were not used")
	}
	// The kept values are really the ones used: spoiled ones fail the digest.
	target, _ := fixture(t, 2)
	spoiled := append(chain{}, values...)
	spoiled[0][0] ^= 1
	d := chained(makeDelta(t, base, target), daemonChain(t, 2))
	if d.GetKeptMessages() == 0 {
		t.Fatal("the last delta must keep messages")
	}
	if _, _, _, err := applyChainedDelta(base, d, spoiled, nil, nil); err == nil {
		t.Fatal("spoiled chain values were not used")
	}
}

// Every way a chained delta can go wrong is caught before the view is used, and so is a
// base whose kept message differs from the daemon's.
func TestChainedMismatchesAreDetected(t *testing.T) {
	v2, _ := fixture(t, 2)
	v3, _ := fixture(t, 3)
	v3more := proto.Clone(v3).(*ctxccv1.CompiledView)
	v3more.Messages = append(append([]*ctxccv1.ViewMessage{}, v2.GetMessages()...), v3.GetMessages()...)
	sum, err := ChainDigest(v3more)
	if err != nil {
		t.Fatal(err)
	}
	fresh := func() *ctxccv1.ViewDelta { return chained(makeDelta(t, v2, v3more), sum) }
	if d := fresh(); d.GetKeptMessages() != uint32(len(v2.GetMessages())) {
		t.Fatalf("the delta should keep all of v2's messages: %d", d.GetKeptMessages())
	}
	if _, err := ApplyDelta(v2, fresh()); err != nil {
		t.Fatalf("the undamaged delta: %v", err)
	}
	cases := map[string]func(d *ctxccv1.ViewDelta){
		"a flipped byte in an appended message": func(d *ctxccv1.ViewDelta) { d.AppendedMessages[0].Tokens++ },
		"a flipped byte in the head": func(d *ctxccv1.ViewDelta) {
			d.Head.Renderings[0].BodyJson = strings.Replace(d.Head.Renderings[0].BodyJson, "a", "b", 1)
		},
		"a note added to the head": func(d *ctxccv1.ViewDelta) { d.Head.Notes = append(d.Head.Notes, "x") },
		"a flipped digest":         func(d *ctxccv1.ViewDelta) { d.ChainSha256 = strings.Repeat("0", 64) },
		"a message fewer kept":     func(d *ctxccv1.ViewDelta) { d.KeptMessages-- },
		"another section of the base": func(d *ctxccv1.ViewDelta) {
			d.Sections[0] = &ctxccv1.SectionSlot{Slot: &ctxccv1.SectionSlot_BaseIndex{BaseIndex: 1}}
		},
		"tools emptied": func(d *ctxccv1.ViewDelta) { d.ToolsChanged, d.Tools = true, nil },
	}
	for name, spoil := range cases {
		d := fresh()
		spoil(d)
		if _, err := ApplyDelta(v2, d); err == nil {
			t.Errorf("%s: not detected", name)
		}
	}
	// The client's base differs from the daemon's in a kept message (its chain values are
	// those of the damaged message, as if it had arrived so).
	damaged := proto.Clone(v2).(*ctxccv1.CompiledView)
	damaged.Messages[0].Tokens++
	values, err := extendChain(nil, 0, damaged.GetMessages())
	if err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := applyChainedDelta(damaged, fresh(), values, nil, nil); err == nil {
		t.Error("a damaged kept message of the base: not detected")
	}
}

// The stream asks for the chained digest with the compaction apart by default and checks it; WithWholeViewDigest asks
// for view_sha256 as before. A daemon that sends view_sha256 anyway is still checked, and a
// damaged chained delta is fetched whole.
func TestStreamAsksForTheChainedDigest(t *testing.T) {
	v1, _ := fixture(t, 1)
	v2, want2 := fixture(t, 2)
	v3, want3 := fixture(t, 3)
	for _, whole := range []bool{false, true} {
		s := &scripted{}
		s.answer = func(n int, req *ctxccv1.CompileStreamRequest) ([]*ctxccv1.CompileStreamResponse, error) {
			step := req.GetStep()
			wantDigest := ctxccv1.DeltaDigest_DELTA_DIGEST_MESSAGE_CHAIN_COMPACTION_APART
			if whole || step.GetDeltaBaseCompileId() == "" {
				wantDigest = ctxccv1.DeltaDigest_DELTA_DIGEST_UNSPECIFIED
			}
			if step.GetDeltaDigest() != wantDigest {
				t.Errorf("request %d asks for %v", n, step.GetDeltaDigest())
			}
			switch {
			case req.GetResume() != nil:
				return []*ctxccv1.CompileStreamResponse{wholeView(v3)}, nil
			case n == 1:
				return []*ctxccv1.CompileStreamResponse{wholeView(v1)}, nil
			case n == 2 && !whole:
				return []*ctxccv1.CompileStreamResponse{asDelta(chained(makeDelta(t, v1, v2), daemonApart(t, 2)), nil)}, nil
			case n == 2:
				return []*ctxccv1.CompileStreamResponse{asDelta(makeDelta(t, v1, v2), nil)}, nil
			case !whole: // damaged by the hook below: its head changed
				return []*ctxccv1.CompileStreamResponse{asDelta(chained(makeDelta(t, v2, v3), daemonApart(t, 3)), nil)}, nil
			default:
				return []*ctxccv1.CompileStreamResponse{asDelta(makeDelta(t, v2, v3), nil)}, nil
			}
		}
		c := serve(t, s)
		var opts []StreamOption
		if whole {
			opts = append(opts, WithWholeViewDigest())
		}
		opts = append(opts, WithDeltaHook(func(d *ctxccv1.ViewDelta) {
			if d.GetHead().GetCompileId() == v3.GetCompileId() && d.GetChainSha256() != "" {
				d.Head.EventBoundary++
			}
		}))
		st := c.OpenStream(context.Background(), opts...)
		for i, want := range [][]byte{nil, want2, want3} {
			view, _, err := st.Step(&ctxccv1.CompileRequest{}, nil, "")
			if err != nil {
				t.Fatal(err)
			}
			if want != nil && !bytes.Equal(marshal(t, view), want) {
				t.Fatalf("whole digest %v, step %d: the view differs from the daemon's", whole, i+1)
			}
		}
		got := st.Stats()
		if whole && (got.Deltas != 2 || got.Mismatches != 0) || !whole && (got.Deltas != 1 || got.Mismatches != 1) {
			t.Fatalf("whole digest %v: stats %+v", whole, got)
		}
		st.Close()
	}
}

func wholeView(v *ctxccv1.CompiledView) *ctxccv1.CompileStreamResponse {
	return &ctxccv1.CompileStreamResponse{Response: &ctxccv1.CompileStreamResponse_View{View: proto.Clone(v).(*ctxccv1.CompiledView)}}
}

func TestApartDigestIsTheDaemons(t *testing.T) {
	for n := 1; n <= 5; n++ {
		view, _ := fixture(t, n)
		values, err := extendChain(nil, 0, view.GetMessages())
		if err != nil {
			t.Fatal(err)
		}
		got, _, err := chainDigest(view, values, nil, &compactionSum{})
		if err != nil || got != daemonApart(t, n) {
			t.Fatalf("view%d: %s (%v), the daemon's is %s", n, got, err, daemonApart(t, n))
		}
		if plain, _, _ := chainDigest(view, values, nil, nil); plain == got {
			t.Fatalf("view%d: the digest with the compaction apart is the plain chained one", n)
		}
	}
}

// Over budget the deltas of a turn keep their base's compaction request: with the
// compaction apart, its Q is hashed when the request comes and handed on with it (by
// pointer) while it is kept; Q is part of the digest, so a wrong one held for the kept
// request fails the check.
func TestApartDeltasHashAKeptCompactionOnce(t *testing.T) {
	v3, _ := fixture(t, 3)
	v4, _ := fixture(t, 4)
	v5, _ := fixture(t, 5)
	values3, err := extendChain(nil, 0, v3.GetMessages())
	if err != nil {
		t.Fatal(err)
	}
	var q compactionSum
	view4, values4, recs4, err := applyChainedDelta(v3, chained(makeDelta(t, v3, v4), daemonApart(t, 4)), values3, nil, &q)
	if err != nil {
		t.Fatal(err)
	}
	if q.req == nil || q.req != view4.GetCompaction() {
		t.Fatalf("Q is not held for the request the delta brought")
	}
	kept := func() *ctxccv1.ViewDelta {
		d := makeDelta(t, view4, v5)
		d.CompactionKept, d.Head.Compaction = true, nil
		return chained(d, daemonApart(t, 5))
	}
	held := q
	view5, _, _, err := applyChainedDelta(view4, kept(), values4, recs4, &q)
	if err != nil {
		t.Fatal(err)
	}
	if q != held || view5.GetCompaction() != view4.GetCompaction() {
		t.Fatalf("the kept request was not handed on with its Q")
	}
	if !proto.Equal(view5, v5) {
		t.Fatalf("view5 rebuilt differs from the daemon's")
	}
	wrong := compactionSum{req: view4.GetCompaction(), sum: [32]byte{1}}
	if _, _, _, err := applyChainedDelta(view4, kept(), values4, recs4, &wrong); err == nil {
		t.Fatalf("a wrong Q for the kept request passed the digest")
	}
	// ApplyDelta is not told which chained digest was asked for: it takes either.
	for _, sum := range []string{daemonApart(t, 5), mustChain(t, v5)} {
		if got, err := ApplyDelta(view4, func() *ctxccv1.ViewDelta { d := kept(); d.ChainSha256 = sum; return d }()); err != nil || !proto.Equal(got, v5) {
			t.Fatalf("ApplyDelta with digest %s: %v", sum, err)
		}
	}
	if _, err := ApplyDelta(view4, chained(kept(), strings.Repeat("0", 64))); err == nil {
		t.Fatalf("ApplyDelta took a wrong chained digest")
	}
}

func mustChain(t *testing.T, view *ctxccv1.CompiledView) string {
	t.Helper()
	sum, err := ChainDigest(view)
	if err != nil {
		t.Fatal(err)
	}
	return sum
}

// View6's route model holds a framing of -0.0, which proto3 writes (only +0.0 is left out):
// the client's encoding and digests are the daemon's, as in Python and TypeScript.
func TestNegativeZeroIsWrittenAsTheDaemonWritesIt(t *testing.T) {
	view, data := fixture(t, 6)
	if f := view.GetBudget().GetRouteModel().GetFramingTokens(); f != 0 || !math.Signbit(f) {
		t.Fatalf("view6's framing is %v, not -0.0", f)
	}
	got, err := canonicalMarshal(view.ProtoReflect())
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("view6 encodes otherwise than the daemon wrote it (%v)", err)
	}
	if sum, err := ChainDigest(view); err != nil || sum != daemonChain(t, 6) {
		t.Fatalf("view6: %s (%v), the daemon's is %s", sum, err, daemonChain(t, 6))
	}
	wire, err := proto.Marshal(&ctxccv1.RouteModel{Ratio: math.Copysign(0, -1)})
	if err != nil || hex.EncodeToString(wire) != "090000000000000080" {
		t.Fatalf("RouteModel{ratio: -0.0} is %x (%v)", wire, err)
	}
}
