// Package pgwrite holds what the relay's two PostgreSQL stores write
// alike: relay/pgstore over Ordo's outbox and relay/tablesource over an
// adopted table. Each has its own SQL; the lease check every write makes
// (HeldCTE) and the calls that run a write over settled rows are shared.
package pgwrite

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/ordo-relay/ordo/relay"
)

// PlanFresh is the query mode of every relay statement: each execution
// is planned for its parameters and the tables as they are when it runs
// (relay/pgstore's planFresh says why).
const PlanFresh = pgx.QueryExecModeCacheDescribe

// PlanCached is the query mode of the statements whose every plan,
// generic or custom, with or without statistics, follows the work
// (relay/pgstore's read and mark, TestPlansFollowTheWork): prepared once
// per connection, so that PostgreSQL parses them once and may keep a
// generic plan after five executions instead of planning every one.
const PlanCached = pgx.QueryExecModeCacheStatement

// HeldCTE is the lease check shared by every relay write, two common
// table expressions for a WITH: m, the rows ($2 ids, $3 partitions, $4
// epochs), and held, the leases of node $1 at those epochs, locked FOR
// SHARE until the write commits, so no claim can slip between the check
// and the write. They are locked in partition order (the LockRows sits
// above the sort), as the leaser locks them to renew, release or claim:
// in any other order a write holding 3 and waiting for 7 and a renewal
// holding 7 and waiting for 3 deadlock (docs/design.md, "Lease row
// locks").
const HeldCTE = `
m AS (SELECT * FROM unnest($2::uuid[], $3::int[], $4::bigint[]) AS m(id, partition, epoch)),
held AS (
    SELECT l.partition, l.epoch FROM ordo_leases AS l
    WHERE l.owner = $1 AND (l.partition, l.epoch) IN (SELECT DISTINCT partition, epoch FROM m)
    ORDER BY l.partition
    FOR SHARE)`

// Querier runs a query; *pgxpool.Pool, *pgx.Conn and pgx.Tx satisfy it.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Mark runs sql, a mark of rows by node ($1 node, then HeldCTE's
// parameters), in query mode mode (PlanFresh, or PlanCached where every
// plan of sql follows the work), and returns the ids it returns: those it
// marked.
func Mark(ctx context.Context, q Querier, mode pgx.QueryExecMode, sql, node string, rows []relay.Settled) ([]uuid.UUID, error) {
	ids, parts, epochs, _, _ := relay.SettledColumns(rows)
	marked, err := collectIDs(q.Query(ctx, sql, mode, node, ids, parts, epochs))
	if err != nil {
		return nil, fmt.Errorf("mark %d row(s) published: %w", len(rows), err)
	}
	return marked, nil
}

// RecordFailures runs sql, a failure record of rows by node ($1 node,
// then HeldCTE's parameters, $5 errors, $6 delays in seconds, $7
// maxAttempts), and returns the ids it returns: those it parked.
func RecordFailures(ctx context.Context, q Querier, sql, node string, rows []relay.Settled, maxAttempts int) ([]uuid.UUID, error) {
	ids, parts, epochs, errs, delays := relay.SettledColumns(rows)
	parked, err := collectIDs(q.Query(ctx, sql, PlanFresh, node, ids, parts, epochs, errs, delays, maxAttempts))
	if err != nil {
		return nil, fmt.Errorf("record %d failure(s): %w", len(rows), err)
	}
	return parked, nil
}

// PrevKeySeq runs sql, the walk down from key_seq $2 - 1 of key $1 over
// its dead rows, and returns the key_seq it returns.
func PrevKeySeq(ctx context.Context, q Querier, sql, key string, keySeq int64) (int64, error) {
	var prev int64
	if err := q.QueryRow(ctx, sql, PlanFresh, key, keySeq).Scan(&prev); err != nil {
		return 0, fmt.Errorf("previous key_seq of %q/%d: %w", key, keySeq, err)
	}
	return prev, nil
}

func collectIDs(rows pgx.Rows, err error) ([]uuid.UUID, error) {
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
}

// Head is a parked row a read met rows behind: its key and partition.
type Head struct {
	Key       string
	Partition int
}

// Hold runs sql, a hold of the rows behind parked rows by node ($1 node,
// $2 partitions, $3 keys, $4 the parked rows' key_seqs, one of each per
// head), in a transaction of its own on conn planned under plan, and
// returns the ids it returns: those it held.
func Hold(ctx context.Context, conn *pgx.Conn, plan, sql, node string, heads map[Head]int64) (map[uuid.UUID]bool, error) {
	parts := make([]int32, 0, len(heads))
	keys := make([]string, 0, len(heads))
	seqs := make([]int64, 0, len(heads))
	for h, ks := range heads {
		parts, keys, seqs = append(parts, int32(h.Partition)), append(keys, h.Key), append(seqs, ks)
	}
	var held []uuid.UUID
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, plan, PlanFresh); err != nil {
			return err
		}
		var err error
		held, err = collectIDs(tx.Query(ctx, sql, PlanFresh, node, parts, keys, seqs))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("hold the rows behind %d parked row(s): %w", len(heads), err)
	}
	isHeld := make(map[uuid.UUID]bool, len(held))
	for _, id := range held {
		isHeld[id] = true
	}
	return isHeld, nil
}
