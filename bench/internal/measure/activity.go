package measure

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ordo-relay/ordo/bench/internal/result"
)

// activityEvery is how often an activitySampler looks at pg_stat_activity.
const activityEvery = 20 * time.Millisecond

// activitySampler is a poor man's profiler of the database side: it polls
// pg_stat_activity for the rig's database and counts, per kind of
// statement (the relay's read, mark and lease statements, the producers'
// inserts and commits), the samples in which one was running, and what
// running statements waited on. The share of samples in which the relay's read
// was running says how much of the wall time the relay spent waiting for
// the database to find key heads. Start it with StartActivity; stop
// waits for its goroutine and returns the counts.
type activitySampler struct {
	pool   *pgxpool.Pool
	dbName string
	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	samples int
	active  map[string]int // kind -> samples with at least one running
	waits   map[string]int // "kind: wait_event_type/wait_event" -> occurrences
	err     error
}

// statementKinds classify the relay's statements by a fragment of their
// text (see relay/pgstore/queries.go, lease/queries.go and classic.go); the
// first match wins.
var statementKinds = []struct{ kind, fragment string }{
	{"mark", "SET processed_at"},
	{"failure", "SET attempts"},
	{"lease", "ordo_leases"},
	{"bench", "count(*) FROM outbox"},
	{"insert", "INSERT INTO outbox"},
	{"bench", "FROM pg_stat_activity"},
	{"read", "FOR UPDATE SKIP LOCKED"}, // the classic relay's batch select
	{"read", "FROM outbox"},            // any other relay query of the outbox reads it
}

func Classify(query string) string {
	if strings.EqualFold(strings.TrimSpace(query), "commit") {
		return "commit" // a producer's (or the leaser's) COMMIT
	}
	for _, k := range statementKinds {
		if strings.Contains(query, k.fragment) {
			return k.kind
		}
	}
	return "other"
}

func StartActivity(pool *pgxpool.Pool, dbName string) *activitySampler {
	ctx, cancel := context.WithCancel(context.Background())
	a := &activitySampler{pool: pool, dbName: dbName, cancel: cancel, done: make(chan struct{}),
		active: map[string]int{}, waits: map[string]int{}}
	go func() {
		defer close(a.done)
		a.loop(ctx)
	}()
	return a
}

func (a *activitySampler) loop(ctx context.Context) {
	t := time.NewTicker(activityEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := a.sample(ctx); err != nil && ctx.Err() == nil {
			a.mu.Lock()
			a.err = err
			a.mu.Unlock()
			return
		}
	}
}

func (a *activitySampler) sample(ctx context.Context) error {
	rows, err := a.pool.Query(ctx, `
SELECT query, coalesce(wait_event_type, ''), coalesce(wait_event, '')
FROM pg_stat_activity
WHERE datname = $1 AND state = 'active' AND pid <> pg_backend_pid()`, a.dbName)
	if err != nil {
		return fmt.Errorf("sample pg_stat_activity: %w", err)
	}
	defer rows.Close()
	seen := map[string]bool{}
	var waits []string
	for rows.Next() {
		var q, wt, we string
		if err := rows.Scan(&q, &wt, &we); err != nil {
			return fmt.Errorf("sample pg_stat_activity: %w", err)
		}
		k := Classify(q)
		seen[k] = true
		if wt != "" {
			waits = append(waits, k+": "+wt+"/"+we)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("sample pg_stat_activity: %w", err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.samples++
	for k := range seen {
		a.active[k]++
	}
	for _, w := range waits {
		a.waits[w]++
	}
	return nil
}

// ActivityReport is what an activitySampler counted.
type ActivityReport struct {
	Samples int
	Active  map[string]int
	Waits   map[string]int
	err     error
}

// Stop ends sampling, waits for the goroutine and returns the counts.
func (a *activitySampler) Stop() ActivityReport {
	a.cancel()
	<-a.done
	a.mu.Lock()
	defer a.mu.Unlock()
	return ActivityReport{Samples: a.samples, Active: a.active, Waits: a.waits, err: a.err}
}

// AddTo adds to r the share of samples in which each kind of relay
// statement was running (db_<kind>_active, in %) and a note with the
// commonest waits, as the average number of statements in each.
func (a ActivityReport) AddTo(r *result.Result) {
	if a.err != nil {
		r.Note("database activity sampling stopped early: %v", a.err)
	}
	if a.Samples == 0 {
		return
	}
	for _, k := range []string{"read", "mark", "lease"} {
		r.Figure("db_"+k+"_active", 100*float64(a.Active[k])/float64(a.Samples), "%")
	}
	type wc struct {
		what string
		n    int
	}
	var ws []wc
	for w, n := range a.Waits {
		ws = append(ws, wc{w, n})
	}
	sort.Slice(ws, func(i, j int) bool { return ws[i].n > ws[j].n || ws[i].n == ws[j].n && ws[i].what < ws[j].what })
	var parts []string
	for _, w := range ws[:min(len(ws), 4)] {
		parts = append(parts, fmt.Sprintf("%s %.2f", w.what, float64(w.n)/float64(a.Samples)))
	}
	if len(parts) > 0 {
		r.Note("commonest waits in the bench database (statements waiting, average over %d samples): %s",
			a.Samples, strings.Join(parts, ", "))
	}
}
