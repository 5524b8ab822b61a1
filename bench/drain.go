package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/ordo-relay/ordo/partition"
)

// runDrain measures how fast Ordo drains a backlog, once for each count in
// -nodes (default 1): see drainOnce.
func runDrain(ctx context.Context, o options, emit func(*Result)) error {
	for _, n := range o.Nodes {
		res, err := drainOnce(ctx, o, ordo(n))
		if err != nil {
			return fmt.Errorf("%d node(s): %w", n, err)
		}
		emit(res)
	}
	return nil
}

// runClassic drains the same backlog with the classic relay, once for
// each count in -instances (default 1,2).
func runClassic(ctx context.Context, o options, emit func(*Result)) error {
	for _, n := range o.Instances {
		res, err := drainOnce(ctx, o, classic(n))
		if err != nil {
			return fmt.Errorf("%d instance(s): %w", n, err)
		}
		emit(res)
	}
	return nil
}

// drainOnce measures how fast the relays of spec drain a backlog. They
// start on an empty outbox and are waited for until ready (Ordo: the
// nodes agree on the map and hold every lease). Then -rows pending rows
// (default 100000) over -keys keys (default 10000), spread round-robin so
// every key has rows/keys messages, are committed in one transaction
// (COPY, then ANALYZE). The clock starts when that COMMIT returns and
// stops when the consumer has every row; the database must then show no
// pending row.
func drainOnce(ctx context.Context, o options, spec systemSpec) (*Result, error) {
	keys := o.keysOr(10000)
	scenario := "drain"
	if spec.classic {
		scenario = "classic"
	}
	r, err := newRig(ctx, o, scenario, 4)
	if err != nil {
		return nil, err
	}
	defer r.close()
	res := newResult(scenario)
	res.Label = spec.String()
	spec.addParams(res)
	res.Param("msgs", o.Rows)
	res.Param("keys", keys)
	res.Param("partitions", o.Partitions)
	if spec.classic {
		res.Param("batch", o.ClassicBatch)
		res.Param("interval", o.ClassicEvery)
	} else {
		res.Param("confirm_window", o.ConfirmWindow)
	}
	res.Param("payload_bytes", o.Payload)
	res.Param("analyze", o.Analyze)

	c, err := r.startConsumer(ctx)
	if err != nil {
		return nil, err
	}
	startAt := time.Now()
	sys, err := spec.start(ctx, r)
	if err != nil {
		return nil, err
	}
	ready := time.Since(startAt)
	fmt.Printf("%s ready in %v\n", spec, ready.Round(time.Millisecond))

	loadStart := time.Now()
	ids, committed, err := loadRows(ctx, r, o.Rows, keys, o.Payload, o.Analyze)
	if err != nil {
		return nil, err
	}
	load := committed.Sub(loadStart)
	fmt.Printf("committed %d rows in %v\n", len(ids), load.Round(time.Millisecond))
	cpu0 := sampleCPU()
	relayCPU0, err := usageNow(sys)
	if err != nil {
		return nil, err
	}
	act := startActivity(r.pool, r.name)
	err = c.waitDistinct(ctx, len(ids), o.Timeout, sys.failed)
	activity := act.stop()
	if err != nil {
		return nil, err
	}
	_, first, last := c.distinct()
	fmt.Printf("all %d delivered %v after the commit\n", len(ids), last.Sub(committed).Round(time.Millisecond))
	markedAt, err := r.waitPending(ctx, sys.failed)
	if err != nil {
		return nil, err
	}
	cpu1 := sampleCPU()
	if err := addUsage(res, sys, relayCPU0, len(ids)); err != nil {
		return nil, err
	}
	if err := sys.stop(); err != nil {
		return nil, err
	}
	if cs, ok := sys.(*classicSystem); ok {
		cs.addTo(res)
	}

	drain := last.Sub(committed)
	res.Seconds("ready_seconds", ready)
	res.Seconds("load_seconds", load)
	res.Figure("load_rows_per_sec", float64(len(ids))/load.Seconds(), "rows/s")
	res.Seconds("first_delivery_seconds", first.Sub(committed))
	res.Seconds("seconds", drain)
	res.Figure("msgs_per_sec", float64(len(ids))/last.Sub(first).Seconds(), "msg/s")
	res.Figure("msgs_per_sec_from_commit", float64(len(ids))/drain.Seconds(), "msg/s")
	res.Seconds("all_marked_seconds", markedAt.Sub(committed))
	addCPU(res, cpu0, cpu1, "")
	activity.addTo(res)
	res.Check = c.report(ids)
	res.Finished = time.Now()
	return res, nil
}

// drainColumns are the outbox columns a producer supplies; the database
// assigns seq, key_seq and occurred_at (its BEFORE INSERT trigger fires
// for COPY too).
var drainColumns = []string{"id", "partition", "correlation_id", "exchange", "routing_key", "type", "payload", "headers"}

// loadRows inserts rows pending messages with one COPY in a transaction of
// its own, row i for key i mod keys, runs ANALYZE outbox in the same
// transaction when analyze is set (it sees the transaction's own rows), and
// commits. It returns the ids in insertion order and when COMMIT returned:
// the relays see the rows from then on, all at once.
func loadRows(ctx context.Context, r *rig, rows, keys, payload int, analyze bool) ([]string, time.Time, error) {
	ids := make([]string, 0, rows)
	// Payload: {"key":"key-00042","n":123,"pad":"xxx..."} of about payload bytes.
	pad := strings.Repeat("x", max(0, payload-len(`{"key":"key-00000","n":100000,"pad":""}`)))
	headers := json.RawMessage(`{}`)
	width := len(strconv.Itoa(keys - 1))
	i := 0
	src := pgx.CopyFromFunc(func() ([]any, error) {
		if i == rows {
			return nil, nil
		}
		key := fmt.Sprintf("key-%0*d", width, i%keys)
		id, err := uuid.NewV7()
		if err != nil {
			return nil, fmt.Errorf("message id: %w", err)
		}
		body := fmt.Appendf(nil, `{"key":%q,"n":%d,"pad":%q}`, key, i, pad)
		ids = append(ids, id.String())
		i++
		return []any{id, int32(partition.Of(key, r.o.Partitions)), key, r.exchange, "bench.event",
			"ordo.bench.event.v1", json.RawMessage(body), headers}, nil
	})
	cctx, cancel := context.WithTimeout(ctx, r.o.Timeout)
	defer cancel()
	tx, err := r.pool.Begin(cctx)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("load rows: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }() // no-op after Commit
	n, err := tx.CopyFrom(cctx, pgx.Identifier{"outbox"}, drainColumns, src)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("copy %d rows into the outbox: %w", rows, err)
	}
	if int(n) != rows {
		return nil, time.Time{}, fmt.Errorf("copy into the outbox: %d rows copied, want %d", n, rows)
	}
	if analyze {
		if _, err := tx.Exec(cctx, `ANALYZE outbox`); err != nil {
			return nil, time.Time{}, fmt.Errorf("analyze outbox: %w", err)
		}
	}
	if err := tx.Commit(cctx); err != nil {
		return nil, time.Time{}, fmt.Errorf("load rows: commit: %w", err)
	}
	return ids, time.Now(), nil
}
