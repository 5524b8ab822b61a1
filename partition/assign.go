package partition

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/cespare/xxhash/v2"
)

// ErrEmptyMember is returned by Assign when the member list contains the
// empty string, which Assignment reserves for "no owner".
var ErrEmptyMember = errors.New("empty member name")

// Assignment says which member should own each partition: the owner of
// partition p is Assignment[p], and "" means no owner (the member list was
// empty). It is the desired state computed from gossip; which node actually
// holds a partition is decided by its lease in PostgreSQL.
//
// An Assignment is a plain slice: it is safe for concurrent reads, and its
// methods do not modify it.
type Assignment []string

// Owned returns the partitions assigned to member, in ascending order, or
// nil if it owns none. It is the shape lease.Config.Want expects.
func (a Assignment) Owned(member string) []int {
	var ps []int
	for p, m := range a {
		if m == member && m != "" {
			ps = append(ps, p)
		}
	}
	return ps
}

// Diff returns, in ascending order, the partitions whose owner differs
// between a and b: the partitions that move when the cluster goes from a to
// b. A partition present in only one of them (different counts) counts as
// moved.
func (a Assignment) Diff(b Assignment) []int {
	var ps []int
	for p := range max(len(a), len(b)) {
		if p >= len(a) || p >= len(b) || a[p] != b[p] {
			ps = append(ps, p)
		}
	}
	return ps
}

// Assign returns, for partitions 0..count-1, the member that should own
// each. Every node calls it with the membership it sees and gets the same
// map from the same member set.
//
// Guarantees:
//
//   - Deterministic: the result depends only on the set of names in members
//     (order and duplicates are ignored) and on count; not on time,
//     randomness or map iteration order. It is a pure function and safe for
//     concurrent use.
//   - Balanced: with N distinct members and P = count, every member owns
//     ⌊P/N⌋ or ⌈P/N⌉ partitions; when N > P, P members own one each.
//   - Near-minimal movement: when one member joins or leaves, few partitions
//     change owner besides the ones the joining member must gain or the
//     leaving member must hand over; docs/assignment.md has the measured
//     figures.
//
// An empty member list gives count empty owners and no error. Assign
// returns an error wrapping ErrInvalidCount if count is outside 1..MaxCount
// and one wrapping ErrEmptyMember if a member name is "".
//
// The algorithm (a round-based draft over per-member rendezvous rankings,
// described in docs/assignment.md) is part of the cluster protocol: nodes
// that compute different maps fight over partitions until they agree, so a
// change to it must ship to all nodes at once. TestAssignGolden pins it.
func Assign(members []string, count int) (Assignment, error) {
	if err := ValidateCount(count); err != nil {
		return nil, fmt.Errorf("assign: %w", err)
	}
	ms, err := memberSet(members)
	if err != nil {
		return nil, fmt.Errorf("assign: %w", err)
	}
	out := make(Assignment, count)
	if len(ms) == 0 {
		return out, nil
	}
	d := newAssignDraft(ms, count, nil)
	d.lowCap = d.r
	for p, m := range d.run() {
		out[p] = ms[m]
	}
	return out, nil
}

// memberSet returns the distinct names of members, sorted, or
// ErrEmptyMember if one is "".
func memberSet(members []string) ([]string, error) {
	ms := slices.Clone(members)
	slices.Sort(ms)
	ms = slices.Compact(ms)
	if len(ms) > 0 && ms[0] == "" {
		return nil, ErrEmptyMember
	}
	return ms, nil
}

// assignChoice is one entry of a member's preference list.
type assignChoice struct {
	weight    uint64
	partition int
}

// assignDraft holds the state of one Assign computation.
type assignDraft struct {
	n, count int
	// prefs[m] lists every partition by member m's descending weight:
	// prefs[m][k] is m's k-th choice.
	prefs [][]assignChoice
	// q and r: every member may own q partitions, and r of them q+1.
	q, r int
	// load[m] is the number of partitions member m owns so far.
	load []int
	// The r places at q+1 (the "extras") go to the first members to reach
	// q+1, at most lowCap of them among the members not in high and at
	// most highCap among those in high; bigLow and bigHigh count them.
	// lowCap+highCap = r. Assign has high nil and lowCap r; AssignSources
	// uses high to spread the extras of many sources evenly.
	high            []bool
	lowCap, highCap int
	bigLow, bigHigh int
}

// newAssignDraft prepares a draft of count partitions over members, with
// the weights assignWeight gives for suffix (nil for Assign's weights).
// The caller sets lowCap (and high, highCap) before run.
func newAssignDraft(members []string, count int, suffix []byte) *assignDraft {
	n := len(members)
	d := &assignDraft{
		n:     n,
		count: count,
		prefs: make([][]assignChoice, n),
		q:     count / n,
		r:     count % n,
		load:  make([]int, n),
	}
	all := make([]assignChoice, n*count)
	for m, name := range members {
		pref := all[m*count : (m+1)*count : (m+1)*count]
		buf := make([]byte, len(name)+4, len(name)+4+len(suffix))
		copy(buf, name)
		buf = append(buf, suffix...)
		for p := range pref {
			pref[p] = assignChoice{weight: assignWeight(buf, len(name), p), partition: p}
		}
		slices.SortFunc(pref, func(a, b assignChoice) int {
			if c := cmp.Compare(b.weight, a.weight); c != 0 {
				return c
			}
			return cmp.Compare(a.partition, b.partition)
		})
		d.prefs[m] = pref
	}
	return d
}

// assignWeight is the rendezvous weight of member and partition p:
// XXH64(seed 0) of utf8(member) followed by p as 4 little-endian bytes,
// followed by the source suffix of AssignSources, if any. buf holds the
// member's bytes, 4 spare bytes at offset at, which it overwrites, and the
// suffix. The fixed-width p keeps (member, p) -> input one-to-one for one
// suffix.
func assignWeight(buf []byte, at, p int) uint64 {
	binary.LittleEndian.PutUint32(buf[at:at+4], uint32(p))
	return xxhash.Sum64(buf)
}

// room reports whether member m may take one more partition: anyone below
// q may, and a member at q may while its group (high or not) has extras
// left.
func (d *assignDraft) room(m int) bool {
	switch {
	case d.load[m] < d.q:
		return true
	case d.load[m] > d.q:
		return false
	case d.high != nil && d.high[m]:
		return d.bigHigh < d.highCap
	}
	return d.bigLow < d.lowCap
}

// take gives member m one more partition.
func (d *assignDraft) take(m int) {
	if d.load[m] == d.q {
		if d.high != nil && d.high[m] {
			d.bigHigh++
		} else {
			d.bigLow++
		}
	}
	d.load[m]++
}

// run performs the draft and returns the owner index of every partition.
//
// In round k every member that still has room claims its k-th choice if
// nobody owns it yet; a member whose k-th choice is taken does not look
// further down its list in that round. Within a round, claims are settled
// in descending weight of the claimed pair (ties by member index, i.e.
// name). Every partition is owned after at most count rounds: a partition
// left over would mean every member refused it for want of room, that is
// every member full, and full members own exactly count partitions.
func (d *assignDraft) run() []int {
	owner := make([]int, d.count)
	for p := range owner {
		owner[p] = -1
	}
	active := make([]int, d.n) // members with room, in index order
	for m := range active {
		active[m] = m
	}
	claims := make([]int, 0, d.n)
	left := d.count
	for k := 0; left > 0 && k < d.count; k++ {
		claims = claims[:0]
		for _, m := range active {
			if owner[d.prefs[m][k].partition] < 0 {
				claims = append(claims, m)
			}
		}
		slices.SortFunc(claims, func(a, b int) int {
			if c := cmp.Compare(d.prefs[b][k].weight, d.prefs[a][k].weight); c != 0 {
				return c
			}
			return cmp.Compare(a, b)
		})
		for _, m := range claims {
			p := d.prefs[m][k].partition
			if owner[p] >= 0 || !d.room(m) {
				continue
			}
			d.take(m)
			owner[p] = m
			left--
		}
		active = slices.DeleteFunc(active, func(m int) bool { return !d.room(m) })
	}
	if left > 0 {
		// Unreachable (see above); fail loudly rather than hand out a
		// partial map that nodes would act on.
		panic(fmt.Sprintf("partition: draft left %d of %d partitions unowned", left, d.count))
	}
	return owner
}
