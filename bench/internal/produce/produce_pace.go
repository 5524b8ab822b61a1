package produce

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ordo-relay/ordo/outbox"
)

// A paced run (-produce-rate) spaces each producer's transactions evenly,
// so that the producers together commit rate transactions a second: what
// a steady load under a relay's busy threshold looks like, where every
// commit of an armed partition could notify. A producer that falls behind
// starts its next transaction at once, but never catches up by more than
// one interval (no burst after a stall).

// pacer spaces one producer's transactions; nil is a closed loop.
type pacer struct {
	every time.Duration
	next  time.Time
}

// newPacer returns the pacer of one of producers producers sharing rate
// transactions a second, its first start at a random phase; nil for rate 0.
func newPacer(rate, producers int, rng *rand.Rand) *pacer {
	if rate <= 0 {
		return nil
	}
	every := time.Duration(float64(time.Second) * float64(producers) / float64(rate))
	return &pacer{every: every, next: time.Now().Add(time.Duration(rng.Int64N(int64(every))))}
}

// wait sleeps until the next start (nil pacer: not at all).
func (p *pacer) wait(ctx context.Context) error {
	if p == nil {
		return nil
	}
	now := time.Now()
	if p.next.Before(now.Add(-p.every)) {
		p.next = now
	}
	d := p.next.Sub(now)
	p.next = p.next.Add(p.every)
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// notifyCounter counts the outbox's notifications on the run's database
// while the window measures: how many commits notified (PostgreSQL folds
// a transaction's identical notifications into one).
type notifyCounter struct {
	conn   *pgx.Conn
	n      atomic.Int64
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// watchNotifies listens on the outbox's channel of dbURL's database and
// counts what arrives while measuring is set.
func watchNotifies(ctx context.Context, dbURL string, measuring *atomic.Bool) (*notifyCounter, error) {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return nil, fmt.Errorf("connect the notification counter: %w", err)
	}
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{outbox.NotifyChannel}.Sanitize()); err != nil {
		_ = conn.Close(context.Background())
		return nil, fmt.Errorf("listen: %w", err)
	}
	wctx, cancel := context.WithCancel(context.Background())
	c := &notifyCounter{conn: conn, cancel: cancel}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		for {
			if _, err := conn.WaitForNotification(wctx); err != nil {
				return // cancelled by close (or the connection failed: the count stops)
			}
			if measuring.Load() {
				c.n.Add(1)
			}
		}
	}()
	return c, nil
}

// Close stops the counter.
func (c *notifyCounter) Close() {
	c.cancel()
	c.wg.Wait()
	_ = c.conn.Close(context.Background())
}
