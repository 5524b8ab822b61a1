package drain

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/ordo-relay/ordo/bench/internal/measure"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/ordo-relay/ordo/bench/internal/harness"
	"github.com/ordo-relay/ordo/partition"
)

// drainColumns are the outbox columns a producer supplies; the database
// assigns seq, key_seq and occurred_at (its BEFORE INSERT trigger fires
// for COPY too).
var drainColumns = []string{"id", "partition", "correlation_id", "exchange", "routing_key", "type", "payload", "headers"}

// loaded is what LoadGroups committed.
type loaded struct {
	Timed     []string  // ids of rows of the groups without poison, in insertion order
	held      []string  // ids of the poison groups' rows (parked, and their followers)
	committed time.Time // when COMMIT returned: the relays see every row from then on
	insertCPU time.Duration
}

// LoadGroups inserts the groups' rows with one COPY in a transaction of
// its own, interleaved (row i of every group, then row i+1), runs ANALYZE
// outbox in the same transaction when analyze is set (it sees the
// transaction's own rows), and commits. insertCPU is the CPU of the
// bench's PostgreSQL backends during the COPY and the COMMIT, not the
// ANALYZE.
func LoadGroups(ctx context.Context, r *harness.Rig, groups []RowGroup, payload int, analyze bool) (*loaded, error) {
	out := &loaded{}
	// Payload: {"key":"key-00042","n":123,"pad":"xxx..."} of about payload bytes.
	pad := strings.Repeat("x", max(0, payload-len(`{"key":"key-00000","n":100000,"pad":""}`)))
	headers := json.RawMessage(`{}`)
	missing := r.Name + "_missing" // never declared
	widths := make([]int, len(groups))
	most := 0
	for g := range groups {
		widths[g] = len(strconv.Itoa(groups[g].Keys - 1))
		most = max(most, groups[g].Rows)
	}
	i, g := 0, 0
	src := pgx.CopyFromFunc(func() ([]any, error) {
		for ; i < most; i, g = i+1, 0 {
			for ; g < len(groups); g++ {
				grp := groups[g]
				if i >= grp.Rows {
					continue
				}
				key := fmt.Sprintf("%s-%0*d", grp.Prefix, widths[g], i%grp.Keys)
				id, err := uuid.NewV7()
				if err != nil {
					return nil, fmt.Errorf("message id: %w", err)
				}
				exchange := r.Exchange
				if grp.Poison {
					out.held = append(out.held, id.String())
					if i < grp.Keys {
						exchange = missing
					}
				} else {
					out.Timed = append(out.Timed, id.String())
				}
				g++
				body := fmt.Appendf(nil, `{"key":%q,"n":%d,"pad":%q}`, key, i, pad)
				return []any{id, int32(partition.Of(key, r.Config.Partitions)), key, exchange, "bench.event",
					"ordo.bench.event.v1", json.RawMessage(body), headers}, nil
			}
		}
		return nil, nil
	})
	rows, _, _ := PlanSize(groups)
	cctx, cancel := context.WithTimeout(ctx, r.Config.Timeout)
	defer cancel()
	b0, err := measure.ListBackends(cctx, r.Probe, r.Name)
	if err != nil {
		return nil, err
	}
	tx, err := r.Pool.Begin(cctx)
	if err != nil {
		return nil, fmt.Errorf("load rows: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }() // no-op after Commit
	n, err := tx.CopyFrom(cctx, pgx.Identifier{"outbox"}, drainColumns, src)
	if err != nil {
		return nil, fmt.Errorf("copy %d rows into the outbox: %w", rows, err)
	}
	if int(n) != rows {
		return nil, fmt.Errorf("copy into the outbox: %d rows copied, want %d", n, rows)
	}
	for _, g := range groups {
		if g.Poison && g.Parked {
			// The poison rows (the first of each key) were parked by a
			// relay already: -max-attempts failed attempts, parked_at.
			if _, err := tx.Exec(cctx, `UPDATE outbox SET attempts = 1, parked_at = now(), last_error = 'loaded parked' WHERE exchange = $1`, missing); err != nil {
				return nil, fmt.Errorf("park the poison rows: %w", err)
			}
			if g.Held {
				// Their followers, held behind them as a node's read
				// holds them (docs/outbox-table.md, "Rows held behind
				// a parked row").
				if _, err := tx.Exec(cctx, `UPDATE outbox AS f SET held_behind = p.key_seq
					FROM outbox AS p
					WHERE p.exchange = $1 AND p.parked_at IS NOT NULL AND f.correlation_id = p.correlation_id AND f.key_seq > p.key_seq`, missing); err != nil {
					return nil, fmt.Errorf("hold the poison rows' followers (-parked-held needs outbox migration 15): %w", err)
				}
			}
			break
		}
	}
	b1, err := measure.ListBackends(cctx, r.Probe, r.Name)
	if err != nil {
		return nil, err
	}
	if analyze {
		if _, err := tx.Exec(cctx, `ANALYZE outbox`); err != nil {
			return nil, fmt.Errorf("analyze outbox: %w", err)
		}
	}
	b2, err := measure.ListBackends(cctx, r.Probe, r.Name)
	if err != nil {
		return nil, err
	}
	if err := tx.Commit(cctx); err != nil {
		return nil, fmt.Errorf("load rows: commit: %w", err)
	}
	out.committed = time.Now()
	b3, err := measure.ListBackends(cctx, r.Probe, r.Name)
	if err != nil {
		return nil, err
	}
	out.insertCPU = measure.GroupDelta(b0, b1)[measure.GroupBench] + measure.GroupDelta(b2, b3)[measure.GroupBench]
	return out, nil
}

// loadVacuumed, with plan.vacuum, loads the plan's parked groups (poison
// rows loaded parked, and their followers) in a transaction of their own,
// waits until the relays have held the followers (or finds them loaded
// held), VACUUMs the outbox, and returns the groups still to load and the ids of
// the rows it loaded: the timed rows then arrive beside parked keys that
// have stood for a while, which autovacuum has seen. Without plan.vacuum
// it loads nothing.
func loadVacuumed(ctx context.Context, r *harness.Rig, plan Plan) (rest []RowGroup, ids []string, err error) {
	if !plan.Vacuum {
		return plan.Groups, nil, nil
	}
	var early []RowGroup
	for _, g := range plan.Groups {
		if g.Poison && g.Parked {
			early = append(early, g)
		} else {
			rest = append(rest, g)
		}
	}
	if len(early) > 0 {
		load, err := LoadGroups(ctx, r, early, plan.Payload, false)
		if err != nil {
			return nil, nil, err
		}
		ids = load.held
		// Without -parked-held the relays hold the followers at their
		// first read: wait for it, so that VACUUM comes after the holds.
		deadline := time.Now().Add(r.Config.Timeout)
		for {
			var ready bool
			if err := r.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM outbox
				WHERE processed_at IS NULL AND parked_at IS NULL AND held_behind IS NULL)`).Scan(&ready); err != nil {
				return nil, nil, fmt.Errorf("wait for the parked keys' holds: %w", err)
			}
			if !ready {
				break
			}
			if time.Now().After(deadline) {
				return nil, nil, fmt.Errorf("the parked keys' followers not held after %v", r.Config.Timeout)
			}
			select {
			case <-ctx.Done():
				return nil, nil, ctx.Err()
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	if _, err := r.Pool.Exec(ctx, `VACUUM outbox`); err != nil {
		return nil, nil, fmt.Errorf("vacuum the outbox: %w", err)
	}
	return rest, ids, nil
}
