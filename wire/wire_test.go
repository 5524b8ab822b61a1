package wire_test

import (
	"errors"
	"fmt"
	"math"
	"testing"

	"github.com/ordo-relay/ordo/wire"
)

func TestInt(t *testing.T) {
	for _, tc := range []struct {
		v    any
		want int64
		err  error
	}{
		{int64(-5), -5, nil}, {int32(7), 7, nil}, {int16(8), 8, nil}, {int8(9), 9, nil},
		{10, 10, nil}, {uint8(11), 11, nil}, {uint16(12), 12, nil}, {uint32(13), 13, nil},
		{uint64(14), 14, nil}, {uint(15), 15, nil}, {uint64(math.MaxInt64), math.MaxInt64, nil},
		{uint64(1 << 63), 0, wire.ErrNotInteger},
		{float64(15), 0, wire.ErrNotInteger}, {float32(16), 0, wire.ErrNotInteger},
		{"17", 0, wire.ErrNotInteger}, {[]byte("19"), 0, wire.ErrNotInteger},
		{true, 0, wire.ErrNotInteger}, {nil, 0, wire.ErrNotInteger},
	} {
		t.Run(fmt.Sprintf("%T(%v)", tc.v, tc.v), func(t *testing.T) {
			got, err := wire.Int(map[string]any{"h": tc.v}, "h")
			if got != tc.want || !errors.Is(err, tc.err) || (tc.err == nil) != (err == nil) {
				t.Errorf("Int(%#v) = %d, %v; want %d, %v", tc.v, got, err, tc.want, tc.err)
			}
		})
	}
	if _, err := wire.Int(map[string]any{}, "h"); !errors.Is(err, wire.ErrNoHeader) {
		t.Errorf("absent header: %v, want ErrNoHeader", err)
	}
}

func TestParseOrder(t *testing.T) {
	h := func(seq, prev, part any) map[string]any {
		m := map[string]any{}
		for k, v := range map[string]any{wire.HeaderKeySeq: seq, wire.HeaderPrevKeySeq: prev, wire.HeaderPartition: part} {
			if v != nil {
				m[k] = v
			}
		}
		return m
	}
	for _, tc := range []struct {
		name string
		h    map[string]any
		want wire.Order
		err  error
	}{
		{"as the relay sends it", h(int64(7), int64(6), int32(3)), wire.Order{KeySeq: 7, PrevKeySeq: 6, Partition: 3}, nil},
		{"other widths", h(int32(7), int8(6), int64(3)), wire.Order{KeySeq: 7, PrevKeySeq: 6, Partition: 3}, nil},
		{"first of its key", h(int64(1), int64(0), int32(0)), wire.Order{KeySeq: 1}, nil},
		{"no key_seq", h(nil, int64(0), int32(0)), wire.Order{}, wire.ErrNoHeader},
		{"no prev", h(int64(1), nil, int32(0)), wire.Order{}, wire.ErrNoHeader},
		{"no partition", h(int64(1), int64(0), nil), wire.Order{}, wire.ErrNoHeader},
		{"text key_seq", h("1", int64(0), int32(0)), wire.Order{}, wire.ErrNotInteger},
		{"key_seq 0", h(int64(0), int64(0), int32(0)), wire.Order{}, wire.ErrOutOfRange},
		{"prev not below key_seq", h(int64(1), int64(1), int32(0)), wire.Order{}, wire.ErrOutOfRange},
		{"negative prev", h(int64(2), int64(-1), int32(0)), wire.Order{}, wire.ErrOutOfRange},
		{"negative partition", h(int64(1), int64(0), int32(-1)), wire.Order{}, wire.ErrOutOfRange},
		{"partition past int32", h(int64(1), int64(0), int64(math.MaxInt32)+1), wire.Order{}, wire.ErrOutOfRange},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := wire.ParseOrder(tc.h)
			if got != tc.want || !errors.Is(err, tc.err) || (tc.err == nil) != (err == nil) {
				t.Errorf("ParseOrder = %+v, %v; want %+v, %v", got, err, tc.want, tc.err)
			}
		})
	}
}
