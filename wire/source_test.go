package wire_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/ordo-relay/ordo/wire"
)

func TestValidateSource(t *testing.T) {
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"default", true},
		{"a", true},
		{"orders", true},
		{"billing-eu_2", true},
		{"z9", true},
		{strings.Repeat("a", wire.MaxSourceLen), true},
		{"", false},
		{strings.Repeat("a", wire.MaxSourceLen+1), false},
		{"Orders", false},
		{"ORDERS", false},
		{"1orders", false},
		{"-orders", false},
		{"_orders", false},
		{"orders.eu", false},
		{"orders eu", false},
		{"orders=x", false},
		{"orders/eu", false},
		{"ordérs", false},
		{"orders\x00", false},
		{"orders\n", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := wire.ValidateSource(tc.name)
			if tc.ok != (err == nil) {
				t.Fatalf("ValidateSource(%q) = %v, want ok %v", tc.name, err, tc.ok)
			}
			if err != nil && !errors.Is(err, wire.ErrInvalidSource) {
				t.Fatalf("ValidateSource(%q) = %v, want ErrInvalidSource", tc.name, err)
			}
		})
	}
}

func TestSource(t *testing.T) {
	for _, tc := range []struct {
		name string
		h    map[string]any
		want string
		err  error
	}{
		{"absent: default", map[string]any{wire.HeaderKeySeq: int64(1)}, wire.DefaultSource, nil},
		{"nil table: default", nil, wire.DefaultSource, nil},
		{"string", map[string]any{wire.HeaderSource: "billing"}, "billing", nil},
		{"default named", map[string]any{wire.HeaderSource: "default"}, wire.DefaultSource, nil},
		{"byte array", map[string]any{wire.HeaderSource: []byte("billing")}, "billing", nil},
		{"empty string", map[string]any{wire.HeaderSource: ""}, "", wire.ErrInvalidSource},
		{"upper case", map[string]any{wire.HeaderSource: "Billing"}, "", wire.ErrInvalidSource},
		{"too long", map[string]any{wire.HeaderSource: strings.Repeat("b", 33)}, "", wire.ErrInvalidSource},
		{"integer", map[string]any{wire.HeaderSource: int64(1)}, "", wire.ErrNotString},
		{"nil value", map[string]any{wire.HeaderSource: nil}, "", wire.ErrNotString},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := wire.Source(tc.h)
			if got != tc.want || !errors.Is(err, tc.err) || (tc.err == nil) != (err == nil) {
				t.Errorf("Source = %q, %v; want %q, %v", got, err, tc.want, tc.err)
			}
		})
	}
}
