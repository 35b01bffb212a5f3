package ctxcc

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/ctxcc/ctxcc/client/go/ctxccv1"
)

// Three successive views of one session as the daemon serialized them
// (scripts/gen_view_fixtures.py): messages appended, a memory section changed, a rules
// section inserted, a tool registered, an inline image and four renderings.
func fixture(t *testing.T, n int) (*ctxccv1.CompiledView, []byte) {
	t.Helper()
	name := filepath.Join("..", "..", "tests", "fixtures", "client-views", "view"+string(rune('0'+n))+".binpb")
	data, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	view := &ctxccv1.CompiledView{}
	if err := proto.Unmarshal(data, view); err != nil {
		t.Fatal(err)
	}
	return view, data
}

func marshal(t *testing.T, m proto.Message) []byte {
	t.Helper()
	b, err := canonicalMarshal(m.ProtoReflect())
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// makeDelta describes target against base the way the proto says a daemon may: the common
// prefix of messages kept, sections found in base by index, tools sent only when they
// differ.
func makeDelta(t *testing.T, base, target *ctxccv1.CompiledView) *ctxccv1.ViewDelta {
	t.Helper()
	kept := 0
	for kept < len(base.GetMessages()) && kept < len(target.GetMessages()) &&
		proto.Equal(base.GetMessages()[kept], target.GetMessages()[kept]) {
		kept++
	}
	var slots []*ctxccv1.SectionSlot
	for _, s := range target.GetSystemSections() {
		slot := &ctxccv1.SectionSlot{Slot: &ctxccv1.SectionSlot_Section{Section: s}}
		for i, b := range base.GetSystemSections() {
			if proto.Equal(s, b) {
				slot = &ctxccv1.SectionSlot{Slot: &ctxccv1.SectionSlot_BaseIndex{BaseIndex: uint32(i)}}
			}
		}
		slots = append(slots, slot)
	}
	head := proto.Clone(target).(*ctxccv1.CompiledView)
	head.Messages, head.SystemSections, head.SystemPrompt, head.Tools = nil, nil, "", nil
	toolsChanged := len(base.GetTools()) != len(target.GetTools())
	for i := 0; !toolsChanged && i < len(target.GetTools()); i++ {
		toolsChanged = !proto.Equal(base.GetTools()[i], target.GetTools()[i])
	}
	d := &ctxccv1.ViewDelta{BaseCompileId: base.GetCompileId(), Head: head, KeptMessages: uint32(kept),
		Sections: slots, ToolsChanged: toolsChanged, ViewSha256: mustDigest(t, target)}
	d.AppendedMessages = append(d.AppendedMessages, target.GetMessages()[kept:]...)
	if toolsChanged {
		d.Tools = target.GetTools()
	}
	return proto.Clone(d).(*ctxccv1.ViewDelta)
}

func mustDigest(t *testing.T, v *ctxccv1.CompiledView) string {
	t.Helper()
	d, err := ViewDigest(v)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestCanonicalMarshalIsTheDaemons(t *testing.T) {
	for n := 1; n <= 3; n++ {
		view, data := fixture(t, n)
		if !bytes.Equal(marshal(t, view), data) {
			t.Fatalf("view%d: the serialization differs from the daemon's", n)
		}
		// Why ViewDigest does not use it: protobuf-go writes oneof fields last.
		det, err := proto.MarshalOptions{Deterministic: true}.Marshal(view)
		if err != nil || bytes.Equal(det, data) {
			t.Fatalf("view%d: protobuf-go's deterministic output now equals the daemon's (%v)", n, err)
		}
	}
}

func TestApplyDeltaRebuildsRealViews(t *testing.T) {
	for _, pair := range [][2]int{{1, 2}, {2, 3}, {1, 3}, {3, 1}, {2, 2}} {
		base, baseBytes := fixture(t, pair[0])
		target, want := fixture(t, pair[1])
		d := makeDelta(t, base, target)
		got, err := ApplyDelta(base, d)
		if err != nil {
			t.Fatalf("%v: %v", pair, err)
		}
		if !bytes.Equal(marshal(t, got), want) {
			t.Fatalf("%v: rebuilt view differs from the daemon's", pair)
		}
		if !bytes.Equal(marshal(t, base), baseBytes) {
			t.Fatalf("%v: applying the delta changed its base", pair)
		}
	}
}

func TestDeltaShapes(t *testing.T) {
	v1, _ := fixture(t, 1)
	v2, want2 := fixture(t, 2)
	v3, want3 := fixture(t, 3)
	// What the fixtures are for. v1->v2: the same turn goes on (v1's message kept, two
	// appended) and a tool was registered.
	d := makeDelta(t, v1, v2)
	if d.GetKeptMessages() != 1 || len(d.GetAppendedMessages()) != 2 || !d.GetToolsChanged() || len(d.GetTools()) != 2 {
		t.Fatalf("unexpected delta v1->v2: kept %d appended %d tools %v",
			d.GetKeptMessages(), len(d.GetAppendedMessages()), d.GetTools())
	}
	got, err := ApplyDelta(v1, d)
	if err != nil || !bytes.Equal(marshal(t, got), want2) {
		t.Fatalf("v1->v2: %v", err)
	}
	// v2->v3: the tools stay; a rules section is inserted after the kernel, so v2's
	// sections are reused at shifted positions.
	d = makeDelta(t, v2, v3)
	if d.GetToolsChanged() || len(d.GetTools()) != 0 {
		t.Fatalf("v2->v3 keeps the tools: %v", d.GetTools())
	}
	var indexes []uint32
	for _, s := range d.GetSections() {
		if s.GetSection() == nil {
			indexes = append(indexes, s.GetBaseIndex())
		}
	}
	if len(indexes) < 2 || indexes[0] != 0 || d.GetSections()[1].GetSection() == nil {
		t.Fatalf("v3's sections should come partly from v2's around the new one: %v", d.GetSections())
	}
	got, err = ApplyDelta(v2, d)
	if err != nil || got.GetSystemPrompt() != v3.GetSystemPrompt() || !bytes.Equal(marshal(t, got), want3) {
		t.Fatalf("v2->v3: %v", err)
	}
}

func TestToolsEmptiedAndSectionsFromBase(t *testing.T) {
	v2, _ := fixture(t, 2)
	v3, _ := fixture(t, 3)
	// No tools at all: tools_changed with an empty list must not fall back to the base's.
	target := proto.Clone(v3).(*ctxccv1.CompiledView)
	target.Tools = nil
	// Messages kept only in part (one dropped) and one of another text appended: the rebuilt
	// view must not share the base's slice (an append into it would overwrite the base).
	target.Messages = append([]*ctxccv1.ViewMessage{}, v2.GetMessages()[:2]...)
	target.Messages = append(target.Messages, &ctxccv1.ViewMessage{Role: ctxccv1.MessageRole_MESSAGE_ROLE_USER,
		Parts: []*ctxccv1.ViewPart{{Part: &ctxccv1.ViewPart_Text{Text: "instead"}}}})
	// Sections in another order than the base's.
	n := len(v2.GetSystemSections())
	target.SystemSections = []*ctxccv1.SystemSection{v2.GetSystemSections()[n-1], v2.GetSystemSections()[0]}
	target.SystemPrompt = v2.GetSystemSections()[n-1].GetText() + "\n\n" + v2.GetSystemSections()[0].GetText()
	d := makeDelta(t, v2, target)
	if !d.GetToolsChanged() || len(d.GetTools()) != 0 || d.GetKeptMessages() != 2 {
		t.Fatalf("unexpected delta: %v", d)
	}
	base := proto.Clone(v2).(*ctxccv1.CompiledView)
	before := marshal(t, base)
	got, err := ApplyDelta(base, d)
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(got, target) {
		t.Fatal("rebuilt view differs")
	}
	if !bytes.Equal(marshal(t, base), before) {
		t.Fatal("applying the delta changed its base")
	}
}

// Every way a delta can go wrong is caught before the view is used.
func TestMismatchesAreDetected(t *testing.T) {
	v2, _ := fixture(t, 2)
	v3, _ := fixture(t, 3)
	cases := map[string]func(d *ctxccv1.ViewDelta){
		"a flipped byte in a message": func(d *ctxccv1.ViewDelta) {
			p := d.GetAppendedMessages()[0].GetParts()[0]
			text := []byte(p.GetText())
			text[0] ^= 1
			p.Part = &ctxccv1.ViewPart_Text{Text: string(text)}
		},
		"a flipped byte in the head": func(d *ctxccv1.ViewDelta) {
			d.Head.Renderings[0].BodyJson = strings.Replace(d.Head.Renderings[0].BodyJson, "a", "b", 1)
		},
		"a flipped digest": func(d *ctxccv1.ViewDelta) {
			d.ViewSha256 = strings.Repeat("0", 64)
		},
		"a message more kept":                  func(d *ctxccv1.ViewDelta) { d.KeptMessages++ },
		"more messages kept than the base has": func(d *ctxccv1.ViewDelta) { d.KeptMessages = 99 },
		"a section index out of range": func(d *ctxccv1.ViewDelta) {
			d.Sections[0] = &ctxccv1.SectionSlot{Slot: &ctxccv1.SectionSlot_BaseIndex{BaseIndex: 99}}
		},
		"another section of the base": func(d *ctxccv1.ViewDelta) {
			d.Sections[0] = &ctxccv1.SectionSlot{Slot: &ctxccv1.SectionSlot_BaseIndex{BaseIndex: 1}}
		},
		"an empty slot":                    func(d *ctxccv1.ViewDelta) { d.Sections[0] = &ctxccv1.SectionSlot{} },
		"tools emptied when they were not": func(d *ctxccv1.ViewDelta) { d.ToolsChanged, d.Tools = true, nil },
		"another base":                     func(d *ctxccv1.ViewDelta) { d.BaseCompileId = "other" },
		"no head":                          func(d *ctxccv1.ViewDelta) { d.Head = nil },
	}
	for name, spoil := range cases {
		d := makeDelta(t, v2, v3)
		spoil(d)
		if _, err := ApplyDelta(v2, d); err == nil {
			t.Errorf("%s: not detected", name)
		}
	}
	if _, err := ApplyDelta(nil, makeDelta(t, v2, v3)); err == nil {
		t.Error("a delta without a base: not detected")
	}
}

// A rebuilt view's encodings of messages (sections, tools) are kept for the next delta,
// which encodes only its new ones: a chain of deltas gives the daemon's bytes, and the kept
// encodings are really the ones used (a spoiled one is caught by the digest).
func TestMessageEncodingsCarryOver(t *testing.T) {
	v1, _ := fixture(t, 1)
	v2, want2 := fixture(t, 2)
	v3, want3 := fixture(t, 3)
	got2, recs, err := applyDelta(v1, makeDelta(t, v1, v2), nil)
	kept := len(got2.GetMessages()) + len(got2.GetSystemSections()) + len(got2.GetTools())
	if err != nil || !bytes.Equal(marshal(t, got2), want2) || len(recs) != kept {
		t.Fatalf("v1->v2: %v, %d records", err, len(recs))
	}
	// v3 keeps none of v2's messages (their layer changes): a delta from v2 to v2
	// itself keeps them all.
	again, recs2, err := applyDelta(got2, makeDelta(t, got2, v2), recs)
	if err != nil || !bytes.Equal(marshal(t, again), want2) {
		t.Fatalf("v2->v2: %v", err)
	}
	for m, b := range recs2 {
		if &recs[m][0] != &b[0] {
			t.Fatal("a kept message was encoded again")
		}
	}
	got3, _, err := applyDelta(again, makeDelta(t, again, v3), recs2)
	if err != nil || !bytes.Equal(marshal(t, got3), want3) {
		t.Fatalf("v2->v3: %v", err)
	}
	spoiled := records{}
	for m, b := range recs2 {
		spoiled[m] = append([]byte{}, b...)
		spoiled[m][len(b)-1] ^= 1
	}
	if _, _, err := applyDelta(again, makeDelta(t, again, v2), spoiled); err == nil {
		t.Fatal("spoiled encodings were not used")
	}
}

// withCompaction is fixture view n recommending compaction c.
func withCompaction(t *testing.T, n int, c *ctxccv1.CompactionRequest) *ctxccv1.CompiledView {
	t.Helper()
	v, _ := fixture(t, n)
	v.Compaction = proto.Clone(c).(*ctxccv1.CompactionRequest)
	return v
}

// A delta that keeps the base's compaction request (compaction_kept, head without one)
// rebuilds the view with it, under either digest; keeping one the base lacks, keeping one
// while sending another, or keeping one the daemon's view no longer has is caught.
func TestCompactionKept(t *testing.T) {
	c := &ctxccv1.CompactionRequest{FromSeq: 1, ThroughSeq: 9, Prompt: strings.Repeat("Summarise this. ", 500)}
	kept := func(base, target *ctxccv1.CompiledView, chainedDigest bool) *ctxccv1.ViewDelta {
		d := makeDelta(t, base, target)
		d.Head.Compaction, d.CompactionKept = nil, true
		if chainedDigest {
			sum, err := ChainDigest(target)
			if err != nil {
				t.Fatal(err)
			}
			d = chained(d, sum)
		}
		return d
	}
	for _, chainedDigest := range []bool{false, true} {
		base, target := withCompaction(t, 2, c), withCompaction(t, 3, c)
		want := marshal(t, target)
		got, err := ApplyDelta(base, kept(base, target, chainedDigest))
		if err != nil {
			t.Fatalf("chained %v: %v", chainedDigest, err)
		}
		if !bytes.Equal(marshal(t, got), want) || got.GetCompaction().GetPrompt() != c.GetPrompt() {
			t.Fatalf("chained %v: the rebuilt view lacks the kept compaction", chainedDigest)
		}
		bare, _ := fixture(t, 2)
		if _, err := ApplyDelta(bare, kept(bare, target, chainedDigest)); err == nil {
			t.Errorf("chained %v: kept the compaction of a base without one", chainedDigest)
		}
		both := kept(base, target, chainedDigest)
		both.Head.Compaction = proto.Clone(c).(*ctxccv1.CompactionRequest)
		if _, err := ApplyDelta(base, both); err == nil {
			t.Errorf("chained %v: a head with its own compaction and compaction_kept", chainedDigest)
		}
		// The daemon's new view recommends another compaction: the digest it states is of
		// that one, so the base's kept by mistake is caught.
		other := proto.Clone(c).(*ctxccv1.CompactionRequest)
		other.ThroughSeq++
		moved := withCompaction(t, 3, other)
		if _, err := ApplyDelta(base, kept(base, moved, chainedDigest)); err == nil {
			t.Errorf("chained %v: a kept compaction that is not the new view's", chainedDigest)
		}
	}
}
