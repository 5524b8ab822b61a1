package node

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

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

// sqlPartitionStatus is one row per partition: its lease and its backlog.
const sqlPartitionStatus = `
SELECT l.partition, coalesce(l.owner, ''), l.epoch, nullif(l.expires_at, '-infinity'),
       coalesce(p.pending, 0), extract(epoch FROM clock_timestamp() - p.oldest)::float8
FROM ordo_leases AS l
LEFT JOIN (
    SELECT partition, count(*) AS pending, min(occurred_at) AS oldest
    FROM outbox WHERE processed_at IS NULL GROUP BY partition
) AS p ON p.partition = l.partition
ORDER BY l.partition`

// partitionStatus returns every partition's lease and backlog.
func partitionStatus(ctx context.Context, pool *pgxpool.Pool) ([]PartitionStatus, error) {
	rows, err := pool.Query(ctx, sqlPartitionStatus)
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
