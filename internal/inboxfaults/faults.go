// Package inboxfaults is fault injection around an inbox consumer, built
// from the inbox's public interfaces only (inbox.Handler, inbox.DB): a
// handler that takes longer, fails, panics or never succeeds for some
// orders, and a process that kills itself between a handler's commit and
// the inbox's acknowledgement. cmd/shipping's tests and the consumer
// nemesis (bench/nemesis, docs/reliability.md) use it through a shipping
// built with the ordofaults build tag; the default build links none of it
// (internal/modcheck checks it), so the example consumer a user copies
// has no fault flags.
package inboxfaults

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ordo-relay/ordo/inbox"
)

// Config is what to inject. The zero value injects nothing.
type Config struct {
	// HandlerDelay is simulated work: every attempt waits this long (or
	// until its context ends) before the handler runs.
	HandlerDelay time.Duration

	// ErrorRate and PanicRate are the shares of attempts that, after the
	// handler's writes, return ErrInjected or panic, so the inbox must
	// roll the attempt back and retry it. Each 0..1, together at most 1.
	ErrorRate, PanicRate float64

	// PoisonPrefix: orders (correlation ids) starting with it fail on
	// every attempt with ErrPoison, so they are dead-lettered. Empty:
	// none.
	PoisonPrefix string

	// KillAfter, when above 0, SIGKILLs the process after the KillAfter-th
	// commit of a transaction a handler ran in: after the commit, before
	// the inbox acknowledges the delivery.
	KillAfter int
}

// ErrInjected is what an attempt failed by ErrorRate returns.
var ErrInjected = errors.New("fault injection: transient handler error")

// ErrPoison is what every attempt at a poison order returns.
var ErrPoison = errors.New("fault injection: poison order")

// AddFlags registers c's flags on fs: -handler-delay, -fault-error-rate,
// -fault-panic-rate, -fault-poison-prefix and -kill-after.
func (c *Config) AddFlags(fs *flag.FlagSet) {
	fs.DurationVar(&c.HandlerDelay, "handler-delay", 0, "fault injection: simulated work per handler attempt, before its writes")
	fs.Float64Var(&c.ErrorRate, "fault-error-rate", 0, "fault injection: share of handler attempts that fail with an error after the projection's writes (0..1)")
	fs.Float64Var(&c.PanicRate, "fault-panic-rate", 0, "fault injection: share of handler attempts that panic after the projection's writes (0..1)")
	fs.StringVar(&c.PoisonPrefix, "fault-poison-prefix", "", "fault injection: orders whose id starts with this fail on every attempt")
	fs.IntVar(&c.KillAfter, "kill-after", 0, "fault injection: SIGKILL this process after N handled commits, before the ack")
}

// Validate reports a setting c cannot inject, naming its flag.
func (c Config) Validate() error {
	if c.ErrorRate < 0 || c.PanicRate < 0 || c.ErrorRate+c.PanicRate > 1 {
		return fmt.Errorf("-fault-error-rate %v and -fault-panic-rate %v: want shares from 0 to 1, together at most 1", c.ErrorRate, c.PanicRate)
	}
	if c.HandlerDelay < 0 || c.KillAfter < 0 {
		return fmt.Errorf("-handler-delay %v and -kill-after %d: want neither negative", c.HandlerDelay, c.KillAfter)
	}
	return nil
}

// Wrap returns db and h with c's faults injected: db and h themselves when
// there are none. The inbox must be given both (h runs in a transaction
// that db began).
func (c Config) Wrap(db inbox.DB, h inbox.Handler, logger *slog.Logger) (inbox.DB, inbox.Handler) {
	h = c.failing(c.delayed(h))
	if c.KillAfter > 0 {
		var k *killAfter
		k, db = c.killer(db, logger)
		h = k.handler(h)
	}
	return db, h
}

// WrapQueue is Wrap for a QueueHandler (inbox.NewQueued): the delay comes
// before q queues its statements, a failure or panic after it (the
// statements it queued are then never sent), and KillAfter counts the
// commits of transactions in which a batch of statements was sent (the
// handler's, or the per-message path's savepoint and decision).
func (c Config) WrapQueue(db inbox.DB, q inbox.QueueHandler, logger *slog.Logger) (inbox.DB, inbox.QueueHandler) {
	if c.HandlerDelay > 0 || c.fails() {
		inner := q
		q = func(ctx context.Context, m *inbox.Message, b *pgx.Batch) error {
			if err := c.wait(ctx); err != nil {
				return err
			}
			if err := inner(ctx, m, b); err != nil {
				return err
			}
			return c.fault(m)
		}
	}
	if c.KillAfter > 0 {
		var k *killAfter
		k, db = c.killer(db, logger)
		k.queued = true
	}
	return db, q
}

// killer wraps db for KillAfter.
func (c Config) killer(db inbox.DB, logger *slog.Logger) (*killAfter, inbox.DB) {
	k := &killAfter{DB: db, n: int64(c.KillAfter), logger: logger}
	if bs, ok := k.DB.(batchSender); ok {
		return k, &killAfterBatches{killAfter: k, batches: bs}
	}
	return k, k
}

// delayed returns h, each attempt HandlerDelay late.
func (c Config) delayed(h inbox.Handler) inbox.Handler {
	if c.HandlerDelay <= 0 {
		return h
	}
	return func(ctx context.Context, tx pgx.Tx, m *inbox.Message) error {
		if err := c.wait(ctx); err != nil {
			return err
		}
		return h(ctx, tx, m)
	}
}

// wait waits HandlerDelay, or until ctx ends.
func (c Config) wait(ctx context.Context) error {
	if c.HandlerDelay <= 0 {
		return nil
	}
	t := time.NewTimer(c.HandlerDelay)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// failing returns h with the failures and poison orders injected after
// its writes; h itself when there are none.
func (c Config) failing(h inbox.Handler) inbox.Handler {
	if !c.fails() {
		return h
	}
	return func(ctx context.Context, tx pgx.Tx, m *inbox.Message) error {
		if err := h(ctx, tx, m); err != nil {
			return err
		}
		return c.fault(m)
	}
}

// fails reports whether c injects failures or poison orders.
func (c Config) fails() bool { return c.ErrorRate != 0 || c.PanicRate != 0 || c.PoisonPrefix != "" }

// fault is the failure injected into an attempt at m, after its writes:
// ErrPoison for a poison order, else ErrInjected or a panic at their
// rates, else nil.
func (c Config) fault(m *inbox.Message) error {
	if c.PoisonPrefix != "" && strings.HasPrefix(m.CorrelationID, c.PoisonPrefix) {
		return fmt.Errorf("order %s: %w", m.CorrelationID, ErrPoison)
	}
	switch r := rand.Float64(); {
	case r < c.ErrorRate:
		return fmt.Errorf("order %s key_seq %d: %w", m.CorrelationID, m.KeySeq, ErrInjected)
	case r < c.ErrorRate+c.PanicRate:
		panic(fmt.Sprintf("fault injection: handler panic on order %s key_seq %d", m.CorrelationID, m.KeySeq))
	}
	return nil
}
