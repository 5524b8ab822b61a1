// Package backoff is capped exponential backoff with jitter, and a sleep
// that ends with its context: the waits of every loop that talks to a
// server.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Backoff is capped exponential backoff with full jitter on the upper
// half. Not safe for concurrent use.
type Backoff struct {
	min, max, cur time.Duration
}

// New returns a Backoff whose first wait is about lo and whose waits never
// exceed hi.
func New(lo, hi time.Duration) *Backoff { return &Backoff{min: lo, max: hi} }

// Next returns the next wait: double the last one, capped, with jitter.
func (b *Backoff) Next() time.Duration {
	if b.cur == 0 {
		b.cur = b.min
	} else {
		b.cur = min(b.cur*2, b.max)
	}
	return b.cur/2 + rand.N(b.cur/2+1)
}

// Reset starts the backoff over: the next wait is about the first again.
func (b *Backoff) Reset() { b.cur = 0 }

// Attempt is the wait before attempt n+1 of something that failed n times:
// lo·2^n, capped at hi, with jitter on the upper half.
func Attempt(n int, lo, hi time.Duration) time.Duration {
	d := lo
	for i := 0; i < n && d < hi; i++ {
		d *= 2
	}
	d = min(d, hi)
	return d/2 + rand.N(d/2+1)
}

// Doubled is lo doubled n times, capped at hi, without jitter: the bound
// of an attempt after n attempts in a row ran out of time, for a server
// that may simply be slower than lo (a connect to a PostgreSQL just
// restarted on a loaded machine: given up at a fixed bound and started
// over, it never succeeds, and each attempt costs the server as much).
func Doubled(n int, lo, hi time.Duration) time.Duration {
	d := lo
	for i := 0; i < n && d < hi; i++ {
		d *= 2
	}
	return min(d, hi)
}

// Sleep waits d or until ctx ends; it reports whether d passed.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
