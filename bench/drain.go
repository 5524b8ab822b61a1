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

// runDrain measures how fast one node drains a backlog: -rows pending rows
// (default 100000) over -keys keys (default 10000), spread round-robin so
// every key has rows/keys messages, are loaded with COPY before the node
// starts. The clock starts when the node is started and stops when the
// consumer has every row; the database must then show no pending row.
func runDrain(ctx context.Context, o options) (*Result, error) {
	keys := o.keysOr(10000)
	r, err := newRig(ctx, o, "drain", 4)
	if err != nil {
		return nil, err
	}
	defer r.close()
	res := newResult("drain")
	res.Param("nodes", 1)
	res.Param("msgs", o.Rows)
	res.Param("keys", keys)
	res.Param("partitions", o.Partitions)
	res.Param("confirm_window", o.ConfirmWindow)
	res.Param("payload_bytes", o.Payload)
	res.Param("analyze", o.Analyze)

	c, err := r.startConsumer(ctx)
	if err != nil {
		return nil, err
	}
	loadStart := time.Now()
	ids, err := loadRows(ctx, r, o.Rows, keys, o.Payload)
	if err != nil {
		return nil, err
	}
	load := time.Since(loadStart)
	fmt.Printf("loaded %d rows in %v\n", len(ids), load.Round(time.Millisecond))
	if o.Analyze {
		if _, err := r.pool.Exec(ctx, `ANALYZE outbox`); err != nil {
			return nil, fmt.Errorf("analyze outbox: %w", err)
		}
	}

	cpu0 := sampleCPU()
	n, err := r.startNode(ctx, o.AMQPURL)
	if err != nil {
		return nil, err
	}
	act := startActivity(r.pool, r.name)
	err = c.waitDistinct(ctx, len(ids), o.Timeout, n.failed)
	activity := act.stop()
	if err != nil {
		return nil, err
	}
	_, first, last := c.distinct()
	fmt.Printf("all %d delivered %v after the node started\n", len(ids), last.Sub(n.started).Round(time.Millisecond))
	markedAt, err := r.waitPending(ctx, n)
	if err != nil {
		return nil, err
	}
	cpu1 := sampleCPU()
	rss, err := n.peakRSSMiB()
	if err != nil {
		return nil, err
	}
	nodeCPU, err := n.cpu()
	if err != nil {
		return nil, err
	}
	stopTook, err := n.stop(nodeStopTimeout)
	if err != nil {
		return nil, err
	}

	drain := last.Sub(n.started)
	res.Seconds("load_seconds", load)
	res.Figure("load_rows_per_sec", float64(len(ids))/load.Seconds(), "rows/s")
	res.Seconds("first_delivery_seconds", first.Sub(n.started))
	res.Seconds("seconds", drain)
	res.Figure("msgs_per_sec", float64(len(ids))/last.Sub(first).Seconds(), "msg/s")
	res.Figure("msgs_per_sec_from_start", float64(len(ids))/drain.Seconds(), "msg/s")
	res.Seconds("all_marked_seconds", markedAt.Sub(n.started))
	res.Figure("node_rss_peak", rss, "MiB")
	res.Seconds("node_cpu", nodeCPU)
	res.Figure("node_cpu_per_1k_msgs", 1000*nodeCPU.Seconds()/float64(len(ids)), "s")
	addCPU(res, cpu0, cpu1, "")
	activity.addTo(res)
	res.Seconds("node_stop_seconds", stopTook)
	res.Check = c.report(ids)
	res.Finished = time.Now()
	return res, nil
}

// drainColumns are the outbox columns a producer supplies; the database
// assigns seq, key_seq and occurred_at (its BEFORE INSERT trigger fires
// for COPY too).
var drainColumns = []string{"id", "partition", "correlation_id", "exchange", "routing_key", "type", "payload", "headers"}

// loadRows inserts rows pending messages with one COPY, row i for key
// i mod keys, and returns their ids in insertion order.
func loadRows(ctx context.Context, r *rig, rows, keys, payload int) ([]string, error) {
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
	n, err := r.pool.CopyFrom(cctx, pgx.Identifier{"outbox"}, drainColumns, src)
	if err != nil {
		return nil, fmt.Errorf("copy %d rows into the outbox: %w", rows, err)
	}
	if int(n) != rows {
		return nil, fmt.Errorf("copy into the outbox: %d rows copied, want %d", n, rows)
	}
	return ids, nil
}
