package main

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// waitSampleEvery is how often the produce window samples pg_stat_activity.
const waitSampleEvery = 10 * time.Millisecond

// sqlWaits counts the run database's active backends that wait, by event.
// The producers' idle-in-transaction time (a pg_sleep is "Timeout:PgSleep")
// is theirs; a lock wait ("Lock:transactionid", "Lock:tuple",
// "LWLock:...") between producers is what the hot-key cell looks for.
const sqlWaits = `
SELECT wait_event_type || ':' || wait_event, count(*)::int FROM pg_stat_activity
WHERE datname = $1 AND state = 'active' AND wait_event IS NOT NULL AND pid <> pg_backend_pid()
GROUP BY 1`

// waitSample samples wait events until stop.
type waitSample struct {
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	counts map[string]int
	n      int
}

// startWaitSample samples dbName's wait events every waitSampleEvery on
// probe until stop.
func startWaitSample(ctx context.Context, probe *pgxpool.Pool, dbName string) *waitSample {
	ctx, cancel := context.WithCancel(ctx)
	w := &waitSample{cancel: cancel, done: make(chan struct{}), counts: map[string]int{}}
	go func() {
		defer close(w.done)
		t := time.NewTicker(waitSampleEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			rows, err := probe.Query(ctx, sqlWaits, dbName)
			if err != nil {
				continue // a sample lost; the others count
			}
			got := map[string]int{}
			for rows.Next() {
				var ev string
				var n int
				if rows.Scan(&ev, &n) == nil {
					got[ev] = n
				}
			}
			rows.Close()
			if rows.Err() != nil {
				continue
			}
			w.mu.Lock()
			w.n++
			for ev, n := range got {
				w.counts[ev] += n
			}
			w.mu.Unlock()
		}
	}()
	return w
}

// stop ends the sampling and returns the counts and the samples taken.
func (w *waitSample) stop() (map[string]int, int) {
	w.cancel()
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.counts, w.n
}

// waitsNote describes the waits of runs: the average number of waiting
// backends per sample, by event, largest first (at most 5).
func waitsNote(runs []produceRun) string {
	total, samples := map[string]int{}, 0
	for _, r := range runs {
		samples += r.waitSamples
		for ev, n := range r.waits {
			total[ev] += n
		}
	}
	if samples == 0 {
		return ""
	}
	evs := slices.SortedFunc(maps.Keys(total), func(a, b string) int { return total[b] - total[a] })
	if len(evs) == 0 {
		return fmt.Sprintf("waits: none in %d samples", samples)
	}
	parts := make([]string, 0, 5)
	for _, ev := range evs[:min(len(evs), 5)] {
		parts = append(parts, fmt.Sprintf("%s %.2f", ev, float64(total[ev])/float64(samples)))
	}
	return fmt.Sprintf("waiting backends per sample (%d samples): %s", samples, strings.Join(parts, ", "))
}
