package rabbitmq

import (
	"errors"
	"testing"
	"time"

	"github.com/ordo-relay/ordo/relay"
)

// TestFlushSendsWhatIsCorked: publishes far from their deadline are held
// in the corked connection and go out together on Flush, all confirmed;
// the connection is uncorked after it.
func TestFlushSendsWhatIsCorked(t *testing.T) {
	t.Parallel()
	h := newBroker(t, nil)
	r := newResults(t)
	h.confirmOne(t, r) // the exchange check is cached from here on
	var ms []*relay.Message
	for range 50 {
		m := h.message("bound")
		m.Deadline = time.Now().Add(time.Minute)
		h.publish(t, m, r.settle(m.ID))
		ms = append(ms, m)
	}
	h.pub.pubMu.Lock()
	corked := h.pub.cur != nil && h.pub.cur.corked
	h.pub.pubMu.Unlock()
	if !corked {
		t.Fatal("the connection is not corked after 50 publishes a minute from their deadline")
	}
	h.pub.Flush()
	h.pub.pubMu.Lock()
	corked = h.pub.cur != nil && h.pub.cur.corked
	h.pub.pubMu.Unlock()
	if corked {
		t.Fatal("the connection is still corked after Flush")
	}
	for _, m := range ms {
		if res := r.wait(m.ID, 1); res.Outcome != relay.Confirmed {
			t.Fatalf("a flushed publish: %v (%v), want confirmed", res.Outcome, res.Err)
		}
	}
}

// TestFlushPastDeadlineResets: when the deadline of a message held corked
// has passed by the time it would be sent, Flush resets the connection
// rather than send it late: the broker never routes it, it settles
// Unsent, and the publisher reconnects. (What is corked is sent within
// 200 ms, and a message is held only a second or more from its deadline,
// so the test makes the held message's deadline pass directly.)
func TestFlushPastDeadlineResets(t *testing.T) {
	t.Parallel()
	h := newBroker(t, nil)
	r := newResults(t)
	h.confirmOne(t, r)
	opened := h.pub.Status().ChannelsOpened
	h.proxy.Stall()
	m := h.message("bound")
	m.Deadline = time.Now().Add(time.Minute)
	h.publish(t, m, r.settle(m.ID))
	h.pub.pubMu.Lock()
	s := h.pub.cur
	if s == nil || !s.corked || s.corkedBy == nil {
		h.pub.pubMu.Unlock()
		h.proxy.Resume()
		t.Fatal("the publish was not held corked")
	}
	late := *s.corkedBy
	late.Deadline = time.Now().Add(-time.Millisecond)
	s.corkedBy = &late
	h.pub.pubMu.Unlock()
	h.pub.Flush()
	h.proxy.Resume()
	if res := r.wait(m.ID, 1); res.Outcome != relay.Unsent {
		t.Fatalf("a held publish past its deadline at Flush: %v (%v), want unsent (the connection reset)", res.Outcome, res.Err)
	}
	h.confirmOne(t, r) // the publisher reconnected and goes on
	if got := h.pub.Status().ChannelsOpened; got <= opened {
		t.Fatalf("channels opened: %d, want more than %d (a reconnect)", got, opened)
	}
}

// TestHeldDeadlineGuardsLaterWrite: a write that sends what the corked
// connection holds (here a payload past corkMax, which the proxy, no
// longer reading, makes block in the socket) is cut off at the earliest
// deadline of the messages held, not at the later deadline of the
// message being written: the held message must not leave after its
// deadline either.
func TestHeldDeadlineGuardsLaterWrite(t *testing.T) {
	t.Parallel()
	h := newBroker(t, nil)
	r := newResults(t)
	h.confirmOne(t, r)
	h.proxy.Stall()
	held := h.message("bound")
	held.Deadline = time.Now().Add(corkLead + 500*time.Millisecond) // far enough to be held
	h.publish(t, held, r.settle(held.ID))
	big := h.message("bound")
	big.Payload = make([]byte, 12<<20) // more than the socket buffers hold
	big.Deadline = time.Now().Add(time.Minute)
	took, err := h.publishAsync(t, big, r.settle(big.ID), corkLead+10*time.Second, h.proxy.Resume)
	returned := time.Now()
	t.Logf("the blocked publish returned after %v: %v", took.Round(time.Millisecond), err)
	if returned.Before(held.Deadline) {
		t.Fatalf("the write did not block: it returned %v before the held message's deadline", held.Deadline.Sub(returned))
	}
	if err == nil {
		if res := r.wait(big.ID, 1); res.Outcome != relay.Unsent {
			t.Fatalf("the publish cut off: %v (%v), want unsent", res.Outcome, res.Err)
		}
	} else if !errors.Is(err, relay.ErrLeaseExpired) {
		t.Fatalf("the publish cut off returned %v, want ErrLeaseExpired", err)
	}
	if res := r.wait(held.ID, 1); res.Outcome != relay.Unsent {
		t.Fatalf("the held publish: %v (%v), want unsent (the connection reset at its deadline)", res.Outcome, res.Err)
	}
	h.proxy.Resume()
	h.confirmOne(t, r) // the publisher reconnected and goes on
}
