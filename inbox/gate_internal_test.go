package inbox

import (
	"slices"
	"sync/atomic"
	"testing"
	"time"
)

// gateRig drives a gate with a handler clock and handler count of its own.
type gateRig struct {
	g       *gate
	handled atomic.Int64 // nanoseconds
	inside  atomic.Int64
}

func newGateRig(most int) *gateRig {
	r := &gateRig{}
	r.g = newGate(most, func() time.Duration { return time.Duration(r.handled.Load()) },
		func() int { return int(r.inside.Load()) })
	return r
}

// atOne is a rig whose gate's cap has come down to 1.
func atOne(most int) *gateRig {
	r := newGateRig(most)
	r.g.mu.Lock()
	r.g.limit = 1
	r.g.mu.Unlock()
	return r
}

// window runs one window's batches one after another, each of d of
// which share went to its handler, with a lane waiting or not.
func (r *gateRig) window(d time.Duration, share float64, waiting bool) {
	for range max(gateMinWindow, r.g.cap()) {
		r.g.acquire(nil)
		if waiting {
			r.g.mu.Lock()
			r.g.waited = true
			r.g.mu.Unlock()
		}
		r.handled.Add(int64(float64(d) * share))
		r.g.release(d, true)
	}
}

// fastWindows runs 20 windows of handlers that take 5 % of the lanes'
// time, and fails t unless the cap is then 1.
func (r *gateRig) fastWindows(t *testing.T) {
	t.Helper()
	for range 20 {
		r.window(time.Millisecond, 0.05, true)
	}
	if got := r.g.cap(); got != 1 {
		t.Fatalf("fast handlers: cap %d, want 1", got)
	}
}

// TestGateFollowsHandlerShare: a new gate's cap is the pool's; a share
// under a quarter halves it each window, to 1; lanes whose time
// goes to their handlers, with lanes waiting, double it each window up to
// the pool's; a high share with no lane waiting leaves it; retries count
// in no window.
func TestGateFollowsHandlerShare(t *testing.T) {
	r := newGateRig(14)
	if got := r.g.cap(); got != 14 {
		t.Fatalf("a new gate's cap is %d, want the pool's 14", got)
	}
	r.fastWindows(t)
	r.window(10*time.Millisecond, 0.9, false)
	if got := r.g.cap(); got != 1 {
		t.Fatalf("slow handlers, no lane waiting: cap %d, want 1", got)
	}
	var caps []int
	for range 5 {
		r.window(10*time.Millisecond, 0.9, true)
		caps = append(caps, r.g.cap())
	}
	if want := []int{2, 4, 8, 14, 14}; !slices.Equal(caps, want) {
		t.Fatalf("slow handlers: caps %v, want %v", caps, want)
	}
	r.window(10*time.Millisecond, 0.4, true)
	if got := r.g.cap(); got != 14 {
		t.Fatalf("cap %d after windows that give no reason to move, want 14", got)
	}
	r.fastWindows(t)
	for range 3 * gateMinWindow {
		r.g.acquire(nil)
		r.handled.Add(int64(time.Second))
		r.g.release(time.Second, false)
	}
	if got := r.g.cap(); got != 1 {
		t.Fatalf("retries moved the cap to %d", got)
	}
}

// TestGateBlocksAtTheCapAndGrowsForHandlersThatWait: a second lane waits
// while the first holds the only place; once it has waited gateStall
// with every lane at work inside its handler, the cap doubles and it
// goes in, without any batch having ended. With the lane at work outside
// its handler (in the inbox's own statements), it waits for the release.
func TestGateBlocksAtTheCapAndGrowsForHandlersThatWait(t *testing.T) {
	for _, inHandler := range []bool{true, false} {
		r := atOne(4)
		r.g.acquire(nil)
		if inHandler {
			r.inside.Store(1)
		}
		in := make(chan struct{})
		go func() {
			r.g.acquire(nil)
			close(in)
		}()
		select {
		case <-in:
			if !inHandler {
				t.Fatal("a second lane went in at a cap of 1 while the first was outside its handler")
			}
			if got := r.g.cap(); got != 2 {
				t.Fatalf("cap %d after a lane waited behind a handler, want 2", got)
			}
			r.g.release(time.Millisecond, true)
		case <-time.After(20 * gateStall):
			if inHandler {
				t.Fatal("a lane waited 20 stalls behind a lane inside its handler")
			}
			r.g.release(time.Millisecond, true) // the first lane's
			select {
			case <-in:
			case <-time.After(10 * time.Second):
				t.Fatal("the waiting lane did not go in once the first released")
			}
			if got := r.g.cap(); got != 1 {
				t.Fatalf("cap %d, want 1", got)
			}
		}
		r.g.release(time.Millisecond, true)
	}
}

// TestGateLetsAStoppedLaneGo: a lane waiting at the gate gives up once
// its lanes stop (quit closed), without taking a place.
func TestGateLetsAStoppedLaneGo(t *testing.T) {
	r := atOne(4)
	r.g.acquire(nil)
	quit := make(chan struct{})
	got := make(chan bool)
	go func() { got <- r.g.acquire(quit) }()
	close(quit)
	select {
	case ok := <-got:
		if ok {
			t.Fatal("a stopped lane went in at the cap")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a stopped lane still waits at the gate")
	}
	if r.g.inUse != 1 {
		t.Fatalf("%d places in use, want 1", r.g.inUse)
	}
}
