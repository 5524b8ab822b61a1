package produce

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/ordo-relay/ordo/bench/internal/measure"

	"github.com/ordo-relay/ordo/bench/internal/result"
)

// produceSummary is one variant's medians over a cell's repetitions.
type produceSummary struct {
	runs        int
	tps         float64 // transactions per second
	msgsPerSec  float64
	commitP50   float64            // ms
	commitP99   float64            // ms
	txP99       float64            // ms, BEGIN to COMMIT returned
	pgUs        float64            // producers' backends, µs of CPU per message
	pgServerUs  float64            // every postgres process, µs per message (an upper bound: other databases too)
	walBytes    float64            // this database's WAL per message (the server's when not inspected)
	walServer   float64            // the server's WAL per message (an upper bound)
	walFPI      float64            // of walBytes, full-page images; NaN when not inspected
	hotShare    float64            // outbox_keys' HOT updates ÷ its updates; NaN without updates
	walByRel    map[string]float64 // this database's WAL per message, by relation
	pgRelayUs   float64            // the relay node's backends, µs of CPU per message produced (ordo-sql-relay)
	pendingUp   float64            // pending rows at the window's end less at its start (ordo-sql-relay)
	notifyPerTx float64            // notifications on the outbox's channel per committed transaction
	errors      int                // summed over the runs
	notes       []string
}

// Median returns the median of vs, NaN for none. NaNs are left out.
func Median(vs []float64) float64 {
	s := slices.DeleteFunc(slices.Clone(vs), math.IsNaN)
	if len(s) == 0 {
		return math.NaN()
	}
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// summarizeProduce groups runs by variant and takes each figure's median.
func summarizeProduce(runs []produceRun) map[string]produceSummary {
	by := map[string][]produceRun{}
	for _, r := range runs {
		by[r.variant] = append(by[r.variant], r)
	}
	out := map[string]produceSummary{}
	for v, rs := range by {
		col := func(f func(produceRun) float64) float64 {
			vs := make([]float64, len(rs))
			for i, r := range rs {
				vs[i] = f(r)
			}
			return Median(vs)
		}
		s := produceSummary{
			runs:       len(rs),
			tps:        col(produceRun.tps),
			msgsPerSec: col(func(r produceRun) float64 { return r.tps() * float64(r.rows) }),
			commitP50:  col(func(r produceRun) float64 { return ms(r.commit.P50) }),
			commitP99:  col(func(r produceRun) float64 { return ms(r.commit.P99) }),
			txP99:      col(func(r produceRun) float64 { return ms(r.tx.P99) }),
			pgUs:       col(func(r produceRun) float64 { return r.perMsg(float64(r.pgBackend.Microseconds())) }),
			pgServerUs: col(func(r produceRun) float64 { return r.perMsg(float64(r.pgServer.Microseconds())) }),
			walBytes:   col(func(r produceRun) float64 { return r.perMsg(float64(walOf(r))) }),
			walServer:  col(func(r produceRun) float64 { return r.perMsg(float64(r.walServer)) }),
			pgRelayUs:  col(func(r produceRun) float64 { return r.perMsg(float64(r.pgRelay.Microseconds())) }),
			pendingUp:  col(func(r produceRun) float64 { return float64(r.pendingGrowth) }),
			notifyPerTx: col(func(r produceRun) float64 {
				if r.commits == 0 {
					return math.NaN()
				}
				return float64(r.notifies) / float64(r.commits)
			}),
			walFPI: col(func(r produceRun) float64 {
				if r.walDB < 0 {
					return math.NaN()
				}
				return r.perMsg(float64(r.walFPI))
			}),
		}
		s.hotShare = col(func(r produceRun) float64 {
			if r.keysUpdates == 0 {
				return math.NaN()
			}
			return float64(r.keysHOT) / float64(r.keysUpdates)
		})
		s.walByRel = map[string]float64{}
		for _, r := range rs {
			for rel := range r.walByRel {
				s.walByRel[rel] = col(func(r produceRun) float64 { return r.perMsg(float64(r.walByRel[rel])) })
			}
		}
		for _, r := range rs {
			s.errors += r.errors
			if r.note != "" && !slices.Contains(s.notes, r.note) {
				s.notes = append(s.notes, r.note)
			}
		}
		if n := waitsNote(rs); n != "" {
			s.notes = append(s.notes, n)
		}
		out[v] = s
	}
	return out
}

// fratio is a / b, NaN when b is 0 or either is NaN.
func fratio(a, b float64) float64 {
	if b == 0 || math.IsNaN(a) || math.IsNaN(b) {
		return math.NaN()
	}
	return a / b
}

// figureName turns a variant name into a figure prefix: ordo_sql_nonotify.
func figureName(variant string) string { return strings.ReplaceAll(variant, "-", "_") }

// produceCellResult turns one cell's runs into a Result: every variant's
// medians, and its tps and commit p99 as ratios to classic's.
func produceCellResult(o Options, rows, producers int, runs []produceRun) *result.Result {
	res := result.New("produce")
	res.Label = fmt.Sprintf("%drows-%dproducers", rows, producers)
	res.Param("rows_per_tx", rows)
	res.Param("producers", producers)
	res.Param("keys", measure.OrDefault(o.Keys, 10000))
	res.Param("payload", o.Payload)
	res.Param("duration", o.Produce.Duration)
	res.Param("reps", o.Produce.Reps)
	res.Param("rate", o.Produce.Rate)
	sums := summarizeProduce(runs)
	base := sums[variantClassic]
	for _, v := range o.Produce.Variants {
		s, ok := sums[v]
		if !ok {
			continue
		}
		p := figureName(v) + "_"
		res.Figure(p+"tps", s.tps, "tx/s")
		res.Figure(p+"msgs_per_sec", s.msgsPerSec, "msg/s")
		res.Figure(p+"commit_p50", s.commitP50, "ms")
		res.Figure(p+"commit_p99", s.commitP99, "ms")
		res.Figure(p+"tx_p99", s.txP99, "ms")
		res.Figure(p+"pg_us_per_msg", s.pgUs, "µs")
		res.Figure(p+"pg_server_us_per_msg", s.pgServerUs, "µs")
		res.Figure(p+"wal_bytes_per_msg", s.walBytes, "B")
		res.Figure(p+"wal_server_bytes_per_msg", s.walServer, "B")
		if !math.IsNaN(s.walFPI) {
			res.Figure(p+"wal_fpi_bytes_per_msg", s.walFPI, "B")
		}
		if !math.IsNaN(s.hotShare) {
			res.Figure(p+"keys_hot_share", s.hotShare, "")
		}
		rels := make([]string, 0, len(s.walByRel))
		for rel := range s.walByRel {
			rels = append(rels, rel)
		}
		slices.Sort(rels)
		for _, rel := range rels {
			res.Figure(p+"wal_"+rel+"_bytes_per_msg", s.walByRel[rel], "B")
		}
		if FindVariant(v).relay != relayNone {
			res.Figure(p+"pg_relay_us_per_msg", s.pgRelayUs, "µs")
			res.Figure(p+"pending_growth", s.pendingUp, "rows")
			res.Figure(p+"pg_whole_us_per_msg", s.pgUs+s.pgRelayUs, "µs")
		}
		if !math.IsNaN(s.notifyPerTx) {
			res.Figure(p+"notifies_per_tx", s.notifyPerTx, "")
		}
		res.Figure(p+"errors", float64(s.errors), "")
		if v != variantClassic {
			res.Figure(p+"over_classic_tps", fratio(s.tps, base.tps), "×")
			res.Figure(p+"over_classic_commit_p99", fratio(s.commitP99, base.commitP99), "×")
		}
		if cr, ok := sums[variantClassicRelay]; ok && (v == variantOrdoSQLRelay || v == variantOrdoLeanRelay || v == variantAdoptedRelay) {
			// The like-for-like whole cost: both tables relayed meanwhile.
			res.Figure(p+"over_classic_relay_tps", fratio(s.tps, cr.tps), "×")
			res.Figure(p+"over_classic_relay_commit_p50", fratio(s.commitP50, cr.commitP50), "×")
			res.Figure(p+"over_classic_relay_commit_p99", fratio(s.commitP99, cr.commitP99), "×")
			res.Figure(p+"over_classic_relay_pg_whole", fratio(s.pgUs+s.pgRelayUs, cr.pgUs+cr.pgRelayUs), "×")
		}
		for _, n := range s.notes {
			res.Note("%s: %s", v, n)
		}
		if s.errors > 0 {
			res.Note("%s: %d transactions failed (the first are printed above)", v, s.errors)
		}
	}
	res.Finished = time.Now()
	return res
}

// printProduceTable prints every cell as the markdown table that
// docs/performance.md keeps.
func printProduceTable(w io.Writer, cells []*result.Result, variants []string) {
	fmt.Fprintln(w, "\n| rows/tx | producers | variant | tps | ÷ classic | commit p50 / p99 ms | p99 ÷ classic | PG µs/msg (backends / server) | WAL B/msg (of which page images) |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|")
	for _, c := range cells {
		var rows, producers any
		for _, p := range c.Params {
			switch p.Name {
			case "rows_per_tx":
				rows = p.Value
			case "producers":
				producers = p.Value
			}
		}
		for _, v := range variants {
			f := variantFigure(c, v)
			if math.IsNaN(f("tps")) {
				continue
			}
			tpsRatio, p99Ratio := "1.00×", "1.00×"
			if v != variantClassic {
				tpsRatio, p99Ratio = fmt.Sprintf("%.2f×", f("over_classic_tps")), fmt.Sprintf("%.2f×", f("over_classic_commit_p99"))
			}
			fmt.Fprintf(w, "| %v | %v | %s | %.0f | %s | %.2f / %.2f | %s | %.0f / %.0f | %.0f (%.0f) |\n",
				rows, producers, v, f("tps"), tpsRatio, f("commit_p50"), f("commit_p99"), p99Ratio,
				f("pg_us_per_msg"), f("pg_server_us_per_msg"), f("wal_bytes_per_msg"), f("wal_fpi_bytes_per_msg"))
		}
	}
}

// variantFigure returns a lookup of variant v's figures in cell c: NaN
// for a figure the cell does not have.
func variantFigure(c *result.Result, v string) func(name string) float64 {
	p := figureName(v) + "_"
	return func(name string) float64 {
		x, ok := c.Lookup(p + name)
		if !ok {
			return math.NaN()
		}
		return x
	}
}

// printRelayedTable prints, for cells with a relayed variant, the whole
// cost: the producers' and the relay's backends, the pending rows' growth
// and the notifications per commit.
func printRelayedTable(w io.Writer, cells []*result.Result, variants []string) {
	header := false
	for _, c := range cells {
		for _, v := range variants {
			f := variantFigure(c, v)
			if math.IsNaN(f("tps")) || FindVariant(v).relay == relayNone {
				continue
			}
			if !header {
				fmt.Fprintln(w, "\n| cell | variant | tps | commit p50 / p99 ms | PG µs/msg producers + relay = whole | pending rows growth | notifications/commit |")
				fmt.Fprintln(w, "|---|---|---|---|---|---|---|")
				header = true
			}
			fmt.Fprintf(w, "| %s | %s | %.0f | %.2f / %.2f | %.0f + %.0f = %.0f | %+.0f | %.2f |\n", c.Label, v, f("tps"),
				f("commit_p50"), f("commit_p99"), f("pg_us_per_msg"), f("pg_relay_us_per_msg"), f("pg_whole_us_per_msg"),
				f("pending_growth"), f("notifies_per_tx"))
		}
	}
}
