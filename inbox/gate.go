package inbox

import (
	"sync"
	"time"
)

// gate caps the lanes of all of an instance's shards at work at once (a
// lane at work holds a connection for its transaction). The cap moves
// between 1 and most with what the lanes' time goes to:
//
//   - Handlers that wait (on a remote call, a sleep, a slow query) leave
//     the database and the CPU idle, and more transactions at once buy
//     throughput. The cap doubles when lanes wait for the gate while
//     handlers took at least half of the lanes' time in the last window,
//     and at once when a lane has waited gateStall while every lane at
//     work is inside its handler (a handler that takes seconds would
//     otherwise end a window only after many of them).
//   - Handlers that take little of it leave the cost in the inbox's own
//     statements and commits, which group commit amortises: one lane
//     batches every key ready, and more lanes at once only split the
//     batches and contend for the same CPU (three instances with 14 each
//     handled fewer messages than one). While handlers take under a
//     quarter of the lanes' time, the cap halves per window.
//
// A window is at least gateMinWindow batches and at least as many as the
// cap, so that a look sees every lane's work. A new instance starts at
// most: slow handlers lose nothing while the cap finds fast ones out.
type gate struct {
	most    int                  // the pool's connections for lanes (laneSlots)
	handler func() time.Duration // the handlers' time so far (Store's counter)
	inside  func() int           // handlers running now (Store's counter)

	mu      sync.Mutex
	wake    chan struct{} // closed and replaced when a lane releases or the cap grows
	limit   int
	inUse   int
	waited  bool          // a lane waited for the gate in this window
	held    time.Duration // the lanes' time at work in this window
	batches int
	since   time.Duration // handler() at the window's start
}

const (
	// gateGrow and gateShrink are the handlers' share of a window at or
	// above which (with lanes waiting) the cap doubles, and below which
	// it halves.
	gateGrow   = 0.5
	gateShrink = 0.25
	// gateMinWindow is a window's fewest batches.
	gateMinWindow = 4
	// gateStall is how long a lane waits for the gate before it looks
	// whether every lane at work is inside its handler.
	gateStall = 20 * time.Millisecond
)

func newGate(most int, handler func() time.Duration, inside func() int) *gate {
	return &gate{most: max(1, most), handler: handler, inside: inside, limit: max(1, most), wake: make(chan struct{}), since: handler()}
}

// acquire waits until a lane may work, and reports true; or until quit
// is closed, and reports false.
func (g *gate) acquire(quit <-chan struct{}) bool {
	g.mu.Lock()
	for g.inUse >= g.limit {
		g.waited = true
		wake := g.wake
		g.mu.Unlock()
		t := time.NewTimer(gateStall)
		select {
		case <-quit:
			t.Stop()
			return false
		case <-wake:
			t.Stop()
			g.mu.Lock()
		case <-t.C:
			g.mu.Lock()
			if g.inUse >= g.limit && g.inside() >= g.inUse {
				g.grow()
			}
		}
	}
	g.inUse++
	g.mu.Unlock()
	return true
}

// release ends a lane's work of d; batch is false for work that is not a
// batch of deliveries (a retry), which counts in no window.
func (g *gate) release(d time.Duration, batch bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.inUse--
	if batch {
		g.held += d
		g.batches++
		if g.batches >= max(gateMinWindow, g.limit) {
			g.look()
		}
	}
	g.signal()
}

// look ends a window: it moves the cap by the handlers' share of the
// lanes' time, and starts the next.
func (g *gate) look() {
	h := g.handler()
	share := 0.0
	if g.held > 0 {
		share = float64(h-g.since) / float64(g.held)
	}
	switch {
	case share >= gateGrow && g.waited:
		g.grow()
	case share < gateShrink:
		g.limit = max(1, g.limit/2)
	}
	g.since, g.held, g.batches, g.waited = h, 0, 0, false
}

// grow doubles the cap, up to most. The caller holds mu.
func (g *gate) grow() {
	if g.limit < g.most {
		g.limit = min(g.most, 2*g.limit)
		g.signal()
	}
}

// signal wakes every waiting lane. The caller holds mu.
func (g *gate) signal() {
	close(g.wake)
	g.wake = make(chan struct{})
}

// cap returns the cap now.
func (g *gate) cap() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.limit
}
