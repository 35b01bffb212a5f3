package ctxcc

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"google.golang.org/protobuf/proto"

	"github.com/ctxcc/ctxcc/client/go/ctxccv1"
)

// ViewDigest is the lower-case hex sha256 of a view's serialization in field-number order,
// the digest a ViewDelta's view_sha256 states for the view it describes.
func ViewDigest(view *ctxccv1.CompiledView) (string, error) {
	return digest(view, nil)
}

func digest(view *ctxccv1.CompiledView, e *encoder) (string, error) {
	h := sha256.New()
	if err := e.eachPart(view.ProtoReflect(), func(part []byte) { h.Write(part) }); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// ApplyDelta rebuilds the whole view that d describes against base, the view named by
// d.BaseCompileId, and checks it against d.ViewSha256. On any error the result must not be
// used; ask for the view whole instead (Stream.Step does). A delta with ChainSha256 (a
// chained digest, DELTA_DIGEST_MESSAGE_CHAIN or DELTA_DIGEST_MESSAGE_CHAIN_COMPACTION_APART:
// the delta does not say which was asked for, so either is accepted) is checked against
// that instead.
//
// The result is d's head with its messages, sections, system prompt, tools and (when
// CompactionKept) compaction filled in (so d is used up), and what it keeps from base is the same
// objects as base's: nothing is copied, so treat views as read-only.
func ApplyDelta(base *ctxccv1.CompiledView, d *ctxccv1.ViewDelta) (*ctxccv1.CompiledView, error) {
	if d.GetChainSha256() != "" {
		baseChain, err := extendChain(nil, 0, base.GetMessages())
		if err != nil {
			return nil, err
		}
		// Rebuilding uses d up: a second try at the other digest rebuilds from a copy.
		spare := proto.Clone(d).(*ctxccv1.ViewDelta)
		view, _, _, err := applyChainedDelta(base, d, baseChain, nil, nil)
		if err != nil {
			view, _, _, err = applyChainedDelta(base, spare, baseChain, nil, &compactionSum{})
		}
		return view, err
	}
	view, _, err := applyDelta(base, d, nil)
	return view, err
}

// applyDelta is ApplyDelta reusing the encodings of base's messages (baseRecords, may be
// nil); it returns the new view's.
func applyDelta(base *ctxccv1.CompiledView, d *ctxccv1.ViewDelta, baseRecords records) (*ctxccv1.CompiledView, records, error) {
	view, err := rebuild(base, d)
	if err != nil {
		return nil, nil, err
	}
	e := newEncoder(baseRecords)
	sum, err := digest(view, e)
	if err != nil {
		return nil, nil, err
	}
	if sum != d.GetViewSha256() {
		return nil, nil, fmt.Errorf("view %s rebuilt from a delta has sha256 %s, the daemon's is %s",
			view.GetCompileId(), sum, d.GetViewSha256())
	}
	return view, e.next, nil
}

// applyChainedDelta rebuilds the view d describes against base and checks it against
// d.ChainSha256, continuing from baseChain (base's chain values): only the appended
// messages and the view without its messages are encoded and hashed, and of that only the
// sections and tools not in baseRecords (base's, may be nil). It returns the new view's
// chain values and the encodings of its sections and tools. apart (not nil): the digest
// with the compaction apart, Q held in *apart (see chainDigest).
func applyChainedDelta(base *ctxccv1.CompiledView, d *ctxccv1.ViewDelta, baseChain chain, baseRecords records, apart *compactionSum) (*ctxccv1.CompiledView, chain, records, error) {
	kept := int(d.GetKeptMessages())
	if base != nil && len(baseChain) != len(base.GetMessages()) {
		return nil, nil, nil, fmt.Errorf("the base's chain has %d values for %d messages", len(baseChain), len(base.GetMessages()))
	}
	view, err := rebuild(base, d)
	if err != nil {
		return nil, nil, nil, err
	}
	values, err := extendChain(baseChain, kept, d.GetAppendedMessages())
	if err != nil {
		return nil, nil, nil, err
	}
	sum, recs, err := chainDigest(view, values, baseRecords, apart)
	if err != nil {
		return nil, nil, nil, err
	}
	if sum != d.GetChainSha256() {
		return nil, nil, nil, fmt.Errorf("view %s rebuilt from a delta has chained digest %s, the daemon's is %s",
			view.GetCompileId(), sum, d.GetChainSha256())
	}
	return view, values, recs, nil
}

// rebuild makes the view d describes against base, without checking its digest.
func rebuild(base *ctxccv1.CompiledView, d *ctxccv1.ViewDelta) (*ctxccv1.CompiledView, error) {
	if base == nil || base.GetCompileId() != d.GetBaseCompileId() {
		return nil, fmt.Errorf("delta against %q, but the view held is %q", d.GetBaseCompileId(), base.GetCompileId())
	}
	if d.GetHead() == nil {
		return nil, fmt.Errorf("delta %q has no head", d.GetBaseCompileId())
	}
	kept := int(d.GetKeptMessages())
	if kept > len(base.GetMessages()) {
		return nil, fmt.Errorf("delta keeps %d messages of a view with %d", kept, len(base.GetMessages()))
	}
	// The head becomes the view: cloning it would copy its renderings, often the largest
	// part of a view, at every step.
	view := d.GetHead()
	// A fresh slice: appending into base.Messages[:kept] would overwrite base's own.
	view.Messages = make([]*ctxccv1.ViewMessage, 0, kept+len(d.GetAppendedMessages()))
	view.Messages = append(view.Messages, base.GetMessages()[:kept]...)
	view.Messages = append(view.Messages, d.GetAppendedMessages()...)
	view.SystemSections = make([]*ctxccv1.SystemSection, 0, len(d.GetSections()))
	texts := make([]string, 0, len(d.GetSections()))
	for _, slot := range d.GetSections() {
		var s *ctxccv1.SystemSection
		switch v := slot.GetSlot().(type) {
		case *ctxccv1.SectionSlot_BaseIndex:
			if int(v.BaseIndex) >= len(base.GetSystemSections()) {
				return nil, fmt.Errorf("delta names section %d of a view with %d", v.BaseIndex, len(base.GetSystemSections()))
			}
			s = base.GetSystemSections()[v.BaseIndex]
		case *ctxccv1.SectionSlot_Section:
			s = v.Section
		default:
			return nil, fmt.Errorf("delta has an empty section slot")
		}
		view.SystemSections = append(view.SystemSections, s)
		texts = append(texts, s.GetText())
	}
	view.SystemPrompt = strings.Join(texts, "\n\n")
	if d.GetToolsChanged() {
		view.Tools = d.GetTools()
	} else {
		view.Tools = base.GetTools()
	}
	if d.GetCompactionKept() {
		if base.GetCompaction() == nil || view.GetCompaction() != nil {
			return nil, fmt.Errorf("delta keeps the compaction of a view without one, or has its own")
		}
		view.Compaction = base.GetCompaction()
	}
	return view, nil
}
