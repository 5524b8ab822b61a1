package ordercheck

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// msg builds a delivery with the prev header (prev >= 0).
func msg(id, key string, seq, prev int64) Delivery {
	d := Delivery{MessageID: id, CorrelationID: key, KeySeq: seq}
	if prev >= 0 {
		d.PrevKeySeq, d.HasPrevKeySeq = prev, true
	}
	return d
}

// ev builds a delivery of type t with the prev header (prev >= 0).
func ev(id, key string, seq, prev int64) Delivery {
	d := msg(id, key, seq, prev)
	d.Type = "t"
	return d
}

// again is d delivered once more, flagged redelivered or not.
func again(d Delivery, redelivered bool) Delivery {
	d.Redelivered = redelivered
	return d
}

// TestHistoryCatchesEachBrokenKind feeds the one order checker a broken
// history of each kind, with the skips unknown (as tests and the bench run
// it) and known (as the nemesis does), and checks that it counts exactly
// that breakage, fails the history with ErrHistory and describes it.
func TestHistoryCatchesEachBrokenKind(t *testing.T) {
	a1, a2, a3 := ev("a1", "a", 1, 0), ev("a2", "a", 2, 1), ev("a3", "a", 3, 2)
	type counts struct{ Duplicates, Redeliveries, Lost, Reorders, Gaps int }
	for _, tc := range []struct {
		name     string
		known    bool // the skips are known (NewHistoryWithSkips)
		skips    []Skip
		ids      []string
		events   [][2]string
		ds       []Delivery
		want     counts
		wantFail bool
	}{
		{name: "clean", ds: []Delivery{a1, a2, a3}},
		{name: "clean, skips known", known: true, ds: []Delivery{a1, a2, a3}},
		{name: "duplicate is allowed", ds: []Delivery{a1, a2, again(a1, false)}, want: counts{Duplicates: 1}},
		{name: "redelivery is no duplicate", known: true, ds: []Delivery{a1, again(a1, true)}, want: counts{Redeliveries: 1}},
		{name: "lost id", ids: []string{"a1", "a2"}, ds: []Delivery{a1}, want: counts{Lost: 1}, wantFail: true},
		{name: "lost event", events: [][2]string{{"a", "t"}, {"b", "t"}}, ds: []Delivery{a1}, want: counts{Lost: 1}, wantFail: true},
		{name: "reorder", ds: []Delivery{a2, a1}, want: counts{Reorders: 1, Gaps: 1}, wantFail: true},
		{name: "reorder, skips known", known: true, ds: []Delivery{a2, a1}, want: counts{Reorders: 1}, wantFail: true},
		{name: "gap: prev says a message came between", ds: []Delivery{a1, a3}, want: counts{Gaps: 1}, wantFail: true},
		{name: "gap: no prev header and key_seq jumps", ds: []Delivery{msg("a1", "a", 1, -1), msg("a3", "a", 3, -1)},
			want: counts{Gaps: 1}, wantFail: true},
		{name: "gap: never arrived, skips known", known: true, ds: []Delivery{a1, a3}, want: counts{Gaps: 1}, wantFail: true},
		{name: "skip explained by prev", ds: []Delivery{a1, ev("a4", "a", 4, 1)}},
		{name: "skip made on purpose, skips known", known: true, skips: []Skip{{"a", 2}, {"a", 3}},
			ds: []Delivery{a1, ev("a4", "a", 4, 1)}},
		{name: "prev claims a skip nobody made, skips known", known: true, ds: []Delivery{a1, ev("a3", "a", 3, 1)},
			want: counts{Gaps: 2}, wantFail: true},
		{name: "prev disagrees with a skip made, skips known", known: true, skips: []Skip{{"a", 2}},
			ds: []Delivery{a1, a3}, want: counts{Gaps: 1}, wantFail: true},
		{name: "no prev header, skips known", known: true, ds: []Delivery{a1, msg("a2", "a", 2, -1)},
			want: counts{Gaps: 1}, wantFail: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := NewHistory(0)
			if tc.known {
				h = NewHistoryWithSkips(0, tc.skips)
			}
			h.Expect(tc.ids...)
			for _, e := range tc.events {
				h.ExpectEvent(e[0], e[1])
			}
			for _, d := range tc.ds {
				h.Add(d)
			}
			r := h.Report()
			got := counts{r.Duplicates, r.Redeliveries, r.Lost, r.Reorders, r.Gaps}
			if got != tc.want {
				t.Fatalf("counts %+v, want %+v\n%s", got, tc.want, r.Detail())
			}
			err := r.Err()
			if (err != nil) != tc.wantFail || r.OK() == tc.wantFail {
				t.Fatalf("Err() = %v, OK() = %v; want failing %v", err, r.OK(), tc.wantFail)
			}
			if err != nil && !errors.Is(err, ErrHistory) {
				t.Fatalf("Err() = %v, does not wrap ErrHistory", err)
			}
			if len(r.Problems) != r.Reorders+r.Gaps || len(r.LostIDs) != r.Lost {
				t.Fatalf("%d problems and %d lost ids for %+v", len(r.Problems), len(r.LostIDs), got)
			}
		})
	}
}

func TestHistoryArrival(t *testing.T) {
	h := NewHistory(0)
	d := ev("a1", "a", 1, 0)
	for i, want := range []Arrival{First, Duplicate, Redelivery} {
		if got := h.Add(again(d, i == 2)); got != want {
			t.Fatalf("delivery %d: %v, want %v", i, got, want)
		}
	}
}

func TestHistoryLostEventNamed(t *testing.T) {
	h := NewHistory(0)
	h.Expect("x")
	h.ExpectEvent("order-1", "OrderPlaced")
	h.ExpectEvent("order-1", "OrderPlaced")
	if r := h.Report(); r.Lost != 2 || strings.Join(r.LostIDs, " ") != "x order-1/OrderPlaced" {
		t.Fatalf("lost %d: %v", r.Lost, r.LostIDs)
	}
}

func TestHistoryListCap(t *testing.T) {
	h := NewHistoryWithSkips(3, nil)
	for i := range 10 {
		h.Expect(fmt.Sprint("never", i))
	}
	h.Add(ev("a9", "a", 9, 8)) // eight end gaps
	r := h.Report()
	if r.Gaps != 8 || len(r.Problems) != 3 || r.Lost != 10 || len(r.LostIDs) != 3 {
		t.Fatalf("gaps %d (%d listed), lost %d (%d listed), want 8 (3) and 10 (3)", r.Gaps, len(r.Problems), r.Lost, len(r.LostIDs))
	}
}

func TestCheckHistory(t *testing.T) {
	ds := []Delivery{ev("a1", "a", 1, 0), ev("a3", "a", 3, 1)}
	if r, err := CheckHistory(ds, []string{"a1", "a3"}, []Skip{{"a", 2}}); err != nil || r.Distinct != 2 {
		t.Fatalf("a history with a skip made on purpose: %v, %v", r, err)
	}
	if _, err := CheckHistory(ds, []string{"a1", "a3"}, nil); !errors.Is(err, ErrHistory) || !strings.Contains(err.Error(), "never arrived") {
		t.Fatalf("the same history without the skip: %v, want an ErrHistory naming the missing key_seq", err)
	}
}

func TestPrevNotSkipped(t *testing.T) {
	for _, tc := range []struct {
		skipped []int64
		keySeq  int64
		want    int64
	}{
		{nil, 1, 0},
		{nil, 5, 4},
		{[]int64{4}, 5, 3},
		{[]int64{3, 4}, 5, 2},
		{[]int64{1, 2, 3, 4}, 5, 0},
		{[]int64{2}, 5, 4},
		{[]int64{7}, 5, 4},
	} {
		if got := prevNotSkipped(tc.skipped, tc.keySeq); got != tc.want {
			t.Errorf("prevNotSkipped(%v, %d) = %d, want %d", tc.skipped, tc.keySeq, got, tc.want)
		}
	}
}
