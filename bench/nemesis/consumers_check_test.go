package nemesis

import (
	"strings"
	"testing"

	"github.com/ordo-relay/ordo/inbox"
)

func TestCheckConsumers(t *testing.T) {
	committed := []committedRow{
		{"a1", "a", 1}, {"a2", "a", 2}, {"b1", "b", 1}, {"b2", "b", 2},
		{"p1", "nemesis-poison-1", 1}, {"p2", "nemesis-poison-1", 2},
	}
	good := []handledRow{{1, "a", 1, "a1"}, {2, "b", 1, "b1"}, {3, "a", 2, "a2"}, {4, "b", 2, "b2"}}
	poison := map[string]int64{"nemesis-poison-1": 1}
	held := consumerState{
		Dead:    []inbox.DeadMessage{{Key: "nemesis-poison-1", KeySeq: 1, Waiting: 1}},
		LastSeq: map[string]int64{"nemesis-poison-1": 0},
	}
	with := func(f func(*[]handledRow, *consumerState)) ([]handledRow, consumerState) {
		h := append([]handledRow(nil), good...)
		st := consumerState{Dead: append([]inbox.DeadMessage(nil), held.Dead...), LastSeq: map[string]int64{"nemesis-poison-1": 0}}
		f(&h, &st)
		return h, st
	}
	for _, tc := range []struct {
		name    string
		mutate  func(*[]handledRow, *consumerState)
		check   func(consumerVerdict) bool
		problem string
	}{
		{name: "clean", mutate: func(*[]handledRow, *consumerState) {}, check: func(v consumerVerdict) bool { return v.OK() && v.Dead == 1 }},
		{name: "handled twice", mutate: func(h *[]handledRow, _ *consumerState) { *h = append(*h, handledRow{5, "a", 2, "a2"}) },
			check: func(v consumerVerdict) bool { return v.HandledTwice == 1 }, problem: "handled twice: key a key_seq 2"},
		{name: "lost", mutate: func(h *[]handledRow, _ *consumerState) { *h = (*h)[:3] },
			check: func(v consumerVerdict) bool { return v.Lost == 1 }, problem: "lost: key b key_seq 2"},
		{name: "out of order", mutate: func(h *[]handledRow, _ *consumerState) { (*h)[0].N, (*h)[2].N = 3, 1 },
			check: func(v consumerVerdict) bool { return v.OutOfOrder == 1 }, problem: "out of order: key a key_seq 1 handled after key_seq 2"},
		{name: "unexpected dead", mutate: func(h *[]handledRow, st *consumerState) {
			*h = (*h)[:3]
			st.Dead = append(st.Dead, inbox.DeadMessage{Key: "b", KeySeq: 2, Attempts: 8, LastError: "boom"})
		}, check: func(v consumerVerdict) bool { return v.UnexpectedDead == 1 && v.Lost == 1 && v.Dead == 2 }, problem: "unexpected dead letter: key b key_seq 2"},
		{name: "poison handled", mutate: func(h *[]handledRow, _ *consumerState) { *h = append(*h, handledRow{6, "nemesis-poison-1", 2, "p2"}) },
			check: func(v consumerVerdict) bool { return v.PoisonUnheld == 1 }, problem: "poison: key nemesis-poison-1 key_seq 2 was handled"},
		{name: "poison not dead", mutate: func(_ *[]handledRow, st *consumerState) { st.Dead = nil },
			check: func(v consumerVerdict) bool { return v.PoisonUnheld == 1 }, problem: "is not dead-lettered"},
		{name: "follower not waiting", mutate: func(_ *[]handledRow, st *consumerState) { st.Dead[0].Waiting = 0 },
			check: func(v consumerVerdict) bool { return v.PoisonUnheld == 1 }, problem: "0 of its later rows wait"},
		{name: "stuck", mutate: func(_ *[]handledRow, st *consumerState) { st.Stuck = []inbox.StuckKey{{Key: "c", Last: 1, Prev: 2}} },
			check: func(v consumerVerdict) bool { return v.Stuck == 1 && !v.OK() }, problem: "stuck: key c"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, st := with(tc.mutate)
			v := checkConsumers(committed, h, st, poison)
			if !tc.check(v) {
				t.Fatalf("verdict %+v", v)
			}
			if tc.problem != "" && !strings.Contains(strings.Join(v.Problems, "\n"), tc.problem) {
				t.Fatalf("problems %q do not mention %q", v.Problems, tc.problem)
			}
			if tc.problem != "" && v.OK() {
				t.Fatal("a broken history passed")
			}
		})
	}
}

// TestCheckConsumersRedelivered is the redeliver fault's history: the
// relay republishes a key's handled rows (same message ids and key_seq)
// after other keys moved on. An inbox that drops them passes; one that
// runs the handler again must fail, once per row handled again.
func TestCheckConsumersRedelivered(t *testing.T) {
	committed := []committedRow{{"a1", "a", 1}, {"a2", "a", 2}, {"a3", "a", 3}, {"b1", "b", 1}, {"b2", "b", 2}}
	first := []handledRow{{1, "a", 1, "a1"}, {2, "a", 2, "a2"}, {3, "b", 1, "b1"}, {4, "a", 3, "a3"}, {5, "b", 2, "b2"}}
	// The republished copies of a2 and a3, handled after b2.
	again := []handledRow{{6, "a", 2, "a2"}, {7, "a", 3, "a3"}}
	for _, tc := range []struct {
		name    string
		handled []handledRow
		twice   int
	}{
		{"copies dropped", first, 0},
		{"copies handled again", append(append([]handledRow(nil), first...), again...), 2},
		{"one copy handled again", append(append([]handledRow(nil), first...), again[1]), 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := checkConsumers(committed, tc.handled, consumerState{}, nil)
			if v.HandledTwice != tc.twice || v.Lost != 0 || v.OutOfOrder != 0 {
				t.Fatalf("verdict %+v, want handled_twice=%d and nothing else", v, tc.twice)
			}
			if v.OK() != (tc.twice == 0) {
				t.Fatalf("OK() = %v with %d handled twice", v.OK(), v.HandledTwice)
			}
			if tc.twice > 0 && !strings.Contains(strings.Join(v.Problems, "\n"), "handled twice: key a key_seq 3 (message a3, event 7)") {
				t.Fatalf("problems %q do not name a3's second handling", v.Problems)
			}
		})
	}
}
