package partition

import (
	"cmp"
	"errors"
	"fmt"
	"slices"

	"github.com/ordo-relay/ordo/wire"
)

// ErrDuplicateSource is returned by AssignSources when two sources have
// the same name.
var ErrDuplicateSource = errors.New("duplicate source name")

// Source is one outbox database as the assignment sees it.
type Source struct {
	Name  string // wire.ValidateSource; wire.DefaultSource for the one-source form
	Count int    // its partition count, 1..MaxCount (stored in that database)
	// Without lists members left out of this source's draft only: the
	// members not eligible for it (cut off from its database, or not
	// configured with it). Names that are not members are ignored.
	Without []string
}

// Pair names one partition of one source.
type Pair struct {
	Source    string
	Partition int
}

// SourceAssignment says which member should own each partition of each
// source: the owner of partition p of source s is a[s][p] ("" for no
// owner). a[s].Owned(member) is what source s's lease.Config.Want returns.
// Like Assignment it is safe for concurrent reads.
type SourceAssignment map[string]Assignment

// Load returns how many pairs member owns, over all sources.
func (a SourceAssignment) Load(member string) int {
	n := 0
	for _, as := range a {
		n += len(as.Owned(member))
	}
	return n
}

// Diff returns the pairs whose owner differs between a and b, by source
// name then partition: the pairs that move when the cluster goes from a to
// b. A pair present in only one of them counts as moved.
func (a SourceAssignment) Diff(b SourceAssignment) []Pair {
	names := make([]string, 0, len(a)+len(b))
	for s := range a {
		names = append(names, s)
	}
	for s := range b {
		names = append(names, s)
	}
	slices.Sort(names)
	var out []Pair
	for _, s := range slices.Compact(names) {
		for _, p := range a[s].Diff(b[s]) {
			out = append(out, Pair{Source: s, Partition: p})
		}
	}
	return out
}

// AssignSources returns, for every partition of every source, the member
// that should own it: an assignment over (source, partition) pairs, each
// source with its own partition count. Every node calls it with the
// membership it sees and the sources it is configured with (the same on
// every node), and gets the same map.
//
// Guarantees:
//
//   - Compatible: with the one source wire.DefaultSource of P partitions,
//     the result is exactly Assign(members, P), so a one-source cluster
//     upgraded to a binary that calls AssignSources moves nothing.
//   - Deterministic: the result depends only on the set of member names
//     and the set of sources (order and duplicate members are ignored).
//     It is a pure function and safe for concurrent use.
//   - Balanced per source: with N members, every member owns ⌊P_s/N⌋ or
//     ⌈P_s/N⌉ partitions of each source s (N counting the members not in
//     s.Without; those own none of s).
//   - Balanced over all pairs: with T = ΣP_s, every member owns ⌊T/N⌋ or
//     ⌈T/N⌉ pairs, when no source leaves a member out.
//   - Isolated: a member left out of one source (Source.Without) moves no
//     pair of any other source.
//   - Near-minimal movement on a join or leave, as Assign (see
//     docs/assignment.md for the measured figures). Adding or removing a
//     source moves no pair of the sources drafted before it (the default
//     source first, then by name), and only a few of those after it.
//
// It returns an error wrapping ErrInvalidCount for a count outside
// 1..MaxCount, wire.ErrInvalidSource for a bad name, ErrDuplicateSource
// for a name given twice, and ErrEmptyMember for a member named "". No
// sources give an empty map; no members give every pair no owner.
//
// The rule, described in docs/assignment.md ("Many sources"), is part of
// the cluster protocol like Assign's; TestAssignSourcesGolden pins it.
func AssignSources(members []string, sources []Source) (SourceAssignment, error) {
	srcs, err := draftOrder(sources)
	if err != nil {
		return nil, fmt.Errorf("assign sources: %w", err)
	}
	ms, err := memberSet(members)
	if err != nil {
		return nil, fmt.Errorf("assign sources: %w", err)
	}
	out := make(SourceAssignment, len(srcs))
	extras := make(map[string]int, len(ms)) // places at q_s+1 each member got so far
	for _, s := range srcs {
		a := make(Assignment, s.Count)
		out[s.Name] = a
		draft := ms
		if len(s.Without) > 0 {
			draft = slices.DeleteFunc(slices.Clone(ms), func(m string) bool { return slices.Contains(s.Without, m) })
		}
		var d *assignDraft
		if len(draft) > 0 {
			d = newAssignDraft(draft, s.Count, sourceSuffix(s.Name))
			spreadExtras(d, draft, extras)
			for p, m := range d.run() {
				a[p] = draft[m]
			}
		}
		if len(draft) < len(ms) {
			// The extras the sources drafted after this one are spread
			// against are those of its draft over every member, as if
			// nobody were left out: a member cut off from this source
			// moves no pair of any other (TestAssignSourcesWithoutMovesNoOtherSource).
			// Counted from the draft without it, a member left out of
			// default lost or gained one of billing's extras.
			d = newAssignDraft(ms, s.Count, sourceSuffix(s.Name))
			spreadExtras(d, ms, extras)
			d.run()
			draft = ms
		}
		if d == nil {
			continue // no members
		}
		for m, l := range d.load {
			if l > d.q {
				extras[draft[m]]++
			}
		}
	}
	return out, nil
}

// draftOrder validates sources and returns them in the order they are
// drafted: wire.DefaultSource first, then by name.
func draftOrder(sources []Source) ([]Source, error) {
	srcs := slices.Clone(sources)
	for _, s := range srcs {
		if err := wire.ValidateSource(s.Name); err != nil {
			return nil, err
		}
		if err := ValidateCount(s.Count); err != nil {
			return nil, fmt.Errorf("source %s: %w", s.Name, err)
		}
	}
	notDefault := func(s Source) int {
		if s.Name == wire.DefaultSource {
			return 0
		}
		return 1
	}
	slices.SortFunc(srcs, func(a, b Source) int {
		return cmp.Or(cmp.Compare(notDefault(a), notDefault(b)), cmp.Compare(a.Name, b.Name))
	})
	for i := 1; i < len(srcs); i++ {
		if srcs[i].Name == srcs[i-1].Name {
			return nil, fmt.Errorf("source %s: %w", srcs[i].Name, ErrDuplicateSource)
		}
	}
	return srcs, nil
}

// sourceSuffix is what a source appends to the weight input after the
// partition: nothing for the default source (its weights are Assign's),
// utf8(name) followed by its length as one byte for any other, so that
// the input stays one-to-one per member.
func sourceSuffix(name string) []byte {
	if name == wire.DefaultSource {
		return nil
	}
	return append([]byte(name), byte(len(name)))
}

// spreadExtras sets d's caps so that the r extras of this source go to
// the members (of the draft, members) with the fewest extras so far
// (extras[name], which differ by at most one while no source leaves a
// member out): all of them to those members when r is at most their
// number k, else k to them and r-k to the others. The extras then stay
// within one of each other, and so do the members' total loads.
func spreadExtras(d *assignDraft, members []string, extras map[string]int) {
	low := extras[members[0]]
	for _, m := range members {
		low = min(low, extras[m])
	}
	d.high = make([]bool, len(members))
	k := 0
	for i, m := range members {
		d.high[i] = extras[m] > low
		if !d.high[i] {
			k++
		}
	}
	d.lowCap = min(d.r, k)
	d.highCap = d.r - d.lowCap
}
