package drain

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"sort"
	"time"

	"github.com/ordo-relay/ordo/bench/internal/measure"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ordo-relay/ordo/bench/internal/harness"
	"github.com/ordo-relay/ordo/bench/internal/result"
)

// Options are drain's: a backlog drained by each count of -nodes.
type Options struct {
	measure.Common
	measure.Backlog
	Analyze bool  // ANALYZE the outbox after loading it
	Nodes   []int // node counts, one run each
	Lean    bool  // drop the producers' key_seq trigger first: the relays number the rows
	// WALInspect counts the drain's WAL in the run's database by
	// relation with pg_walinspect (besides the server-wide figure).
	WALInspect bool
}

func DefaultOptions() Options {
	return Options{Backlog: measure.DefaultBacklog(), Analyze: true, Nodes: []int{1}}
}

func (o *Options) AddFlags(fs *flag.FlagSet) {
	o.Backlog.AddFlags(fs)
	analyzeVar(fs, &o.Analyze)
	measure.CountsVar(fs, "nodes", &o.Nodes, "comma-separated Ordo node counts, one run each")
	fs.BoolVar(&o.Lean, "lean", o.Lean, "drop the producers' key_seq trigger before loading (outbox.DropKeySeqTrigger): the rows arrive without key_seq and the relays number them")
	fs.BoolVar(&o.WALInspect, "wal-inspect", o.WALInspect, "count the drain's WAL in the run's own database by relation with pg_walinspect (besides the server-wide LSN delta)")
}

func analyzeVar(fs *flag.FlagSet, p *bool) {
	fs.BoolVar(p, "analyze", *p, "ANALYZE the outbox after loading it, as autovacuum would soon")
}

// ClassicOptions are classic's: drain's backlog through the classic relay
// on each count of -instances.
type ClassicOptions struct {
	measure.Common
	measure.Backlog
	measure.ClassicPolling
	Analyze   bool  // ANALYZE the outbox after loading it
	Instances []int // instance counts, one run each
}

func DefaultClassicOptions() ClassicOptions {
	return ClassicOptions{Backlog: measure.DefaultBacklog(), ClassicPolling: measure.DefaultClassicPolling(), Analyze: true, Instances: []int{1, 2}}
}

func (o *ClassicOptions) AddFlags(fs *flag.FlagSet) {
	o.Backlog.AddFlags(fs)
	o.ClassicPolling.AddFlags(fs)
	analyzeVar(fs, &o.Analyze)
	measure.CountsVar(fs, "instances", &o.Instances, "comma-separated classic instance counts, one run each")
}

func (o ClassicOptions) Validate() error {
	return errors.Join(o.Backlog.Validate(), o.ClassicPolling.Validate())
}

// Run measures how fast Ordo drains a backlog, once for each count in
// -nodes (default 1): see drainOnce.
func Run(ctx context.Context, o Options, emit func(*result.Result)) error {
	for _, n := range o.Nodes {
		res, err := drainOnce(ctx, o.Common, o.Backlog, drainSwitches{analyze: o.Analyze, lean: o.Lean, walInspect: o.WALInspect}, measure.Ordo(n))
		if err != nil {
			return fmt.Errorf("%d node(s): %w", n, err)
		}
		emit(res)
	}
	return nil
}

// RunClassic drains the same backlog with the classic relay, once for
// each count in -instances (default 1,2).
func RunClassic(ctx context.Context, o ClassicOptions, emit func(*result.Result)) error {
	for _, n := range o.Instances {
		res, err := drainOnce(ctx, o.Common, o.Backlog, drainSwitches{analyze: o.Analyze}, measure.Classic(n, o.ClassicPolling))
		if err != nil {
			return fmt.Errorf("%d instance(s): %w", n, err)
		}
		emit(res)
	}
	return nil
}

// drainOnce measures how fast the relays of spec drain a backlog of -rows
// rows (default 100000) over -keys keys (default 10000): see Backlog.
func drainOnce(ctx context.Context, c measure.Common, b measure.Backlog, sw drainSwitches, spec measure.SystemSpec) (*result.Result, error) {
	name := "drain"
	if spec.Classic {
		name = "classic"
	}
	plan := Plan{Scenario: name, Groups: []RowGroup{{Prefix: "key", Keys: measure.OrDefault(b.Keys, 10000), Rows: b.Rows}},
		Payload: b.Payload, Analyze: sw.analyze, Lean: sw.lean, walInspect: sw.walInspect}
	res, _, err := Backlog(ctx, c, spec, plan)
	return res, err
}

// drainSwitches are a drain's flags besides the backlog: -analyze, -lean
// and -wal-inspect.
type drainSwitches struct {
	analyze, lean, walInspect bool
}

// RowGroup is a set of keys named prefix-<n> with rows messages spread
// round-robin over them, so row i goes to key i mod keys. With poison,
// each key's first row goes to an exchange that does not exist: Ordo
// parks it, and the key's later rows (followers) wait behind it for good.
// With parked too, those first rows are loaded parked already, as after
// -max-attempts failures: the drain then times the other keys beside
// parked keys, not the parking. With held too, the followers are loaded
// held behind them (held_behind), as a node's first read leaves them.
type RowGroup struct {
	Prefix string
	Keys   int
	Rows   int
	Poison bool
	Parked bool
	Held   bool
}

// Plan is what Backlog loads and how.
type Plan struct {
	Scenario string
	Label    string // the result's label; empty: the relay's name
	Groups   []RowGroup
	Payload  int  // approximate payload size in bytes
	Analyze  bool // ANALYZE outbox in the loading transaction
	// AutovacuumOff sets autovacuum_enabled = off on the outbox before
	// loading, so that no statistics appear during the drain either.
	AutovacuumOff bool
	// vacuum VACUUMs the outbox after the load commits, before the drain.
	Vacuum bool
	// limit, when set, bounds the drain: a backlog not drained by then is
	// reported as incomplete (complete=0, msgs_per_sec over what arrived)
	// instead of failing the run. 0 waits up to -timeout and fails.
	Limit   time.Duration
	Durable bool // the consumer's queue is durable (confirms wait for fsync)
	Lean    bool // the key_seq trigger is dropped once the relays run: they number the rows
	// walInspect counts the drain's WAL in the rig's database by relation
	// (pg_walinspect), as wal_<relation>_bytes_per_msg figures.
	walInspect bool
	// before, when set, runs right after the rows were committed, and
	// after once they are drained (before the relays stop); both may add
	// figures to the result.
	Before, After func(ctx context.Context, r *harness.Rig, sys measure.System, res *result.Result) error
}

// Costs is what a drain measured of PostgreSQL's work, for the shapes
// scenario's whole-cost figures.
type Costs struct {
	Msgs       int                // messages timed (not the poison groups')
	Insert     time.Duration      // the bench's backends during the COPY and its COMMIT
	LoadRows   int                // rows the COPY wrote
	Relay      measure.RelaySplit // the relay's backends during the drain
	RelayTotal time.Duration
	complete   bool
}

// Backlog measures how fast the relays of spec drain a backlog. They
// start on an empty outbox and are waited for until ready (Ordo: the
// nodes agree on the map and hold every lease). Then the plan's rows are
// committed in one transaction (COPY, then ANALYZE if asked). The clock
// starts when that COMMIT returns and stops when the consumer has every
// row not of a poison group; the database must then show none of those
// pending.
func Backlog(ctx context.Context, o measure.Common, spec measure.SystemSpec, plan Plan) (*result.Result, Costs, error) {
	var costs Costs
	r, err := measure.NewRig(ctx, o, plan.Scenario, 4)
	if err != nil {
		return nil, costs, err
	}
	defer r.Close()
	res := result.New(plan.Scenario)
	res.Label = plan.Label
	if res.Label == "" {
		res.Label = spec.String()
	}
	spec.AddParams(res)
	rows, keys, poisoned := PlanSize(plan.Groups)
	res.Param("msgs", rows)
	res.Param("keys", keys)
	if poisoned > 0 {
		res.Param("parked_keys", poisoned)
	}
	res.Param("partitions", o.Partitions)
	if spec.Classic {
		res.Param("batch", spec.Relay.ClassicBatch)
		res.Param("interval", spec.Relay.ClassicEvery)
	} else {
		res.Param("confirm_window", o.ConfirmWindow)
	}
	res.Param("payload_bytes", plan.Payload)
	res.Param("analyze", plan.Analyze)
	if plan.AutovacuumOff {
		res.Param("autovacuum", false)
	}
	if plan.Durable {
		res.Param("durable_queue", true)
	}

	c, err := measure.StartRigConsumer(ctx, r, plan.Durable)
	if err != nil {
		return nil, costs, err
	}
	startAt := time.Now()
	sys, err := spec.Start(ctx, r)
	if err != nil {
		return nil, costs, err
	}
	ready := time.Since(startAt)
	fmt.Printf("%s ready in %v\n", spec, ready.Round(time.Millisecond))
	if plan.Lean {
		res.Param("lean", true)
		if err := measure.DropKeySeqTrigger(ctx, r); err != nil {
			return nil, costs, err
		}
	}

	if plan.AutovacuumOff {
		if _, err := r.Pool.Exec(ctx, `ALTER TABLE outbox SET (autovacuum_enabled = off)`); err != nil {
			return nil, costs, fmt.Errorf("autovacuum off: %w", err)
		}
	}
	var wal *measure.WALWatch
	if plan.walInspect {
		// Before the load: its slot keeps the drain's WAL from here on.
		if wal, err = measure.WatchWAL(ctx, r.DBURL, true); err != nil {
			return nil, costs, err
		}
		defer wal.Close()
	}
	groups, early, err := loadVacuumed(ctx, r, plan)
	if err != nil {
		return nil, costs, err
	}
	loadStart := time.Now()
	load, err := LoadGroups(ctx, r, groups, plan.Payload, plan.Analyze)
	if err != nil {
		return nil, costs, err
	}
	load.held = append(early, load.held...)
	ids, committed := load.Timed, load.committed
	loadTime := committed.Sub(loadStart)
	costs.Insert, costs.LoadRows, costs.Msgs = load.insertCPU, len(load.Timed)+len(load.held), len(ids)
	fmt.Printf("committed %d rows in %v\n", costs.LoadRows, loadTime.Round(time.Millisecond))
	wal0, err := serverLSN(ctx, r.Probe)
	if err != nil {
		return nil, costs, err
	}
	cpu0 := measure.SampleCPU()
	relayCPU0, err := measure.UsageNow(sys)
	if err != nil {
		return nil, costs, err
	}
	act := measure.StartActivity(r.Probe, r.Name)
	backends, err := measure.StartBackendCPU(ctx, r.Probe, r.Name)
	if err != nil {
		act.Stop()
		return nil, costs, err
	}
	if plan.Before != nil {
		if err := plan.Before(ctx, r, sys, res); err != nil {
			return nil, costs, err
		}
	}
	limit := o.Timeout
	if plan.Limit > 0 {
		limit = plan.Limit
	}
	if poisoned > 0 {
		err = c.WaitAll(ctx, ids, limit, sys.Failed) // a follower of a parked key must not count
	} else {
		err = c.WaitDistinct(ctx, len(ids), limit, sys.Failed) // cheaper for a million ids
	}
	activity := act.Stop()
	btotals, berr := backends.Stop(ctx)
	costs.complete = err == nil
	if err != nil && (plan.Limit == 0 || ctx.Err() != nil || sys.Failed() != nil || c.Failed() != nil) {
		return nil, costs, err
	}
	if berr != nil {
		res.Note("backend CPU sampling: %v", berr)
	}
	recv := c.ReceiveTimes()
	first, last, got := DeliverySpan(ids, recv)
	if costs.complete {
		fmt.Printf("all %d delivered %v after the commit\n", len(ids), last.Sub(committed).Round(time.Millisecond))
		if _, err := r.WaitPending(ctx, sys.Failed, poisonPrefixes(plan.Groups)); err != nil {
			return nil, costs, err
		}
	} else {
		last = time.Now()
		res.Note("not drained within %v: %d of %d delivered; msgs_per_sec is over what arrived", limit, got, len(ids))
		fmt.Printf("!!! INCOMPLETE: %d of %d delivered in %v\n", got, len(ids), limit)
	}
	markedAt := time.Now()
	cpu1 := measure.SampleCPU()
	if wal1, err := serverLSN(ctx, r.Probe); err != nil {
		res.Note("WAL position: %v", err)
	} else if got > 0 {
		// Server-wide: other databases' WAL counts too.
		res.Figure("wal_server_bytes_per_msg", float64(wal1-wal0)/float64(got), "B")
		if wal != nil {
			if err := addWALByRelation(ctx, res, wal, wal0, wal1, got); err != nil {
				res.Note("WAL by relation: %v", err)
			}
		}
	}
	if plan.After != nil {
		if err := plan.After(ctx, r, sys, res); err != nil {
			return nil, costs, err
		}
	}
	if err := measure.AddUsage(res, sys, relayCPU0, got); err != nil {
		return nil, costs, err
	}
	if ordo, ok := sys.(*measure.OrdoSystem); ok && got > 0 {
		// Rows read per message delivered: 1 is every row read once.
		n, err := ordo.ReadRows(ctx)
		if err != nil {
			res.Note("read rows: %v", err)
		} else {
			res.Figure("read_rows", n, "")
			res.Figure("read_rows_per_msg", n/float64(got), "")
		}
	}
	if poisoned > 0 {
		// Each poison key's head is parked once its publish fails,
		// which may come after the other rows are marked.
		n, err := r.Parked(ctx)
		if costs.complete {
			n, err = r.WaitParked(ctx, sys.Failed, poisoned)
		}
		if err != nil {
			return nil, costs, err
		}
		res.Figure("parked", float64(n), "")
	}
	if err := sys.Stop(); err != nil {
		return nil, costs, err
	}
	if cs, ok := sys.(*measure.ClassicSystem); ok {
		cs.AddTo(res)
	}

	costs.RelayTotal = btotals[measure.GroupRelay]
	costs.Relay = measure.SplitRelayCPU(costs.RelayTotal, activity)
	drain := last.Sub(committed)
	res.Seconds("ready_seconds", ready)
	res.Seconds("load_seconds", loadTime)
	res.Figure("load_rows_per_sec", float64(costs.LoadRows)/loadTime.Seconds(), "rows/s")
	res.Figure("complete", b2f(costs.complete), "")
	res.Figure("delivered", float64(got), "")
	res.Seconds("first_delivery_seconds", first.Sub(committed))
	res.Seconds("seconds", drain)
	res.Figure("msgs_per_sec", float64(got)/last.Sub(first).Seconds(), "msg/s")
	res.Figure("msgs_per_sec_from_commit", float64(got)/drain.Seconds(), "msg/s")
	if costs.complete {
		res.Seconds("all_marked_seconds", markedAt.Sub(committed))
	}
	measure.AddCPU(res, cpu0, cpu1, "")
	activity.AddTo(res)
	res.Figure("pg_insert_us_per_msg", measure.PerMsgMicros(costs.Insert, costs.LoadRows), "µs")
	res.Figure("pg_read_us_per_msg", measure.PerMsgMicros(costs.Relay.Read, got), "µs")
	res.Figure("pg_mark_us_per_msg", measure.PerMsgMicros(costs.Relay.Mark, got), "µs")
	res.Figure("pg_relay_us_per_msg", measure.PerMsgMicros(costs.RelayTotal, got), "µs")
	if costs.complete {
		res.Check = c.Report(ids)
	} else {
		res.Check = c.Report(deliveredOf(ids, recv)) // judge the order of what arrived
	}
	res.Finished = time.Now()
	costs.Msgs = got
	return res, costs, nil
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// DeliverySpan returns the first and last receive time among ids, and how
// many of them arrived.
func DeliverySpan(ids []string, recv map[string]time.Time) (first, last time.Time, n int) {
	for _, id := range ids {
		t, ok := recv[id]
		if !ok {
			continue
		}
		n++
		if first.IsZero() || t.Before(first) {
			first = t
		}
		if t.After(last) {
			last = t
		}
	}
	return first, last, n
}

// deliveredOf returns the ids that arrived.
func deliveredOf(ids []string, recv map[string]time.Time) []string {
	var out []string
	for _, id := range ids {
		if _, ok := recv[id]; ok {
			out = append(out, id)
		}
	}
	return out
}

// PlanSize returns the rows, the keys and the poisoned keys of groups.
func PlanSize(groups []RowGroup) (rows, keys, poisoned int) {
	for _, g := range groups {
		rows += g.Rows
		keys += g.Keys
		if g.Poison {
			poisoned += g.Keys
		}
	}
	return rows, keys, poisoned
}

// poisonPrefixes returns the key prefixes of the poison groups.
func poisonPrefixes(groups []RowGroup) []string {
	var out []string
	for _, g := range groups {
		if g.Poison {
			out = append(out, g.Prefix+"-")
		}
	}
	return out
}

// addWALByRelation adds the WAL that the rig's database wrote between
// from and to, per message of got: in all (wal_bytes_per_msg), of it in
// full-page images, and by relation (wal_<relation>_bytes_per_msg;
// "commit" for the commit records of the transactions that wrote it).
func addWALByRelation(ctx context.Context, res *result.Result, w *measure.WALWatch, from, to int64, got int) error {
	byRel, fpi, err := w.ByRelation(ctx, from, to)
	if err != nil {
		return err
	}
	var total int64
	rels := make([]string, 0, len(byRel))
	for rel, n := range byRel {
		total += n
		rels = append(rels, rel)
	}
	sort.Strings(rels)
	res.Figure("wal_bytes_per_msg", float64(total)/float64(got), "B")
	res.Figure("wal_fpi_bytes_per_msg", float64(fpi)/float64(got), "B")
	for _, rel := range rels {
		res.Figure("wal_"+rel+"_bytes_per_msg", float64(byRel[rel])/float64(got), "B")
	}
	return nil
}

// serverLSN returns the server's WAL insert position in bytes.
func serverLSN(ctx context.Context, q *pgxpool.Pool) (int64, error) {
	var n int64
	if err := q.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn`).Scan(&n); err != nil {
		return 0, fmt.Errorf("read WAL position: %w", err)
	}
	return n, nil
}
