package main

import (
	"context"
	"errors"
	"io"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/ordo-relay/ordo/inbox"
)

func TestFaultsWrap(t *testing.T) {
	calls := 0
	h := func(context.Context, pgx.Tx, *inbox.Message) error { calls++; return nil }
	msg := &inbox.Message{CorrelationID: "order-1", KeySeq: 1}
	run := func(f faults) (err error, panicked bool) {
		defer func() {
			if recover() != nil {
				panicked = true
			}
		}()
		return f.wrap(h)(context.Background(), nil, msg), false
	}
	for _, tc := range []struct {
		name      string
		f         faults
		wantErr   error
		wantPanic bool
	}{
		{name: "none", f: faults{}},
		{name: "errors", f: faults{errorRate: 1}, wantErr: errInjected},
		{name: "panics", f: faults{panicRate: 1}, wantPanic: true},
		{name: "poison", f: faults{poisonPrefix: "order-"}, wantErr: errPoison},
		{name: "other orders are not poison", f: faults{poisonPrefix: "poison-"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := calls
			err, panicked := run(tc.f)
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) || panicked != tc.wantPanic {
				t.Fatalf("err %v panicked %v; want %v, panic %v", err, panicked, tc.wantErr, tc.wantPanic)
			}
			if calls != before+1 {
				t.Fatalf("the projection ran %d times, want once (the fault comes after its writes)", calls-before)
			}
		})
	}
}

func TestFaultFlags(t *testing.T) {
	none := func(string) (string, bool) { return "", false }
	c, err := parseConfig([]string{"-fault-error-rate", "0.03", "-fault-panic-rate", "0.02", "-fault-poison-prefix", "p-"}, none, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.faults != (faults{errorRate: 0.03, panicRate: 0.02, poisonPrefix: "p-"}) {
		t.Fatalf("faults %+v", c.faults)
	}
	for _, args := range [][]string{{"-fault-error-rate", "-0.1"}, {"-fault-error-rate", "0.6", "-fault-panic-rate", "0.6"}} {
		if _, err := parseConfig(args, none, io.Discard); err == nil {
			t.Errorf("%q accepted", args)
		}
	}
}
