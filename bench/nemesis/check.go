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

// skipKey is a row skipped on purpose (by the nemesis, through the
// operator CLI): a key_seq that is never delivered.
type skipKey struct {
	Key    string
	KeySeq int64
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

// keyHistory is one correlation id's deliveries so far.
type keyHistory struct {
	last      int64 // highest key_seq delivered
	delivered map[int64]bool
}

// checkHistory checks deliveries (in arrival order) against the promises,
// the rows skipped on purpose and the steps, by these rules, over first
// deliveries (the first of each message id) unless said otherwise:
//
//   - lost: a promise whose message never arrived;
//   - duplicate: a delivery of a message id delivered before, not flagged
//     redelivered (a redelivered one is the broker handing the checker's
//     own unacknowledged delivery back after its connection dropped);
//   - reorder: a key_seq below the highest already delivered for its key;
//   - gap: a key_seq at or below the highest delivered for its key that
//     never arrived and was not skipped on purpose; and a delivery whose
//     x-ordo-prev-key-seq is not the highest key_seq below it that was not
//     skipped on purpose (a consumer would wait for a message that never
//     comes, or take a skip that did not happen);
//   - stale publish: a delivery (duplicates included, redeliveries not)
//     stamped with an x-ordo-epoch below one already delivered for its
//     partition: published by an owner after the first message of a
//     newer lease arrived. Counted per step; a step with more than its
//     Bound is over the bound.
//
// It needs nothing but the deliveries, the promises (what the order API
// and the bench were told was committed) and what the nemesis skipped.
func checkHistory(ds []testkit.Delivery, promises []promise, skipped []skipKey, steps []stepWindow) historyVerdict {
	v := historyVerdict{Deliveries: len(ds), Steps: make([]stepTally, len(steps)), Promised: len(promises)}
	skip := map[string][]int64{} // key -> skipped key_seqs, ascending
	for _, s := range skipped {
		skip[s.Key] = append(skip[s.Key], s.KeySeq)
	}
	for _, s := range skip {
		slices.Sort(s)
	}
	seen := map[string]bool{}
	byKeyType := map[[2]string]bool{}
	keys := map[string]*keyHistory{}
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
		if seen[d.MessageID] {
			if d.Redelivered {
				v.Redeliveries++
				continue
			}
			v.Duplicates++
			if w >= 0 {
				v.Steps[w].Duplicates++
				if q := steps[w].Quiet; w == 0 || (!q.IsZero() && !d.Received.Before(q)) {
					v.QuietDuplicates++
				}
			}
			continue
		}
		seen[d.MessageID] = true
		byKeyType[[2]string{d.CorrelationID, d.Type}] = true
		v.Distinct++
		v.checkOrder(keys, skip, d)
	}
	v.Keys = len(keys)
	v.endGaps(keys, skip)
	for _, p := range promises {
		if (p.ID != "" && !seen[p.ID]) || (p.ID == "" && !byKeyType[[2]string{p.Key, p.Type}]) {
			v.Lost++
			v.problem("lost: key %s type %s id %q promised at %s never arrived", p.Key, p.Type, p.ID, p.At.Format("15:04:05.000"))
		}
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

// checkOrder checks one first delivery against its key's history.
func (v *historyVerdict) checkOrder(keys map[string]*keyHistory, skip map[string][]int64, d testkit.Delivery) {
	k := keys[d.CorrelationID]
	if k == nil {
		k = &keyHistory{delivered: map[int64]bool{}}
		keys[d.CorrelationID] = k
	}
	if d.KeySeq < k.last {
		v.Reorders++
		v.problem("reorder: key %s key_seq %d (message %s) arrived after key_seq %d", d.CorrelationID, d.KeySeq, d.MessageID, k.last)
	}
	if want := prevNotSkipped(skip[d.CorrelationID], d.KeySeq); !d.HasPrevKeySeq || d.PrevKeySeq != want {
		v.Gaps++
		v.problem("gap: key %s key_seq %d (message %s) says x-ordo-prev-key-seq %d (present %v), want %d",
			d.CorrelationID, d.KeySeq, d.MessageID, d.PrevKeySeq, d.HasPrevKeySeq, want)
	}
	k.delivered[d.KeySeq] = true
	k.last = max(k.last, d.KeySeq)
}

// endGaps counts every key_seq at or below its key's highest delivered one
// that never arrived and was not skipped on purpose.
func (v *historyVerdict) endGaps(keys map[string]*keyHistory, skip map[string][]int64) {
	names := make([]string, 0, len(keys))
	for name := range keys {
		names = append(names, name)
	}
	sort.Strings(names) // problems in a stable order
	for _, name := range names {
		k := keys[name]
		for s := int64(1); s < k.last; s++ {
			if !k.delivered[s] && !slices.Contains(skip[name], s) {
				v.Gaps++
				v.problem("gap: key %s key_seq %d never arrived (key_seq %d did)", name, s, k.last)
			}
		}
	}
}

// prevNotSkipped returns the highest key_seq below keySeq that is not in
// skipped (ascending), or 0: what x-ordo-prev-key-seq must say.
func prevNotSkipped(skipped []int64, keySeq int64) int64 {
	prev := keySeq - 1
	for i := len(skipped) - 1; i >= 0 && prev > 0; i-- {
		switch {
		case skipped[i] > prev:
			continue
		case skipped[i] == prev:
			prev--
		default:
			return prev
		}
	}
	return prev
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
	for _, k := range append(slices.Clone(allKinds), consumerOnlyKinds...) {
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
