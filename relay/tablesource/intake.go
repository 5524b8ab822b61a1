package tablesource

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ordo-relay/ordo/internal/backoff"
)

// The intake's defaults (docs/adopt.md, "Intake: who reads the user's
// table").
const (
	// DefaultIntakePage is how many rows one read of the user's table
	// returns.
	DefaultIntakePage = 500
	// DefaultLookBack is how far behind the last row read a fast pass
	// starts reading.
	DefaultLookBack = time.Second
	// DefaultSweepEvery is how often the sweep reads every pending row
	// from the start.
	DefaultSweepEvery = 10 * time.Second
	// DefaultPollMin and DefaultPollMax bound the wait between two fast
	// passes: the least while rows keep arriving, doubling up to the most
	// while none do.
	DefaultPollMin = 10 * time.Millisecond
	DefaultPollMax = 200 * time.Millisecond
	// DefaultProbeEvery is how often an intake waiting longer than that
	// for its next fast pass asks whether a row newer than the last it
	// read is pending (Intake.newer), and passes at once if one is.
	DefaultProbeEvery = 25 * time.Millisecond
	// NoProbe, as Intake.ProbeEvery, turns the probe off.
	NoProbe time.Duration = -1
	// holderCheckEvery is how often Run checks that the node still holds
	// partition 0. Two intakes at once lose or duplicate nothing, so a
	// node that lost the lease may go on taking rows in for up to this
	// long, and the passes between two checks save a round trip each.
	holderCheckEvery = time.Second
)

// Intake takes the user's pending rows into ordo_table_rows, numbered
// (each key's rows in the order it reads them), where the partition
// owners publish them. The node that holds
// partition 0 runs it (Run); taking a row in twice changes nothing, so
// two intakes at once (a lease in hand-off) lose or duplicate nothing.
type Intake struct {
	reader  *Reader
	pool    *pgxpool.Pool
	node    string
	logger  *slog.Logger
	sql     string
	newest  string // newestSQL: the idle intake's probe
	channel string // NotifyChannel: each page taken in notifies its partitions

	// Page, LookBack, SweepEvery, PollMin, PollMax and ProbeEvery: zero
	// means the default above; ProbeEvery NoProbe (negative) probes
	// nothing.
	Page       int
	LookBack   time.Duration
	SweepEvery time.Duration
	PollMin    time.Duration
	PollMax    time.Duration
	ProbeEvery time.Duration

	pos           *Position               // the last row a pass read, for the next fast pass
	paged         bool                    // the last pass read more than a page: the next reads page by page at once
	taken         map[uuid.UUID]time.Time // rows this intake took in (or found processed), by occurred-at: fast passes skip them
	late          atomic.Int64            // rows numbered after a later row of their key
	afterPage     func()                  // tests: runs after each page is taken in
	onTake        func(n int)             // tests: runs before each take of n rows
	onProbe       func(newer bool)        // tests: runs after each probe that did not fail
	onHolderCheck func(held bool)         // tests: runs after each check of partition 0's lease that did not fail
}

// NewIntake returns the intake of node over the table r reads, on pool.
func NewIntake(pool *pgxpool.Pool, node string, r *Reader, logger *slog.Logger) *Intake {
	if logger == nil {
		logger = slog.Default()
	}
	return &Intake{reader: r, pool: pool, node: node, logger: logger, sql: intakeSQL(r.layout), newest: newestSQL(r.layout),
		channel: NotifyChannel(r.layout)}
}

func orDefault[T int | time.Duration](v, d T) T {
	if v > 0 {
		return v
	}
	return d
}

// Pass reads the user's pending rows and takes them in, page by page,
// and returns how many it took in (rows taken in before are skipped).
// A sweep reads from the oldest pending row; a fast pass from LookBack
// before the last row read. Every page of a pass is read in one snapshot,
// each taken in as it is read: a pass that fits a page is one statement
// and one round trip (Reader.onePage); one that does not is read again
// page by page in a REPEATABLE READ transaction (Reader.pages), and so
// are the passes after it until one fits a page again. A fast pass
// misses a row that commits later behind where it starts: only the sweep
// guarantees every row.
//
// A fast pass sends on only the rows this intake has not taken in
// itself: the look-back returns again every row taken in and not yet
// marked, and taking those in again is a transaction that changes
// nothing (at 1,500 rows a second, most of the intake's PostgreSQL time).
// The rows are remembered until they fall two look-backs behind the
// position; a sweep sends every row it reads, remembered or not.
//
// The look-back is read on every fast pass, not once in a while: it is
// what keeps a key's rows in order when producers of other keys commit
// out of their occurred-at order. A producer's row a1 commits, then it
// writes a2 of the same key; meanwhile another producer's row with a
// later occurred-at than a1 committed first and moved the position past
// a1. A pass reading only after the position takes a2 in without a1,
// a2 is numbered first and a1 becomes a late row
// (TestAdoptedTableRelayed saw it with four producers). The pass that
// sees a2 began after a2 committed, so after a1 did: reading from
// LookBack behind the position it takes a1 in too, before a2.
func (in *Intake) Pass(ctx context.Context, sweep bool) (int, error) {
	page := orDefault(in.Page, DefaultIntakePage)
	var after *Position
	if !sweep && in.pos != nil {
		after = &Position{OccurredAt: in.pos.OccurredAt.Add(-orDefault(in.LookBack, DefaultLookBack)), ID: uuid.Nil}
	}
	taken, pages := 0, 0
	handle := func(rows []Row) error {
		pages++
		send := rows
		if !sweep {
			send = in.unknown(rows)
		}
		if len(send) > 0 {
			n, err := in.take(ctx, send)
			taken += n
			if err != nil {
				return err
			}
			in.remember(send)
		}
		last := rows[len(rows)-1].Position()
		if in.pos == nil || in.pos.OccurredAt.Before(last.OccurredAt) ||
			in.pos.OccurredAt.Equal(last.OccurredAt) && bytes.Compare(in.pos.ID[:], last.ID[:]) < 0 {
			in.pos = &last
		}
		if in.afterPage != nil {
			in.afterPage()
		}
		return nil
	}
	if !in.paged {
		rows, whole, err := in.reader.onePage(ctx, in.pool, after, page)
		if err != nil {
			return 0, fmt.Errorf("intake: %w", err)
		}
		if whole {
			if len(rows) > 0 {
				if err := handle(rows); err != nil {
					return taken, fmt.Errorf("intake: %w", err)
				}
			}
			in.forgetBehind()
			return taken, nil
		}
		// More than a page: the pass is read again, page by page in
		// one snapshot, and so are the next ones until one fits a page.
	}
	if err := in.reader.pages(ctx, in.pool, after, page, nil, handle); err != nil {
		return taken, fmt.Errorf("intake: %w", err)
	}
	in.paged = pages > 1
	in.forgetBehind()
	return taken, nil
}

// unknown returns the rows of a page that this intake has not taken in.
func (in *Intake) unknown(rows []Row) []Row {
	return slices.DeleteFunc(slices.Clone(rows), func(r Row) bool {
		_, ok := in.taken[r.ID]
		return ok
	})
}

// remember records rows as taken in: their page committed, so each is in
// ordo_table_rows or was processed.
func (in *Intake) remember(rows []Row) {
	if in.taken == nil {
		in.taken = make(map[uuid.UUID]time.Time, len(rows))
	}
	for _, r := range rows {
		in.taken[r.ID] = r.OccurredAt
	}
}

// forgetBehind drops the rows remembered that no fast pass reads again:
// those two look-backs or more behind the position.
func (in *Intake) forgetBehind() {
	if in.pos == nil {
		return
	}
	edge := in.pos.OccurredAt.Add(-2 * orDefault(in.LookBack, DefaultLookBack))
	for id, at := range in.taken {
		if at.Before(edge) {
			delete(in.taken, id)
		}
	}
}

// take inserts rows into ordo_table_rows, numbered, in one statement,
// sent with the planner settings it is written for (sqlIntakePlan) in
// one pipeline: one round trip, one implicit transaction.
func (in *Intake) take(ctx context.Context, rows []Row) (int, error) {
	if in.onTake != nil {
		in.onTake(len(rows))
	}
	var n, late, notified int64
	b := &pgx.Batch{}
	b.Queue(sqlIntakePlan)
	b.Queue(in.sql, in.takeArgs(rows)...).QueryRow(func(row pgx.Row) error {
		err := row.Scan(&n, &late, &notified)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil // every row of the page was taken in before, or processed
		}
		return err
	})
	if err := in.pool.SendBatch(ctx, b).Close(); err != nil {
		return 0, fmt.Errorf("take in %d row(s): %w", len(rows), err)
	}
	if late > 0 {
		in.late.Add(late)
		in.logger.Warn("rows numbered after a later row of their key (committed late, or a producer's clock behind)",
			"rows", late)
	}
	return int(n), nil
}

// LateRows returns how many rows this Intake numbered after a row of
// their key with a later occurred-at (docs/adopt.md, "Late rows").
func (in *Intake) LateRows() int64 { return in.late.Load() }

// takeArgs are the intake statement's arguments for rows.
//
// The intake's statements are prepared once per connection (a pipeline
// runs in the pool's default query mode, pgx's statement cache, which is
// planCached), not planned at every page as the Store's writes are:
// confined by sqlIntakePlan (without statistics PostgreSQL otherwise hashes every
// pending row of the user's table to join a page to it), the statement
// has one plan whatever its parameters, and PostgreSQL's generic plan is
// that plan (TestStorePlansWithoutStatistics). Planned afresh, it cost
// 0.3-0.8 ms a page, a page every 10 ms while rows arrive.
func (in *Intake) takeArgs(rows []Row) []any {
	ids := make([][16]byte, len(rows))
	parts := make([]int32, len(rows))
	keys := make([]string, len(rows))
	ats := make([]time.Time, len(rows))
	problems := make([]*string, len(rows))
	for i, r := range rows {
		ids[i], parts[i], keys[i], ats[i] = r.ID, int32(r.Partition), r.Key, r.OccurredAt
		if r.Problem != nil {
			p := r.Problem.Error()
			problems[i] = &p
		}
	}
	return []any{ids, parts, keys, ats, problems, in.channel, notifyPayloads(rows)}
}

// holder reports whether the node holds partition 0, whose holder runs
// the intake.
func (in *Intake) holder(ctx context.Context) (bool, error) {
	var ok bool
	err := in.pool.QueryRow(ctx, sqlIntakeHolder, planCached, in.node).Scan(&ok)
	return ok, err
}

// newer reports whether a row newer than the last a pass read is
// pending: the newest pending row's occurred-at after it (newestSQL),
// one prepared statement. A row committed late with an occurred-at behind
// the last read is not seen so; the next fast pass or sweep takes it in.
func (in *Intake) newer(ctx context.Context) (bool, error) {
	var after time.Time // nothing read yet: from the start (0001-01-01)
	if in.pos != nil {
		after = in.pos.OccurredAt
	}
	var newest *time.Time
	if err := in.pool.QueryRow(ctx, in.newest, planCached, after).Scan(&newest); err != nil {
		return false, fmt.Errorf("intake: probe: %w", err)
	}
	newer := newest != nil
	if in.onProbe != nil {
		in.onProbe(newer)
	}
	return newer, nil
}

// idle waits up to wait for the next fast pass, asking every probeEvery
// whether a newer row is pending, and returns at once when one is (or a
// probe failed: the pass says why). It returns false when ctx ended.
// While rows keep arriving the wait is PollMin and nothing is probed; a
// quiet table costs a probe every probeEvery (docs/adopt.md, "Intake").
func (in *Intake) idle(ctx context.Context, wait, probeEvery time.Duration) bool {
	if probeEvery < 0 {
		return backoff.Sleep(ctx, wait)
	}
	end := time.Now().Add(wait)
	for {
		left := time.Until(end)
		if left <= probeEvery {
			return backoff.Sleep(ctx, left)
		}
		if !backoff.Sleep(ctx, probeEvery) {
			return false
		}
		if newer, err := in.newer(ctx); err != nil || newer {
			return ctx.Err() == nil
		}
	}
}

// Run takes rows in until ctx ends, while the node holds partition 0
// (checked at most every holderCheckEvery; while it does not, after
// PollMin, doubling to PollMax): a
// fast pass after every wait (PollMin while rows keep arriving, doubling
// to PollMax while none do, and at once when a probe every ProbeEvery
// finds a newer row pending), a sweep every SweepEvery. A failed pass is
// logged and tried again after a back-off.
func (in *Intake) Run(ctx context.Context) error {
	pollMin, pollMax := orDefault(in.PollMin, DefaultPollMin), orDefault(in.PollMax, DefaultPollMax)
	sweepEvery := orDefault(in.SweepEvery, DefaultSweepEvery)
	probeEvery := in.ProbeEvery
	if probeEvery == 0 {
		probeEvery = DefaultProbeEvery
	}
	bo := backoff.New(pollMin, sweepEvery)
	gap := pollMin
	var lastSweep, heldAt time.Time // heldAt: when a check last found partition 0 held
	for {
		holding := false
		err := func() error {
			if time.Since(heldAt) >= holderCheckEvery {
				ok, err := in.holder(ctx)
				if in.onHolderCheck != nil && err == nil {
					in.onHolderCheck(ok)
				}
				if err != nil || !ok {
					in.pos, in.taken, in.paged, lastSweep, heldAt = nil, nil, false, time.Time{}, time.Time{} // a new holder sweeps first
					// Checked again soon, then less and less often: a
					// node that has just started claims its leases
					// within a few tens of milliseconds, and its first
					// rows would otherwise wait PollMax.
					gap = min(gap*2, pollMax)
					return err
				}
				heldAt = time.Now()
			}
			holding = true
			sweep := time.Since(lastSweep) >= sweepEvery
			n, err := in.Pass(ctx, sweep)
			if err != nil {
				return err
			}
			if sweep {
				lastSweep = time.Now()
			}
			if n > 0 {
				gap = pollMin
			} else {
				gap = min(gap*2, pollMax)
			}
			return nil
		}()
		wait := gap
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if !errors.Is(err, context.DeadlineExceeded) {
				in.logger.Warn("intake of the adopted table failed; retrying", "err", err)
			}
			wait = bo.Next()
		} else {
			bo.Reset()
		}
		if holding && err == nil {
			if !in.idle(ctx, wait, probeEvery) {
				return nil
			}
		} else if !backoff.Sleep(ctx, wait) {
			return nil
		}
	}
}
