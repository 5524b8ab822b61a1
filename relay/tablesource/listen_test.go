package tablesource_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/partition"
	"github.com/ordo-relay/ordo/relay/tablesource"
)

// TestIntakeNotifiesItsPartitions: the Store's Listen wakes the relay
// once when it connects (-1), and then with the partitions of each page
// the intake takes in, at its commit; a pass that takes nothing in
// notifies nothing. Arm fails until Listen is connected, and then arms
// whatever it is asked.
func TestIntakeNotifiesItsPartitions(t *testing.T) {
	t.Parallel()
	pool := adoptedDB(t)
	s, in := newStore(t, pool, "n1")
	ctx := testkit.Context(t, 30*time.Second)
	if _, err := s.Arm(ctx, []int{0}); !errors.Is(err, tablesource.ErrNotListening) {
		t.Fatalf("Arm before Listen connected: %v, want ErrNotListening", err)
	}
	woke := make(chan int, 64)
	lctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.Listen(lctx, func(p int) { woke <- p }) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	next := func(what string) int {
		t.Helper()
		select {
		case p := <-woke:
			return p
		case <-time.After(10 * time.Second):
			t.Fatalf("no wake-up within 10s: %s", what)
			return 0
		}
	}
	if p := next("the connect"); p != -1 {
		t.Fatalf("first wake-up %d, want -1 (connected)", p)
	}
	if armed, err := s.Arm(ctx, []int{0, 3}); err != nil || !slices.Equal(armed, []int{0, 3}) {
		t.Fatalf("Arm while listening: %v, %v; want [0 3]", armed, err)
	}
	keys := []string{"a", "b", "c", "d", "e", "f"}
	want := map[int]bool{}
	now := time.Now()
	for i, k := range keys {
		insert(t, pool, msg{id: uuid.Must(uuid.NewV7()), corr: ptr(k), at: now.Add(time.Duration(i) * time.Millisecond)})
		want[partition.Of(k, storeParts)] = true
	}
	if n := take(t, in, true); n != len(keys) {
		t.Fatalf("took in %d rows, want %d", n, len(keys))
	}
	for len(want) > 0 {
		p := next("the page's partitions")
		if !want[p] {
			t.Fatalf("woken for partition %d, not one of the page's (%v left)", p, want)
		}
		delete(want, p)
	}
	// Nothing new: no notification. The next page's comes next, alone.
	if n := take(t, in, true); n != 0 {
		t.Fatalf("a pass with nothing new took in %d rows", n)
	}
	insert(t, pool, msg{id: uuid.Must(uuid.NewV7()), corr: ptr("z"), at: now.Add(time.Second)})
	if n := take(t, in, false); n != 1 {
		t.Fatalf("took in %d rows, want the one new", n)
	}
	if p, want := next("the last row's partition"), partition.Of("z", storeParts); p != want {
		t.Fatalf("woken for partition %d after a pass that took nothing in and one that took a row of partition %d", p, want)
	}
}
