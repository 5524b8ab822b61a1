package nemesis

import (
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/ordo-relay/ordo/bench/internal/result"
	"github.com/ordo-relay/ordo/internal/ordercheck"
)

// problemCap caps the problems a historyVerdict lists (the counts are exact).
const problemCap = 30

// promise is a message the system owes: an order the order API answered
// 201 for (OrderPlaced) or a cancel it answered 200 for (OrderCancelled),
// matched by source, correlation id and type, or a row the bench committed
// itself (the recovery probes, the followers of poisoned rows), matched by
// source and id. Source is the database it was committed to: the
// delivery must say that source (x-ordo-source).
type promise struct {
	Source string
	ID     string // message id; empty: match Key and Type
	Key    string
	Type   string
	At     time.Time // when the answer (or the commit) came
}

// skip is a row the nemesis skipped on purpose, in its source.
type skip struct {
	Source string
	ordercheck.Skip
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
	// Isolation, for a source-link step, is what it must show.
	Isolation *isolationCheck
}

// isolationCheck is what a source-link step must show: the other source
// kept relaying on the node cut off from one source. When the link was
// cut the node held, of source Source, the partitions in Held (partition
// -> lease epoch); some delivery of Source on one of them stamped with
// that epoch (published under the cut node's lease, which no other node
// can hold) must arrive in [From, To): from sourceLinkWatchFrom after the
// cut (the cut source's leases on the node have lapsed, and a node that
// stepped aside for every source has handed the other one off) to the
// heal.
//
// And at the heal the node must still hold every one of those leases at
// its epoch (Kept, read from the source's ordo_leases: -1 when the read
// failed, which judges nothing).
type isolationCheck struct {
	Node     string
	Source   string
	Held     map[int]int64
	From, To time.Time
	Kept     int
}

// holds reports whether d is one of the deliveries c looks for.
func (c *isolationCheck) holds(d delivery) bool {
	e, ok := c.Held[d.Partition]
	return ok && d.Source == c.Source && d.Epoch == e && !d.Received.Before(c.From) && d.Received.Before(c.To)
}

// quietSlack extends a step's fault window past its measured recovery:
// confirms and marks of messages republished around the fault settle then.
const quietSlack = 2 * time.Second

// stepTally is what the checker attributes to one step.
type stepTally struct {
	Stale      int
	Duplicates int
	OverBound  bool
	// Relayed counts, for a source-link step, the deliveries its
	// isolationCheck looks for; Stalled is set when there are none.
	Relayed int
	Stalled bool
}

// sourceTally is the checker's finding for one source.
type sourceTally struct {
	Name                                   string
	Foreign                                bool // a source the run does not have (a node's mistake)
	Deliveries, Distinct, Duplicates, Keys int
	Promised, Lost, Reorders, Gaps, Stale  int
	Redeliveries                           int
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
	Isolation    int // source-link steps whose other source was not seen relaying on the cut node
	Foreign      int // deliveries naming a source the run does not have
	// QuietDuplicates are duplicates outside every fault window (before
	// the first fault, or after a step's recovery + quietSlack).
	QuietDuplicates int
	Steps           []stepTally   // by window
	Sources         []sourceTally // the run's sources in order, then any foreign one
	Keys            int
	Problems        []string
}

// OK reports whether the history keeps Ordo's promises.
func (v historyVerdict) OK() bool {
	return v.Lost == 0 && v.Reorders == 0 && v.Gaps == 0 && v.OverBound == 0 && v.Isolation == 0 && v.Foreign == 0
}

func (v *historyVerdict) problem(format string, args ...any) {
	if len(v.Problems) < problemCap {
		v.Problems = append(v.Problems, fmt.Sprintf(format, args...))
	}
}

// sourceCheck is one source's order checker and the names of its lost
// promises' times.
type sourceCheck struct {
	h     *ordercheck.History
	at    map[string]time.Time // what LostIDs names -> when it was promised
	t     sourceTally
	seqID map[seqOfKey]string // (key, key_seq) -> the message id first delivered with it
}

type seqOfKey struct {
	key string
	seq int64
}

func newSourceCheck(name string, foreign bool, skips []ordercheck.Skip) *sourceCheck {
	return &sourceCheck{h: ordercheck.NewHistoryWithSkips(problemCap, skips), at: map[string]time.Time{},
		t: sourceTally{Name: name, Foreign: foreign}, seqID: map[seqOfKey]string{}}
}

// add gives d to the source's History and returns what it was to it. A
// first delivery whose (key, key_seq) came before with another message id
// is a gap on top of the History's rules: a consumer that keeps one
// number per key drops it as applied already (two sources' rows under one
// name, or a key_seq counted twice).
func (c *sourceCheck) add(d delivery, v *historyVerdict) ordercheck.Arrival {
	a := c.h.Add(d.Delivery)
	if a != ordercheck.First {
		return a
	}
	k := seqOfKey{d.CorrelationID, d.KeySeq}
	if id, ok := c.seqID[k]; ok {
		c.t.Gaps++
		v.Gaps++
		v.problem("%s: gap: key %q key_seq %d arrived as two messages, %s and %s", c.t.Name, d.CorrelationID, d.KeySeq, id, d.MessageID)
	} else {
		c.seqID[k] = d.MessageID
	}
	return a
}

// sourceChecks returns a checker per source of sources, each expecting
// its own promises and knowing its own skips.
func sourceChecks(sources []string, promises []promise, skipped []skip) map[string]*sourceCheck {
	cs := map[string]*sourceCheck{}
	for _, name := range sources {
		var sk []ordercheck.Skip
		for _, s := range skipped {
			if s.Source == name {
				sk = append(sk, s.Skip)
			}
		}
		cs[name] = newSourceCheck(name, false, sk)
	}
	for _, p := range promises {
		c := cs[p.Source]
		if c == nil {
			c = newSourceCheck(p.Source, true, nil)
			cs[p.Source] = c
		}
		c.t.Promised++
		if p.ID != "" {
			c.h.Expect(p.ID)
			c.at[p.ID] = p.At
		} else {
			c.h.ExpectEvent(p.Key, p.Type)
			c.at[p.Key+"/"+p.Type] = p.At
		}
	}
	return cs
}

// checkHistory checks deliveries (in arrival order) against the promises,
// the rows skipped on purpose and the steps, per source: each of sources
// (the run's, in order) has its own order checker, since key_seq counts
// per (source, key) and message ids and partitions are per source. Loss,
// duplicates, redeliveries, reorders and gaps (x-ordo-prev-key-seq
// included) are the test kit's History with the source's skips known
// (ordercheck.NewHistoryWithSkips states the rules); a promise with an id is
// expected by id, one without by correlation id and type, each in its
// source's checker: a message delivered under another source's name is
// lost from its own. On top of it:
//
//   - stale publish: a delivery (duplicates included, redeliveries not)
//     stamped with an x-ordo-epoch below one already delivered for its
//     (source, partition): published by an owner after the first message
//     of a newer lease arrived. Counted per step; a step with more than
//     its Bound is over the bound;
//   - duplicates are attributed to the step whose window holds them, and
//     those outside every fault window are quiet;
//   - a first delivery whose (source, key, key_seq) arrived before under
//     another message id is a gap (sourceCheck.add);
//   - a source-link step's isolationCheck must find a delivery;
//   - a delivery naming a source the run does not have is foreign.
//
// It needs nothing but the deliveries, the promises (what the order API
// and the bench were told was committed) and what the nemesis skipped.
func checkHistory(ds []delivery, promises []promise, skipped []skip, steps []stepWindow, sources []string) historyVerdict {
	v := historyVerdict{Deliveries: len(ds), Steps: make([]stepTally, len(steps)), Promised: len(promises)}
	cs := sourceChecks(sources, promises, skipped)
	epochs := map[[2]any]int64{} // (source, partition) -> highest epoch delivered
	for _, d := range ds {
		c := cs[d.Source]
		if c == nil {
			c = newSourceCheck(d.Source, true, nil)
			cs[d.Source] = c
		}
		w := windowOf(steps, d.Received)
		if !d.Redelivered {
			sp := [2]any{d.Source, d.Partition}
			if e := epochs[sp]; d.Epoch < e {
				v.Stale++
				c.t.Stale++
				if w >= 0 {
					v.Steps[w].Stale++
				}
			} else {
				epochs[sp] = d.Epoch
			}
			if w >= 0 && steps[w].Isolation != nil && steps[w].Isolation.holds(d) {
				v.Steps[w].Relayed++
			}
		}
		if c.add(d, &v) != ordercheck.Duplicate || w < 0 {
			continue
		}
		v.Steps[w].Duplicates++
		if q := steps[w].Quiet; w == 0 || (!q.IsZero() && !d.Received.Before(q)) {
			v.QuietDuplicates++
		}
	}
	v.addSources(cs, sources)
	v.judgeSteps(steps)
	return v
}

// addSources adds each source's report to v, the run's sources first.
func (v *historyVerdict) addSources(cs map[string]*sourceCheck, sources []string) {
	names := slices.Clone(sources)
	var foreign []string
	for name := range cs {
		if !slices.Contains(sources, name) {
			foreign = append(foreign, name)
		}
	}
	slices.Sort(foreign)
	for _, name := range append(names, foreign...) {
		c := cs[name]
		r := c.h.Report()
		t := c.t
		t.Deliveries, t.Distinct, t.Duplicates, t.Redeliveries, t.Keys = r.Total, r.Distinct, r.Duplicates, r.Redeliveries, r.Keys
		t.Lost, t.Reorders, t.Gaps = r.Lost, r.Reorders, t.Gaps+r.Gaps
		v.Sources = append(v.Sources, t)
		v.Distinct += r.Distinct
		v.Duplicates += r.Duplicates
		v.Redeliveries += r.Redeliveries
		v.Keys += r.Keys
		v.Lost += r.Lost
		v.Reorders += r.Reorders
		v.Gaps += r.Gaps
		if t.Foreign && r.Total > 0 {
			v.Foreign += r.Total
			v.problem("foreign source: %d deliveries name the source %s, which the run does not have", r.Total, name)
		}
		for _, id := range r.LostIDs {
			v.problem("lost: %s: %s promised at %s never arrived", name, id, c.at[id].Format("15:04:05.000"))
		}
		for _, p := range r.Problems {
			v.problem("%s: %s", name, p)
		}
	}
}

// judgeSteps marks the steps over their bound of stale publishes and the
// source-link steps whose other source was not seen relaying.
func (v *historyVerdict) judgeSteps(steps []stepWindow) {
	for i, st := range steps {
		if v.Steps[i].Stale > st.Bound {
			v.Steps[i].OverBound = true
			v.OverBound++
			v.problem("stale over bound: %s: %d stale publishes, bound %d", st.Label, v.Steps[i].Stale, st.Bound)
		}
		c := st.Isolation
		if c == nil {
			continue
		}
		if v.Steps[i].Relayed == 0 {
			v.problem("isolation: %s: no message of %s on the %d partitions %s held, under its lease, from %s to %s",
				st.Label, c.Source, len(c.Held), c.Node, c.From.Format("15:04:05.000"), c.To.Format("15:04:05.000"))
		} else if c.Kept >= 0 && c.Kept < len(c.Held) {
			v.problem("isolation: %s: at the heal %s held %d of the %d leases of %s it held at the cut", st.Label, c.Node, c.Kept, len(c.Held), c.Source)
		} else {
			continue
		}
		v.Steps[i].Stalled = true
		v.Isolation++
	}
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
// sourceKinds, then the consumer scenario's own kinds; kinds that did
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
