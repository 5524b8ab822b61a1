package nemesis

import (
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/ordo-relay/ordo/bench/internal/result"
	"github.com/ordo-relay/ordo/internal/testkit"
)

// problemCap caps the problems a historyVerdict lists (the counts are exact).
const problemCap = 30

// promise is a message the system owes: an order the order API answered
// 201 for (OrderPlaced) or a cancel it answered 200 for (OrderCancelled),
// matched by correlation id and type, or a row the bench committed itself
// (the recovery probes, the followers of poisoned rows), matched by id.
type promise struct {
	ID   string // message id; empty: match Key and Type
	Key  string
	Type string
	At   time.Time // when the answer (or the commit) came
}

// stepWindow is one nemesis step as it ran, for the attribution of
// duplicates and stale publishes: a delivery belongs to the step whose
// [Start, End) holds its arrival; the first window is the warm-up before
// any fault.
type stepWindow struct {
	Label string
	Kind  Kind
	Start time.Time
	End   time.Time // the next step's Start, or the end of the run
	// Quiet is when the step's fault window ends (its recovery plus
	// quietSlack); zero when it never recovered. Duplicates after it are
	// quiet duplicates.
	Quiet time.Time
	// Bound is the most stale publishes the step may cause: W for every
	// node it acts on (at least one).
	Bound int
}

// quietSlack extends a step's fault window past its measured recovery:
// confirms and marks of messages republished around the fault settle then.
const quietSlack = 2 * time.Second

// stepTally is what the checker attributes to one step.
type stepTally struct {
	Stale      int
	Duplicates int
	OverBound  bool
}

// historyVerdict is the history checker's finding.
type historyVerdict struct {
	Deliveries   int // every delivery recorded
	Distinct     int // distinct message ids
	Duplicates   int // deliveries of an id delivered before, not flagged redelivered: published again
	Redeliveries int // deliveries of an id delivered before, flagged redelivered: the broker gave the checker's own unacked delivery again
	Promised     int
	Lost         int // promises never delivered
	Reorders     int
	Gaps         int
	Stale        int // stale publishes, every step together
	OverBound    int // steps with more stale publishes than their bound
	// QuietDuplicates are duplicates outside every fault window (before
	// the first fault, or after a step's recovery + quietSlack).
	QuietDuplicates int
	Steps           []stepTally // by window
	Keys            int
	Problems        []string
}

// OK reports whether the history keeps Ordo's promises.
func (v historyVerdict) OK() bool {
	return v.Lost == 0 && v.Reorders == 0 && v.Gaps == 0 && v.OverBound == 0
}

func (v *historyVerdict) problem(format string, args ...any) {
	if len(v.Problems) < problemCap {
		v.Problems = append(v.Problems, fmt.Sprintf(format, args...))
	}
}

// checkHistory checks deliveries (in arrival order) against the promises,
// the rows skipped on purpose and the steps. Loss, duplicates,
// redeliveries, reorders and gaps (x-ordo-prev-key-seq included) are the
// test kit's History with the skips known (testkit.NewHistoryWithSkips
// states the rules); a promise with an id is expected by id, one without
// by correlation id and type. On top of it, per step:
//
//   - stale publish: a delivery (duplicates included, redeliveries not)
//     stamped with an x-ordo-epoch below one already delivered for its
//     partition: published by an owner after the first message of a
//     newer lease arrived. Counted per step; a step with more than its
//     Bound is over the bound;
//   - duplicates are attributed to the step whose window holds them, and
//     those outside every fault window are quiet.
//
// It needs nothing but the deliveries, the promises (what the order API
// and the bench were told was committed) and what the nemesis skipped.
func checkHistory(ds []testkit.Delivery, promises []promise, skipped []testkit.Skip, steps []stepWindow) historyVerdict {
	v := historyVerdict{Deliveries: len(ds), Steps: make([]stepTally, len(steps)), Promised: len(promises)}
	h := testkit.NewHistoryWithSkips(problemCap, skipped)
	at := map[string]time.Time{} // what LostIDs names -> when it was promised
	for _, p := range promises {
		if p.ID != "" {
			h.Expect(p.ID)
			at[p.ID] = p.At
		} else {
			h.ExpectEvent(p.Key, p.Type)
			at[p.Key+"/"+p.Type] = p.At
		}
	}
	epochs := map[int]int64{} // partition -> highest epoch delivered
	for _, d := range ds {
		w := windowOf(steps, d.Received)
		if !d.Redelivered {
			if e := epochs[d.Partition]; d.Epoch < e {
				v.Stale++
				if w >= 0 {
					v.Steps[w].Stale++
				}
			} else {
				epochs[d.Partition] = d.Epoch
			}
		}
		if h.Add(d) != testkit.Duplicate || w < 0 {
			continue
		}
		v.Steps[w].Duplicates++
		if q := steps[w].Quiet; w == 0 || (!q.IsZero() && !d.Received.Before(q)) {
			v.QuietDuplicates++
		}
	}
	r := h.Report()
	v.Distinct, v.Duplicates, v.Redeliveries, v.Keys = r.Distinct, r.Duplicates, r.Redeliveries, r.Keys
	v.Lost, v.Reorders, v.Gaps = r.Lost, r.Reorders, r.Gaps
	for _, id := range r.LostIDs {
		v.problem("lost: %s promised at %s never arrived", id, at[id].Format("15:04:05.000"))
	}
	for _, p := range r.Problems {
		v.problem("%s", p)
	}
	for i, st := range steps {
		if v.Steps[i].Stale > st.Bound {
			v.Steps[i].OverBound = true
			v.OverBound++
			v.problem("stale over bound: %s: %d stale publishes, bound %d", st.Label, v.Steps[i].Stale, st.Bound)
		}
	}
	return v
}

// windowOf returns the index of the window holding t, or -1.
func windowOf(steps []stepWindow, t time.Time) int {
	i := sort.Search(len(steps), func(i int) bool { return steps[i].Start.After(t) }) - 1
	if i < 0 || !t.Before(steps[i].End) {
		return -1
	}
	return i
}

// recoveryStat is the recovery of one kind's steps.
type recoveryStat struct {
	Kind     Kind
	N        int // steps that recovered
	Failed   int // steps that did not recover in time
	P50, Max time.Duration
}

// stepResult is one step as it ran.
type stepResult struct {
	Kind      Kind
	Recovered bool
	Recovery  time.Duration // from the heal to the recovery (see docs/reliability.md)
}

// recoveryStats groups results by kind (in the order of allKinds, then
// the consumer scenario's own kinds; kinds that did
// not run left out) and returns them with the p50 and max over every step.
func recoveryStats(results []stepResult) (byKind []recoveryStat, p50, worst time.Duration) {
	per := map[Kind][]time.Duration{}
	failed := map[Kind]int{}
	var all []time.Duration
	for _, r := range results {
		if !r.Recovered {
			failed[r.Kind]++
			continue
		}
		per[r.Kind] = append(per[r.Kind], r.Recovery)
		all = append(all, r.Recovery)
	}
	for _, k := range slices.Concat(allKinds, sourceKinds, consumerOnlyKinds) {
		ds := per[k]
		if len(ds) == 0 && failed[k] == 0 {
			continue
		}
		slices.Sort(ds)
		st := recoveryStat{Kind: k, N: len(ds), Failed: failed[k]}
		if len(ds) > 0 {
			st.P50, st.Max = result.Percentile(ds, 0.5), ds[len(ds)-1]
		}
		byKind = append(byKind, st)
	}
	slices.Sort(all)
	if len(all) > 0 {
		p50, worst = result.Percentile(all, 0.5), all[len(all)-1]
	}
	return byKind, p50, worst
}
