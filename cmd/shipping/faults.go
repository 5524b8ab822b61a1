package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/ordo-relay/ordo/inbox"
)

// faults is the handler's fault injection, for the consumer nemesis
// (bench/nemesis, docs/reliability.md): after the projection has written
// its rows, a share of attempts fail with an error and a share panic, so
// the inbox must roll the attempt back and retry it; and the orders whose
// id starts with poisonPrefix fail on every attempt, so they are
// dead-lettered. The zero value injects nothing.
type faults struct {
	errorRate    float64 // share of attempts that return errInjected
	panicRate    float64 // share of attempts that panic
	poisonPrefix string  // orders whose id starts with it always fail ("" for none)
}

// errInjected is what a failing attempt returns.
var errInjected = errors.New("fault injection: transient handler error")

// errPoison is what a poison order's every attempt returns.
var errPoison = errors.New("fault injection: poison order")

// addFlags registers the fault flags on fs.
func (f *faults) addFlags(fs *flag.FlagSet) {
	fs.Float64Var(&f.errorRate, "fault-error-rate", 0, "fault injection: share of handler attempts that fail with an error after the projection's writes (0..1)")
	fs.Float64Var(&f.panicRate, "fault-panic-rate", 0, "fault injection: share of handler attempts that panic after the projection's writes (0..1)")
	fs.StringVar(&f.poisonPrefix, "fault-poison-prefix", "", "fault injection: orders whose id starts with this fail on every attempt")
}

func (f faults) validate() error {
	if f.errorRate < 0 || f.panicRate < 0 || f.errorRate+f.panicRate > 1 {
		return fmt.Errorf("-fault-error-rate %v and -fault-panic-rate %v: want shares from 0 to 1, together at most 1", f.errorRate, f.panicRate)
	}
	return nil
}

// wrap returns h with the faults injected; h itself when there are none.
func (f faults) wrap(h inbox.Handler) inbox.Handler {
	if f == (faults{}) {
		return h
	}
	return func(ctx context.Context, tx pgx.Tx, m *inbox.Message) error {
		if err := h(ctx, tx, m); err != nil {
			return err
		}
		if f.poisonPrefix != "" && strings.HasPrefix(m.CorrelationID, f.poisonPrefix) {
			return fmt.Errorf("order %s: %w", m.CorrelationID, errPoison)
		}
		switch r := rand.Float64(); {
		case r < f.errorRate:
			return fmt.Errorf("order %s key_seq %d: %w", m.CorrelationID, m.KeySeq, errInjected)
		case r < f.errorRate+f.panicRate:
			panic(fmt.Sprintf("fault injection: handler panic on order %s key_seq %d", m.CorrelationID, m.KeySeq))
		}
		return nil
	}
}
