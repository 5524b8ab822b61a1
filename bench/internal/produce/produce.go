package produce

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ordo-relay/ordo/bench/internal/measure"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ordo-relay/ordo/bench/internal/harness"
	"github.com/ordo-relay/ordo/bench/internal/result"
	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/outbox"
	"github.com/ordo-relay/ordo/partition"
)

// The produce scenario measures what the outbox costs the producers: the
// same closed-loop producers (each a connection that commits transactions
// back to back) write into each variant's table (produce_variants.go), one
// variant after the other, each in a fresh database, for every
// combination of rows per transaction and producer count, -produce-reps
// times. Per run: transactions per second, the COMMIT's latency, the
// CPU of the producers' PostgreSQL backends, and the WAL written. Per
// cell: the medians over the repetitions and each variant's ratio to the
// classic table measured in the same cell.

// produceRunSlack bounds a run's setup, sampling and cleanup on top of its
// warm-up and window.
const produceRunSlack = 3 * time.Minute

// produceRun is what one run of one variant measured.
type produceRun struct {
	variant   string
	rows      int // per transaction
	producers int
	commits   int                  // transactions committed in the window
	errors    int                  // transactions that failed in the window
	window    time.Duration        // measured wall time
	commit    measure.Distribution // COMMIT alone
	tx        measure.Distribution // BEGIN to COMMIT returned
	pgBackend time.Duration        // CPU of the producers' backends in the window
	pgServer  time.Duration        // CPU of every postgres process (other databases' too)
	walServer int64                // pg_current_wal_insert_lsn delta: the whole server
	walDB     int64                // this database's WAL records (pg_walinspect); -1 if not measured
	// walByRel is walDB by relation (table or index; "commit" for the
	// transactions' commit records), when inspected.
	walByRel map[string]int64
	walFPI   int64 // of walDB, the full-page images (after a checkpoint, a page's first change logs all of it)
	// keysUpdates and KeysHOT are outbox_keys' updates and HOT updates
	// over the whole run (warm-up included); 0 where there is no such
	// table or it was never updated.
	keysUpdates, keysHOT int64
	// pgRelay is the CPU of the relay node's backends in the window
	// (ordo-sql-relay), and pendingGrowth how many more rows were
	// pending at the window's end than at its start (the relay fell
	// behind by that much).
	pgRelay       time.Duration
	pendingGrowth int
	notifies      int64 // notifications on the outbox's channel in the window
	note          string
	// waits counts, over waitSamples samples of pg_stat_activity in the
	// window (activitySampler), the database's active statements waiting,
	// by "kind: wait_event_type/wait_event".
	waits       map[string]int
	waitSamples int
}

func (r produceRun) msgs() int { return r.commits * r.rows }

func (r produceRun) tps() float64 {
	if r.window <= 0 {
		return 0
	}
	return float64(r.commits) / r.window.Seconds()
}

// perMsg is v per message, or NaN without messages.
func (r produceRun) perMsg(v float64) float64 {
	if r.msgs() == 0 {
		return math.NaN()
	}
	return v / float64(r.msgs())
}

func Run(ctx context.Context, o Options, emit func(*result.Result)) error {
	p := o.Produce
	var cells []*result.Result
	failedRuns := 0
	for _, rows := range p.Rows {
		for _, producers := range p.Producers {
			var runs []produceRun
			var failed []string
			for rep := range p.Reps {
				for _, name := range p.Variants {
					run, err := produceOnce(ctx, o, FindVariant(name), rows, producers)
					if ctx.Err() != nil {
						return ctx.Err()
					}
					if err != nil {
						// One failed run (the shared server out of
						// connections, say) costs its figures, not the
						// scenario: the cell's medians are of the runs
						// that finished, and the result says so.
						fmt.Fprintf(os.Stderr, "bench: produce: %s, %d rows, %d producers, rep %d: %v\n", name, rows, producers, rep+1, err)
						failed = append(failed, fmt.Sprintf("%s rep %d: %v", name, rep+1, err))
						failedRuns++
						continue
					}
					fmt.Printf("produce: %-18s rows=%-3d producers=%-3d rep=%d tps=%8.0f commit p50=%6.2fms p99=%6.2fms pg=%5.0fµs/msg wal=%5.0fB/msg errors=%d\n",
						name, rows, producers, rep+1, run.tps(), ms(run.commit.P50), ms(run.commit.P99),
						run.perMsg(float64(run.pgBackend.Microseconds())), run.perMsg(float64(walOf(run))), run.errors)
					if run.pgRelay > 0 || run.notifies > 0 {
						fmt.Printf("produce: %-18s relay backends pg=%5.0fµs/msg, pending rows %+d over the window, notifications %.2f/commit\n",
							name, run.perMsg(float64(run.pgRelay.Microseconds())), run.pendingGrowth, float64(run.notifies)/max(float64(run.commits), 1))
					}
					runs = append(runs, run)
				}
			}
			res := produceCellResult(o, rows, producers, runs)
			for _, f := range failed {
				res.Note("run failed, left out: %s", f)
			}
			cells = append(cells, res)
			emit(res)
		}
	}
	printProduceTable(os.Stdout, cells, p.Variants)
	printRelayedTable(os.Stdout, cells, p.Variants)
	if failedRuns > 0 {
		return fmt.Errorf("%d run(s) failed and were left out of the medians (see the notes)", failedRuns)
	}
	return nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// walOf is the run's best WAL figure: its own database's, else the server's.
func walOf(r produceRun) int64 {
	if r.walDB >= 0 {
		return r.walDB
	}
	return r.walServer
}

// produceOnce runs one variant in a fresh database and measures it.
func produceOnce(ctx context.Context, o Options, v *produceVariant, rows, producers int) (produceRun, error) {
	run := produceRun{variant: v.name, rows: rows, producers: producers, walDB: -1}
	// A run that cannot finish (a server restarted under it, say) fails
	// instead of hanging the scenario.
	ctx, stopRun := context.WithTimeout(ctx, o.Produce.Warmup+o.Produce.Duration+produceRunSlack)
	defer stopRun()
	name := "ordo_bench_produce_" + strings.ReplaceAll(v.name, "-", "_") + "_" + harness.RandomHex(4)
	sctx, cancel := context.WithTimeout(ctx, harness.SetupTimeout)
	defer cancel()
	dbURL, drop, err := testkit.CreateDatabase(sctx, o.PostgresURL, name)
	if err != nil {
		return run, err
	}
	defer func() {
		dctx, dcancel := context.WithTimeout(context.Background(), harness.SetupTimeout)
		defer dcancel()
		if err := drop(dctx); err != nil {
			fmt.Fprintf(os.Stderr, "bench: drop database %s: %v\n", name, err)
		}
	}()
	pool, probe, err := producePools(sctx, dbURL, producers)
	if err != nil {
		return run, err
	}
	defer pool.Close()
	defer probe.Close()
	if run.note, err = v.setup(sctx, pool, o.Partitions); err != nil {
		return run, err
	}
	w, err := NewWriter(o.Partitions, measure.OrDefault(o.Keys, 10000), o.Payload)
	if w != nil {
		w.sleep = o.Produce.Sleep
	}
	if err != nil {
		return run, err
	}
	if v.relay != relayNone {
		w.Exchange = name
	}
	w.dbURL = dbURL
	if err := prefillKeys(sctx, v, w, pool); err != nil {
		return run, err
	}
	if v.relay != relayNone {
		relay, err := startProduceRelay(ctx, o, v, dbURL, name, func(ctx context.Context) (int, error) { return pendingRows(ctx, probe, v) })
		if err != nil {
			return run, err
		}
		defer relay.stop()
	}
	wal, err := measure.WatchWAL(sctx, dbURL, o.Produce.WALInspect)
	if err != nil {
		return run, err
	}
	defer wal.Close()
	return measureProduce(ctx, o, v, w, pool, probe, wal, name, run)
}

func producePools(ctx context.Context, dbURL string, producers int) (pool, probe *pgxpool.Pool, err error) {
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return nil, nil, fmt.Errorf("postgres-url: %w", err)
	}
	cfg.MaxConns = int32(producers)
	cfg.MinConns = int32(producers)
	cfg.ConnConfig.RuntimeParams["application_name"] = harness.AppBench
	if pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		return nil, nil, fmt.Errorf("open pool: %w", err)
	}
	pcfg := cfg.Copy()
	pcfg.MaxConns, pcfg.MinConns = 2, 0
	pcfg.ConnConfig.RuntimeParams["application_name"] = harness.AppProbe
	if probe, err = pgxpool.NewWithConfig(ctx, pcfg); err != nil {
		pool.Close()
		return nil, nil, fmt.Errorf("open probe pool: %w", err)
	}
	return pool, probe, nil
}

// NewWriter returns a writer of about payload bytes a message over
// n keys, with their partitions out of partitions.
func NewWriter(partitions, n, payload int) (*Writer, error) {
	out, err := outbox.NewProducer(partitions)
	if err != nil {
		return nil, err
	}
	w := &Writer{Keys: make([]string, n), Partitions: make([]int32, n), producer: out, Exchange: produceExchange}
	for i := range w.Keys {
		w.Keys[i] = "key-" + strconv.Itoa(i)
		w.Partitions[i] = int32(partition.Of(w.Keys[i], partitions))
	}
	w.pad = strings.Repeat("x", max(0, payload-len(`{"key":"key-1234","t":1767000000000000000,"pad":""}`)))
	return w, nil
}

// prefillBatch is how many keys' first messages one prefill transaction
// writes.
const prefillBatch = 500

// prefillKeys writes one message per key through the variant, before the
// warm-up: the window then measures a key's later rows (in Ordo, an
// increment of an existing counter row) rather than the first rows of a
// fresh database, and every variant's table starts with as many rows.
func prefillKeys(ctx context.Context, v *produceVariant, w *Writer, pool *pgxpool.Pool) error {
	keys := make([]int, len(w.Keys))
	for i := range keys {
		keys[i] = i
	}
	slices.SortFunc(keys, func(a, b int) int { return strings.Compare(w.Keys[a], w.Keys[b]) })
	for start := 0; start < len(keys); start += prefillBatch {
		batch := keys[start:min(start+prefillBatch, len(keys))]
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return v.write(ctx, tx, w, batch) }); err != nil {
			return fmt.Errorf("%s: write the keys' first messages: %w", v.name, err)
		}
	}
	return nil
}

// Window is the measuring window the workers look at: a commit
// that returns while measuring is set counts.
type Window struct {
	Measuring atomic.Bool
	Mu        sync.Mutex
	commit    []time.Duration
	tx        []time.Duration
	Commits   int
	Errors    int
	shown     int
}

func (pw *Window) Record(commit, tx time.Duration, err error) {
	if !pw.Measuring.Load() {
		return
	}
	pw.Mu.Lock()
	defer pw.Mu.Unlock()
	if err != nil {
		pw.Errors++
		if pw.shown < measure.CommitErrorsShown {
			pw.shown++
			fmt.Fprintf(os.Stderr, "bench: produce: %v\n", err)
		}
		return
	}
	pw.Commits++
	pw.commit = append(pw.commit, commit)
	pw.tx = append(pw.tx, tx)
}

// measureProduce runs the producers through the warm-up and the window and
// takes the samples at the window's edges.
func measureProduce(ctx context.Context, o Options, v *produceVariant, w *Writer, pool, probe *pgxpool.Pool,
	wal *measure.WALWatch, dbName string, run produceRun) (produceRun, error) {
	var pw Window
	notifies, err := watchNotifies(ctx, w.dbURL, &pw.Measuring)
	if err != nil {
		return run, err
	}
	defer notifies.Close()
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	for i := range run.producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			Work(wctx, v, w, pool, &pw, run.rows, uint64(i), o.Produce.Rate, run.producers)
		}()
	}
	defer wg.Wait()
	if err := harness.Sleep(ctx, o.Produce.Warmup); err != nil {
		return run, err
	}
	lsn0, err := wal.LSN(ctx)
	if err != nil {
		return run, err
	}
	var pending0, pending1 int
	if v.relay != relayNone {
		if pending0, err = pendingRows(ctx, probe, v); err != nil {
			return run, err
		}
	}
	cpu0 := measure.SampleCPU()
	backends, err := measure.StartBackendCPU(ctx, probe, dbName)
	if err != nil {
		return run, err
	}
	act := measure.StartActivity(probe, dbName)
	start := time.Now()
	pw.Measuring.Store(true)
	werr := harness.Sleep(ctx, o.Produce.Duration)
	pw.Measuring.Store(false)
	acts := act.Stop()
	run.waits, run.waitSamples = acts.Waits, acts.Samples
	run.window = time.Since(start)
	cpu1 := measure.SampleCPU()
	totals, berr := backends.Stop(ctx)
	lsn1, lerr := wal.LSN(ctx)
	var perr error
	if v.relay != relayNone {
		pending1, perr = pendingRows(ctx, probe, v)
	}
	stop()
	wg.Wait()
	pool.Close() // the backends flush their statistics as they exit
	if err := errors.Join(werr, berr, lerr, perr); err != nil {
		return run, err
	}
	run.pendingGrowth = pending1 - pending0
	run.notifies = notifies.n.Load()
	run.pgRelay = totals[measure.GroupRelay]
	pw.Mu.Lock()
	run.commits, run.errors = pw.Commits, pw.Errors
	run.commit, run.tx = measure.DistributionOf(pw.commit), measure.DistributionOf(pw.tx)
	pw.Mu.Unlock()
	run.pgBackend = totals[measure.GroupBench]
	for pid, t := range cpu1.ByComm["postgres"] {
		run.pgServer += t - cpu0.ByComm["postgres"][pid]
	}
	run.walServer = lsn1 - lsn0
	if wal.Inspect {
		if run.walByRel, run.walFPI, err = wal.ByRelation(ctx, lsn0, lsn1); err != nil {
			return run, err
		}
		run.walDB = 0
		for _, n := range run.walByRel {
			run.walDB += n
		}
	}
	run.keysUpdates, run.keysHOT, err = measure.KeysHOT(ctx, probe)
	return run, err
}

// Work commits transactions of rows messages back to back until ctx
// ends. Keys are drawn uniformly and sorted within a transaction.
func Work(ctx context.Context, v *produceVariant, w *Writer, pool *pgxpool.Pool, pw *Window, rows int,
	seed uint64, rate, producers int) {
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), seed))
	keys := make([]int, rows)
	pace := newPacer(rate, producers, rng)
	for pace.wait(ctx) == nil {
		for i := range keys {
			keys[i] = rng.IntN(len(w.Keys))
		}
		slices.Sort(keys)
		begun := time.Now()
		commit, err := produceTx(ctx, v, w, pool, keys)
		if ctx.Err() != nil {
			return // a transaction cut short by the end of the run is not an error
		}
		pw.Record(commit, time.Since(begun), err)
	}
}

// produceTx runs one transaction and returns how long its COMMIT took.
func produceTx(ctx context.Context, v *produceVariant, w *Writer, pool *pgxpool.Pool, keys []int) (time.Duration, error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }() // no-op after Commit
	if err := v.write(ctx, tx, w, keys); err != nil {
		return 0, fmt.Errorf("%s: insert: %w", v.name, err)
	}
	if w.sleep > 0 {
		if _, err := tx.Exec(ctx, `SELECT pg_sleep($1)`, w.sleep.Seconds()); err != nil {
			return 0, fmt.Errorf("%s: sleep: %w", v.name, err)
		}
	}
	sent := time.Now()
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("%s: commit: %w", v.name, err)
	}
	return time.Since(sent), nil
}
