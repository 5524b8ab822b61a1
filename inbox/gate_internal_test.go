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

// window runs one window's batches one after another, each of d of
// which share went to its handler, with a lane waiting or not.
func (r *gateRig) window(d time.Duration, share float64, waiting bool) {
	for range max(gateMinWindow, r.g.cap()) {
		r.g.acquire()
		if waiting {
			r.g.mu.Lock()
			r.g.waited = true
			r.g.mu.Unlock()
		}
		r.handled.Add(int64(float64(d) * share))
		r.g.release(d, true)
	}
}

// TestGateFollowsHandlerShare: lanes whose time goes to their handlers,
// with lanes waiting, double the cap each window up to the pool's; a
// share under a quarter brings it back down by one a window, to 1; a
// high share with no lane waiting leaves it; retries count in no window.
func TestGateFollowsHandlerShare(t *testing.T) {
	r := newGateRig(14)
	if got := r.g.cap(); got != 1 {
		t.Fatalf("a new gate's cap is %d, want 1", got)
	}
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
	for range 20 {
		r.window(time.Millisecond, 0.05, true)
	}
	if got := r.g.cap(); got != 1 {
		t.Fatalf("fast handlers: cap %d, want 1", got)
	}
	for range 3 * gateMinWindow {
		r.g.acquire()
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
		r := newGateRig(4)
		r.g.acquire()
		if inHandler {
			r.inside.Store(1)
		}
		in := make(chan struct{})
		go func() {
			r.g.acquire()
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
