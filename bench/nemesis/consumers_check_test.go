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
