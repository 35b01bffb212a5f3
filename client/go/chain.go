package ctxcc

import (
	"crypto/sha256"
	"encoding/hex"

	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/ctxcc/ctxcc/client/go/ctxccv1"
)

// messagesField is CompiledView.messages, left out of the chained digest's R;
// compactionField is CompiledView.compaction, also left out of R and hashed apart (Q) with
// DELTA_DIGEST_MESSAGE_CHAIN_COMPACTION_APART.
const (
	messagesField   = 10
	compactionField = 19
)

// compactionSum is Q of the digest with the compaction apart for one compaction request,
// found by pointer: a delta that keeps its base's request (CompactionKept) hands the same
// one on, so over budget the request, as long as a model window, is hashed once per turn.
type compactionSum struct {
	req *ctxccv1.CompactionRequest
	sum [sha256.Size]byte
}

// compactionDigest is Q for req (32 zero bytes without one): held's when req is held's.
func compactionDigest(req *ctxccv1.CompactionRequest, held compactionSum) (compactionSum, error) {
	if req == nil {
		return compactionSum{}, nil
	}
	if req == held.req {
		return held, nil
	}
	var e *encoder
	b, err := e.messageBytes(req.ProtoReflect())
	if err != nil {
		return compactionSum{}, err
	}
	return compactionSum{req: req, sum: sha256.Sum256(b)}, nil
}

// chain holds a view's chain values c_1..c_n (ViewDelta.chain_sha256 in the proto):
// c_i = sha256(c_{i-1} || sha256(message i's encoding)), c_0 all zero.
type chain [][sha256.Size]byte

// extendChain is the chain of a view whose first kept messages are those of the view
// whose chain values are base, followed by msgs: only msgs are encoded and hashed.
func extendChain(base chain, kept int, msgs []*ctxccv1.ViewMessage) (chain, error) {
	out := make(chain, kept, kept+len(msgs))
	copy(out, base[:kept])
	var last [sha256.Size]byte
	if kept > 0 {
		last = base[kept-1]
	}
	var e *encoder
	var pair [2 * sha256.Size]byte
	for _, m := range msgs {
		b, err := e.messageBytes(m.ProtoReflect())
		if err != nil {
			return nil, err
		}
		h := sha256.Sum256(b)
		copy(pair[:sha256.Size], last[:])
		copy(pair[sha256.Size:], h[:])
		last = sha256.Sum256(pair[:])
		out = append(out, last)
	}
	return out, nil
}

// chainDigest is the chained digest of view, whose messages' chain values are values:
// sha256(sha256(the view's encoding without its messages) || c_n), in lower-case hex. The
// sections and tools found in prev (by object: the ones a view rebuilt from a delta keeps
// from its base) are not encoded again; it returns the encodings of view's. With apart
// (not nil) it is the digest with the compaction apart, sha256(R' || c_n || Q), R' also
// without the compaction; Q is *apart's when view's request is *apart's, and *apart is
// set to view's.
func chainDigest(view *ctxccv1.CompiledView, values chain, prev records, apart *compactionSum) (string, records, error) {
	rest := sha256.New()
	e := newEncoder(prev)
	skip := []protoreflect.FieldNumber{messagesField}
	if apart != nil {
		skip = append(skip, compactionField)
	}
	if err := e.eachPartExcept(view.ProtoReflect(), func(part []byte) { rest.Write(part) }, skip...); err != nil {
		return "", nil, err
	}
	var last [sha256.Size]byte
	if len(values) > 0 {
		last = values[len(values)-1]
	}
	h := sha256.New()
	h.Write(rest.Sum(nil))
	h.Write(last[:])
	if apart != nil {
		q, err := compactionDigest(view.GetCompaction(), *apart)
		if err != nil {
			return "", nil, err
		}
		*apart = q
		h.Write(q.sum[:])
	}
	return hex.EncodeToString(h.Sum(nil)), e.next, nil
}

// ChainDigest is the chained digest (ViewDelta.chain_sha256) of a whole view, computed
// over all its messages; a stream continues it from its base's instead.
func ChainDigest(view *ctxccv1.CompiledView) (string, error) {
	values, err := extendChain(nil, 0, view.GetMessages())
	if err != nil {
		return "", err
	}
	sum, _, err := chainDigest(view, values, nil, nil)
	return sum, err
}
