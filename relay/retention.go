package relay

import (
	"context"
	"time"

	"github.com/ordo-relay/ordo/internal/outage"
)

// retentionLoop deletes processed rows older than RetentionAge from the
// partitions this node holds, every RetentionInterval, in chunks of
// RetentionChunk rows so no statement holds locks for long.
func (r *Relay) retentionLoop(ctx context.Context) {
	if r.cfg.RetentionAge <= 0 {
		return
	}
	down := outage.New(r.cfg.Logger, "PostgreSQL (retention)")
	t := time.NewTimer(r.cfg.RetentionInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := r.retentionOnce(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			down.Fail(err)
		} else {
			down.OK()
		}
		t.Reset(r.cfg.RetentionInterval)
	}
}

// retentionOnce runs one retention pass over every held partition.
func (r *Relay) retentionOnce(ctx context.Context) error {
	var total int64
	r.mu.Lock()
	epochs := make(map[int]int64, len(r.parts))
	for p, ps := range r.parts {
		epochs[p] = ps.epoch
	}
	r.mu.Unlock()
	for p, epoch := range epochs {
		lease, held := r.own.Lease(p)
		if !held || lease.Epoch != epoch {
			continue
		}
		for ctx.Err() == nil && lease.Valid(time.Now()) {
			n, err := r.store.DeleteProcessed(ctx, p, lease.Epoch, r.cfg.RetentionAge, r.cfg.RetentionChunk)
			if err != nil {
				return err
			}
			total += n
			if n < int64(r.cfg.RetentionChunk) {
				break
			}
		}
	}
	if total > 0 {
		r.mu.Lock()
		r.stats.Deleted += total
		r.mu.Unlock()
		r.cfg.Logger.Info("retention deleted processed rows", "rows", total, "older_than", r.cfg.RetentionAge)
	}
	return ctx.Err()
}
