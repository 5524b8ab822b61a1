package relaytest

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ordo-relay/ordo/relay"
)

// PublisherHarness is what the Publisher conformance suite needs of one
// implementation: a running, connected publisher and a broker of its own.
type PublisherHarness interface {
	// Publisher is the implementation under test, connected.
	Publisher() relay.Publisher
	// Routable, Unroutable and Missing return a message to an exchange
	// with a queue bound, to an exchange with nothing bound (it comes
	// back Returned), and to an exchange that does not exist.
	Routable() relay.Message
	Unroutable() relay.Message
	Missing() relay.Message
	// Stall stops the broker's answers from reaching the publisher, so
	// that what is published stays unconfirmed; Cut then drops the
	// connection; Restore brings everything back.
	Stall(t testing.TB)
	Cut(t testing.TB)
	Restore(t testing.TB)
	// Delay makes the broker answer late, far later than any deadline in
	// the suite (until Restore), so that the publisher's waits for it
	// stretch: a publish to an exchange not used before waits for it.
	Delay(t testing.TB)
	// BeforeWrite makes f run in each publish after its last wait, right
	// before it writes (nil: nothing), as a pause of the node there.
	BeforeWrite(t testing.TB, f func())
	// Received returns the ids of the messages the broker has received
	// since the last call (those routed to Routable's queue, for a real
	// broker).
	Received(t testing.TB) []uuid.UUID
}

// PublisherSuite runs the relay.Publisher contract against the
// implementation newHarness makes, one fresh harness per case.
func PublisherSuite(t *testing.T, newHarness func(t *testing.T) PublisherHarness) {
	cases := []struct {
		name string
		run  func(t *testing.T, h PublisherHarness)
	}{
		{"confirmed, settled exactly once", pubConfirmedOnce},
		{"returns reported before acks", pubReturnsBeforeAcks},
		{"missing exchange fails", pubMissingExchange},
		{"unsent when the connection drops, then refused until back", pubUnsentOnCut},
		{"nothing sent after the deadline", pubNothingAfterDeadline},
		{"a wait for the broker ends at the deadline", pubWaitEndsAtDeadline},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.run(t, newHarness(t))
		})
	}
}

// outcomes collects settle calls and fails on a second one per message.
type outcomes struct {
	t  *testing.T
	mu sync.Mutex
	by map[uuid.UUID]relay.Result
}

func newOutcomes(t *testing.T) *outcomes { return &outcomes{t: t, by: map[uuid.UUID]relay.Result{}} }

func (o *outcomes) settle(id uuid.UUID) func(relay.Result) {
	return func(r relay.Result) {
		o.mu.Lock()
		defer o.mu.Unlock()
		if prev, dup := o.by[id]; dup {
			o.t.Errorf("message %s settled twice: %v, then %v", id, prev.Outcome, r.Outcome)
		}
		o.by[id] = r
	}
}

func (o *outcomes) wait(n int) map[uuid.UUID]relay.Result {
	o.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		o.mu.Lock()
		got := len(o.by)
		o.mu.Unlock()
		if got >= n {
			break
		}
		if time.Now().After(deadline) {
			o.t.Fatalf("%d of %d messages settled after 30s", got, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond) // room for a wrong second settle to show
	o.mu.Lock()
	defer o.mu.Unlock()
	out := make(map[uuid.UUID]relay.Result, len(o.by))
	for k, v := range o.by {
		out[k] = v
	}
	return out
}

func fresh(m relay.Message, keySeq int64) *relay.Message {
	m.ID = uuid.Must(uuid.NewV7())
	m.CorrelationID = fmt.Sprintf("key-%d", keySeq%7)
	m.KeySeq, m.PrevKeySeq = keySeq, keySeq-1
	return &m
}

func waitConnected(t *testing.T, p relay.Publisher, want bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for p.Connected() != want {
		if time.Now().After(deadline) {
			t.Fatalf("Connected() still %v after 30s", !want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func pubConfirmedOnce(t *testing.T, h PublisherHarness) {
	p := h.Publisher()
	waitConnected(t, p, true)
	o := newOutcomes(t)
	const n = 200
	for i := range n {
		m := fresh(h.Routable(), int64(i+1))
		if err := p.Publish(ctxFor(t), m, o.settle(m.ID)); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	for id, r := range o.wait(n) {
		if r.Outcome != relay.Confirmed {
			t.Fatalf("message %s: %v (%v), want confirmed", id, r.Outcome, r.Err)
		}
	}
}

func pubReturnsBeforeAcks(t *testing.T, h PublisherHarness) {
	p := h.Publisher()
	waitConnected(t, p, true)
	o := newOutcomes(t)
	want := map[uuid.UUID]relay.Outcome{}
	for i := range 100 {
		tmpl, outcome := h.Routable(), relay.Confirmed
		if i%3 == 0 {
			tmpl, outcome = h.Unroutable(), relay.Returned
		}
		m := fresh(tmpl, int64(i+1))
		want[m.ID] = outcome
		if err := p.Publish(ctxFor(t), m, o.settle(m.ID)); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	for id, r := range o.wait(len(want)) {
		if r.Outcome != want[id] {
			t.Fatalf("message %s: %v (%v), want %v", id, r.Outcome, r.Err, want[id])
		}
	}
}

func pubMissingExchange(t *testing.T, h PublisherHarness) {
	p := h.Publisher()
	waitConnected(t, p, true)
	o := newOutcomes(t)
	bad := fresh(h.Missing(), 1)
	if err := p.Publish(ctxFor(t), bad, o.settle(bad.ID)); err != nil {
		t.Fatalf("publish to a missing exchange returned %v; want a Failed settle", err)
	}
	r := o.wait(1)[bad.ID]
	if r.Outcome != relay.Failed || !errors.Is(r.Err, relay.ErrExchangeNotFound) {
		t.Fatalf("missing exchange: %v (%v), want failed with ErrExchangeNotFound", r.Outcome, r.Err)
	}
	// The publisher carries on.
	waitConnected(t, p, true)
	good := fresh(h.Routable(), 2)
	for {
		err := p.Publish(ctxFor(t), good, o.settle(good.ID))
		if err == nil {
			break
		}
		if !errors.Is(err, relay.ErrNotConnected) {
			t.Fatal(err)
		}
		waitConnected(t, p, true)
	}
	if r := o.wait(2)[good.ID]; r.Outcome != relay.Confirmed {
		t.Fatalf("after a missing exchange: %v (%v), want confirmed", r.Outcome, r.Err)
	}
}

func pubUnsentOnCut(t *testing.T, h PublisherHarness) {
	p := h.Publisher()
	waitConnected(t, p, true)
	o := newOutcomes(t)
	// One confirmed publish first: a publisher may check the exchange on
	// its first publish to it, and a stalled broker would not answer.
	first := fresh(h.Routable(), 1)
	if err := p.Publish(ctxFor(t), first, o.settle(first.ID)); err != nil {
		t.Fatal(err)
	}
	if r := o.wait(1)[first.ID]; r.Outcome != relay.Confirmed {
		t.Fatalf("before the stall: %v (%v)", r.Outcome, r.Err)
	}
	h.Stall(t)
	sent := []uuid.UUID{first.ID}
	for i := range 5 {
		m := fresh(h.Routable(), int64(i+1))
		if err := p.Publish(ctxFor(t), m, o.settle(m.ID)); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
		sent = append(sent, m.ID)
	}
	h.Cut(t)
	for _, id := range sent[1:] {
		if r := o.wait(len(sent))[id]; r.Outcome != relay.Unsent {
			t.Fatalf("message %s unconfirmed at the cut: %v (%v), want unsent", id, r.Outcome, r.Err)
		}
	}
	waitConnected(t, p, false)
	m := fresh(h.Routable(), 9)
	if err := p.Publish(ctxFor(t), m, func(relay.Result) { t.Error("settle called after Publish returned an error") }); err == nil {
		t.Fatal("Publish while disconnected returned nil")
	}
	h.Restore(t)
	waitConnected(t, p, true)
	m = fresh(h.Routable(), 10)
	if err := p.Publish(ctxFor(t), m, o.settle(m.ID)); err != nil {
		t.Fatal(err)
	}
	if r := o.wait(len(sent) + 1)[m.ID]; r.Outcome != relay.Confirmed {
		t.Fatalf("after the connection came back: %v (%v), want confirmed", r.Outcome, r.Err)
	}
}

// publishExpired publishes m and requires Publish to refuse it with
// relay.ErrLeaseExpired, without settling it.
func publishExpired(t *testing.T, p relay.Publisher, m *relay.Message) {
	t.Helper()
	err := p.Publish(ctxFor(t), m, func(r relay.Result) {
		t.Errorf("a publish past its deadline was settled %v (%v)", r.Outcome, r.Err)
	})
	if !errors.Is(err, relay.ErrLeaseExpired) {
		t.Fatalf("publish past its deadline: %v, want ErrLeaseExpired", err)
	}
}

// confirmSentinel publishes a routable message without a deadline,
// retrying while the publisher reconnects, waits for its confirm, and
// requires it to be all the broker received since the last look.
func confirmSentinel(t *testing.T, h PublisherHarness, o *outcomes, settled int) {
	t.Helper()
	p := h.Publisher()
	m := fresh(h.Routable(), 99)
	for {
		waitConnected(t, p, true)
		err := p.Publish(ctxFor(t), m, o.settle(m.ID))
		if err == nil {
			break
		}
		if !errors.Is(err, relay.ErrNotConnected) {
			t.Fatal(err)
		}
	}
	if r := o.wait(settled + 1)[m.ID]; r.Outcome != relay.Confirmed {
		t.Fatalf("sentinel: %v (%v), want confirmed", r.Outcome, r.Err)
	}
	if got := h.Received(t); len(got) != 1 || got[0] != m.ID {
		t.Fatalf("the broker received %v; want only the sentinel %s", got, m.ID)
	}
}

// pubNothingAfterDeadline: a message whose deadline passed before the
// publish, or passes while the publisher pauses right before the write,
// is not sent.
func pubNothingAfterDeadline(t *testing.T, h PublisherHarness) {
	p := h.Publisher()
	waitConnected(t, p, true)
	o := newOutcomes(t)
	late := fresh(h.Routable(), 1)
	late.Deadline = time.Now().Add(-time.Millisecond)
	publishExpired(t, p, late)

	paused := fresh(h.Routable(), 2)
	paused.Deadline = time.Now().Add(100 * time.Millisecond)
	h.BeforeWrite(t, func() {
		for !time.Now().After(paused.Deadline) {
			time.Sleep(time.Millisecond)
		}
	})
	publishExpired(t, p, paused)
	h.BeforeWrite(t, nil)
	confirmSentinel(t, h, o, 0)
}

// pubWaitEndsAtDeadline: a publish that waits for a broker answering late
// gives up at its deadline and sends nothing; the publisher works again
// once the broker answers.
func pubWaitEndsAtDeadline(t *testing.T, h PublisherHarness) {
	p := h.Publisher()
	waitConnected(t, p, true)
	o := newOutcomes(t)
	h.Delay(t)
	m := fresh(h.Routable(), 1)
	const lease = 300 * time.Millisecond
	m.Deadline = time.Now().Add(lease)
	start := time.Now()
	publishExpired(t, p, m)
	took := time.Since(start)
	t.Logf("the publish gave up after %v (deadline %v)", took.Round(time.Millisecond), lease)
	if took > lease+10*time.Second {
		t.Fatalf("the publish waited %v for a deadline %v away", took, lease)
	}
	h.Restore(t)
	confirmSentinel(t, h, o, 0)
}
