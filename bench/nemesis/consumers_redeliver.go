package nemesis

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ordo-relay/ordo/bench/internal/harness"
)

const (
	// redeliverWindow is how many of the latest outbox rows (by seq) the
	// redeliver fault considers: a few seconds of the scenario's load.
	redeliverWindow = 300
	// redeliverSettled is how long ago a row must have been marked for the
	// redeliver fault to take it: long enough for the consumers to have
	// handled it, so that what comes again is a duplicate.
	redeliverSettled = time.Second
	// redeliverTimeout bounds the wait for the relay to mark the rows again.
	redeliverTimeout = time.Minute
	// metricDuplicates is the inbox's counter of dropped duplicates.
	metricDuplicates = "ordo_inbox_duplicates_total"
)

// sqlRedeliver undoes the marks of the rows of the latest $1 (by seq)
// that were marked more than $3 seconds ago, of the keys with no pending
// row (nothing in flight, so the republish keeps key order), the poison
// orders' ($2) and dead rows left out, and returns them. The relay's next
// pass reads them as pending and publishes them again: same message id,
// key_seq and x-ordo-prev-key-seq, a new x-ordo-attempt. It is what a lost
// mark does (a relay's database failing over to a replica that had not
// received the marks, or a backup restored): at least once, on the wire.
const sqlRedeliver = `
WITH pick AS (
    SELECT o.id FROM outbox AS o
    WHERE o.seq > (SELECT coalesce(max(seq), 0) FROM outbox) - $1
      AND o.processed_at < clock_timestamp() - make_interval(secs => $3)
      AND o.dead_at IS NULL AND NOT starts_with(o.correlation_id, $2)
      AND NOT EXISTS (SELECT 1 FROM outbox AS p WHERE p.correlation_id = o.correlation_id AND p.processed_at IS NULL)
)
UPDATE outbox AS o SET processed_at = NULL FROM pick WHERE o.id = pick.id
RETURNING o.id::text, o.correlation_id`

// sqlRemarked counts the rows of $1 marked again.
const sqlRemarked = `SELECT count(*) FROM outbox WHERE id = ANY($1::uuid[]) AND processed_at IS NOT NULL`

// redeliver undoes the marks of handled rows in q (see sqlRedeliver) and
// returns their ids and how many keys they belong to.
func redeliver(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, window int, settled time.Duration) (ids []string, keys int, err error) {
	rows, err := q.Query(ctx, sqlRedeliver, window, poisonPrefix, settled.Seconds())
	if err != nil {
		return nil, 0, fmt.Errorf("undo the marks of handled rows: %w", err)
	}
	seen := map[string]bool{}
	var id, key string
	_, err = pgx.ForEachRow(rows, []any{&id, &key}, func() error {
		ids = append(ids, id)
		seen[key] = true
		return nil
	})
	if err != nil {
		return nil, 0, fmt.Errorf("undo the marks of handled rows: %w", err)
	}
	return ids, len(seen), nil
}

// redeliverHandled is the redeliver fault: the relay republishes rows the
// consumers have already handled, and the step waits until it has marked
// them again. The instances must drop every one as a duplicate; the
// checker counts any handled again. It logs how many duplicates the
// running instances dropped meanwhile (their metric), which shows the
// copies reached them.
func (c *consumerRun) redeliverHandled(ctx context.Context) error {
	before := c.sh.duplicates(ctx)
	ids, keys, err := redeliver(ctx, c.r.Pool, redeliverWindow, redeliverSettled)
	if err != nil {
		return err
	}
	c.logf("  %d handled rows of %d keys pending again: the relay republishes them", len(ids), keys)
	start := time.Now()
	var marked int
	err = harness.WaitUntil(ctx, redeliverTimeout, 100*time.Millisecond, "the republished rows to be marked again", func() (bool, error) {
		if err := c.failed(); err != nil {
			return false, err
		}
		if err := c.r.Pool.QueryRow(ctx, sqlRemarked, ids).Scan(&marked); err != nil {
			return false, nil // the database restarting
		}
		return marked == len(ids), nil
	})
	if err != nil {
		return fmt.Errorf("%w (%d of %d marked)", err, marked, len(ids))
	}
	// The marks follow the broker's confirms; the instances may still be
	// taking the last copies off their queues.
	_ = harness.Sleep(ctx, 500*time.Millisecond)
	c.logf("  republished and marked again after %v; the instances dropped %d duplicates meanwhile",
		time.Since(start).Round(time.Millisecond), c.sh.duplicates(ctx)-before)
	return nil
}

// duplicates sums the running instances' ordo_inbox_duplicates_total; an
// instance that does not answer counts 0.
func (s *shippingFleet) duplicates(ctx context.Context) int64 {
	var sum int64
	for _, i := range s.running() {
		n, err := scrapeCounter(ctx, s.procs[i].HTTPAddr, metricDuplicates)
		if err == nil {
			sum += n
		}
	}
	return sum
}

// scrapeCounter sums the samples of the counter name on addr's /metrics.
func scrapeCounter(ctx context.Context, addr, name string) (int64, error) {
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, fmt.Errorf("scrape %s: %w", addr, err)
	}
	defer resp.Body.Close()
	var sum int64
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+" ") && !strings.HasPrefix(line, name+"{") {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			return 0, fmt.Errorf("scrape %s: %s: %w", addr, line, err)
		}
		sum += int64(v)
	}
	return sum, sc.Err()
}
