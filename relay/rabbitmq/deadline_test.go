package rabbitmq

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/ordo-relay/ordo/relay"
)

// publishAsync runs Publish in a goroutine of its own and returns its
// result, or fails the test when it has not returned within limit; then
// release (which must make it return) is called first, so that nothing
// is left running.
func (h *brokerHarness) publishAsync(t *testing.T, m *relay.Message, settle func(relay.Result), limit time.Duration, release func()) (time.Duration, error) {
	t.Helper()
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- h.pub.Publish(context.Background(), m, settle) }()
	select {
	case err := <-done:
		return time.Since(start), err
	case <-time.After(limit):
		release()
		err := <-done
		t.Fatalf("Publish had not returned %v after it started (deadline %v); released, it returned %v",
			limit, time.Until(m.Deadline)+time.Since(start), err)
		return 0, nil
	}
}

// TestWriteCutOffAtDeadline: a publish whose write blocks in the socket
// (the proxy stops reading, as a broker that stops reading its socket
// does, and the payload is larger than the socket buffers) is cut off by
// the watchdog at its lease deadline: the connection is reset, so the rest
// of the message never leaves. The broker never routes it; the publishes
// in flight with it are Unsent, not charged; the publisher reconnects and
// goes on.
func TestWriteCutOffAtDeadline(t *testing.T) {
	t.Parallel()
	h := newBroker(t, nil)
	r := newResults(t)
	h.confirmOne(t, r) // the exchange check is cached from here on
	opened := h.pub.Status().ChannelsOpened
	h.proxy.Stall()
	var inFlight []*relay.Message
	for range 3 {
		m := h.message("bound")
		h.publish(t, m, r.settle(m.ID))
		inFlight = append(inFlight, m)
	}
	big := h.message("bound")
	big.Payload = make([]byte, 12<<20) // more than the socket buffers hold (4 MiB + a little)
	const lease = 500 * time.Millisecond
	big.Deadline = time.Now().Add(lease)
	took, err := h.publishAsync(t, big, r.settle(big.ID), lease+10*time.Second, h.proxy.Resume)
	returned := time.Now()
	t.Logf("the blocked publish returned after %v: %v", took.Round(time.Millisecond), err)
	// Judged against the deadline itself, not against took: publishAsync
	// starts its clock a little after the deadline was set.
	if returned.Before(big.Deadline) {
		t.Fatalf("the write did not block: it returned %v before its deadline; the test needs a payload larger than the socket buffers",
			big.Deadline.Sub(returned))
	}
	if err == nil {
		if res := r.wait(big.ID, 1); res.Outcome != relay.Unsent {
			t.Fatalf("the cut-off publish: %v (%v), want unsent", res.Outcome, res.Err)
		}
	} else if !errors.Is(err, relay.ErrLeaseExpired) {
		t.Fatalf("the cut-off publish returned %v, want ErrLeaseExpired", err)
	}
	for _, m := range inFlight {
		if res := r.wait(m.ID, 1); res.Outcome != relay.Unsent {
			t.Fatalf("a publish in flight at the reset: %v (%v), want unsent", res.Outcome, res.Err)
		}
	}
	h.proxy.Resume() // what the proxy held (not the whole message) reaches the broker now
	h.confirmOne(t, r)
	if now := h.pub.Status().ChannelsOpened; now <= opened {
		t.Fatalf("no channel opened after the reset (%d, then %d)", opened, now)
	}
	got := h.Received(t)
	if slices.Contains(got, big.ID) {
		t.Fatalf("the broker routed the message cut off at its deadline (received %v)", got)
	}
}

// TestIsolationWaitEndsAtDeadline: while isolating a broker error, a
// publish waits for the one before it to be confirmed; when that confirm
// comes late, the wait ends at the publish's deadline and it is not sent.
func TestIsolationWaitEndsAtDeadline(t *testing.T) {
	t.Parallel()
	h := newBroker(t, nil)
	r := newResults(t)
	h.confirmOne(t, r)
	h.pub.mu.Lock()
	h.pub.isolate = 10
	h.pub.mu.Unlock()
	h.proxy.DelayReplies(time.Hour)
	first := h.message("bound")
	h.publish(t, first, r.settle(first.ID))
	m := h.message("bound")
	const lease = 300 * time.Millisecond
	m.Deadline = time.Now().Add(lease)
	took, err := h.publishAsync(t, m, func(res relay.Result) { t.Errorf("settled %v (%v)", res.Outcome, res.Err) },
		lease+10*time.Second, func() { h.proxy.DelayReplies(0) })
	t.Logf("the waiting publish returned after %v: %v", took.Round(time.Millisecond), err)
	if !errors.Is(err, relay.ErrLeaseExpired) {
		t.Fatalf("a publish waiting past its deadline: %v, want ErrLeaseExpired", err)
	}
	h.proxy.DelayReplies(0)
	if res := r.wait(first.ID, 1); res.Outcome != relay.Confirmed {
		t.Fatalf("the publish before it: %v (%v)", res.Outcome, res.Err)
	}
	h.confirmOne(t, r)
	if got := h.Received(t); slices.Contains(got, m.ID) || !slices.Contains(got, first.ID) {
		t.Fatalf("the broker received %v: want %s and not %s", got, first.ID, m.ID)
	}
}

// BenchmarkWatched is what the watchdog adds to each write: arming and
// stopping a timer ("none": a message without a deadline, for comparison).
func BenchmarkWatched(b *testing.B) {
	p := newPublisher(Config{}.withDefaults())
	s := &session{}
	s.dog = p.newWatchdog(s)
	write := func() error { return nil }
	for _, c := range []struct {
		name     string
		deadline time.Time
	}{{"none", time.Time{}}, {"deadline", time.Now().Add(time.Hour)}} {
		b.Run(c.name, func(b *testing.B) {
			m := &relay.Message{Deadline: c.deadline}
			b.ReportAllocs()
			for b.Loop() {
				if cut, _ := p.watched(s, m, write); cut {
					b.Fatal("cut")
				}
			}
		})
	}
}
