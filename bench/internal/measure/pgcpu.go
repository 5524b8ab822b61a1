package measure

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/ordo-relay/ordo/bench/internal/harness"
)

// PostgreSQL connections are told apart by application_name: the bench's
// own (loads, producers, waits), the samplers', and everything else, which
// is the relay under test (the node sets "ordo node <name>"; the classic relay sets
// AppClassic).
const (
	AppClassic = "ordo_bench_classic"
	// backendEvery is how often a BackendCPU sampler lists the database's
	// backends. A backend that exits between two samples loses at most
	// this much of its CPU from the count.
	backendEvery = 100 * time.Millisecond
)

// AppInbox is the application_name of the consume scenario's inbox
// instances' connections, so that their backends' CPU is told apart from
// the relay's.
const AppInbox = "ordo_bench_inbox"

// Backend groups of a BackendCPU sampler.
const (
	GroupBench = "bench" // application_name ordo_bench: the bench's loads and producers
	GroupProbe = "probe" // the samplers themselves
	GroupInbox = "inbox" // application_name ordo_bench_inbox: the consume scenario's inbox instances
	GroupRelay = "relay" // anything else: the relay under test
)

// BackendGroup returns the group of a backend by its application_name.
func BackendGroup(app string) string {
	switch app {
	case harness.AppBench:
		return GroupBench
	case harness.AppProbe:
		return GroupProbe
	case AppInbox:
		return GroupInbox
	default:
		return GroupRelay
	}
}

// BackendCPU measures the CPU that PostgreSQL spends on one database's
// connections, by group, from /proc/<pid>/stat of each backend process
// listed in pg_stat_activity. Unlike cpu_postgres (every postgres process
// of the machine) it leaves out other databases' work (other engineers'
// tests) and the server's background processes (WAL writer, checkpointer,
// autovacuum), which are shared. Start it with StartBackendCPU; stop
// takes a last sample, waits for the goroutine and returns the totals.
type BackendCPU struct {
	pool   *pgxpool.Pool
	dbName string
	cancel context.CancelFunc
	done   chan struct{}

	mu    sync.Mutex
	first bool                   // the next sample is the first
	procs map[int]*backendSample // pid -> CPU when first and last seen
	err   error
}

// backendSample is one backend's CPU at its first and last sample. A
// backend first seen after the first sample started during the window:
// its first is 0, so all its CPU counts.
type backendSample struct {
	group       string
	first, last time.Duration
}

// StartBackendCPU takes the first sample and starts sampling.
func StartBackendCPU(ctx context.Context, pool *pgxpool.Pool, dbName string) (*BackendCPU, error) {
	b := &BackendCPU{pool: pool, dbName: dbName, first: true, procs: map[int]*backendSample{}, done: make(chan struct{})}
	if err := b.sample(ctx); err != nil {
		return nil, err
	}
	sctx, cancel := context.WithCancel(context.Background())
	b.cancel = cancel
	go func() {
		defer close(b.done)
		t := time.NewTicker(backendEvery)
		defer t.Stop()
		for {
			select {
			case <-sctx.Done():
				return
			case <-t.C:
			}
			if err := b.sample(sctx); err != nil && sctx.Err() == nil {
				b.mu.Lock()
				b.err = err
				b.mu.Unlock()
				return
			}
		}
	}()
	return b, nil
}

// BackendCPUNow is one backend's group and CPU so far.
type BackendCPUNow struct {
	group string
	cpu   time.Duration
}

// ListBackends returns the CPU so far of every backend of database
// dbName, by pid. A backend that exits while being read is left out.
func ListBackends(ctx context.Context, pool *pgxpool.Pool, dbName string) (map[int]BackendCPUNow, error) {
	rows, err := pool.Query(ctx, `SELECT pid, coalesce(application_name, '') FROM pg_stat_activity WHERE datname = $1`, dbName)
	if err != nil {
		return nil, fmt.Errorf("list backends: %w", err)
	}
	apps := map[int]string{}
	for rows.Next() {
		var pid int32
		var app string
		if err := rows.Scan(&pid, &app); err != nil {
			rows.Close()
			return nil, fmt.Errorf("list backends: %w", err)
		}
		apps[int(pid)] = app
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list backends: %w", err)
	}
	out := make(map[int]BackendCPUNow, len(apps))
	for pid, app := range apps {
		if cpu, err := harness.ProcCPU(pid); err == nil {
			out[pid] = BackendCPUNow{group: BackendGroup(app), cpu: cpu}
		}
	}
	return out, nil
}

// GroupDelta is the CPU each group used between two listings; a backend
// missing from before started in between and counts from 0.
func GroupDelta(before, after map[int]BackendCPUNow) backendTotals {
	t := backendTotals{}
	for pid, a := range after {
		t[a.group] += a.cpu - before[pid].cpu
	}
	return t
}

// sample lists the database's backends and records each one's CPU.
func (b *BackendCPU) sample(ctx context.Context) error {
	now, err := ListBackends(ctx, b.pool, b.dbName)
	if err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for pid, x := range now {
		s, ok := b.procs[pid]
		if !ok {
			s = &backendSample{group: x.group}
			if b.first {
				s.first = x.cpu
			}
			b.procs[pid] = s
		}
		s.last = x.cpu
	}
	b.first = false
	return nil
}

// backendTotals is CPU by backend group over a BackendCPU's window.
type backendTotals map[string]time.Duration

// Stop takes a last sample and returns the CPU of each group since the
// first sample.
func (b *BackendCPU) Stop(ctx context.Context) (backendTotals, error) {
	b.cancel()
	<-b.done
	err := b.sample(ctx)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.err != nil {
		err = b.err
	}
	return sumBackends(b.procs), err
}

func sumBackends(procs map[int]*backendSample) backendTotals {
	t := backendTotals{}
	for _, s := range procs {
		t[s.group] += s.last - s.first
	}
	return t
}

// RelaySplit is the relay's PostgreSQL CPU split by statement kind.
type RelaySplit struct {
	Read, Mark, Other time.Duration
}

// SplitRelayCPU splits relay, the CPU of the relay's backends, between its
// reads, marks and everything else (leases, failure records) in
// proportion to the share of activity samples in which each kind was
// running. A statement waiting (on a lock or a WAL flush) counts as
// running, so a kind that waits more than the others is charged more
// than it used; with no sample of any kind, everything is "other".
func SplitRelayCPU(relay time.Duration, a ActivityReport) RelaySplit {
	read, mark := a.Active["read"], a.Active["mark"]
	other := a.Active["lease"] + a.Active["failure"]
	total := read + mark + other
	if total == 0 {
		return RelaySplit{Other: relay}
	}
	part := func(n int) time.Duration { return time.Duration(float64(relay) * float64(n) / float64(total)) }
	s := RelaySplit{Read: part(read), Mark: part(mark)}
	s.Other = relay - s.Read - s.Mark
	return s
}

// PerMsgMicros is d per message in microseconds (0 for no messages).
func PerMsgMicros(d time.Duration, msgs int) float64 {
	if msgs <= 0 {
		return 0
	}
	return float64(d.Microseconds()) / float64(msgs)
}
