package ctxcc

import (
	"fmt"
	"math"
	"sort"
	"sync"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// canonicalMarshal serializes m with every field in field-number order, map entries sorted
// by key: the daemon's deterministic serialization, of which a ViewDelta states the digest.
// proto.MarshalOptions{Deterministic: true} is not that: protobuf-go writes the fields of a
// oneof after all other fields (ViewPart's text, field 1, after its authority, field 3).
// Unknown fields go last, as they were received.
func canonicalMarshal(m protoreflect.Message) ([]byte, error) {
	return appendMessage(nil, m)
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

func appendMessage(b []byte, m protoreflect.Message) ([]byte, error) {
	var err error
	for _, fd := range orderedFields(m.Descriptor()) {
		if !m.Has(fd) {
			continue
		}
		v := m.Get(fd)
		switch {
		case fd.IsMap():
			b, err = appendMap(b, fd, v.Map())
		case fd.IsList():
			b, err = appendList(b, fd, v.List())
		default:
			b, err = appendField(b, fd, v)
		}
		if err != nil {
			return nil, err
		}
	}
	return append(b, m.GetUnknown()...), nil
}

func appendList(b []byte, fd protoreflect.FieldDescriptor, list protoreflect.List) ([]byte, error) {
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
		if b, err = appendField(b, fd, list.Get(i)); err != nil {
			return nil, err
		}
	}
	return b, nil
}

func appendMap(b []byte, fd protoreflect.FieldDescriptor, m protoreflect.Map) ([]byte, error) {
	keys := make([]protoreflect.MapKey, 0, m.Len())
	m.Range(func(k protoreflect.MapKey, _ protoreflect.Value) bool {
		keys = append(keys, k)
		return true
	})
	sort.Slice(keys, func(i, j int) bool { return lessKey(keys[i], keys[j]) })
	for _, k := range keys {
		entry, err := appendField(nil, fd.MapKey(), k.Value())
		if err != nil {
			return nil, err
		}
		if entry, err = appendField(entry, fd.MapValue(), m.Get(k)); err != nil {
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

func appendField(b []byte, fd protoreflect.FieldDescriptor, v protoreflect.Value) ([]byte, error) {
	switch fd.Kind() {
	case protoreflect.MessageKind:
		inner, err := appendMessage(nil, v.Message())
		if err != nil {
			return nil, err
		}
		b = protowire.AppendTag(b, fd.Number(), protowire.BytesType)
		return protowire.AppendBytes(b, inner), nil
	case protoreflect.GroupKind:
		b = protowire.AppendTag(b, fd.Number(), protowire.StartGroupType)
		b, err := appendMessage(b, v.Message())
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
