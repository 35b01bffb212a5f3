package ctxcc

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"sync"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/ctxcc/ctxcc/client/go/ctxccv1"
)

// canonicalMarshal serializes m with every field in field-number order, map entries sorted
// by key: the daemon's deterministic serialization, of which a ViewDelta states the digest.
// proto.MarshalOptions{Deterministic: true} is not that: protobuf-go writes the fields of a
// oneof after all other fields (ViewPart's text, field 1, after its authority, field 3).
// Unknown fields go last, as they were received. Messages with no oneof anywhere in them
// are left to protobuf-go, whose order is then the same and which is several times faster.
func canonicalMarshal(m protoreflect.Message) ([]byte, error) {
	var e *encoder
	return e.appendMessage(nil, m)
}

// encoder remembers the encoding of each view message, system section and tool object: a
// view rebuilt from a delta shares the messages, sections and tools it keeps with its base,
// so only the new ones are encoded again. A nil encoder remembers nothing.
type encoder struct {
	prev, next records
}

// records are encodings (without their field's tag) of view messages, system sections and
// tools by object.
type records map[proto.Message][]byte

// remembered says whether an encoder keeps the encodings of m's type.
func remembered(m proto.Message) bool {
	switch m.(type) {
	case *ctxccv1.ViewMessage, *ctxccv1.SystemSection, *ctxccv1.ViewTool:
		return true
	}
	return false
}

func newEncoder(prev records) *encoder { return &encoder{prev: prev, next: records{}} }

// Per message type: whether it or a message type it holds has a (non-synthetic) oneof.
var hasOneof sync.Map // protoreflect.FullName -> bool

func needsOrder(md protoreflect.MessageDescriptor) bool {
	if v, ok := hasOneof.Load(md.FullName()); ok {
		return v.(bool)
	}
	found := oneofWithin(md, map[protoreflect.FullName]bool{})
	hasOneof.Store(md.FullName(), found)
	return found
}

func oneofWithin(md protoreflect.MessageDescriptor, seen map[protoreflect.FullName]bool) bool {
	if seen[md.FullName()] {
		return false // a recursive type's cycle: its types are looked at elsewhere
	}
	seen[md.FullName()] = true
	for i := 0; i < md.Oneofs().Len(); i++ {
		if !md.Oneofs().Get(i).IsSynthetic() {
			return true
		}
	}
	for i := 0; i < md.Fields().Len(); i++ {
		fd := md.Fields().Get(i)
		if fd.IsMap() {
			fd = fd.MapValue()
		}
		if fd.Message() != nil && oneofWithin(fd.Message(), seen) {
			return true
		}
	}
	return false
}

// Fields of each message type in number order, computed once per type.
var fieldOrder sync.Map // protoreflect.FullName -> []protoreflect.FieldDescriptor

func orderedFields(md protoreflect.MessageDescriptor) []protoreflect.FieldDescriptor {
	if fs, ok := fieldOrder.Load(md.FullName()); ok {
		return fs.([]protoreflect.FieldDescriptor)
	}
	fields := md.Fields()
	fs := make([]protoreflect.FieldDescriptor, fields.Len())
	for i := range fs {
		fs[i] = fields.Get(i)
	}
	sort.Slice(fs, func(i, j int) bool { return fs[i].Number() < fs[j].Number() })
	fieldOrder.Store(md.FullName(), fs)
	return fs
}

func (e *encoder) appendMessage(b []byte, m protoreflect.Message) ([]byte, error) {
	err := e.eachPart(m, func(part []byte) {
		b = append(b, part...)
	})
	return b, err
}

// eachPart calls emit with m's encoding in consecutive parts (a field, or one element of a
// repeated message field), each valid only during the call: a digest hashes them as they
// come instead of growing one buffer the size of the view.
func (e *encoder) eachPart(m protoreflect.Message, emit func([]byte)) error {
	return e.eachPartExcept(m, emit)
}

// eachPartExcept is eachPart leaving out the fields numbered skip.
func (e *encoder) eachPartExcept(m protoreflect.Message, emit func([]byte), skip ...protoreflect.FieldNumber) error {
	var part []byte
	var err error
	for _, fd := range orderedFields(m.Descriptor()) {
		if !m.Has(fd) || slices.Contains(skip, fd.Number()) {
			continue
		}
		v := m.Get(fd)
		switch {
		case fd.IsMap():
			part, err = e.appendMap(part[:0], fd, v.Map())
		case fd.IsList() && fd.Kind() == protoreflect.MessageKind:
			for i, list := 0, v.List(); i < list.Len() && err == nil; i++ {
				if part, err = e.appendField(part[:0], fd, list.Get(i)); err == nil {
					emit(part)
				}
			}
			if err != nil {
				return err
			}
			continue
		case fd.IsList():
			part, err = e.appendList(part[:0], fd, v.List())
		default:
			part, err = e.appendField(part[:0], fd, v)
		}
		if err != nil {
			return err
		}
		emit(part)
	}
	emit(m.GetUnknown())
	return nil
}

func (e *encoder) appendList(b []byte, fd protoreflect.FieldDescriptor, list protoreflect.List) ([]byte, error) {
	var err error
	if fd.IsPacked() {
		var packed []byte
		for i := 0; i < list.Len(); i++ {
			if packed, err = appendValue(packed, fd, list.Get(i)); err != nil {
				return nil, err
			}
		}
		b = protowire.AppendTag(b, fd.Number(), protowire.BytesType)
		return protowire.AppendBytes(b, packed), nil
	}
	for i := 0; i < list.Len(); i++ {
		if b, err = e.appendField(b, fd, list.Get(i)); err != nil {
			return nil, err
		}
	}
	return b, nil
}

func (e *encoder) appendMap(b []byte, fd protoreflect.FieldDescriptor, m protoreflect.Map) ([]byte, error) {
	keys := make([]protoreflect.MapKey, 0, m.Len())
	m.Range(func(k protoreflect.MapKey, _ protoreflect.Value) bool {
		keys = append(keys, k)
		return true
	})
	sort.Slice(keys, func(i, j int) bool { return lessKey(keys[i], keys[j]) })
	for _, k := range keys {
		entry, err := e.appendField(nil, fd.MapKey(), k.Value())
		if err != nil {
			return nil, err
		}
		if entry, err = e.appendField(entry, fd.MapValue(), m.Get(k)); err != nil {
			return nil, err
		}
		b = protowire.AppendTag(b, fd.Number(), protowire.BytesType)
		b = protowire.AppendBytes(b, entry)
	}
	return b, nil
}

func lessKey(x, y protoreflect.MapKey) bool {
	switch v := x.Interface().(type) {
	case bool:
		return !v && y.Bool()
	case string:
		return v < y.String()
	case int32, int64:
		return x.Int() < y.Int()
	default:
		return x.Uint() < y.Uint()
	}
}

func (e *encoder) appendField(b []byte, fd protoreflect.FieldDescriptor, v protoreflect.Value) ([]byte, error) {
	switch fd.Kind() {
	case protoreflect.MessageKind:
		inner, err := e.messageBytes(v.Message())
		if err != nil {
			return nil, err
		}
		b = protowire.AppendTag(b, fd.Number(), protowire.BytesType)
		return protowire.AppendBytes(b, inner), nil
	case protoreflect.GroupKind:
		b = protowire.AppendTag(b, fd.Number(), protowire.StartGroupType)
		b, err := e.appendMessage(b, v.Message())
		if err != nil {
			return nil, err
		}
		return protowire.AppendTag(b, fd.Number(), protowire.EndGroupType), nil
	case protoreflect.StringKind, protoreflect.BytesKind:
		b = protowire.AppendTag(b, fd.Number(), protowire.BytesType)
	case protoreflect.Fixed32Kind, protoreflect.Sfixed32Kind, protoreflect.FloatKind:
		b = protowire.AppendTag(b, fd.Number(), protowire.Fixed32Type)
	case protoreflect.Fixed64Kind, protoreflect.Sfixed64Kind, protoreflect.DoubleKind:
		b = protowire.AppendTag(b, fd.Number(), protowire.Fixed64Type)
	default:
		b = protowire.AppendTag(b, fd.Number(), protowire.VarintType)
	}
	return appendValue(b, fd, v)
}

func (e *encoder) messageBytes(m protoreflect.Message) ([]byte, error) {
	key := m.Interface()
	kept := e != nil && remembered(key)
	if kept {
		if b, ok := e.prev[key]; ok {
			e.next[key] = b
			return b, nil
		}
	}
	var b []byte
	var err error
	if needsOrder(m.Descriptor()) {
		b, err = e.appendMessage(nil, m)
	} else {
		b, err = proto.MarshalOptions{Deterministic: true}.Marshal(m.Interface())
	}
	if kept && err == nil {
		e.next[key] = b
	}
	return b, err
}

// appendValue appends a scalar without its tag.
func appendValue(b []byte, fd protoreflect.FieldDescriptor, v protoreflect.Value) ([]byte, error) {
	switch fd.Kind() {
	case protoreflect.BoolKind:
		return protowire.AppendVarint(b, protowire.EncodeBool(v.Bool())), nil
	case protoreflect.EnumKind:
		return protowire.AppendVarint(b, uint64(int64(v.Enum()))), nil
	case protoreflect.Int32Kind, protoreflect.Int64Kind:
		return protowire.AppendVarint(b, uint64(v.Int())), nil
	case protoreflect.Sint32Kind, protoreflect.Sint64Kind:
		return protowire.AppendVarint(b, protowire.EncodeZigZag(v.Int())), nil
	case protoreflect.Uint32Kind, protoreflect.Uint64Kind:
		return protowire.AppendVarint(b, v.Uint()), nil
	case protoreflect.Fixed32Kind:
		return protowire.AppendFixed32(b, uint32(v.Uint())), nil
	case protoreflect.Sfixed32Kind:
		return protowire.AppendFixed32(b, uint32(v.Int())), nil
	case protoreflect.FloatKind:
		return protowire.AppendFixed32(b, math.Float32bits(float32(v.Float()))), nil
	case protoreflect.Fixed64Kind:
		return protowire.AppendFixed64(b, v.Uint()), nil
	case protoreflect.Sfixed64Kind:
		return protowire.AppendFixed64(b, uint64(v.Int())), nil
	case protoreflect.DoubleKind:
		return protowire.AppendFixed64(b, math.Float64bits(v.Float())), nil
	case protoreflect.StringKind:
		return protowire.AppendString(b, v.String()), nil
	case protoreflect.BytesKind:
		return protowire.AppendBytes(b, v.Bytes()), nil
	}
	return nil, fmt.Errorf("field %s: kind %s", fd.FullName(), fd.Kind())
}
