package relay

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ordo-relay/ordo/internal/outage"
)

// planFresh is the query mode of every relay statement: pgx describes the
// statement once and caches only its description; each execution parses an
// unnamed statement that PostgreSQL plans for the parameters and the table
// as they are now. A named prepared statement (pgx's default) switches to a
// cached generic plan after five executions, and that plan is never
// revisited as the table grows: made while the outbox was empty after an
// idle start, the key-head read's plan walked every pending row once per
// candidate row, 2.3-3.7 s a read on a 40,000-row burst, and the relay
// stalled. Planning afresh costs about a tenth of a millisecond per
// statement, and each statement handles a batch.
const planFresh = pgx.QueryExecModeCacheDescribe

// PGStore is the PostgreSQL Store.
type PGStore struct {
	pool   *pgxpool.Pool
	logger *slog.Logger
}

var _ Store = (*PGStore)(nil)

// NewPGStore returns a Store on pool. Listen uses a connection of its own
// from the pool's configuration, outside the pool.
func NewPGStore(pool *pgxpool.Pool, logger *slog.Logger) *PGStore {
	if logger == nil {
		logger = slog.Default()
	}
	return &PGStore{pool: pool, logger: logger}
}

// ReadHeads implements Store.
func (s *PGStore) ReadHeads(ctx context.Context, partitions []int32, exclude []uuid.UUID, perKey, limit int) ([]Row, error) {
	rows, err := s.pool.Query(ctx, sqlReadHeads, planFresh, partitions, rawUUIDs(exclude), perKey, limit)
	if err != nil {
		return nil, fmt.Errorf("read key heads: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Row, error) {
		var x Row
		err := r.Scan(&x.ID, &x.Partition, &x.CorrelationID, &x.KeySeq, &x.Exchange, &x.RoutingKey,
			&x.Type, &x.Payload, &x.Headers, &x.OccurredAt, &x.Attempts, &x.PrevDead)
		x.PrevKeySeq = x.KeySeq - 1
		return x, err
	})
	if err != nil {
		return nil, fmt.Errorf("read key heads: %w", err)
	}
	return out, nil
}

func settledArrays(rows []Settled) ([]uuid.UUID, []int32, []int64, []string, []float64) {
	ids := make([]uuid.UUID, len(rows))
	parts := make([]int32, len(rows))
	epochs := make([]int64, len(rows))
	errs := make([]string, len(rows))
	delays := make([]float64, len(rows))
	for i, r := range rows {
		ids[i], parts[i], epochs[i], errs[i], delays[i] = r.ID, int32(r.Partition), r.Epoch, r.Err, r.Delay.Seconds()
	}
	return ids, parts, epochs, errs, delays
}

// rawUUIDs converts ids to [16]byte values, which pgx encodes in binary
// directly; for uuid.UUID it first tries and fails other encodings, which
// cost about a quarter of the node's CPU in a drain. Never nil: a NULL
// array would exclude every row.
func rawUUIDs(ids []uuid.UUID) [][16]byte {
	out := make([][16]byte, len(ids))
	for i, id := range ids {
		out[i] = id
	}
	return out
}

// MarkPublished implements Store.
func (s *PGStore) MarkPublished(ctx context.Context, node string, rows []Settled) ([]uuid.UUID, error) {
	ids, parts, epochs, _, _ := settledArrays(rows)
	r, err := s.pool.Query(ctx, sqlMarkPublished, planFresh, node, rawUUIDs(ids), parts, epochs)
	if err != nil {
		return nil, fmt.Errorf("mark %d row(s) published: %w", len(rows), err)
	}
	marked, err := pgx.CollectRows(r, pgx.RowTo[uuid.UUID])
	if err != nil {
		return nil, fmt.Errorf("mark %d row(s) published: %w", len(rows), err)
	}
	return marked, nil
}

// RecordFailures implements Store.
func (s *PGStore) RecordFailures(ctx context.Context, node string, rows []Settled, maxAttempts int) ([]uuid.UUID, error) {
	ids, parts, epochs, errs, delays := settledArrays(rows)
	r, err := s.pool.Query(ctx, sqlRecordFailures, planFresh, node, rawUUIDs(ids), parts, epochs, errs, delays, maxAttempts)
	if err != nil {
		return nil, fmt.Errorf("record %d failure(s): %w", len(rows), err)
	}
	parked, err := pgx.CollectRows(r, pgx.RowTo[uuid.UUID])
	if err != nil {
		return nil, fmt.Errorf("record %d failure(s): %w", len(rows), err)
	}
	return parked, nil
}

// PrevKeySeq implements Store.
func (s *PGStore) PrevKeySeq(ctx context.Context, key string, keySeq int64) (int64, error) {
	var prev int64
	if err := s.pool.QueryRow(ctx, sqlPrevKeySeq, planFresh, key, keySeq).Scan(&prev); err != nil {
		return 0, fmt.Errorf("previous key_seq of %q/%d: %w", key, keySeq, err)
	}
	return prev, nil
}

// DeleteProcessed implements Store.
func (s *PGStore) DeleteProcessed(ctx context.Context, node string, partition int, epoch int64, olderThan time.Duration, limit int) (int64, error) {
	tag, err := s.pool.Exec(ctx, sqlRetention, planFresh, node, partition, limit, olderThan.Seconds(), epoch)
	if err != nil {
		return 0, fmt.Errorf("delete processed rows of partition %d: %w", partition, err)
	}
	return tag.RowsAffected(), nil
}

// Listen implements Store.
func (s *PGStore) Listen(ctx context.Context, wake func(partition int)) error {
	down := outage.New(s.logger, "PostgreSQL listener")
	backoff := newBackoff(100*time.Millisecond, 2*time.Second)
	for {
		listened, err := s.listenOnce(ctx, wake, down)
		if ctx.Err() != nil {
			return nil
		}
		if listened {
			backoff.reset() // it worked: the next outage starts the backoff over
		}
		down.Fail(err)
		if !sleepCtx(ctx, backoff.next()) {
			return nil
		}
	}
}

func (s *PGStore) listenOnce(ctx context.Context, wake func(int), down *outage.Log) (listened bool, err error) {
	cfg := s.pool.Config().ConnConfig.Copy()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	conn, err := pgx.ConnectConfig(cctx, cfg)
	cancel()
	if err != nil {
		return false, fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "LISTEN "+NotifyChannel); err != nil {
		return false, fmt.Errorf("listen: %w", err)
	}
	down.OK()
	wake(-1) // poll once: notifications sent while we were not listening are gone
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return true, fmt.Errorf("wait for notification: %w", err)
		}
		p, err := strconv.Atoi(n.Payload)
		if err != nil {
			p = -1 // not ours to interpret: read anyway
		}
		wake(p)
	}
}

// PartitionStatus is one partition's lease and backlog, for /status.
type PartitionStatus struct {
	Partition int        `json:"partition"`
	Owner     string     `json:"owner"`
	Epoch     int64      `json:"epoch"`
	Expires   *time.Time `json:"leaseExpires,omitempty"` // nil when free
	Pending   int64      `json:"pending"`
	// OldestPendingSeconds is the age of the oldest pending row; 0 when
	// nothing is pending.
	OldestPendingSeconds float64 `json:"oldestPendingSeconds"`
}

// Status returns every partition's lease and backlog.
func (s *PGStore) Status(ctx context.Context) ([]PartitionStatus, error) {
	rows, err := s.pool.Query(ctx, sqlPartitionStatus)
	if err != nil {
		return nil, fmt.Errorf("partition status: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (PartitionStatus, error) {
		var x PartitionStatus
		var age *float64
		err := r.Scan(&x.Partition, &x.Owner, &x.Epoch, &x.Expires, &x.Pending, &age)
		if age != nil {
			x.OldestPendingSeconds = *age
		}
		return x, err
	})
	if err != nil {
		return nil, fmt.Errorf("partition status: %w", err)
	}
	return out, nil
}
