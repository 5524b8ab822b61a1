package ordercheck

import (
	"errors"
	"fmt"
	"slices"
	"sort"
)

// History is the one order checker of the repository: tests (through
// Checker), the bench and the nemesis feed it deliveries and read a Report
// by the rules of docs/design.md, "Ordering, precisely". Over first
// deliveries (the first of each message id), with last the highest key_seq
// delivered so far for the key (0 initially):
//
//   - a delivery of a message id delivered before is a redelivery when the
//     broker flagged it redelivered (it handed the checker's own
//     unacknowledged delivery back) and a duplicate (published again)
//     otherwise, and nothing else;
//   - key_seq < last is a reorder;
//   - x-ordo-prev-key-seq must say which message comes before. When the
//     skips are not known (NewHistory), it must equal last (every key_seq
//     between was skipped on purpose, as the header claims), and without
//     the header key_seq must be last+1. When they are known
//     (NewHistoryWithSkips), the header is required and must equal the
//     highest key_seq below this one not skipped, and at the end every
//     key_seq below a key's last that never arrived and was not skipped is
//     a gap too. Either way a mismatch is a gap;
//   - an expected message (Expect, ExpectEvent) never delivered is lost.
//
// A History is not safe for concurrent use (Checker adds the lock) and
// owns no goroutines.
type History struct {
	skipsKnown bool
	skips      map[string][]int64 // correlation id -> skipped key_seqs, ascending
	listCap    int

	seen     map[string]bool
	events   map[[2]string]bool // (correlation id, type) of first deliveries
	keys     map[string]*keyHistory
	expected []expectation
	expSet   map[expectation]bool
	pending  int // expected messages not delivered yet
	report   Report
}

// keyHistory is one correlation id's first deliveries so far.
type keyHistory struct {
	last      int64          // highest key_seq delivered
	delivered map[int64]bool // only kept when the skips are known
}

// expectation is a message that must arrive: by id, or (id empty) by
// correlation id and type.
type expectation struct{ id, key, typ string }

func (e expectation) String() string {
	if e.id != "" {
		return e.id
	}
	return e.key + "/" + e.typ
}

// Arrival says what a delivery was to a History.
type Arrival int

// The kinds of Arrival.
const (
	First      Arrival = iota // the first delivery of its message id
	Duplicate                 // its message id was delivered before, and it is not flagged redelivered
	Redelivery                // its message id was delivered before, and the broker flagged it redelivered
)

// reportListCap is the default cap of Report.LostIDs and Report.Problems.
const reportListCap = 20

// NewHistory returns a History that does not know which key_seqs were
// skipped on purpose: it takes x-ordo-prev-key-seq at its word as long as
// it agrees with what arrived. Report lists at most listCap lost ids and at
// most listCap problems (the counts are exact); listCap <= 0 means 20.
func NewHistory(listCap int) *History {
	if listCap <= 0 {
		listCap = reportListCap
	}
	return &History{
		skips: map[string][]int64{}, listCap: listCap,
		seen: map[string]bool{}, events: map[[2]string]bool{}, keys: map[string]*keyHistory{},
		expSet: map[expectation]bool{},
	}
}

// Skip is a row skipped on purpose (by an operator): a key_seq of its key
// that is never delivered.
type Skip struct {
	Key    string
	KeySeq int64
}

// NewHistoryWithSkips returns a History that knows every row skipped on
// purpose, skips (none when empty): the stricter rules above, for a whole
// history checked at its end.
func NewHistoryWithSkips(listCap int, skips []Skip) *History {
	h := NewHistory(listCap)
	h.skipsKnown = true
	for _, s := range skips {
		h.skips[s.Key] = append(h.skips[s.Key], s.KeySeq)
	}
	for _, s := range h.skips {
		slices.Sort(s)
	}
	return h
}

// Expect declares message ids that must be delivered; those never
// delivered are counted as Lost. Declaring one again has no effect.
func (h *History) Expect(ids ...string) {
	for _, id := range ids {
		h.expect(expectation{id: id})
	}
}

// ExpectEvent declares that a message of correlation id key and type typ
// must be delivered (its id unknown to the caller).
func (h *History) ExpectEvent(key, typ string) {
	h.expect(expectation{key: key, typ: typ})
}

func (h *History) expect(e expectation) {
	if h.expSet[e] {
		return
	}
	h.expSet[e] = true
	h.expected = append(h.expected, e)
	if !h.arrived(e) {
		h.pending++
	}
}

func (h *History) arrived(e expectation) bool {
	if e.id != "" {
		return h.seen[e.id]
	}
	return h.events[[2]string{e.key, e.typ}]
}

// Add records one delivery, in arrival order, and checks it against its
// key's earlier ones.
func (h *History) Add(d Delivery) Arrival {
	h.report.Total++
	if h.seen[d.MessageID] {
		if d.Redelivered {
			h.report.Redeliveries++
			return Redelivery
		}
		h.report.Duplicates++
		return Duplicate
	}
	h.seen[d.MessageID] = true
	h.report.Distinct++
	if h.expSet[expectation{id: d.MessageID}] {
		h.pending--
	}
	ev := [2]string{d.CorrelationID, d.Type}
	if !h.events[ev] {
		h.events[ev] = true
		if h.expSet[expectation{key: d.CorrelationID, typ: d.Type}] {
			h.pending--
		}
	}
	h.checkOrder(d)
	return First
}

// checkOrder checks one first delivery against its key's history.
func (h *History) checkOrder(d Delivery) {
	k := h.keys[d.CorrelationID]
	if k == nil {
		k = &keyHistory{}
		if h.skipsKnown {
			k.delivered = map[int64]bool{}
		}
		h.keys[d.CorrelationID] = k
		h.report.Keys++
	}
	if d.KeySeq < k.last {
		h.report.Reorders++
		h.problem("reorder: key %q message %s key_seq %d arrived after key_seq %d",
			d.CorrelationID, d.MessageID, d.KeySeq, k.last)
	}
	switch {
	case h.skipsKnown:
		if want := prevNotSkipped(h.skips[d.CorrelationID], d.KeySeq); !d.HasPrevKeySeq || d.PrevKeySeq != want {
			h.gap("gap: key %q message %s key_seq %d says x-ordo-prev-key-seq %d (present %v), want %d",
				d.CorrelationID, d.MessageID, d.KeySeq, d.PrevKeySeq, d.HasPrevKeySeq, want)
		}
		k.delivered[d.KeySeq] = true
	case d.KeySeq < k.last:
		// A reorder already; its header says nothing more.
	case d.HasPrevKeySeq && d.PrevKeySeq != k.last:
		h.gap("gap: key %q message %s key_seq %d has prev_key_seq %d but the last delivered is %d",
			d.CorrelationID, d.MessageID, d.KeySeq, d.PrevKeySeq, k.last)
	case !d.HasPrevKeySeq && d.KeySeq != k.last+1:
		h.gap("gap: key %q message %s key_seq %d follows key_seq %d (no prev_key_seq header)",
			d.CorrelationID, d.MessageID, d.KeySeq, k.last)
	}
	k.last = max(k.last, d.KeySeq)
}

func (h *History) gap(format string, args ...any) {
	h.report.Gaps++
	h.problem(format, args...)
}

func (h *History) problem(format string, args ...any) {
	if len(h.report.Problems) < h.listCap {
		h.report.Problems = append(h.report.Problems, fmt.Sprintf(format, args...))
	}
}

// Report returns what the History has seen so far. With the skips known it
// also counts, as gaps, the key_seqs below each key's last that never
// arrived and were not skipped: call it once the history is complete.
func (h *History) Report() Report {
	r := h.report
	r.Problems = slices.Clone(h.report.Problems)
	if h.skipsKnown {
		h.endGaps(&r)
	}
	r.Lost = h.pending
	want := min(r.Lost, h.listCap)
	for _, e := range h.expected {
		if len(r.LostIDs) == want {
			break
		}
		if !h.arrived(e) {
			r.LostIDs = append(r.LostIDs, e.String())
		}
	}
	return r
}

// endGaps adds to r every key_seq below its key's highest delivered one
// that never arrived and was not skipped on purpose, keys in name order.
func (h *History) endGaps(r *Report) {
	names := make([]string, 0, len(h.keys))
	for name := range h.keys {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		k := h.keys[name]
		for s := int64(1); s < k.last; s++ {
			if !k.delivered[s] && !slices.Contains(h.skips[name], s) {
				r.Gaps++
				if len(r.Problems) < h.listCap {
					r.Problems = append(r.Problems, fmt.Sprintf("gap: key %q key_seq %d never arrived (key_seq %d did)", name, s, k.last))
				}
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

// ErrHistory is wrapped by the error CheckHistory and Report.Err return
// for a history that loses, reorders or skips a message.
var ErrHistory = errors.New("delivery history breaks the ordering promise")

// Err returns nil when r is OK, and otherwise an error wrapping ErrHistory
// with r's Detail.
func (r Report) Err() error {
	if r.OK() {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrHistory, r.Detail())
}

// CheckHistory checks a whole history at once: ds in arrival order, the
// ids in expected must each arrive, and skips are every row skipped on
// purpose (the strict rules of NewHistoryWithSkips). It returns the report
// and Report.Err.
func CheckHistory(ds []Delivery, expected []string, skips []Skip) (Report, error) {
	h := NewHistoryWithSkips(0, skips)
	h.Expect(expected...)
	for _, d := range ds {
		h.Add(d)
	}
	r := h.Report()
	return r, r.Err()
}
