package nemesis

import (
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ordo-relay/ordo/bench/internal/result"
)

// report prints the steps, the recovery by kind and the checker's
// findings, writes the JSON result, and prints the RESULT line last. It
// reports whether the history passed.
func (n *nemesis) report(v historyVerdict) bool {
	w := os.Stdout
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "\nstep\tfault\trecovery\tstale\tduplicates\tother source relayed")
	for _, s := range n.steps {
		rec := "NOT RECOVERED"
		if s.recovered {
			rec = fmt.Sprintf("%.2fs", s.recovery.Seconds())
		}
		t := v.Steps[s.window]
		over := ""
		if t.OverBound {
			over = " OVER BOUND"
		}
		relayed := ""
		if n.windows[s.window].Isolation != nil {
			relayed = fmt.Sprint(t.Relayed)
			if t.Stalled {
				relayed += " STALLED"
			}
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d%s\t%d\t%s\n", s.N, s.desc, rec, t.Stale, over, t.Duplicates, relayed)
	}
	_ = tw.Flush()
	byKind, p50, worst := recoveryStats(n.results)
	printRecovery(w, byKind)
	st := n.load.stats()
	fmt.Fprintf(w, "\nload: %d orders placed, %d cancelled (promised); %d answered otherwise, %d without an answer\n",
		st.placed, st.canceled, st.failed, st.errored)
	fmt.Fprintf(w, "history: %d deliveries, %d distinct, %d keys, %d promised; %d duplicates (%.3f%%, %d outside the fault windows), %d redeliveries to the checker\n",
		v.Deliveries, v.Distinct, v.Keys, v.Promised, v.Duplicates, ratio(v.Duplicates, v.Distinct)*100, v.QuietDuplicates, v.Redeliveries)
	printSources(w, v.Sources)
	fmt.Fprintf(w, "stale publishes: %d in all; bound W=%d per node a step acts on; %d steps over it\n", v.Stale, n.o.ConfirmWindow, v.OverBound)
	if u := n.f.gossip.unknownStreams(); u > 0 {
		fmt.Fprintf(w, "gossip: %d streams refused during splits for want of a known sender\n", u)
	}
	for _, p := range v.Problems {
		fmt.Fprintf(w, "  %s\n", p)
	}
	res := n.result(v, byKind, p50, worst)
	if path, err := res.WriteJSON(n.o.Out); err != nil {
		fmt.Fprintf(os.Stderr, "bench: nemesis: %v\n", err)
	} else {
		fmt.Fprintf(w, "results written to %s\n", path)
	}
	if !v.OK() {
		fmt.Fprintf(w, "!!! NEMESIS FAILED: lost=%d reorders=%d gaps=%d stale_over_bound=%d isolation_failures=%d foreign=%d\n",
			v.Lost, v.Reorders, v.Gaps, v.OverBound, v.Isolation, v.Foreign)
	}
	fmt.Fprintln(w, nemesisLine(n.o.Profile, len(n.dbs), n.seed, v, p50, worst))
	return v.OK()
}

// printRecovery prints the recovery of each kind.
func printRecovery(w io.Writer, byKind []recoveryStat) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "\nkind\tsteps\trecovery p50\tmax\tnot recovered")
	for _, k := range byKind {
		fmt.Fprintf(tw, "%s\t%d\t%.2fs\t%.2fs\t%d\n", k.Kind, k.N, k.P50.Seconds(), k.Max.Seconds(), k.Failed)
	}
	_ = tw.Flush()
}

// printSources prints the checker's counts per source.
func printSources(w io.Writer, ts []sourceTally) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "\nsource\tdeliveries\tdistinct\tkeys\tpromised\tlost\treorders\tgaps\tstale\tduplicates")
	for _, t := range ts {
		name := t.Name
		if t.Foreign {
			name += " (FOREIGN)"
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\n", name, t.Deliveries, t.Distinct, t.Keys, t.Promised,
			t.Lost, t.Reorders, t.Gaps, t.Stale, t.Duplicates)
	}
	_ = tw.Flush()
}

// nemesisLine is the run's last line.
func nemesisLine(profile string, sources int, seed int64, v historyVerdict, p50, worst time.Duration) string {
	return fmt.Sprintf("RESULT scenario=nemesis profile=%s sources=%d seed=%d lost=%d reorders=%d gaps=%d stale_over_bound=%d isolation_failures=%d stale_publishes=%d duplicates=%d recovery_p50_s=%.2f recovery_max_s=%.2f",
		profile, sources, seed, v.Lost, v.Reorders, v.Gaps, v.OverBound, v.Isolation, v.Stale, v.Duplicates, p50.Seconds(), worst.Seconds())
}

func ratio(a, b int) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// result is the run as a Result, for the JSON file.
func (n *nemesis) result(v historyVerdict, byKind []recoveryStat, p50, worst time.Duration) *result.Result {
	res := &result.Result{Scenario: "nemesis", Started: n.start, Finished: time.Now()}
	res.Param("profile", n.o.Profile)
	res.Param("seed", n.seed)
	res.Param("nodes", nemesisNodes)
	res.Param("sources", len(n.dbs))
	res.Param("rate", n.o.rateOr(nemesisRate))
	res.Param("confirm_window", n.o.ConfirmWindow)
	res.Param("lease_ttl", nemesisTTL)
	var skipped []string
	for _, k := range n.o.scenarioKinds() {
		if n.srv.can(k) != "" {
			skipped = append(skipped, string(k))
		}
	}
	res.Param("skipped_kinds", strings.Join(skipped, ","))
	res.Figure("steps", float64(len(n.steps)), "")
	res.Figure("stale_publishes", float64(v.Stale), "")
	res.Figure("stale_over_bound", float64(v.OverBound), "")
	res.Figure("isolation_failures", float64(v.Isolation), "")
	for _, t := range v.Sources {
		res.Figure("lost_"+t.Name, float64(t.Lost), "")
		res.Figure("reorders_"+t.Name, float64(t.Reorders), "")
		res.Figure("gaps_"+t.Name, float64(t.Gaps), "")
		res.Figure("duplicates_"+t.Name, float64(t.Duplicates), "")
	}
	res.Figure("duplicates_quiet", float64(v.QuietDuplicates), "")
	res.Figure("redeliveries", float64(v.Redeliveries), "")
	res.Figure("duplicate_ratio", ratio(v.Duplicates, v.Distinct), "")
	res.Seconds("recovery_p50", p50)
	res.Seconds("recovery_max", worst)
	for _, k := range byKind {
		res.Seconds("recovery_"+string(k.Kind)+"_p50", k.P50)
		res.Seconds("recovery_"+string(k.Kind)+"_max", k.Max)
		res.Figure("not_recovered_"+string(k.Kind), float64(k.Failed), "")
	}
	res.Check = result.Check{Total: v.Deliveries, Distinct: v.Distinct, Duplicates: v.Duplicates, Lost: v.Lost,
		Reorders: v.Reorders, Gaps: v.Gaps, Keys: v.Keys, Problems: v.Problems}
	for i, s := range n.steps {
		res.Note("step %d: %s: recovered=%v in %.2fs, stale %d, duplicates %d", s.N, s.desc, s.recovered,
			s.recovery.Seconds(), v.Steps[n.steps[i].window].Stale, v.Steps[n.steps[i].window].Duplicates)
	}
	return res
}
