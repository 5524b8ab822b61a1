package relay

import "testing"

// The Budget's rules, step by step, without relays: the relay-level tests
// (budget_test.go) show them at work.

// TestBudgetWorkConservingAndFair: a relay alone takes all of W; once
// another waits, slots given back go to the waiting one until it has its
// fair share, and the total never passes W.
func TestBudgetWorkConservingAndFair(t *testing.T) {
	b := NewBudget(16, 1<<20)
	busy, other := b.join(make(chan struct{}, 1), nil), b.join(make(chan struct{}, 1), nil)
	took := func(s *share) int {
		n := 0
		for n < 100 && s.takeSlot() {
			n++
		}
		return n
	}
	if n := took(busy); n != 16 {
		t.Fatalf("a busy relay alone took %d slots, want all of W = 16", n)
	}
	if other.takeSlot() {
		t.Fatal("a slot was given past W")
	}
	select {
	case <-other.wakeSlots:
		t.Fatal("the waiting relay was woken before any slot was given back")
	default:
	}
	for range 16 {
		busy.releaseSlot()
	}
	select {
	case <-other.wakeSlots:
	default:
		t.Fatal("a slot given back did not wake the relay waiting for one")
	}
	// The busy relay comes back first: it may refill only its fair share.
	if n := took(busy); n != 8 {
		t.Fatalf("with another relay waiting, the busy relay took %d slots, want its fair share 8", n)
	}
	if n := took(other); n != 8 {
		t.Fatalf("a waiting relay got %d of W = 16 slots, want its fair share 8", n)
	}
	if st := b.Stats(); st.InFlight != 16 {
		t.Fatalf("%d in flight, want 16", st.InFlight)
	}
	// The other runs dry: the busy one may take what it gives back.
	other.wantSlots(false)
	for range 8 {
		other.releaseSlot()
	}
	if n := took(busy); n != 8 {
		t.Fatalf("after the other relay ran dry, the busy one took %d more slots, want 8 (all of W)", n)
	}
}

// TestBudgetBytes: reads follow the same rule as slots.
func TestBudgetBytes(t *testing.T) {
	b := NewBudget(16, 1000)
	busy, other := b.join(nil, make(chan struct{}, 1)), b.join(nil, make(chan struct{}, 1))
	if !busy.mayRead() {
		t.Fatal("an empty budget refused a read")
	}
	busy.addBytes(1000)
	if busy.mayRead() || other.mayRead() {
		t.Fatal("a read was allowed with the budget full")
	}
	busy.addBytes(-600) // 400 used, the busy relay under its share of 500
	select {
	case <-other.wakeBytes:
	default:
		t.Fatal("bytes given back did not wake the relay waiting for them")
	}
	busy.addBytes(200) // 600: past its share
	if busy.mayRead() {
		t.Fatal("a relay past its fair share of bytes read while another waits")
	}
	if !other.mayRead() {
		t.Fatal("a waiting relay under its fair share was refused with room left")
	}
	if !busy.mayRead() {
		t.Fatal("with nobody waiting any more, the busy relay was refused with room left")
	}
}

// TestFairShare: ⌈total/k⌉.
func TestFairShare(t *testing.T) {
	for _, c := range []struct{ total, k, want int }{{16, 1, 16}, {16, 2, 8}, {16, 3, 6}, {1, 12, 1}, {512, 5, 103}} {
		if got := fair(c.total, c.k); got != c.want {
			t.Errorf("fair(%d, %d) = %d, want %d", c.total, c.k, got, c.want)
		}
	}
}
