package rabbitmq

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ordo-relay/ordo/relay"
)

// results collects settle calls by message id, keeping every one, so a
// republished id shows each of its outcomes.
type results struct {
	t  *testing.T
	mu sync.Mutex
	by map[uuid.UUID][]relay.Result
}

func newResults(t *testing.T) *results { return &results{t: t, by: map[uuid.UUID][]relay.Result{}} }

func (r *results) settle(id uuid.UUID) func(relay.Result) {
	return func(res relay.Result) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.by[id] = append(r.by[id], res)
	}
}

// wait returns the n-th outcome of id (1-based), waiting up to 30 s.
func (r *results) wait(id uuid.UUID, n int) relay.Result {
	r.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		r.mu.Lock()
		got := r.by[id]
		r.mu.Unlock()
		if len(got) >= n {
			return got[n-1]
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("message %s: %d outcomes after 30s, want %d", id, len(got), n)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// publish publishes m, retrying while the publisher is (re)connecting.
func (h *brokerHarness) publish(t *testing.T, m *relay.Message, settle func(relay.Result)) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := h.pub.Publish(context.Background(), m, settle)
		if err == nil {
			return
		}
		if !errors.Is(err, relay.ErrNotConnected) || time.Now().After(deadline) {
			t.Fatalf("publish %s: %v", m.ID, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (h *brokerHarness) message(routingKey string) *relay.Message {
	m := h.msg(h.exchange, routingKey)
	m.ID = uuid.Must(uuid.NewV7())
	m.CorrelationID = m.ID.String()
	m.KeySeq = 1
	return &m
}

// confirmOne publishes a routable message and waits for its confirm: once
// it is in, everything the broker sent on the channel before its ack has
// been read.
func (h *brokerHarness) confirmOne(t *testing.T, r *results) {
	t.Helper()
	m := h.message("bound")
	h.publish(t, m, r.settle(m.ID))
	if res := r.wait(m.ID, 1); res.Outcome != relay.Confirmed {
		t.Fatalf("sentinel: %v (%v), want confirmed", res.Outcome, res.Err)
	}
}

// expireReturned publishes m unroutable while the broker's answers are held
// back, so that its confirm times out (Failed) before its return and ack
// arrive; then lets them through.
func (h *brokerHarness) expireReturned(t *testing.T, r *results, m *relay.Message) {
	t.Helper()
	h.proxy.Stall()
	h.publish(t, m, r.settle(m.ID))
	res := r.wait(m.ID, 1)
	h.proxy.Resume()
	if res.Outcome != relay.Failed || !errors.Is(res.Err, ErrConfirmTimeout) {
		t.Fatalf("stalled publish: %v (%v), want failed by the confirm timeout", res.Outcome, res.Err)
	}
}

// TestStaleReturn: a publish that timed out before its basic.return was
// read leaves that return behind. It must not be charged to the next
// publish of the same message (routed this time), and a real return of
// that next publish must still be reported.
func TestStaleReturn(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		// settleFirst: wait until the stale return and ack have been
		// read before republishing; otherwise republish at once, so that
		// they are read while the republish is in flight.
		settleFirst bool
		routingKey  string // of the republish
		want        relay.Outcome
	}{
		{"routed republish after the stale return was read", true, "bound", relay.Confirmed},
		{"routed republish while the stale return is in flight", false, "bound", relay.Confirmed},
		{"unroutable republish is still returned", true, "nobody.listens", relay.Returned},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h := newBroker(t, func(cfg *Config) { cfg.ConfirmTimeout = 300 * time.Millisecond })
			r := newResults(t)
			h.confirmOne(t, r) // the exchange check is cached from here on
			m := h.message("nobody.listens")
			h.expireReturned(t, r, m)
			if c.settleFirst {
				h.confirmOne(t, r)
			}
			again := *m
			again.RoutingKey = c.routingKey
			h.publish(t, &again, r.settle(m.ID))
			if res := r.wait(m.ID, 2); res.Outcome != c.want {
				t.Fatalf("republish to %q: %v (%v), want %v", c.routingKey, res.Outcome, res.Err, c.want)
			}
		})
	}
}

// TestHeaderFrameTooLarge: a message whose headers and properties do not
// fit one frame of the negotiated frame_max (three header values of 60 KB:
// each under the per-value limit, together over 128 KiB) fails at once as
// ErrUnsendable, without being sent: RabbitMQ would close the whole
// connection over it. The connection stays up and the next message goes.
func TestHeaderFrameTooLarge(t *testing.T) {
	t.Parallel()
	h := newBroker(t, nil)
	r := newResults(t)
	h.confirmOne(t, r)
	opened := h.pub.Status().ChannelsOpened
	big := h.message("bound")
	big.Headers = map[string]any{}
	for _, k := range []string{"a", "b", "c"} {
		big.Headers[k] = strings.Repeat("x", 60<<10)
	}
	h.publish(t, big, r.settle(big.ID))
	if res := r.wait(big.ID, 1); res.Outcome != relay.Failed || !errors.Is(res.Err, ErrUnsendable) {
		t.Fatalf("oversized headers: %v (%v), want failed with ErrUnsendable", res.Outcome, res.Err)
	}
	h.confirmOne(t, r)
	if now := h.pub.Status().ChannelsOpened; now != opened {
		t.Fatalf("%d channels opened after the oversized message, want none: it reached the broker", now-opened)
	}
}

// TestConnectionErrorCulprit: a message the broker answers by closing the
// whole connection (here a header frame over frame_max, let through on
// purpose) is found by sending one message at a time after the first
// such close, and fails; the messages in flight with it are Unsent, never
// charged, and confirmed when sent again.
func TestConnectionErrorCulprit(t *testing.T) {
	t.Parallel()
	h := newBroker(t, nil)
	h.pub.noFrameCheck = true
	r := newResults(t)
	h.confirmOne(t, r)
	big := h.message("bound")
	big.Headers = map[string]any{"a": strings.Repeat("x", 60<<10), "b": strings.Repeat("x", 60<<10), "c": strings.Repeat("x", 60<<10)}
	pending := []*relay.Message{big}
	for range 20 {
		pending = append(pending, h.message("bound"))
	}
	sent := map[uuid.UUID]int{}
	for round := 1; len(pending) > 0; round++ {
		if round > 10 {
			t.Fatalf("after 10 rounds %d messages are still unsent; the culprit is %s", len(pending), big.ID)
		}
		for _, m := range pending {
			h.publishRetrying(t, m, r.settle(m.ID))
			sent[m.ID]++
		}
		var again []*relay.Message
		for _, m := range pending {
			res := r.wait(m.ID, sent[m.ID])
			switch {
			case res.Outcome == relay.Unsent:
				again = append(again, m)
			case m == big && res.Outcome == relay.Failed:
				t.Logf("the culprit failed in round %d: %v", round, res.Err)
			case m != big && res.Outcome == relay.Confirmed:
			default:
				t.Fatalf("message %s (culprit: %v) in round %d: %v (%v)", m.ID, m == big, round, res.Outcome, res.Err)
			}
		}
		pending = again
	}
}

// publishRetrying publishes m, retrying on any error (a channel closing
// under the publish), as the relay would read the row again.
func (h *brokerHarness) publishRetrying(t *testing.T, m *relay.Message, settle func(relay.Result)) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := h.pub.Publish(context.Background(), m, settle)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("publish %s: %v", m.ID, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestReconnectBackoffAfterInstantClose: a connection the broker closes
// right after a publish (here over a frame too large, let through on
// purpose) does not start the reconnect backoff over, so a message that
// keeps doing it cannot make the publisher reconnect ten times a second.
func TestReconnectBackoffAfterInstantClose(t *testing.T) {
	t.Parallel()
	h := newBroker(t, func(c *Config) { c.ReconnectMin, c.ReconnectMax = 100*time.Millisecond, time.Second })
	h.pub.noFrameCheck = true
	r := newResults(t)
	h.confirmOne(t, r)
	before := h.pub.Status().ChannelsOpened
	start := time.Now()
	for time.Since(start) < 3*time.Second {
		big := h.message("bound")
		big.Headers = map[string]any{"a": strings.Repeat("x", 60<<10), "b": strings.Repeat("x", 60<<10), "c": strings.Repeat("x", 60<<10)}
		if err := h.pub.Publish(context.Background(), big, r.settle(big.ID)); err != nil {
			time.Sleep(5 * time.Millisecond)
		}
	}
	opened := h.pub.Status().ChannelsOpened - before
	t.Logf("%d connections in 3s while every one was closed over its first publish", opened)
	if opened > 8 { // 100 ms doubling to 1 s: 0.1+0.2+0.4+0.8+1+1 = 3.5 s for 6
		t.Fatalf("%d connections in 3s: the backoff started over after connections that never confirmed a publish", opened)
	}
}
