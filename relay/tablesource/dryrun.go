package tablesource

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// TxBeginner is the part of a pgx pool or connection DryRun needs.
type TxBeginner interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// BadRow is a row that would be parked, and why.
type BadRow struct {
	Row    Row
	Reason string
}

// Report is what a dry run found: what the relay would publish, and in
// which order, if it started now.
type Report struct {
	// At is the database's time of the snapshot the report describes.
	At time.Time
	// Pending counts the pending rows, Keys their distinct keys, and
	// KeysWithoutCorrelationID the rows keyed by their own id.
	Pending                  int
	Keys                     int
	KeysWithoutCorrelationID int
	// PerPartition counts the pending rows of each partition.
	PerPartition []int
	// OldestOccurredAt is the oldest pending row's time (zero when none
	// is pending), and OldestAge its age at At.
	OldestOccurredAt time.Time
	OldestAge        time.Duration
	// Bad lists the rows that would be parked, with their reason.
	Bad []BadRow
	// Samples holds, for the first sampleKeys keys met (oldest first),
	// the ids of their rows in publishing order.
	Samples map[string][]string
}

// DryRun reads every pending row of r's table, page rows at a time (as
// Pending does), in
// one read-only REPEATABLE READ transaction (one snapshot, so the figures
// agree with each other), and reports what a relay would publish. It
// takes no lock a producer or another relay waits on, and writes nothing:
// it may run beside the table's existing relay, whose rows in flight it
// counts as pending. sampleKeys bounds Report.Samples.
func (r *Reader) DryRun(ctx context.Context, db TxBeginner, page, sampleKeys int) (Report, error) {
	if page <= 0 {
		return Report{}, fmt.Errorf("dry run of %s: page %d is not positive", r.layout, page)
	}
	rep := Report{PerPartition: make([]int, r.partitions), Samples: map[string][]string{}}
	keys := map[string]bool{}
	err := r.pages(ctx, db, nil, page, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, `SELECT now()`).Scan(&rep.At)
	}, func(rows []Row) error {
		for _, row := range rows {
			rep.add(row, keys, sampleKeys)
		}
		return nil
	})
	if err != nil {
		return Report{}, fmt.Errorf("dry run of %s: %w", r.layout, err)
	}
	rep.Keys = len(keys)
	if rep.Pending > 0 {
		rep.OldestAge = rep.At.Sub(rep.OldestOccurredAt)
	}
	return rep, nil
}

// add counts one pending row into the report.
func (rep *Report) add(row Row, keys map[string]bool, sampleKeys int) {
	if rep.Pending == 0 {
		rep.OldestOccurredAt = row.OccurredAt
	}
	rep.Pending++
	rep.PerPartition[row.Partition]++
	if !row.HasCorrelationID {
		rep.KeysWithoutCorrelationID++
	}
	if row.Problem != nil {
		rep.Bad = append(rep.Bad, BadRow{Row: row, Reason: row.Problem.Error()})
	}
	if _, sampled := rep.Samples[row.Key]; sampled || (!keys[row.Key] && len(rep.Samples) < sampleKeys) {
		rep.Samples[row.Key] = append(rep.Samples[row.Key], row.ID.String())
	}
	keys[row.Key] = true
}
