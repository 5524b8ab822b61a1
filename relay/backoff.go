package relay

import (
	"context"
	"math/rand/v2"
	"time"
)

// backoff is capped exponential backoff with full jitter on the upper half.
// Not safe for concurrent use.
type backoff struct {
	min, max, cur time.Duration
}

func newBackoff(lo, hi time.Duration) *backoff { return &backoff{min: lo, max: hi} }

func (b *backoff) next() time.Duration {
	if b.cur == 0 {
		b.cur = b.min
	} else {
		b.cur = min(b.cur*2, b.max)
	}
	return b.cur/2 + rand.N(b.cur/2+1)
}

func (b *backoff) reset() { b.cur = 0 }

// retryDelay is the wait before attempt n+1 of a failed message: min·2^n,
// capped at max, with jitter on the upper half.
func retryDelay(attempts int, lo, hi time.Duration) time.Duration {
	d := lo
	for i := 0; i < attempts && d < hi; i++ {
		d *= 2
	}
	d = min(d, hi)
	return d/2 + rand.N(d/2+1)
}

// sleepCtx waits d or until ctx ends; it reports whether d passed.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
